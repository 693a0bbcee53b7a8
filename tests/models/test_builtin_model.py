"""Specification of the built-in tiny model, its tokenizer, and model-path loading."""

from __future__ import annotations

import shutil
import string
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pacs.models import loading
from pacs.models.loading import (
    BUILTIN_MODELS,
    load_causal_lm,
    load_tokenizer,
    register_builtin_model,
    resolve_model_path,
)
from pacs.models.tiny import CHAT_TEMPLATE, build_char_tokenizer, save_builtin_tiny

MESSAGES = [{"role": "user", "content": "What is 12+34? Put the final answer in \\boxed{}."}]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_builtin_tiny(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.mark.parametrize("text", [" a  b ", "\\boxed{-12}", string.printable[:95], "{{}}\\\\ x~"])
def test_char_tokenizer_round_trips_printable_ascii(tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_char_tokenizer_uses_one_token_per_character(tokenizer) -> None:
    assert len(tokenizer.encode("What is 1+2?", add_special_tokens=False)) == len("What is 1+2?")


def test_char_tokenizer_adds_no_bos_or_eos_when_encoding(tokenizer) -> None:
    assert tokenizer("ab")["input_ids"] == tokenizer.encode("ab", add_special_tokens=False)


def test_char_tokenizer_special_tokens(tokenizer) -> None:
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token) == ("<|end|>", "<|pad|>", "<|unk|>")
    assert tokenizer.bos_token is None


def test_chat_template_renders_roles_and_generation_prompt(tokenizer) -> None:
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|user|>What is 12+34? Put the final answer in \\boxed{}.<|end|><|assistant|>"


@pytest.mark.parametrize("marker", ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"])
def test_chat_markers_encode_to_one_token(tokenizer, marker: str) -> None:
    assert tokenizer.encode(marker, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(marker)]


def test_rendered_prompt_encodes_markers_as_single_ids(tokenizer) -> None:
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    content = MESSAGES[0]["content"]
    assert len(ids) == len(content) + 3
    assert ids[-2:] == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|assistant|>")]


def test_saved_directory_is_a_plain_hugging_face_model(tiny_dir: Path) -> None:
    names = {path.name for path in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names


def test_saving_leaves_no_temporary_directory(tiny_dir: Path) -> None:
    assert [path.name for path in tiny_dir.parent.iterdir()] == [tiny_dir.name]


def test_saving_into_an_existing_directory_is_refused(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="already exists"):
        save_builtin_tiny(tiny_dir)


def test_saved_tokenizer_keeps_chat_template_and_special_tokens(tiny_dir: Path) -> None:
    saved = AutoTokenizer.from_pretrained(tiny_dir)
    assert saved.chat_template == CHAT_TEMPLATE
    assert (saved.eos_token, saved.pad_token) == ("<|end|>", "<|pad|>")


def test_saved_model_loads_as_float32_with_a_few_hundred_thousand_parameters(tiny_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.dtype == torch.float32
    assert 200_000 < model.num_parameters() < 5_000_000


def test_saved_generation_config_stops_at_end_token(tiny_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.generation_config.eos_token_id == build_char_tokenizer().eos_token_id
    assert model.generation_config.pad_token_id == build_char_tokenizer().pad_token_id


def test_same_seed_gives_same_weights(tmp_path: Path, tiny_dir: Path) -> None:
    again = AutoModelForCausalLM.from_pretrained(save_builtin_tiny(tmp_path / "again", seed=0))
    first = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert torch.equal(again.model.embed_tokens.weight, first.model.embed_tokens.weight)


def test_builtin_tiny_is_built_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACS_CACHE_DIR", str(tmp_path))
    resolved = resolve_model_path("builtin:tiny")
    assert Path(resolved) == tmp_path / "models" / "tiny-v2"
    assert resolve_model_path("builtin:tiny") == resolved


def test_building_a_builtin_model_leaves_torchs_random_state_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Else a run's draws (new LoRA adapters, samples) would depend on whether its model was cached."""
    monkeypatch.setenv("PACS_CACHE_DIR", str(tmp_path))
    torch.manual_seed(1)
    before = torch.random.get_rng_state()
    resolve_model_path("builtin:tiny")  # built: the cache is empty
    assert (tmp_path / "models" / "tiny-v2" / "config.json").is_file()
    assert torch.equal(torch.random.get_rng_state(), before)


def test_unknown_builtin_model_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="builtin:tiny"):
        resolve_model_path("builtin:huge")


def test_registered_builtin_model_resolves_to_its_directory(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "BUILTIN_MODELS", dict(BUILTIN_MODELS))
    register_builtin_model("builtin:other", lambda: tiny_dir)
    assert resolve_model_path("builtin:other") == str(tiny_dir)


def test_registering_a_name_without_builtin_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="builtin:<name>"):
        register_builtin_model("tiny", lambda: Path("."))


def test_local_model_directory_resolves_to_itself(tiny_dir: Path) -> None:
    assert resolve_model_path(str(tiny_dir)) == str(tiny_dir)


def test_directory_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_path(str(tmp_path))


def test_hub_id_is_passed_through() -> None:
    assert resolve_model_path("Qwen/Qwen2.5-Math-1.5B") == "Qwen/Qwen2.5-Math-1.5B"


def test_unrecognised_model_path_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a local model directory"):
        resolve_model_path(str(tmp_path / "missing" / "model"))


def test_unreachable_hub_id_says_machine_may_be_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail_offline(path: str, **kwargs: object) -> None:
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(loading, "_hub_unreachable_reason", lambda repo_id: None)  # the hub check passes
    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", fail_offline)
    with pytest.raises(FileNotFoundError, match="may be offline"):
        load_tokenizer("org/model")


def test_loaded_tokenizer_pads_on_the_left(tiny_dir: Path) -> None:
    assert load_tokenizer(str(tiny_dir)).padding_side == "left"


def test_loaded_tokenizer_encodes_the_saved_tokenizer_as_built_spaces_included(tiny_dir: Path) -> None:
    text = "What is 12 + 34? Put the final answer in \\boxed{}."
    assert load_tokenizer(str(tiny_dir)).encode(text) == build_char_tokenizer().encode(text)


def test_loaded_tokenizer_renders_chat_template_to_text(tiny_dir: Path) -> None:
    rendered = load_tokenizer(str(tiny_dir)).apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|end|><|assistant|>")


def test_loaded_tokenizer_without_pad_token_pads_with_eos(tiny_dir: Path, tmp_path: Path) -> None:
    without_pad = build_char_tokenizer()
    without_pad.pad_token = None
    without_pad.save_pretrained(tmp_path)
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    assert load_tokenizer(str(tmp_path)).pad_token == "<|end|>"


def test_load_causal_lm_uses_requested_dtype(tiny_dir: Path) -> None:
    assert load_causal_lm(str(tiny_dir), dtype="bfloat16").dtype == torch.bfloat16


def test_load_causal_lm_rejects_unknown_dtype(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="float32"):
        load_causal_lm(str(tiny_dir), dtype="float16")


def test_a_mistyped_local_path_says_no_such_directory_rather_than_asking_the_hub(tmp_path, monkeypatch) -> None:
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="'runs/nomodel': no such directory"):
        resolve_model_path("runs/nomodel")


def test_the_warm_started_model_asked_for_at_once_is_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pacs.train import builtin_models

    monkeypatch.setenv("PACS_CACHE_DIR", str(tmp_path))
    builds = []

    def slow_build(settings: dict, reference, seed: int, directory: Path, show_progress: bool) -> Path:
        builds.append(seed)
        time.sleep(0.5)  # long enough for the other caller to arrive while this one builds
        directory.mkdir()
        (directory / "config.json").write_text("{}")
        return directory

    monkeypatch.setattr(builtin_models, "_warm_start", slow_build)
    with ThreadPoolExecutor(2) as callers:
        directories = list(callers.map(lambda _: builtin_models.warm_started_tiny(0, show_progress=False), range(2)))
    assert builds == [0]
    assert directories[0] == directories[1]


@pytest.mark.slow
def test_every_built_in_name_is_known_in_a_fresh_interpreter_without_importing_the_trainer():
    code = (
        "import sys; from pacs.models.loading import check_model_path; "
        "check_model_path('builtin:tiny-arithmetic'); print('pacs.train' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"

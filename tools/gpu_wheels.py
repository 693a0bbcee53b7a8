"""The wheels a lent GPU machine lacks, for tools/gpu_check.sh: fetched here, carried there.

    python tools/gpu_wheels.py            # or `make gpu-wheels`: fills .gpu-wheels/

The lent H200 machine (docs/gpu.md, "Running the GPU checks on a lent machine") has its own Python
3.12 with torch and transformers, and no package index. This downloads into `.gpu-wheels/` the
CPython 3.12 manylinux x86-64 wheels of every package that pacs (its core dependencies in
pyproject.toml) and TRL (`trl` and `datasets` at their pins in benchmarks/requirements-trl.txt) need
and the machine's image cannot serve (`IMAGE`: one it lacks, or holds at a version that may not
do, as `resolve` says), following each wheel's own Requires-Dist, one version per package; prints
them with their sizes, and fails, writing nothing, if they pass `LIMIT_MIB` (the working tree that
travels is at most 64 MiB, the repository included). It also writes the commit of this checkout to
`.gpu-wheels/COMMIT`, since the tree may travel without .git.

`resolve` is the resolution on its own (pure: it is given what a package's chosen version needs);
`pip download` picks each version, the newest that every requirement seen so far allows. It runs
where pacs's development venv does (Python 3.11 or later: it reads pyproject.toml with tomllib).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / ".gpu-wheels"
LIMIT_MIB = 56.0
PIP_TARGET = [
    "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    *(arg for tag in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014", "manylinux1")
      for arg in ("--platform", f"{tag}_x86_64")),
]  # fmt: skip
"""The machine's interpreter for `pip download`: CPython 3.12 on x86-64 Linux."""
MARKER_ENVIRONMENT = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "",
    "platform_version": "",
}  # fmt: skip
"""The machine's values of the environment markers in Requires-Dist."""

# The packages of the H200 image 'cuda' as /work/.library/device/KINDS.md lists them ("Python packages
# already there", read on such a machine on 2026-11-17), with the versions its 'pip list' row gives
# (2026-11); None where the list gives no version. Update it from there when the image changes.
IMAGE: dict[str, str | None] = {
    "accelerate": "1.15.0", "botorch": "0.18.1", "cupy-cuda13x": "14.2.0", "gpytorch": "1.15.2",
    "huggingface-hub": "1.33.0", "jax": "0.11.2", "jax-cuda13-pjrt": "0.11.2", "jax-cuda13-plugin": "0.11.2",
    "jaxlib": "0.11.2", "jaxtyping": "0.3.11", "numpy": "2.5.2", "numpyro": "0.21.0", "onnx": "1.23.1",
    "onnx-ir": "1.0.0", "onnxruntime": "1.30.0", "onnxscript": "0.7.2", "pytorch-lightning": "2.6.6",
    "safetensors": "0.8.0", "sentence-transformers": "6.0.1", "sentencepiece": "0.2.2", "tiktoken": "0.14.0",
    "tokenizers": "0.23.2", "torch": "2.11.0", "torch-geometric": "2.8.0.post1", "torchaudio": "2.11.0",
    "torchdiffeq": "0.2.5", "torchmetrics": "1.9.0", "torchvision": "0.26.0", "transformers": "5.17.0",
    "triton": "3.6.0",
    **dict.fromkeys("""
        absl-py aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs build certifi
        charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
        cuda-pathfinder cuda-toolkit cycler cython diffrax e3nn einops equinox etils execnet filelock
        flatbuffers flax fonttools formulaic frozenlist fsspec grpcio h11 h5py hf-xet httpcore httpx humanize
        hypothesis idna imageio iniconfig interface-meta jinja2 joblib kiwisolver lazy-loader lightning
        lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
        mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
        narwhals networkx ninja numba numba-cuda nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
        nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
        nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
        nvidia-nvshmem-cu13 nvidia-nvtx opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
        orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
        prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
        pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
        pytest-xdist python-dateutil pyyaml regex requests rich sacrebleu scikit-build-core scikit-image
        scikit-learn scipy seaborn setuptools shellingham simplejson six sortedcontainers statsmodels sympy
        tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile timm toolz tqdm
        treescope typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt
        xarray xxhash yarl zipp
    """.split()),
}  # fmt: skip


@dataclass(frozen=True)
class Candidate:
    """A version of a package, with its wheel's Requires-Dist lines."""

    version: str
    requires: tuple[str, ...]


class ResolutionError(Exception):
    """A package's wheel cannot be had, or the one had does not meet its requirements."""


def resolve(
    roots: Iterable[str], pick: Callable[[str, SpecifierSet], Candidate], image: Mapping[str, str | None]
) -> dict[str, Candidate]:
    """Every package that `roots` need, directly or through the Requires-Dist of the versions picked,
    and `image` cannot serve: name -> the version `pick(name, specifier)` gave for the intersection
    of every specifier seen for it (picked again when a later requirement excludes the earlier pick).
    The image serves a package when its version meets the specifiers, or when its version is unknown
    (None) and no specifier bounds it from above (a lower bound is taken to hold: the image is recent;
    an upper bound or a pin may exclude it, so such a package is carried). A requirement whose marker
    does not hold on the machine (`MARKER_ENVIRONMENT`, extras only where a requirer asked for them)
    is left out, and what the image serves is not followed."""
    specifiers: dict[str, SpecifierSet] = {}
    extras: dict[str, set[str]] = {}
    picked: dict[str, Candidate] = {}
    pending = [Requirement(root) for root in roots]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        specifiers[name] = specifiers.get(name, SpecifierSet()) & requirement.specifier
        new_extras = set(requirement.extras) - extras.setdefault(name, set())
        extras[name] |= new_extras
        if name not in picked and serves(image, name, specifiers[name]):
            continue
        if name in picked and picked[name].version in specifiers[name] and not new_extras:
            continue
        if name not in picked or picked[name].version not in specifiers[name]:
            picked[name] = pick(name, specifiers[name])
            if picked[name].version not in specifiers[name]:
                raise ResolutionError(f"{name} {picked[name].version} was picked for {name}{specifiers[name]}")
        pending += applicable(picked[name].requires, extras[name])
    # A package picked again may have needed what no pick left in place needs: keep what the roots reach.
    reached: set[str] = set()
    frontier = [Requirement(root) for root in roots]
    while frontier:
        name = canonicalize_name(frontier.pop().name)
        if name in picked and name not in reached:
            reached.add(name)
            frontier += applicable(picked[name].requires, extras[name])
    return {name: picked[name] for name in sorted(reached)}


def serves(image: Mapping[str, str | None], name: str, specifier: SpecifierSet) -> bool:
    """Whether the image's `name` meets `specifier` (`resolve` says how an unknown version is taken)."""
    if name not in image:
        return False
    have = image[name]
    if have is None:
        return not any(clause.operator in ("<", "<=", "==", "===", "~=") for clause in specifier)
    return specifier.contains(have, prereleases=True)


def applicable(requires: Iterable[str], extras: set[str]) -> list[Requirement]:
    """The requirements of `requires` whose markers hold on the machine with `extras` requested."""
    kept = []
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is None or any(
            requirement.marker.evaluate({**MARKER_ENVIRONMENT, "extra": extra}) for extra in {"", *extras}
        ):
            kept.append(requirement)
    return kept


def roots(repo: Path = REPO) -> list[str]:
    """pacs's core dependencies (pyproject.toml) and TRL's and datasets' pins (benchmarks/requirements-trl.txt)."""
    dependencies = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {}
    for line in (repo / "benchmarks" / "requirements-trl.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            pins[canonicalize_name(Requirement(line).name)] = line
    missing = {"trl", "datasets"} - pins.keys()
    if missing:
        raise ResolutionError(f"benchmarks/requirements-trl.txt pins no {', '.join(sorted(missing))}")
    return [*dependencies, pins["trl"], pins["datasets"]]


class WheelPicker:
    """`resolve`'s `pick`: `pip download` of the newest matching wheel for the machine, into `scratch`."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.wheels: dict[str, Path] = {}

    def __call__(self, name: str, specifier: SpecifierSet) -> Candidate:
        folder = self.scratch / f"{name}-{len(list(self.scratch.iterdir()))}"
        download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *PIP_TARGET]
        done = subprocess.run([*download, "-d", str(folder), f"{name}{specifier}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise ResolutionError(f"pip download {name}{specifier} failed:\n{done.stderr.strip()}")
        (wheel,) = folder.glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            (metadata,) = [
                entry for entry in archive.namelist() if entry.endswith(".dist-info/METADATA") and entry.count("/") == 1
            ]
            headers = HeaderParser().parsestr(archive.read(metadata).decode())
        self.wheels[name] = wheel
        return Candidate(headers["Version"], tuple(headers.get_all("Requires-Dist") or ()))


def commit(repo: Path = REPO) -> str:
    """This checkout's commit, marked when files differ from it (unknown without git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
        changes = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return head + (" with uncommitted changes" if changes.strip() else "")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="gpu-wheels-") as scratch:
        picker = WheelPicker(Path(scratch))
        try:
            chosen = resolve(roots(), picker, IMAGE)
        except ResolutionError as error:
            sys.exit(f"gpu_wheels: {error}")
        sizes = {name: picker.wheels[name].stat().st_size / 2**20 for name in chosen}
        width = max(len(name) for name in chosen)
        print(f"{'package':<{width}}  {'version':<12}    MiB")
        for name, candidate in chosen.items():
            shadows = f"  (shadows the image's {IMAGE[name] or 'unknown version'})" if name in IMAGE else ""
            print(f"{name:<{width}}  {candidate.version:<12}  {sizes[name]:5.2f}{shadows}")
        total = sum(sizes.values())
        print(f"{len(chosen)} wheels: {total:.2f} MiB")
        if total > LIMIT_MIB:
            sys.exit(
                f"gpu_wheels: the wheels take {total:.2f} MiB, more than {LIMIT_MIB:g} MiB: with the repository they would "
                f"pass the 64 MiB a device call carries; nothing written to {WHEELS.name}/. Carry fewer: a package the "
                "image serves needs no wheel (IMAGE)"
            )
        WHEELS.mkdir(exist_ok=True)
        for stale in WHEELS.glob("*.whl"):
            stale.unlink()
        for name in chosen:
            shutil.copy2(picker.wheels[name], WHEELS)
    (WHEELS / "COMMIT").write_text(commit() + "\n")
    print(f"written to {WHEELS.relative_to(REPO)}/, with COMMIT")


if __name__ == "__main__":
    main()

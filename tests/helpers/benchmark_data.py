"""Where the public benchmark files kept in the repository are (see data/benchmarks/README.md), for
the tests that prepare them: a module of its own, since ``from conftest import ...`` finds whichever
conftest.py pytest imported last (tests/gpu and tests/rollout have their own)."""

from __future__ import annotations

from pathlib import Path

BENCHMARK_DATA = Path(__file__).resolve().parents[2] / "data" / "benchmarks"

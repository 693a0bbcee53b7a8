"""Hub ids that the hub cannot serve fail fast; cached hub models load without the network.

The loads run in a subprocess because huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and
HF_HUB_OFFLINE when it is imported: one subprocess per hub setting, loading every id its tests
ask about (each process pays seconds of imports). HF_ENDPOINT points at a closed local port (or a
tiny local server), so nothing here depends on the real hub.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from pacs.models import loading

CLOSED_PORT_ENDPOINT = "http://127.0.0.1:9"
MISSING = "nobody-here/no-such-model"
GATED = "nobody-here/gated-model"
CACHED = "pacs-test/tiny"

LOAD_AND_REPORT = """
import json, sys, time
from pacs.models.loading import load_causal_lm, load_tokenizer
for model_id in sys.argv[1:]:
    start = time.monotonic()
    try:
        tokenizer = load_tokenizer(model_id)
        model = load_causal_lm(model_id)
    except FileNotFoundError as error:
        report = f"ERROR after {time.monotonic() - start:.2f} s: {error}"
    else:
        report = f"LOADED {type(model).__name__} vocab={len(tokenizer)} after {time.monotonic() - start:.2f} s"
    print(json.dumps([model_id, report]))
"""


def _load_in_subprocess(model_ids: list[str], hub_cache: Path, *, endpoint: str, offline: bool = False) -> dict[str, str]:
    """model id -> what loading it reported, each load timed by the child around the load call
    alone, not its start-up; the ids are loaded one after the other in one process."""
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(hub_cache), HF_HOME=str(hub_cache.parent / "hf-home"))
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", LOAD_AND_REPORT, *model_ids], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return dict(json.loads(line) for line in result.stdout.splitlines() if line.startswith("["))


@pytest.fixture(scope="module", params=[False, True], ids=["closed-port", "HF_HUB_OFFLINE"])
def unreachable_hub_reports(request, tmp_path_factory, tiny_model_dir: Path) -> tuple[bool, dict[str, str]]:
    """(offline, model id -> report) with the hub unreachable (a closed port, or HF_HUB_OFFLINE):
    an id that is not in the local hub cache, then one that is."""
    hub_cache = tmp_path_factory.mktemp("unreachable") / "hub"
    # The hub cache layout: models--ORG--NAME/refs/main holds a commit hash, whose files lie in
    # models--ORG--NAME/snapshots/HASH/ (as `hf download` leaves them).
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_cache = hub_cache / "models--pacs-test--tiny"
    shutil.copytree(tiny_model_dir, repo_cache / "snapshots" / commit)
    (repo_cache / "refs").mkdir()
    (repo_cache / "refs" / "main").write_text(commit)
    return request.param, _load_in_subprocess([MISSING, CACHED], hub_cache, endpoint=CLOSED_PORT_ENDPOINT, offline=request.param)


@pytest.mark.slow
def test_unreachable_hub_id_not_in_cache_fails_fast_with_advice(unreachable_hub_reports) -> None:
    offline, reports = unreachable_hub_reports
    output = reports[MISSING]
    assert output.startswith("ERROR after"), output
    assert float(output.split()[2]) < 2.0, output  # the load call itself, without imports
    for expected in (
        f"'{MISSING}'",
        "Could not reach the Hugging Face Hub",
        "not in the local hub cache",
        f"hf download {MISSING}",
        "local model directory",
        "builtin:tiny",
    ):
        assert expected in output
    assert ("HF_HUB_OFFLINE" if offline else "Connection refused") in output


@pytest.mark.slow
def test_hub_model_in_local_cache_loads_when_hub_is_unreachable(unreachable_hub_reports) -> None:
    _, reports = unreachable_hub_reports
    assert reports[CACHED].startswith("LOADED Qwen2ForCausalLM vocab=101"), reports[CACHED]


class _HubAnswering(BaseHTTPRequestHandler):
    """Answers every request as the hub does for a missing repo, or a gated one when the
    request's path names the gated id."""

    def do_HEAD(self) -> None:
        gated = GATED in self.path
        self.send_response(401 if gated else 404)
        self.send_header("X-Error-Code", "GatedRepo" if gated else "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def reachable_hub_reports(tmp_path_factory) -> Iterator[tuple[str, dict[str, str]]]:
    """(endpoint, model id -> report) from a local server that answers as the hub does for a
    missing repo and for a gated one."""
    server = HTTPServer(("127.0.0.1", 0), _HubAnswering)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    try:
        yield endpoint, _load_in_subprocess([MISSING, GATED], tmp_path_factory.mktemp("reachable") / "hub", endpoint=endpoint)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("model_id", "expected"), [(MISSING, "is not a model on"), (GATED, "is a gated repo on")], ids=["missing", "gated"]
)
@pytest.mark.slow
def test_reachable_hub_that_lacks_the_repo_says_so(reachable_hub_reports, model_id: str, expected: str) -> None:
    endpoint, reports = reachable_hub_reports
    output = reports[model_id]
    assert output.startswith("ERROR after"), output
    assert f"'{model_id}' {expected} {endpoint}" in output
    assert "hf auth login" in output


def test_hub_check_that_hangs_counts_as_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "HUB_CHECK_TIMEOUT_S", 0.1)
    monkeypatch.setattr(loading, "is_offline_mode", lambda: False)
    monkeypatch.setattr(loading, "get_hf_file_metadata", lambda url, timeout: time.sleep(5))
    start = time.monotonic()
    reason = loading._hub_unreachable_reason("org/model")
    assert time.monotonic() - start < 2
    assert reason is not None and "no answer from" in reason


def test_a_critic_from_a_causal_lm_says_once_in_plain_words_that_its_value_head_is_new(tiny_model_dir, capfd) -> None:
    loading.load_value_model(str(tiny_model_dir))
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "\x1b[" not in err
    assert err.count("value head (score.bias, score.weight) is new, randomly initialised, as expected") == 1

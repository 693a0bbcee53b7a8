"""Hub ids that the hub cannot serve fail fast; cached hub models load without the network.

Each case runs in a subprocess because huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and
HF_HUB_OFFLINE when it is imported. HF_ENDPOINT points at a closed local port (or a tiny local
server), so nothing here depends on the real hub.
"""

from __future__ import annotations

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

LOAD_AND_REPORT = """
import sys, time
from pacs.models.loading import load_causal_lm, load_tokenizer
start = time.monotonic()
try:
    tokenizer = load_tokenizer(sys.argv[1])
    model = load_causal_lm(sys.argv[1])
except FileNotFoundError as error:
    print(f"ERROR after {time.monotonic() - start:.2f} s: {error}")
else:
    print(f"LOADED {type(model).__name__} vocab={len(tokenizer)} after {time.monotonic() - start:.2f} s")
"""


def _load_in_subprocess(model_id: str, hub_cache: Path, *, endpoint: str, offline: bool = False) -> str:
    env = {key: value for key, value in os.environ.items() if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(hub_cache), HF_HOME=str(hub_cache.parent / "hf-home"))
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", LOAD_AND_REPORT, model_id], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout  # timed by the child around the load call alone, not its start-up


@pytest.mark.parametrize("offline", [False, True], ids=["closed-port", "HF_HUB_OFFLINE"])
def test_unreachable_hub_id_not_in_cache_fails_fast_with_advice(tmp_path: Path, offline: bool) -> None:
    output = _load_in_subprocess(
        "nobody-here/no-such-model", tmp_path / "hub", endpoint=CLOSED_PORT_ENDPOINT, offline=offline
    )
    assert output.startswith("ERROR after"), output
    assert float(output.split()[2]) < 2.0, output  # the load call itself, without imports
    for expected in (
        "'nobody-here/no-such-model'",
        "Could not reach the Hugging Face Hub",
        "not in the local hub cache",
        "hf download nobody-here/no-such-model",
        "local model directory",
        "builtin:tiny",
    ):
        assert expected in output
    assert ("HF_HUB_OFFLINE" if offline else "Connection refused") in output


@pytest.mark.parametrize("offline", [False, True], ids=["closed-port", "HF_HUB_OFFLINE"])
def test_hub_model_in_local_cache_loads_when_hub_is_unreachable(
    tmp_path: Path, tiny_model_dir: Path, offline: bool
) -> None:
    # The hub cache layout: models--ORG--NAME/refs/main holds a commit hash, whose files lie in
    # models--ORG--NAME/snapshots/HASH/ (as `hf download` leaves them).
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_cache = tmp_path / "hub" / "models--pacs-test--tiny"
    shutil.copytree(tiny_model_dir, repo_cache / "snapshots" / commit)
    (repo_cache / "refs").mkdir()
    (repo_cache / "refs" / "main").write_text(commit)
    output = _load_in_subprocess("pacs-test/tiny", tmp_path / "hub", endpoint=CLOSED_PORT_ENDPOINT, offline=offline)
    assert output.startswith("LOADED Qwen2ForCausalLM vocab=101"), output


class _HubAnswering(BaseHTTPRequestHandler):
    """Answers every request as the hub does for a missing (or gated) repo."""

    error_code = "RepoNotFound"

    def do_HEAD(self) -> None:  # noqa: N802 - the http.server API
        self.send_response(404 if self.error_code == "RepoNotFound" else 401)
        self.send_header("X-Error-Code", self.error_code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD  # noqa: N815

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - silence the request log
        pass


@pytest.fixture
def fake_hub() -> Iterator[tuple[str, type[_HubAnswering]]]:
    handler = type("Handler", (_HubAnswering,), {})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("error_code", "expected"),
    [("RepoNotFound", "is not a model on"), ("GatedRepo", "is a gated repo on")],
)
def test_reachable_hub_that_lacks_the_repo_says_so(
    tmp_path: Path, fake_hub: tuple[str, type[_HubAnswering]], error_code: str, expected: str
) -> None:
    endpoint, handler = fake_hub
    handler.error_code = error_code
    output = _load_in_subprocess("nobody-here/no-such-model", tmp_path / "hub", endpoint=endpoint)
    assert output.startswith("ERROR after"), output
    assert f"'nobody-here/no-such-model' {expected} {endpoint}" in output
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

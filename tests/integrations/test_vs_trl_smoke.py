"""benchmarks/vs_trl.py's GPU work (`--device cuda`) runs as `--smoke` on a CPU: the same code on a
tiny shape, TRL in its venv (tests/helpers/peer_checks.py), pacs's runs as `pacs train`; and the
pieces its figures rest on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peer_checks import REPOSITORY
from peer_venvs import PEER_VENVS, PeerVenvError, peer
from vs_trl import SHAPES, SMOKE_RUNS, SMOKE_WORK, end_token_bias, parity_score, summarise, synthetic_tokenizer  # benchmarks/

SMOKE_WORK_VOCAB = SHAPES["smoke"]["vocab_size"]


@pytest.mark.slow
def test_the_smoke_run_trains_every_run_and_prints_its_figures():
    try:
        trl_python = peer("trl")
    except PeerVenvError as error:
        pytest.fail(f"the TRL venv {PEER_VENVS / 'trl'} could not be built (it needs the package index):\n{error}")
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    command = [sys.executable, str(REPOSITORY / "benchmarks" / "vs_trl.py"), "--smoke", "--trl-python", str(trl_python)]
    done = subprocess.run(command, capture_output=True, text=True, env=environment, cwd=REPOSITORY, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if line.count("│") > 5}
    for run in SMOKE_RUNS:
        cells = [cell.strip() for cell in rows[run.name].split("│")[2:8]]
        assert all(float(cell) >= 0 for cell in cells), rows[run.name]
        assert float(cells[0]) > 0 and float(cells[4]) > 0, "a step takes time and trains on tokens"


def test_the_end_token_bias_makes_the_end_token_as_likely_as_asked():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True))  # fmt: skip
    probe = torch.randint(510, (4, 32))
    end_token_bias(model, 511, 1 / 16, probe)
    with torch.no_grad():
        fresh = torch.softmax(model(input_ids=torch.randint(510, (8, 32))).logits, dim=-1)[..., 511]
    assert fresh.mean() == pytest.approx(1 / 16, rel=0.25), "on contexts it was not calibrated on"
    assert fresh.max() < 3 / 16, "about the same at every position: lengths near-geometric"


def test_the_synthetic_tokenizer_has_the_vocabulary_size_and_loads_as_qwen2s(tmp_path):
    from transformers import AutoTokenizer, Qwen2Config

    synthetic_tokenizer(SMOKE_WORK_VOCAB).save_pretrained(tmp_path)
    Qwen2Config(vocab_size=SMOKE_WORK_VOCAB).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == SMOKE_WORK_VOCAB and tokenizer.eos_token_id == SMOKE_WORK_VOCAB - 1
    assert len(tokenizer("abcdefgh")["input_ids"]) == 8, "a letter is a token"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "abc"}], add_generation_prompt=True, tokenize=False)
    assert rendered == "abc"


def test_a_runs_figures_leave_its_first_step_out():
    steps = [{"step_s": 9.0, "generate_s": 8.0, "update_s": 1.0, "tokens": 10, "response_length": 1.0, "mfu": 0.1}]
    steps += [{"step_s": 2.0, "generate_s": 1.0, "update_s": 0.5, "tokens": 100, "response_length": 4.0, "mfu": 0.2}] * 2
    figures = summarise(steps, parameters=1000, peak_flops=1e6)
    assert figures["step_s"] == 2.0 and figures["tokens_per_s"] == 50.0 and figures["response_length"] == 4.0
    assert figures["update_mfu"] == pytest.approx(6 * 1000 * 100 / (0.5 * 1e6))


def test_the_reward_needs_no_answer():
    assert parity_score("vs_trl", "ab", "even") == 1.0 and parity_score("vs_trl", "abc", "even") == 0.0


def test_the_smoke_work_is_small_and_its_runs_cover_every_setting():
    assert SMOKE_WORK.device == "cpu" and SMOKE_WORK.max_length <= 16
    assert {run.framework for run in SMOKE_RUNS} == {"trl", "pacs"}
    pacs = [run for run in SMOKE_RUNS if run.framework == "pacs"]
    assert {run.backend for run in pacs} == {"generate", "continuous"} and {run.staleness for run in pacs} == {0, 1}
    assert {run.padding_free for run in pacs} == {False, True} and {run.algorithm for run in pacs} == {"grpo", "pacs"}


def test_a_failed_run_is_reported_and_the_later_runs_still_run_and_are_kept(tmp_path, monkeypatch, capsys):
    """On a lent GPU the benchmark may be stopped at its time limit, and a peer's run may fail: each
    finished run's figures are in results.json at once, and one failure does not end the others."""
    import vs_trl

    ran = []

    def pacs_run(work, run, model_dir, rows_path, output_dir, log_path, peak_flops):
        ran.append(run.name)
        log_path.write_text("trained\n")
        step = {"step_s": 2.0, "generate_s": 1.0, "update_s": 0.5, "tokens": 100, "response_length": 4.0, "mfu": 0.1}
        return [step] * work.steps

    def trl_run(work, run, model_dir, rows_path, work_dir, log_path, trl_python):
        ran.append(run.name)
        log_path.write_text("Traceback: no GPU\n")
        raise vs_trl.RunFailed(f"{run.name} exited with 1; the end of its output:\nTraceback: no GPU")

    monkeypatch.setattr(vs_trl, "pacs_synthetic_run", pacs_run)
    monkeypatch.setattr(vs_trl, "trl_synthetic_run", trl_run)
    runs = SMOKE_RUNS[:2]  # TRL paged, then pacs grpo with generate
    succeeded = vs_trl.synthetic_main([SMOKE_WORK], Path(sys.executable), None, runs, tmp_path / "out")
    assert not succeeded and ran == [run.name for run in runs]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    trl, pacs = results["shapes"][SMOKE_WORK.shape]["runs"]
    assert "Traceback: no GPU" in trl["failed"] and (tmp_path / "out" / trl["log"]).read_text() == "Traceback: no GPU\n"
    assert pacs["figures"]["step_s"] == 2.0 and (tmp_path / "out" / pacs["log"]).is_file()
    assert f"{runs[0].name} (smoke) FAILED" in capsys.readouterr().out


def test_runs_are_chosen_by_their_numbers_in_the_tables_order_and_a_wrong_number_is_refused(capsys):
    import argparse

    import vs_trl

    parser = argparse.ArgumentParser(prog="vs_trl.py")
    assert vs_trl.chosen_runs("6,4", parser) == (vs_trl.RUNS[4], vs_trl.RUNS[6])
    assert vs_trl.chosen_runs(None, parser) == vs_trl.RUNS
    with pytest.raises(SystemExit):
        vs_trl.chosen_runs("7", parser)
    assert "--runs: [7] are not run numbers; valid: 0: TRL GRPOTrainer, generate;" in capsys.readouterr().err

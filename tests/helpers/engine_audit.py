"""`pacs` under the collective audit (`collective_audit.py`) with every vLLM engine recorded: what
each rank's `vllm.LLM` was built with and everything pacs then asks of it, one JSON line per event
in `$PACS_TEST_ENGINE_RECORD/rank<RANK>.jsonl`.

    PACS_TEST_ENGINE_RECORD=DIR OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 tests/helpers/engine_audit.py train ARGS...

Events: `start` (the options that decide placement and weights, RANK and LOCAL_RANK as vLLM read
them, the executor vLLM chose, the ranks of its tensor-parallel group, the current CUDA device
after it started), `generate` (digests of the
prompts and of the sampled tokens, and whether log-probs were asked for: training's rollouts ask,
validation's do not), `sleep` (level), `wake_up` (tags) and `reload_weights`. vLLM runs for real:
the recorder only wraps its methods.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from pathlib import Path

import collective_audit
import torch

RECORDED_OPTIONS = (
    "distributed_executor_backend",
    "tensor_parallel_size",
    "load_format",
    "enforce_eager",
    "enable_sleep_mode",
    "max_num_seqs",
    "seed",
    "logprobs_mode",
)


def record(event: dict) -> None:
    path = Path(os.environ["PACS_TEST_ENGINE_RECORD"]) / f"rank{os.environ.get('RANK', '0')}.jsonl"
    with path.open("a") as file:
        file.write(json.dumps(event) + "\n")


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def recorded(name: str, method, describe):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        record({"event": name, **describe(self, result, *args, **kwargs)})
        return result

    return wrapper


def started(llm, result, **options) -> dict:
    from vllm.distributed import parallel_state

    return {
        "options": {key: options.get(key) for key in RECORDED_OPTIONS},
        "env": {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK")},
        "executor": type(llm.llm_engine.engine_core.engine_core.model_executor).__name__,
        "tensor_parallel_ranks": parallel_state.get_tp_group().ranks,
        "current_device": torch.cuda.current_device() if torch.cuda.is_available() else None,
    }


def generated(llm, outputs, requests, sampling_params, **_) -> dict:
    return {
        "prompts": digest([request["prompt_token_ids"] for request in requests]),
        "tokens": digest([[list(sample.token_ids) for sample in output.outputs] for output in outputs]),
        "logprobs": sampling_params.logprobs is not None,
    }


def install() -> None:
    import vllm

    llm = vllm.LLM
    llm.__init__ = recorded("start", llm.__init__, started)
    llm.generate = recorded("generate", llm.generate, generated)
    llm.sleep = recorded("sleep", llm.sleep, lambda self, result, level=1, **_: {"level": level})
    llm.wake_up = recorded("wake_up", llm.wake_up, lambda self, result, tags=None: {"tags": tags})
    llm.collective_rpc = recorded(
        "rpc",
        llm.collective_rpc,
        lambda self, result, method, *args, **kwargs: {"method": method if isinstance(method, str) else "?"},
    )


def read_record(directory: Path, rank: int) -> list[dict]:
    """The events of `rank`'s engines, in order."""
    return [json.loads(line) for line in (directory / f"rank{rank}.jsonl").read_text().splitlines()]


if __name__ == "__main__":
    install()
    collective_audit.main(sys.argv[1:])

"""Evaluation: n samples per problem, scored by the verifier, pass@k per data source.

Problems. Prepared files may repeat each problem R times (`pacs prepare --repeat R`): the copies
are merged (`merge_repeats`) and generated once with n·R samples, so pass@k reaches k = n·R
without generating any prompt twice. A row without `extra_info.index` or `extra_info.repeat`
(missing or null) is a problem of its own and is never merged.

Generation cap. Every prompt gets its own cap, max_new_tokens = min(max_tokens, context_length −
prompt length), so one long prompt never shortens the answers to the others. The rollout engine
takes one cap per call, so problems are generated in groups of one data source and one cap.

Prompts too long. A prompt that leaves no room to generate (prompt length >= context length) is
left out: it is excluded from pass@k, which averages over the problems generated, and counted per
data source as `prompts_dropped_too_long` (a repeated problem counts once). A data source whose
prompts were all too long is still reported, with 0 problems and pass@k null.

Tools. With `tools` (`pacs.rollout.multiturn.tool_settings`: `pacs eval --tools`, or the settings
of the run whose checkpoint is evaluated), responses are generated as training generates them with
`rollout.tools` (`with_tools`, docs/tools.md), and each data source reports its tool use.

Several processes. Under torchrun, `evaluate_model` splits the problems across the processes
(`evaluate`'s `problem_share`: process k of K takes problems k, k + K, ...), each generating all
the samples of its problems; rank 0 merges the results (`EvalResult.merge`) and writes them, its
processes' records one after the other. Process k seeds its sampling with `seed` (k = 0, as one
process does) or `rank_seed(seed, k)`, so a fixed seed and process count give the same
result run after run; another process count samples differently (pass@k within sampling noise).

`eval_metrics.json` (written by `evaluate_model`):

    {"settings": {"model_path", "specs", "n", "temperature", "top_p", "max_tokens", "seed",
                  "dtype", "reward_function", "reward_timeout_s", "reward_workers", "engine",
                  "tools": {rollout.tools, max_turns, tool_* settings} | null},
     "data_sources": {data_source: {
         "problems": int,                  problems generated and scored
         "samples_per_problem": int,       n · copies per problem
         "prompts_dropped_too_long": int,
         "timeouts": int, "crashes": int,  samples whose scoring timed out or crashed (scored 0)
         "max_new_tokens": {"requested": int, "min": int | null, "max": int | null,
                            "prompts_below_requested": int},
         "pass@k": {"pass@1": float, "pass@2": float, ..., "pass@N": float} | null,
         "tools": {"tool_calls_mean": float, "tool_errors_fraction": float, "turns_mean": float},
                                           with tools only: per sample, as training's rollout/ metrics
         "problem_indices": [int, ...],    position of each generated problem among the problems
         "correct_counts": [int, ...]}}}   correct samples of each (what `pacs compare` pairs)
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
import yaml
from pydantic import ValidationError
from transformers import AutoConfig, PreTrainedTokenizerBase

from pacs import EVAL_SAMPLING
from pacs.config import RolloutConfig, VllmConfig
from pacs.data.loading import load_rows, row_location
from pacs.data.prompts import encode_prompts
from pacs.distributed.collectives import gather_objects_on_rank0, run_on_every_rank, run_on_rank0
from pacs.distributed.world import World
from pacs.eval.passk import mean_pass_at_k
from pacs.models.loading import check_model_reachable, load_causal_lm, load_tokenizer, resolve_model_path
from pacs.outputs import DiskFull, claim_output_dir, disk_faults, replace_file, unusable_inputs
from pacs.plugins import import_function
from pacs.progress import progress_bar
from pacs.rewards import ScoringPool, load_reward_function
from pacs.rewards.checks import check_scoring
from pacs.rewards.pool import ScoringWatch
from pacs.rollout.base import RolloutEngine, SamplingParams, rank_seed
from pacs.rollout.continuous_batching import continuous_batching_on
from pacs.rollout.hf import TransformersEngine
from pacs.rollout.multiturn import TOOL_SETTINGS, ToolCallingEngine, ToolStats, tool_format_of, tool_metrics, with_tools
from pacs.rollout.tools import PYTHON_TOOL
from pacs.rollout.vllm import EnginePlace, VllmEngine, check_vllm_usable, local_model_dir
from pacs.sandbox import check_sandbox

SAME_INPUTS_EVERYWHERE = (
    "Every process runs the same pacs eval command and reads --model and --data from its own disk, at the same paths "
    "(a relative path from its own working directory): put what a node lacks there. Only rank 0 writes --out."
)
MERGE_RULE = (
    "only the copies that `pacs prepare --repeat R` writes share (data_source, extra_info.index): the same "
    "prompt and ground truth, numbered extra_info.repeat = 0..R-1 once each. Prepare each benchmark with "
    "its own --source, the shards of one benchmark as one file, and give each file once"
)


TOOL_USE_COLUMNS = ("tool_calls_mean", "tool_errors_fraction", "turns_mean")
"""`SourceReport.tool_use`'s metrics, in the order `EvalResult.table` shows them."""


@dataclass(frozen=True)
class EvalSettings:
    """Everything `evaluate_model` takes that decides its results; stored in `eval_metrics.json`."""

    model_path: str
    specs: list[str]
    n: int
    temperature: float
    top_p: float
    max_tokens: int
    seed: int
    dtype: str
    reward_function: str | None
    reward_timeout_s: float
    reward_workers: int
    engine: str = "hf"
    continuous_batching: Literal["auto"] | bool = "auto"
    """`rollout.hf.continuous_batching`'s choice for the hf engine: "auto", true or false."""
    tools: dict | None = None


@dataclass
class SourceReport:
    """The evaluation of one data source. Counts are of problems (a repeated problem once), except
    `timeouts` and `crashes`, which count scored samples."""

    samples_per_problem: int
    requested_max_new_tokens: int
    prompts_dropped_too_long: int = 0
    correct_counts: list[int] = field(default_factory=list)
    """Correct samples of each generated problem."""
    problem_indices: list[int] = field(default_factory=list)
    """Position of each generated problem among the evaluated problems (repeats merged), so that
    two evaluations of the same data pair their problems."""
    generation_caps: list[int] = field(default_factory=list)
    """max_new_tokens of each generated problem."""
    timeouts: int = 0
    crashes: int = 0
    tool_stats: ToolStats | None = None
    """With tools: the tool use of every generated sample."""

    @property
    def pass_at_k(self) -> dict[str, float] | None:
        """{"pass@k": mean over the generated problems}, or None when none was generated."""
        return mean_pass_at_k(self.correct_counts, self.samples_per_problem) if self.correct_counts else None

    @property
    def tool_use(self) -> dict[str, float] | None:
        """With tools: tool calls per sample, the fraction of calls that failed and turns per
        sample (`tool_metrics`, without its "rollout/" prefix); None without tools."""
        if self.tool_stats is None:
            return None
        return {
            name.removeprefix("rollout/"): value for name, value in tool_metrics(self.tool_stats, lambda totals: totals).items()
        }

    def summary(self) -> dict:
        """This data source's entry of `eval_metrics.json` (layout in the module docstring)."""
        caps = self.generation_caps
        return {
            "problems": len(self.correct_counts),
            "samples_per_problem": self.samples_per_problem,
            "prompts_dropped_too_long": self.prompts_dropped_too_long,
            "timeouts": self.timeouts,
            "crashes": self.crashes,
            "max_new_tokens": {
                "requested": self.requested_max_new_tokens,
                "min": min(caps, default=None),
                "max": max(caps, default=None),
                "prompts_below_requested": sum(cap < self.requested_max_new_tokens for cap in caps),
            },
            "pass@k": self.pass_at_k,
            **({"tools": self.tool_use} if self.tool_use is not None else {}),
            "problem_indices": self.problem_indices,
            "correct_counts": self.correct_counts,
        }


@dataclass
class EvalResult:
    """records: one dict per sample, in problem order; sources: every data source evaluated."""

    records: list[dict]
    sources: dict[str, SourceReport]

    @classmethod
    def merge(cls, shares: list[EvalResult]) -> EvalResult:
        """One result from the results of disjoint shares of the problems (`evaluate`'s
        `problem_share`): records in share order, each data source's problems and counts joined."""
        sources: dict[str, SourceReport] = {}
        for share in shares:
            for source, report in share.sources.items():
                merged = sources.setdefault(source, SourceReport(report.samples_per_problem, report.requested_max_new_tokens))
                merged.prompts_dropped_too_long += report.prompts_dropped_too_long
                merged.correct_counts += report.correct_counts
                merged.problem_indices += report.problem_indices
                merged.generation_caps += report.generation_caps
                merged.timeouts += report.timeouts
                merged.crashes += report.crashes
                if report.tool_stats is not None:
                    merged.tool_stats = (merged.tool_stats or ToolStats()) + report.tool_stats
        return cls([record for share in shares for record in share.records], sources)

    def without_records(self) -> EvalResult:
        """The same counts without the per-sample records (cheap to send between processes)."""
        return EvalResult([], self.sources)

    @property
    def metrics(self) -> dict[str, dict[str, float]]:
        """{data_source: {"pass@k": value}} for every data source with at least one problem generated."""
        return {source: by_k for source, report in self.sources.items() if (by_k := report.pass_at_k) is not None}

    @property
    def timed_out(self) -> int:
        """Samples, over all data sources, whose scoring timed out."""
        return sum(report.timeouts for report in self.sources.values())

    def warnings(self) -> list[str]:
        """One line per data source with prompts left out or samples that timed out or crashed."""
        lines = []
        for source, report in self.sources.items():
            if report.prompts_dropped_too_long:
                total = report.prompts_dropped_too_long + len(report.correct_counts)
                lines.append(
                    f"{source}: {report.prompts_dropped_too_long} of {total} prompts leave no room to generate "
                    "within the model's context and are left out of pass@k"
                )
            if report.timeouts or report.crashes:
                lines.append(
                    f"{source}: {report.timeouts} samples timed out and {report.crashes} crashed while scoring (scored 0)"
                )
        return lines

    def table(self) -> str:
        """A short, aligned table for a person: one line per data source with its problems,
        samples per problem, pass@k in percent (every k any source reports; "-" where a source has
        fewer samples), the samples whose scoring timed out or crashed and, with tools, the tool
        calls per sample, the fraction that failed and the turns per sample. `eval_metrics.json`
        keeps everything, per problem."""
        ks = sorted({int(key.split("@")[1]) for metrics in self.metrics.values() for key in metrics})
        shows_tools = any(report.tool_stats is not None for report in self.sources.values())
        tool_header = ["tool calls", "tool errors", "turns"] if shows_tools else []
        header = ["data source", "problems", "samples", *(f"pass@{k}" for k in ks), "timeouts", "crashes", *tool_header]
        lines = [header]
        for source, report in self.sources.items():
            by_k = report.pass_at_k or {}
            cells = [f"{100 * by_k[f'pass@{k}']:.1f}" if f"pass@{k}" in by_k else "-" for k in ks]
            counts = [len(report.correct_counts), report.samples_per_problem]
            tool_use = report.tool_use or {}
            tool_cells = (
                [f"{tool_use[name]:.2f}" if name in tool_use else "-" for name in TOOL_USE_COLUMNS] if shows_tools else []
            )
            lines.append([source, *map(str, counts), *cells, str(report.timeouts), str(report.crashes), *tool_cells])
        widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
        return "\n".join(
            "  ".join(
                cell.ljust(width) if column == 0 else cell.rjust(width) for column, (cell, width) in enumerate(zip(line, widths))
            )
            for line in lines
        )

    def write(self, out_dir: Path, settings: EvalSettings) -> None:
        """`eval_rollout.jsonl` (every sample with its score) and `eval_metrics.json`, each whole
        (`replace_file`) or not at all: a full disk or spent quota (`DiskFull`, one line naming the
        folder, the file, its size and the free space) leaves neither, so the same command runs
        again into the folder without --overwrite."""
        metrics = {
            "settings": asdict(settings),
            "data_sources": {source: report.summary() for source, report in self.sources.items()},
        }
        files = {
            "eval_rollout.jsonl": "".join(json.dumps(record) + "\n" for record in self.records),
            "eval_metrics.json": json.dumps(metrics, indent=2) + "\n",
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        try:
            for name, text in files.items():
                with disk_faults(out_dir, name, len(text.encode())):
                    replace_file(out_dir / name, text)
        except DiskFull:
            for name in files:
                (out_dir / name).unlink(missing_ok=True)
            raise


def _copy_key(row: dict) -> tuple[str, int] | None:
    """(data_source, extra_info.index) of a row that `pacs prepare` numbered as a copy, else None."""
    extra_info = row.get("extra_info") or {}
    if extra_info.get("index") is None or extra_info.get("repeat") is None:
        return None
    return row["data_source"], extra_info["index"]


def _check_copies(rows: list[dict], positions: list[int], locations: list[str]) -> None:
    """Raise ValueError, naming the rows, unless `rows[positions]` are copies 0..R-1 of one problem."""
    first = rows[positions[0]]
    where = f"data_source {first['data_source']!r}, extra_info.index {first['extra_info']['index']}"
    for position in positions[1:]:
        row = rows[position]
        if row["prompt"] != first["prompt"] or row["reward_model"]["ground_truth"] != first["reward_model"]["ground_truth"]:
            differing = "prompts" if row["prompt"] != first["prompt"] else "ground truths"
            raise ValueError(
                f"{locations[positions[0]]} and {locations[position]} share {where} but their {differing} differ: "
                f"they are different problems, not copies of one; {MERGE_RULE}"
            )
    numbers = sorted(rows[position]["extra_info"]["repeat"] for position in positions)
    if numbers != list(range(len(positions))):
        rows_text = ", ".join(locations[position] for position in positions)
        raise ValueError(
            f"the copies of {where} ({rows_text}) are numbered extra_info.repeat = {numbers}, "
            f"not 0..{len(positions) - 1} once each (is a file given twice?); {MERGE_RULE}"
        )


def merge_repeats(rows: list[dict], locations: list[str] | None = None) -> list[tuple[dict, int]]:
    """(first row, number of copies) per distinct problem, in order of first appearance.

    Rows whose `extra_info` holds both `index` and `repeat` are copies of one problem when they
    share `data_source` and `index`; they must then ask the same prompt with the same ground
    truth and number their `repeat` 0..R-1 (`_check_copies`). Any other row is its own problem.
    Every problem of one data source must have the same number of copies. `locations[i]` names
    row i in errors (default "row i"), e.g. "data/aime.jsonl: line 7" (`row_location`).
    """
    locations = locations or [f"row {position}" for position in range(len(rows))]
    problems: list[list[int]] = []
    copies_of: dict[tuple[str, int], list[int]] = {}
    for position, row in enumerate(rows):
        key = _copy_key(row)
        if key is None:
            problems.append([position])
        elif key in copies_of:
            copies_of[key].append(position)
        else:
            copies_of[key] = [position]
            problems.append(copies_of[key])
    for positions in copies_of.values():
        _check_copies(rows, positions, locations)
    first_row_with: dict[str, dict[int, int]] = defaultdict(dict)
    """data_source -> number of copies -> position of the first problem with that many."""
    for positions in problems:
        first_row_with[rows[positions[0]]["data_source"]].setdefault(len(positions), positions[0])
    for source, by_copies in first_row_with.items():
        if len(by_copies) > 1:
            examples = "; ".join(f"{locations[position]} has {count}" for count, position in sorted(by_copies.items()))
            raise ValueError(
                f"data_source {source!r} repeats its problems unevenly (copies per problem: {examples}); "
                "prepare every file of one data_source with the same --repeat"
            )
    return [(rows[positions[0]], len(positions)) for positions in problems]


def evaluate(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict],
    params: SamplingParams,
    scorer: ScoringPool,
    *,
    row_locations: list[str] | None = None,
    context_length: int | None = None,
    sequences_per_call: int = 512,
    problem_share: tuple[int, int] = (0, 1),
    show_progress: bool = True,
    scoring_watch: ScoringWatch | None = None,
) -> EvalResult:
    """Sample `params.n` responses per copy of every problem, score them, compute pass@k.

    `problem_share=(k, K)` evaluates only problems k, k + K, k + 2K, … (a problem with all its
    copies), for K processes that split the work; `EvalResult.merge` joins their results.

    With `context_length` (the model's), each prompt is generated with max_new_tokens =
    min(params.max_new_tokens, context_length − its length), and prompts that leave no room are
    left out and counted (module docstring). A sample counts as correct when its score is 1.
    `row_locations[i]` names row i in errors (see `merge_repeats`). `scoring_watch` observes
    every batch of generated prompts: a batch whose answers mostly got no score is warned about
    on stderr, and enough of them in a row stop the evaluation (`ScoringWatch`).
    """
    if params.n < 1 or params.max_new_tokens < 1:
        raise ValueError(f"SamplingParams n={params.n} and max_new_tokens={params.max_new_tokens} must both be integers >= 1")
    problems = merge_repeats(rows, row_locations)
    token_ids = encode_prompts(tokenizer, [row for row, _ in problems], None).token_ids
    sources: dict[str, SourceReport] = {}
    cap_of: dict[int, int] = {}
    """problem -> its max_new_tokens, for every problem that fits the context."""
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    share_index, share_count = problem_share
    for problem, ((row, copies), ids) in enumerate(zip(problems, token_ids)):
        report = sources.setdefault(row["data_source"], SourceReport(params.n * copies, params.max_new_tokens))
        if problem % share_count != share_index:
            continue
        room = params.max_new_tokens if context_length is None else context_length - len(ids)
        if room < 1:
            report.prompts_dropped_too_long += 1
            continue
        cap_of[problem] = min(params.max_new_tokens, room)
        groups[(row["data_source"], cap_of[problem])].append(problem)
    samples_of: dict[int, list[tuple[str, float]]] = {}
    """problem -> (response, score) of each of its samples."""
    progress = progress_bar(total=len(cap_of), desc="evaluating", unit="prompt", disable=not show_progress)
    for (source, cap), members in groups.items():
        report = sources[source]
        samples = report.samples_per_problem
        prompts_per_call = max(1, sequences_per_call // samples)
        for start in range(0, len(members), prompts_per_call):
            chunk = members[start : start + prompts_per_call]
            rollouts = engine.generate([token_ids[problem] for problem in chunk], replace(params, n=samples, max_new_tokens=cap))
            batch = scorer.score([problems[problem][0] for problem in chunk for _ in range(samples)], rollouts.scored_texts)
            report.timeouts += batch.timed_out
            report.crashes += batch.crashed
            if isinstance(engine, ToolCallingEngine):
                report.tool_stats = (report.tool_stats or ToolStats()) + engine.last_stats
            if scoring_watch is not None:
                label = f"{source} problems {start + 1}-{start + len(chunk)} of {len(members)}"
                if warning := scoring_watch.observe(label, batch.timed_out, batch.crashed, len(batch.scores)):
                    progress.write(warning, file=sys.stderr)
            for offset, problem in enumerate(chunk):
                span = slice(offset * samples, (offset + 1) * samples)
                samples_of[problem] = list(zip(rollouts.response_texts[span], batch.scores[span]))
            progress.update(len(chunk))
    progress.close()
    records: list[dict] = []
    for problem in sorted(samples_of):
        row = problems[problem][0]
        report = sources[row["data_source"]]
        report.correct_counts.append(sum(score == 1.0 for _, score in samples_of[problem]))
        report.problem_indices.append(problem)
        report.generation_caps.append(cap_of[problem])
        index = (row.get("extra_info") or {}).get("index")
        for sample, (response, score) in enumerate(samples_of[problem]):
            records.append(
                {
                    "data_source": row["data_source"],
                    "index": problem if index is None else index,
                    "sample": sample,
                    "prompt": row["prompt"],
                    "ground_truth": row["reward_model"]["ground_truth"],
                    "response": response,
                    "score": score,
                }
            )
    return EvalResult(records, sources)


def evaluate_model(
    model_path: str,
    specs: list[str],
    *,
    processes: World,
    n: int,
    out_dir: Path,
    temperature: float = EVAL_SAMPLING["temperature"],
    top_p: float = EVAL_SAMPLING["top_p"],
    max_tokens: int = 4096,
    seed: int = 0,
    dtype: str = "float32",
    reward_function: str | None = None,
    reward_timeout_s: float = 1.0,
    reward_workers: int = 2,
    overwrite: bool = False,
    show_progress: bool = True,
    engine: str = "hf",
    stop_after_failing_batches: int = 3,
    continuous_batching: Literal["auto"] | bool = "auto",
    tools: dict | None = None,
) -> EvalResult | None:
    """`pacs eval`: load a model, sample `n` responses per problem (per copy of a repeated
    problem) of every spec (validation split for built-in tasks), score them, and write
    `eval_rollout.jsonl` and `eval_metrics.json` (with these settings, see `EvalSettings`).
    Every one of `processes` (`World.single()`, or `World.from_environment()` under torchrun) takes
    its share of the problems (module docstring); the whole
    result is returned on rank 0, which writes it, and None on the others. `engine`: `hf`
    (transformers' generate, or its continuous batching as `continuous_batching` says:
    `pacs.rollout.continuous_batching.continuous_batching_on`) or `vllm` (`start_vllm_engine`: under
    torchrun each process's engine on its own device, attached to the job); temperature 0 decodes
    greedily with either. `tools`: the `RolloutConfig` settings responses call tools with
    (`tool_settings`; None: single-turn responses), with either engine.

    Each prompt's `max_tokens` is capped by the model's context length minus its length; prompts
    that do not fit are left out and counted (`evaluate`). Data sources with prompts left out,
    or with samples whose scoring timed out or crashed, are reported on stderr; after
    `stop_after_failing_batches` batches in a row whose answers mostly got no score (0: never) the
    evaluation stops with an error naming the reward function (`ScoringWatch`).

    Every input is checked (on every process), a built-in model not yet cached built (a GGUF file
    converted; by rank 0) and `out_dir` claimed (by rank 0; `pacs.outputs.claim_output_dir`:
    `overwrite` moves a previous evaluation there aside) before the model loads.
    """
    if not specs:
        raise ValueError("no data to evaluate: give at least one dataset spec (e.g. builtin:arithmetic)")
    if engine not in ("hf", "vllm") or (engine == "vllm" and dtype not in ("float32", "bfloat16")):
        raise ValueError(f"engine {engine!r} with dtype {dtype!r}: use engine 'hf' (any dtype) or 'vllm' (float32 or bfloat16)")
    rollout = tool_rollout(tools)
    rows_by_spec = run_on_every_rank(
        processes,
        lambda: _checked_inputs(model_path, specs, reward_function, reward_timeout_s, engine, rollout, probe=processes.is_writer),
        how_to_fix=SAME_INPUTS_EVERYWHERE,
    )
    # a built-in model built (a GGUF converted) before anything is written: if it fails, the disk is as it was
    run_on_rank0(processes, lambda: resolve_model_path(model_path))
    run_on_rank0(processes, lambda: claim_output_dir(out_dir, "pacs eval", replace=overwrite))
    settings = EvalSettings(
        model_path=model_path,
        specs=list(specs),
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
        dtype=dtype,
        reward_function=reward_function,
        reward_timeout_s=reward_timeout_s,
        reward_workers=reward_workers,
        engine=engine,
        continuous_batching=continuous_batching,
        tools=tools,
    )
    process_seed = seed if processes.rank == 0 else rank_seed(seed, processes.rank)
    torch.manual_seed(process_seed)

    def load() -> tuple[PreTrainedTokenizerBase, TransformersEngine | str, int | None, list[dict], list[str]]:
        """What each node reads: the tokenizer, the hf engine's model (vLLM's model directory, whose
        engines every rank then starts at once), the model's context length and the rows."""
        tokenizer = load_tokenizer(model_path)
        hf_engine_or_model_dir: TransformersEngine | str
        if engine == "hf":
            model = load_causal_lm(model_path, dtype=dtype).to(processes.device)  # type: ignore[arg-type]  # transformers types .to() for dtypes only
            batching = continuous_batching_on(continuous_batching, processes.device)
            hf_engine_or_model_dir = TransformersEngine(model, tokenizer, continuous_batching=batching)
            config = model.config
        else:
            hf_engine_or_model_dir = local_model_dir(model_path, with_weights=True)
            config = AutoConfig.from_pretrained(hf_engine_or_model_dir)
        rows: list[dict] = []
        locations: list[str] = []
        for spec in specs:
            rows += rows_by_spec[spec]
            locations += [row_location(spec, position) for position in range(len(rows_by_spec[spec]))]
        return tokenizer, hf_engine_or_model_dir, getattr(config, "max_position_embeddings", None), rows, locations

    tokenizer, hf_engine_or_model_dir, context_length, rows, locations = run_on_every_rank(
        processes, load, how_to_fix=SAME_INPUTS_EVERYWHERE, node_leader_first=True
    )
    rollout_engine: RolloutEngine
    if isinstance(hf_engine_or_model_dir, str):
        rollout_engine = with_tools(
            start_vllm_engine(
                hf_engine_or_model_dir,
                tokenizer,
                dtype=dtype,
                seed=process_seed,
                max_model_len=context_length,
                processes=processes,
            ),
            tokenizer,
            rollout,
        )
    else:
        rollout_engine = with_tools(hf_engine_or_model_dir, tokenizer, rollout)
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_tokens)
    # closed after the last collective: under torchrun vLLM's teardown ends the job's process group
    with (
        contextlib.closing(rollout_engine),
        ScoringPool(reward_function, num_workers=reward_workers, timeout_s=reward_timeout_s) as scorer,
    ):
        watch = ScoringWatch(
            scorer.function_name,
            remedy=f"--reward-timeout {reward_timeout_s:g}",
            stop_after=stop_after_failing_batches,
            stop_option="--stop-after-failing-batches",
            batch="batch",
            batches="batches",
        )
        share = evaluate(
            rollout_engine,
            tokenizer,
            rows,
            params,
            scorer,
            row_locations=locations,
            context_length=context_length,
            problem_share=(processes.rank, processes.world_size),
            show_progress=show_progress and processes.is_writer,
            scoring_watch=watch,
        )
        shares = gather_objects_on_rank0(processes, share)
    if shares is None:
        return None
    result = EvalResult.merge(shares)
    for line in result.warnings():
        print(f"warning: {line}", file=sys.stderr)
    result.write(out_dir, settings)
    return result


def eval_tool_settings(
    model_path: str, tools: str | None, max_turns: int | None, tool_format: str | None = None, tool_sandbox: str | None = None
) -> tuple[dict | None, Path | None]:
    """The tool settings `pacs eval` generates with, and the run config they came from (None: from
    the command alone). A checkpoint of a `pacs train` run (`RUN/checkpoints/NAME`) whose
    `RUN/config.yaml` sets `rollout.tools` starts from that run's `TOOL_SETTINGS`; `tools` (the
    `--tools` option: `python`, `package.module:function`, or `none` for single-turn responses),
    `max_turns`, `tool_format` and `tool_sandbox` replace theirs. None: single-turn responses."""
    run_config = Path(model_path).parent.parent / "config.yaml"
    settings: dict | None = None
    if Path(model_path).parent.name == "checkpoints" and run_config.is_file():
        rollout = (yaml.safe_load(run_config.read_text()) or {}).get("rollout") or {}
        if rollout.get("tools") is not None:
            settings = {name: rollout[name] for name in TOOL_SETTINGS if name in rollout}
    source = run_config if settings is not None else None
    if tools == "none":
        settings, source = None, None
    elif tools is not None:
        settings = {**(settings or {}), "tools": tools}
    replaced = (
        ("--max-turns", "max_turns", max_turns),
        ("--tool-format", "tool_format", tool_format),
        ("--tool-sandbox", "tool_sandbox", tool_sandbox),
    )
    for option, name, value in replaced:
        if value is None:
            continue
        if settings is None:
            raise ValueError(
                f"{option} {value} without tools: give --tools python (or package.module:function), "
                "or evaluate a checkpoint of a run trained with rollout.tools"
            )
        settings[name] = value
    return settings, source


def tool_rollout(tools: dict | None) -> RolloutConfig:
    """The `RolloutConfig` that `evaluate_model`'s `tools` settings make (the default one, without
    tools: single-turn responses); ValueError naming the setting at fault."""
    if tools is None:
        return RolloutConfig()
    unknown = sorted(set(tools) - set(TOOL_SETTINGS))
    if unknown:
        raise ValueError(f"tool settings {unknown} are not among {list(TOOL_SETTINGS)}")
    try:
        return RolloutConfig(**tools)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, problem['loc']))}={problem['input']!r}: {problem['msg']}" for problem in error.errors()
        )
        raise ValueError(
            f"tool settings (--tools, --max-turns, --tool-format, --tool-sandbox or the run's rollout section): {problems}"
        ) from None


def _checked_inputs(
    model_path: str,
    specs: list[str],
    reward_function: str | None,
    reward_timeout_s: float,
    engine: str,
    rollout: RolloutConfig,
    *,
    probe: bool,
) -> dict[str, list[dict]]:
    """Every spec's rows (each checked against the schema), once the model is found reachable, the
    rows scorable (`check_scoring`; with `probe`, the reward function is called on a real row), a
    user's tool (`rollout.tools`) importable, the model's chat template usable by the chat tool
    format (`rollout.tool_format`) and the engine's package usable here; otherwise ValueError
    listing every problem at once. Nothing large is loaded (the tokenizer, for the chat format)."""
    rows_by_spec: dict[str, list[dict]] = {}

    def read(spec: str) -> None:
        rows_by_spec[spec] = load_rows(spec, default_split="val")

    def scoring() -> None:
        if reward_function is not None:
            load_reward_function(reward_function)
        if probe or reward_function is None:
            check_scoring(rows_by_spec, reward_function, timeout_s=reward_timeout_s, where=row_location)

    checks: list[tuple[str, Callable[[], object]]] = [
        ("--model", lambda: check_model_reachable(model_path)),
        *((f"--data {spec}", lambda spec=spec: read(spec)) for spec in specs),
        ("--reward-function" if reward_function else "--data", scoring),
    ]
    if engine == "vllm":
        checks.append(("--engine vllm", check_vllm_usable))
    if rollout.tools is not None and rollout.tools != PYTHON_TOOL:
        user_tool = rollout.tools
        checks.append(("--tools", lambda: import_function(user_tool, "tool")))
    if rollout.tools == PYTHON_TOOL:
        checks.append(("--tools python", lambda: check_sandbox(rollout.tool_sandbox)))
    if rollout.tools is not None and rollout.tool_format == "chat":
        checks.append(("--tool-format chat", lambda: tool_format_of(rollout, load_tokenizer(model_path))))
    if problems := unusable_inputs(checks):
        raise ValueError(problems)
    return rows_by_spec


def start_vllm_engine(
    model_dir: str, tokenizer: PreTrainedTokenizerBase, *, dtype: str, seed: int, max_model_len: int | None, processes: World
) -> VllmEngine:
    """`pacs eval --engine vllm`'s engine on the model in `model_dir`, started by every process at
    once, each on its own device (`EnginePlace`). Alone on its GPU, it may take 90% of its memory
    and never sleeps; it returns no log-probs (faster; evaluation needs none)."""
    return VllmEngine(
        model_dir,
        tokenizer,
        VllmConfig(gpu_memory_utilization=0.9, sleep_mode=False),
        dtype=dtype,
        max_model_len=max_model_len,
        seed=seed,
        place=EnginePlace(processes.rank, processes.world_size, processes.device.index or 0),
        sampler_logprobs=False,
    )

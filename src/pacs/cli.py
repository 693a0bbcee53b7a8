"""The `pacs` command: thin argument parsing; each command calls one function."""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pacs
from pacs import EVAL_SAMPLING
from pacs.outputs import DiskFull, claim_output_dir, claim_output_file
from pacs.progress import say_before_first_bar
from pacs.threads import choose_threads, usable_cores
from pacs.train.determinism import reproducible_math_environment


def _checked(parse: Callable[[str], float], valid: str, is_valid: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse type: `parse` the text, and refuse it unless `is_valid`, saying what is `valid`."""

    def parse_checked(text: str) -> float:
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not is_valid(value):
            raise argparse.ArgumentTypeError(f"expected {valid}, got {text!r}")
        return value

    return parse_checked


AT_LEAST_ONE = _checked(int, "an integer >= 1", lambda value: value >= 1)
AT_LEAST_ZERO = _checked(int, "an integer >= 0", lambda value: value >= 0)
POSITIVE = _checked(float, "a finite number > 0", lambda value: math.isfinite(value) and value > 0)
NON_NEGATIVE = _checked(float, "a finite number >= 0", lambda value: math.isfinite(value) and value >= 0)
NUCLEUS = _checked(float, "a number in (0, 1]", lambda value: 0 < value <= 1)
SMOOTHING = _checked(float, "a smoothing weight in [0, 1)", lambda value: 0 <= value < 1)
OVERWRITE_HELP = "move a previous output at --out aside (to NAME.superseded) instead of refusing"
COMMANDS_WITHOUT_TORCH = {"prepare"}
"""Commands that import neither torch nor transformers: they start in a fraction of a second
rather than seconds."""


class HelpWithDefaults(argparse.HelpFormatter):
    """Help that shows an option's default where it has one to show: not for None (no default:
    the help says what happens) nor for an on/off flag."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        shows = action.default not in (None, False, argparse.SUPPRESS) and not isinstance(action, argparse._StoreTrueAction)
        if shows and action.option_strings and "%(default)" not in help_text:
            help_text += " (default: %(default)s)"
        return help_text


def _comma_list(parse: Callable[[str], Any], valid: str) -> Callable[[str], list]:
    """An argparse type: a comma-separated list of at least one item, each read by `parse`."""

    def parse_list(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        try:
            values = [parse(item) for item in items]
        except ValueError:
            values = []
        if not values:
            raise argparse.ArgumentTypeError(f"expected {valid}, got {text!r}")
        return values

    return parse_list


def _train(args: argparse.Namespace) -> None:
    from pacs.train.metrics import summary_lines
    from pacs.train.preflight import load_run_config
    from pacs.train.trainer import TrainResult, train

    config = load_run_config(args.config, args.overrides)
    if args.print_config:
        from pacs.config import config_text

        print(config_text(config), end="")
        return
    start = time.perf_counter()

    def report(result: TrainResult) -> None:  # while the run still holds its folder: what it says is there
        took = "" if result.finished_before else f" in {duration_text(time.perf_counter() - start)}"
        print(f"finished {config.train.steps} steps{took}; final checkpoint: {result.final_checkpoint}")
        if result.skipped_updates:
            print(f"skipped {result.skipped_updates} updates with a non-finite loss or gradient norm")
        for line in summary_lines(Path(config.output_dir), config):
            print(line)

    train(config, allow_changes=args.allow_changes, replace=args.overwrite, report=report)


def duration_text(seconds: float) -> str:
    """ "42 s", "3 min 12 s", "2 h 05 min"."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _eval(args: argparse.Namespace) -> None:
    from pacs.distributed.world import World
    from pacs.eval.evaluate import eval_tool_settings, evaluate_model

    tools, tools_from = eval_tool_settings(args.model, args.tools, args.max_turns, args.tool_format, args.tool_sandbox)
    if tools_from is not None:
        print(
            f"generating with the tools of {tools_from} (rollout.tools={tools['tools']}); --tools none: without", file=sys.stderr
        )
    world = World.from_environment()  # under torchrun: every process takes its share of the problems
    try:
        result = evaluate_model(
            args.model,
            args.data,
            processes=world,
            n=args.n,
            out_dir=Path(args.out),
            temperature=args.temperature,
            top_p=args.top_p,
            max_tokens=args.max_tokens,
            seed=args.seed,
            reward_function=args.reward_function,
            reward_timeout_s=args.reward_timeout,
            reward_workers=args.reward_workers,
            overwrite=args.overwrite,
            engine=args.engine,
            stop_after_failing_batches=args.stop_after_failing_batches,
            continuous_batching={"true": True, "false": False}.get(args.continuous_batching, "auto"),
            tools=tools,
        )
    finally:
        world.close()
    if result is None:  # not rank 0, which reports
        return
    print(result.table())
    print(
        f"pass@k in %; every sample in {Path(args.out) / 'eval_rollout.jsonl'}, every metric (per problem too) in "
        f"{Path(args.out) / 'eval_metrics.json'}"
    )


def _sft(args: argparse.Namespace) -> None:
    from pacs.data.arithmetic import answer_text
    from pacs.data.loading import load_rows
    from pacs.models.loading import check_model_reachable, resolve_model_path
    from pacs.outputs import unusable_inputs
    from pacs.train.sft import supervised_warm_start

    rows = []
    checks = [
        ("--model", lambda: check_model_reachable(args.model)),
        ("--data", lambda: rows.extend(load_rows(args.data, default_split="train"))),
    ]
    if problems := unusable_inputs(checks):
        raise ValueError(problems)
    resolve_model_path(args.model)  # a built-in model built, a GGUF converted, before anything is written
    if aside := claim_output_dir(Path(args.out), "pacs sft", replace=args.overwrite):
        print(f"the previous model in {args.out} is now {aside}")
    out = supervised_warm_start(
        args.model, rows, answer_text, Path(args.out), steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed
    )
    print(f"wrote {out}")


def _prepare(args: argparse.Namespace) -> None:
    from pacs.data.prepare import prepare_dataset, read_rows, write_parquet

    if args.check:
        from pacs.data.loading import row_location
        from pacs.rewards.checks import check_scoring, first_row_of_each_source

        rows = read_rows(args.check)
        check_scoring({args.check: rows}, args.reward_function, timeout_s=args.reward_timeout, where=row_location)
        sources = ", ".join(first_row_of_each_source({args.check: rows}))
        scorer = args.reward_function or "the built-in reward function of each"
        print(f"{args.check}: {len(rows)} rows, all valid; data_source {sources}, scored by {scorer}")
        return
    if not args.input or not args.out:
        raise ValueError("pacs prepare needs --input FILE and --out FILE.parquet (or --check FILE)")
    from pacs.rewards.checks import unverifiable_ground_truths

    prepared = prepare_dataset(
        args.input,
        source=args.source,
        repeat=args.repeat,
        prompt_field=args.prompt_field,
        answer_field=args.answer_field,
        data_source=args.data_source,
        prompt_suffix=args.prompt_suffix,
        unverifiable=unverifiable_ground_truths,
        allow_unverifiable=args.allow_unverifiable,
    )
    if aside := claim_output_file(Path(args.out), replace=args.overwrite):
        print(f"the previous {args.out} is now {aside}")
    write_parquet(prepared.rows, args.out)
    print(prepared.report.summary())
    print(f"wrote {args.out}")


def _compare(args: argparse.Namespace) -> None:
    from pacs.compare import PAPER_BASELINES, PAPER_METHODS, run_comparison

    algorithms = [name for name in re.split(r",(?![^\[]*\])", args.algorithms) if name]  # no split inside [...]
    if args.paper_baselines and (others := sorted(set(algorithms) - set(PAPER_METHODS))):
        raise ValueError(
            f"--paper-baselines sets what the paper's verl baselines used ({', '.join(PAPER_BASELINES)}), which are "
            f"not the settings of {', '.join(others)}: each of those has its own paper's loss aggregation. Compare them "
            f"without --paper-baselines, or leave them out ({', '.join(PAPER_METHODS)} take it)"
        )
    run_comparison(
        args.config,
        algorithms,
        args.seeds,
        args.out,
        eval_n=args.eval_n,
        baseline=args.baseline,
        unweighted_pacs=not args.without_unweighted_pacs,
        overrides=[*(PAPER_BASELINES if args.paper_baselines else []), *args.overrides],
    )


def _plot(args: argparse.Namespace) -> None:
    from pacs.plots import plot_runs

    out = Path(args.out) if args.out else Path(args.runs[0]) / "plots"
    for path in plot_runs([Path(run) for run in args.runs], out, smoothing=args.smooth, overwrite=args.overwrite):
        print(f"wrote {path}")


def _demo(args: argparse.Namespace) -> None:
    from pacs.demo import run_demo

    run_demo(seed=args.seed, out_dir=args.out, overrides=args.overrides)


def build_parser() -> argparse.ArgumentParser:
    from pacs.data.prepare import PROMPT_SUFFIX, SOURCES, UNVERIFIABLE_LIMIT  # torch-free, as every command's parser must be

    parser = argparse.ArgumentParser(prog="pacs", description="PACS and its baselines for RL from verifiable rewards.")
    parser.add_argument("--version", action="version", version=f"pacs {pacs.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser = functools.partial(commands.add_parser, formatter_class=HelpWithDefaults)

    train = commands.add_parser("train", help="run the RLVR loop from a YAML config")
    train.add_argument(
        "--config",
        help="YAML file, or builtin:NAME for a recipe shipped with pacs (e.g. builtin:demo); none: every key's default",
    )
    train.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.steps=20")
    train.add_argument("--overwrite", action="store_true", help="move a previous run in output_dir aside (to NAME.superseded)")
    train.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration (the recipe, every default and the overrides, as YAML that --config "
        "reads back) and exit: nothing is loaded or written",
    )
    train.add_argument(
        "--allow-changes",
        action="store_true",
        help="resume=auto with settings that change the optimisation (lr, batch sizes, algorithm, model, data, ...) other "
        "than the run's own: go on with them, recorded in config_segments.jsonl (refused without this flag)",
    )
    train.set_defaults(run=_train)

    evaluate = commands.add_parser("eval", help="sample N responses per problem and report pass@k")
    evaluate.add_argument(
        "--model",
        required=True,
        help="Hugging Face model directory, hub id, .gguf file or builtin:NAME (e.g. builtin:smollm2-135m-instruct)",
    )
    evaluate.add_argument(
        "--data",
        type=_comma_list(str, "comma-separated dataset specs"),
        required=True,
        help="comma-separated dataset specs, e.g. builtin:arithmetic",
    )
    evaluate.add_argument(
        "-n",
        "--n",
        type=AT_LEAST_ONE,
        required=True,
        help="samples per problem (pass@k for k up to N); under torchrun write -n (torchrun takes --n for its own options)",
    )
    evaluate.add_argument("--out", required=True, help="directory for eval_rollout.jsonl and eval_metrics.json")
    evaluate.add_argument("--temperature", type=NON_NEGATIVE, default=EVAL_SAMPLING["temperature"], help="0: greedy decoding")
    evaluate.add_argument(
        "--engine", choices=["hf", "vllm"], default="hf", help="hf: transformers' generate; vllm: needs pacs[vllm]"
    )
    evaluate.add_argument(
        "--continuous-batching",
        choices=["auto", "true", "false"],
        default="auto",
        help="hf engine: transformers' continuous batching (auto: on CUDA devices only; rollout.hf.continuous_batching)",
    )
    evaluate.add_argument(
        "--top-p", type=NUCLEUS, default=EVAL_SAMPLING["top_p"], help="nucleus sampling: the smallest set of tokens this likely"
    )
    evaluate.add_argument(
        "--max-tokens", type=AT_LEAST_ONE, default=4096, help="per prompt, capped by the context length minus its length"
    )
    evaluate.add_argument("--seed", type=int, default=0, help="seeds the sampling")
    evaluate.add_argument("--reward-function", default=None, help="package.module:function (default: by data_source)")
    evaluate.add_argument("--reward-timeout", type=POSITIVE, default=1.0, help="seconds per scored answer (over: 0)")
    evaluate.add_argument("--reward-workers", type=AT_LEAST_ZERO, default=2, help="scoring processes (0: in-process)")
    evaluate.add_argument(
        "--stop-after-failing-batches",
        type=AT_LEAST_ZERO,
        default=3,
        metavar="N",
        help="stop after N batches in a row in which most answers got no score (timed out or crashed); 0: never",
    )
    evaluate.add_argument(
        "--tools",
        default=None,
        help="responses call a tool (docs/tools.md): python or package.module:function; none: without "
        "(default: the tools of the run whose checkpoint --model is, if it had any)",
    )
    evaluate.add_argument(
        "--max-turns", type=AT_LEAST_ONE, default=None, help="with tools: turns per response (rollout.max_turns)"
    )
    evaluate.add_argument(
        "--tool-format",
        choices=("tir", "chat"),
        default=None,
        help="with tools: how the model calls them (rollout.tool_format; default: the run's, else tir)",
    )
    evaluate.add_argument(
        "--tool-sandbox",
        choices=("bwrap", "none"),
        default=None,
        help="with --tools python: where its programs run (rollout.tool_sandbox; default: the run's, else bwrap)",
    )
    evaluate.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    evaluate.set_defaults(run=_eval)

    sft = commands.add_parser("sft", help="supervised warm-start on a task's reference answers")
    sft.add_argument(
        "--model", default="builtin:tiny", help="model to fine-tune (local directory, hub id, .gguf file or builtin:NAME)"
    )
    sft.add_argument("--data", default="builtin:arithmetic?size=4000", help="dataset spec of the training rows")
    sft.add_argument("--out", required=True, help="new or empty directory for the fine-tuned model")
    sft.add_argument("--steps", type=AT_LEAST_ONE, default=300, help="optimizer steps")
    sft.add_argument("--batch-size", type=AT_LEAST_ONE, default=64, help="rows per step")
    sft.add_argument("--lr", type=POSITIVE, default=3e-3, help="AdamW learning rate")
    sft.add_argument("--seed", type=int, default=0, help="seeds torch and the order of rows")
    sft.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    sft.set_defaults(run=_sft)

    prepare = commands.add_parser(
        "prepare",
        help="convert a file of problems and answers (yours, or a public math set) into the row schema",
        description="Convert a file of problems and answers into the row schema that pacs train and pacs eval "
        "read. The layouts of public math sets (GSM8K, MATH, AIME, AMC, DeepScaleR) are recognised from a "
        "file's content, never its name (or named with --source); any other file is read by its fields (problem, "
        "question or prompt; answer, ground_truth or solution) or the fields you name. Every ground truth is "
        "checked to be an answer its reward can verify.",
    )
    prepare.add_argument("--input", help="jsonl, json, csv or parquet file, one record per problem")
    prepare.add_argument(
        "--source",
        choices=list(SOURCES),
        help="read the file as this public set (default: the layout its content shows; the set its file name names "
        "labels the rows)",
    )
    prepare.add_argument("--prompt-field", help="field holding each problem (default: problem, question or prompt)")
    prepare.add_argument("--answer-field", help="field holding each answer (default: answer, ground_truth or solution)")
    prepare.add_argument(
        "--data-source",
        help="data_source of every row: picks the built-in reward function (math/NAME: the math verifier), or "
        "names the rows for yours (default: the public set's name; math/FILE_NAME for a file of your own)",
    )
    prepare.add_argument(
        "--prompt-suffix",
        default=PROMPT_SUFFIX,
        help="text appended to every problem ('' for none)",
    )
    prepare.add_argument("--out", help="output .parquet file")
    prepare.add_argument("--repeat", type=AT_LEAST_ONE, default=1, help="write every problem R times (pass@k up to n*R in eval)")
    prepare.add_argument("--overwrite", action="store_true", help="move an existing --out file aside (to NAME.superseded)")
    prepare.add_argument(
        "--allow-unverifiable",
        action="store_true",
        help=f"write the rows even when more than {UNVERIFIABLE_LIMIT * 100:g}%% of their ground truths are no answer their reward can verify "
        "(math-verify reads them as text only: every answer to them scores 0)",
    )
    prepare.add_argument(
        "--check",
        metavar="FILE",
        help="only validate a prepared file: every row against the schema, and every data_source against the "
        "reward functions (yours, with --reward-function, called once per data_source)",
    )
    prepare.add_argument("--reward-function", help="with --check: package.module:function that will score the rows")
    prepare.add_argument(
        "--reward-timeout", type=POSITIVE, default=1.0, help="with --check and --reward-function: seconds per answer"
    )
    prepare.set_defaults(run=_prepare)

    compare = commands.add_parser("compare", help="train PACS and baselines identically and tabulate pass@k")
    compare.add_argument("--config", required=True, help="YAML file or builtin:NAME, e.g. builtin:compare-demo")
    compare.add_argument(
        "--algorithms",
        default="pacs,grpo,ppo,rloo",
        help="comma-separated values of algorithm.name (a built-in's name or your section's package.module:Class); one named again is an A/A run of it (labelled 'NAME (run 2)', "
        "trained with seeds + 1000); NAME[key=value ...] is a variant of it with those overrides and the same seeds, "
        "e.g. 'pacs,pacs[rollout.max_staleness=1]'",
    )
    compare.add_argument(
        "--seeds",
        type=_comma_list(int, "comma-separated integer seeds"),
        default="0,1,2",
        help="seeds to train and evaluate every method with (at least 3 for the interval to mean much)",
    )
    compare.add_argument("--out", required=True, help="directory for every run, comparison.md/json and plots")
    compare.add_argument("--eval-n", type=AT_LEAST_ONE, default=16, help="samples per held-out problem (pass@k up to k = N)")
    compare.add_argument(
        "--baseline",
        help="the method every other one is set against (paired difference of pass@k with a 95%% t interval over "
        "seeds): one of --algorithms, 'pacs (no weighting)' or 'base model' (default: grpo when it is compared, "
        "else the base model)",
    )
    compare.add_argument(
        "--paper-baselines",
        action="store_true",
        help="grpo, rloo, ppo update as the paper's verl baselines did (dual clip 3, verl's loss scale); "
        "default: as the config says. Only with pacs, grpo, rloo, ppo",
    )
    compare.add_argument(
        "--without-unweighted-pacs",
        action="store_true",
        help="leave out 'pacs (no weighting)', the ablation trained beside pacs when pacs is compared (one run per seed less)",
    )
    compare.add_argument("overrides", nargs="*", metavar="key=value", help="overrides applied to every run")
    compare.set_defaults(run=_compare)

    plot = commands.add_parser("plot", help="PNG curves of runs' metrics, several runs on the same axes")
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR", help="output_dir of a pacs train run (several: one curve each)")
    plot.add_argument("--out", help="directory for the PNGs (default: RUN_DIR/plots of the first run)")
    plot.add_argument(
        "--smooth",
        type=SMOOTHING,
        default=0.0,
        metavar="W",
        help="exponential moving average of the training curves, as TensorBoard's smoothing slider "
        "(0 <= W < 1; 0: raw); validation curves are drawn raw",
    )
    plot.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    plot.set_defaults(run=_plot)

    demo = commands.add_parser("demo", help="warm-start, evaluate, train with PACS, evaluate again (CPU, minutes)")
    demo.add_argument("--seed", type=int, default=0, help="seeds the warm-start, training and evaluation")
    demo.add_argument("--out", default="runs/demo", help="directory of the run; a previous demo there is moved aside")
    demo.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of configs/demo.yaml")
    demo.set_defaults(run=_demo)
    return parser


def after_interrupt(command: str, argv: list[str]) -> str:
    """The one line `pacs COMMAND` ends with on Ctrl-C: what is kept and how to go on."""
    again = shlex.join(["pacs", *argv])
    if command == "train":
        kept = [arg for arg in argv if arg != "--overwrite" and not arg.startswith("resume=")]  # --overwrite would move it aside
        resumed = shlex.join(["pacs", *kept, "resume=auto"])
        return f"interrupted; output_dir keeps every checkpoint written so far: continue with {resumed}"
    if command == "compare":
        return f"interrupted; finished runs and evaluations are kept and reused: continue with {again}"
    if command == "prepare":
        return "interrupted; nothing was written"
    if command == "demo":  # a demo moves the previous one aside by itself
        return f"interrupted; start again with {again}"
    return f"interrupted; nothing finished was kept: start again with {again}" + ("" if "--overwrite" in argv else " --overwrite")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    reproducible_math_environment()  # before torch computes: MKL reads its mode once
    if args.command not in COMMANDS_WITHOUT_TORCH:
        threads = choose_threads()  # before torch is imported: its OpenMP runtime reads the choice once
        if threads is not None and threads < usable_cores():
            busy = usable_cores() - threads
            say_before_first_bar(  # once the inputs are checked: a refused command does not say it
                f"pacs {args.command}: computing with {threads} thread{'s' * (threads > 1)}: {busy} of {usable_cores()} "
                f"cores {'was' if busy == 1 else 'were'} busy at the start (OMP_NUM_THREADS=N chooses)"
            )
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    try:
        args.run(args)
    except (ValueError, FileNotFoundError) as error:  # pacs.config.ConfigError is a ValueError
        print(f"pacs {args.command}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except DiskFull as error:  # one line: the folder, what, its size, the free space
        print(f"pacs {args.command}: error: {error.strerror}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback; every rank gets it, rank 0 says it
        if os.environ.get("RANK", "0") == "0":
            print(f"\npacs {args.command}: {after_interrupt(args.command, argv)}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()

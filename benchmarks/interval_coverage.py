"""How often does the interval `pacs compare` reports cover the truth? Simulated A/A comparisons.

An A/A comparison sets two runs of the same method against each other, seed by seed, so the true
difference is 0 and a 95% interval should cover it 95% of the time. Each simulated run solves each
of P problems with a probability whose logit is the problem's difficulty plus the run's own shift
(a run lands somewhere of its own; the spread of the demo's 5-seed table lies at 0.1-0.15), is
sampled 16 times a problem, and scored by the unbiased pass@k estimator
1 − C(16 − c, k) / C(16, k) of its c successes. Two families:

    normal   difficulty N(logit 0.25, 1.5²), shift N(0, 0.15²)
    heavy    difficulty logit 0.25 + 1.5 · t₃, shift 0.15 · t₃ (Student's t, 3 degrees of freedom):
             more problems always or never solved, and runs that land far off

At k = 16 pass@k is 0 or 1 per problem, so seeds tie often (every per-seed difference a multiple
of 1/P). For every family, k ∈ {1, 8, 16}, P ∈ {30, 91} and S ∈ {2, 3, 5} seeds it prints the
coverage, the fraction of comparisons whose interval has width 0 yet excludes 0 ("zero-width
significant"), the fraction where the seeds tied (the within-seed error stood in), the fraction
undetermined (every difference equal: (−1, 1)) and the mean width of the others, for `pacs.eval.significance.difference_interval` and for the plain t interval over
seeds it replaced (no fallback: a tie gives (D, D)).

    python benchmarks/interval_coverage.py [--comparisons 4000]

With --bootstrap it prints instead the pass@1 table of a two-level percentile bootstrap over seeds
and problems (what `pacs compare` reported first; 2,000 resamples) beside the t interval, at 3, 5
and 10 seeds on 91 problems.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import stats
from scipy.special import comb

from pacs.eval.significance import UNDETERMINED, difference_interval, excludes_zero

PROBLEMS, SAMPLES = 91, 16
RUN_SDS = (0.1, 0.15)
SEEDS = (3, 5, 10)
GRID_KS, GRID_PROBLEMS, GRID_SEEDS, GRID_RUN_SD = (1, 8, 16), (30, 91), (2, 3, 5), 0.15
FAMILIES = ("normal", "heavy")


def simulate_aa_differences(rng: np.random.Generator, comparisons: int, seeds: int, run_sd: float) -> np.ndarray:
    """(comparisons, seeds, PROBLEMS) pass@1 differences of two runs of one method (normal family)."""
    difficulty = rng.normal(np.log(0.25 / 0.75), 1.5, size=(comparisons, 1, 1, PROBLEMS))
    shift = rng.normal(0.0, run_sd, size=(comparisons, seeds, 2, 1))
    solved = rng.binomial(SAMPLES, 1 / (1 + np.exp(-(difficulty + shift)))) / SAMPLES
    return solved[:, :, 0] - solved[:, :, 1]


def simulate_passk_differences(
    rng: np.random.Generator, comparisons: int, seeds: int, problems: int, k: int, family: str, run_sd: float = GRID_RUN_SD
) -> np.ndarray:
    """(comparisons, seeds, problems) pass@k differences of two runs of one method, each scored from
    SAMPLES samples a problem (module docstring's families)."""
    if family == "normal":
        difficulty = rng.normal(np.log(0.25 / 0.75), 1.5, size=(comparisons, 1, 1, problems))
        shift = rng.normal(0.0, run_sd, size=(comparisons, seeds, 2, 1))
    else:
        difficulty = np.log(0.25 / 0.75) + 1.5 * rng.standard_t(3, size=(comparisons, 1, 1, problems))
        shift = run_sd * rng.standard_t(3, size=(comparisons, seeds, 2, 1))
    successes = rng.binomial(SAMPLES, 1 / (1 + np.exp(-(difficulty + shift))))
    counts = np.arange(SAMPLES + 1)
    pass_at_k = (1 - comb(SAMPLES - counts, k) / comb(SAMPLES, k))[successes]
    return pass_at_k[:, :, 0] - pass_at_k[:, :, 1]


def plain_t_interval(differences: np.ndarray) -> tuple[float, float]:
    """The t interval over seeds without a fallback for tied seeds (what the module replaced)."""
    units = differences.mean(axis=1)
    center = float(units.mean())
    half_width = stats.t.ppf(0.975, len(units) - 1) * units.std(ddof=1) / math.sqrt(len(units))
    return center - float(half_width), center + float(half_width)


def two_level_bootstrap(differences: np.ndarray, rng: np.random.Generator, resamples: int = 2000) -> tuple[float, float]:
    """Percentile interval of the mean over `resamples` draws of seeds, then problems within each."""
    seeds, problems = differences.shape
    drawn_seeds = rng.integers(0, seeds, size=(resamples, seeds, 1))
    drawn_problems = rng.integers(0, problems, size=(resamples, seeds, problems))
    low, high = np.quantile(differences[drawn_seeds, drawn_problems].mean(axis=(1, 2)), [0.025, 0.975])
    return float(low), float(high)


def coverage(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """(fraction of intervals holding 0, their mean width)."""
    return float(np.mean([low <= 0 <= high for low, high in intervals])), float(np.mean([high - low for low, high in intervals]))


def zero_width_significant(intervals: list[tuple[float, float]]) -> float:
    """Fraction of intervals of width 0 that lie off 0 (what a plain t interval calls significant)."""
    return float(np.mean([low == high and (low > 0 or high < 0) for low, high in intervals]))


def grid_row(rng: np.random.Generator, comparisons: int, family: str, k: int, problems: int, seeds: int) -> dict[str, float]:
    """One cell of the grid: the A/A statistics of both intervals."""
    simulated = simulate_passk_differences(rng, comparisons, seeds, problems, k, family)
    ours = [difference_interval(d) for d in simulated]
    plain = [plain_t_interval(d) for d in simulated]
    tied = float(np.mean([d.mean(axis=1).std(ddof=1) == 0 for d in simulated]))
    cover, _ = coverage(ours)
    plain_cover, _ = coverage(plain)
    determined = [interval for interval in ours if interval != UNDETERMINED]
    return {
        "coverage": cover,
        "zero_width_significant": float(np.mean([low == high and excludes_zero((low, high)) for low, high in ours])),
        "tied": tied,
        "undetermined": 1 - len(determined) / len(ours),
        "width": coverage(determined)[1] if determined else math.nan,
        "plain_coverage": plain_cover,
        "plain_zero_width_significant": zero_width_significant(plain),
    }


def print_grid(comparisons: int) -> None:
    rng = np.random.default_rng(0)
    print(
        "| family | pass@k | problems | seeds | coverage | zero-width significant | seeds tied | undetermined "
        "| mean width (points) | plain t: coverage | plain t: zero-width significant |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    start = time.perf_counter()
    worst = 1.0
    for family in FAMILIES:
        for k in GRID_KS:
            for problems in GRID_PROBLEMS:
                for seeds in GRID_SEEDS:
                    row = grid_row(rng, comparisons, family, k, problems, seeds)
                    worst = min(worst, row["coverage"])
                    print(
                        f"| {family} | {k} | {problems} | {seeds} | {row['coverage']:.3f} | "
                        f"{100 * row['zero_width_significant']:.1f}% | {100 * row['tied']:.1f}% | "
                        f"{100 * row['undetermined']:.1f}% | {100 * row['width']:.1f} | "
                        f"{row['plain_coverage']:.3f} | {100 * row['plain_zero_width_significant']:.1f}% |",
                        flush=True,
                    )
    print(f"\n{comparisons} comparisons a cell, run-to-run sd {GRID_RUN_SD}; lowest coverage {worst:.3f}; "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip


def print_bootstrap_table(comparisons: int, bootstrap_comparisons: int) -> None:
    rng = np.random.default_rng(0)
    print(
        "| seeds | run_sd | t over seeds: coverage | mean width (points) | two-level bootstrap: coverage | mean width (points) |"
    )
    print("|---|---|---|---|---|---|")
    for seeds in SEEDS:
        for run_sd in RUN_SDS:
            simulated = simulate_aa_differences(rng, comparisons, seeds, run_sd)
            t_cover, t_width = coverage([difference_interval(d) for d in simulated])
            b_cover, b_width = coverage([two_level_bootstrap(d, rng) for d in simulated[:bootstrap_comparisons]])
            print(
                f"| {seeds} | {run_sd} | {t_cover:.3f} | {100 * t_width:.1f} | {b_cover:.3f} | {100 * b_width:.1f} |", flush=True
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comparisons", type=int, default=4000, help="A/A comparisons per cell")
    parser.add_argument("--bootstrap", action="store_true", help="the pass@1 table against the two-level bootstrap instead")
    parser.add_argument("--bootstrap-comparisons", type=int, default=400, help="A/A comparisons per row for the bootstrap")
    args = parser.parse_args()
    if args.bootstrap:
        print_bootstrap_table(args.comparisons, args.bootstrap_comparisons)
    else:
        print_grid(args.comparisons)


if __name__ == "__main__":
    main()

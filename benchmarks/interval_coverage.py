"""How often does the interval `pacs compare` reports cover the truth? Simulated A/A comparisons.

An A/A comparison sets two runs of the same method against each other, seed by seed, so the true
difference is 0 and a 95% interval should cover it 95% of the time. Each simulated run solves each
of 91 problems with a probability whose logit is the problem's difficulty, N(logit 0.25, 1.5²),
plus the run's own shift, N(0, run_sd²) (a run lands somewhere of its own; the spread of the demo's
5-seed table lies at 0.1-0.15), and is scored from 16 samples a problem.

    python benchmarks/interval_coverage.py [--comparisons 4000] [--bootstrap-comparisons 400]

prints, for 3, 5 and 10 seeds and both spreads, the coverage and mean width of
`pacs.eval.significance.difference_interval` (t over seeds) and of a two-level percentile bootstrap
over seeds and problems (what `pacs compare` reported before; 2,000 resamples, fewer comparisons
since it is slow).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pacs.eval.significance import difference_interval

PROBLEMS, SAMPLES = 91, 16
RUN_SDS = (0.1, 0.15)
SEEDS = (3, 5, 10)


def simulate_aa_differences(rng: np.random.Generator, comparisons: int, seeds: int, run_sd: float) -> np.ndarray:
    """(comparisons, seeds, PROBLEMS) pass@1 differences of two runs of one method (module docstring)."""
    difficulty = rng.normal(np.log(0.25 / 0.75), 1.5, size=(comparisons, 1, 1, PROBLEMS))
    shift = rng.normal(0.0, run_sd, size=(comparisons, seeds, 2, 1))
    solved = rng.binomial(SAMPLES, 1 / (1 + np.exp(-(difficulty + shift)))) / SAMPLES
    return solved[:, :, 0] - solved[:, :, 1]


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comparisons", type=int, default=4000, help="A/A comparisons per row for the t interval")
    parser.add_argument("--bootstrap-comparisons", type=int, default=400, help="A/A comparisons per row for the bootstrap")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(
        "| seeds | run_sd | t over seeds: coverage | mean width (points) | two-level bootstrap: coverage | mean width (points) |"
    )
    print("|---|---|---|---|---|---|")
    start = time.perf_counter()
    for seeds in SEEDS:
        for run_sd in RUN_SDS:
            simulated = simulate_aa_differences(rng, args.comparisons, seeds, run_sd)
            t_cover, t_width = coverage([difference_interval(d) for d in simulated])
            b_cover, b_width = coverage([two_level_bootstrap(d, rng) for d in simulated[: args.bootstrap_comparisons]])
            print(
                f"| {seeds} | {run_sd} | {t_cover:.3f} | {100 * t_width:.1f} | {b_cover:.3f} | {100 * b_width:.1f} |", flush=True
            )
    print(f"\n{args.comparisons} comparisons a row for t, {args.bootstrap_comparisons} for the bootstrap; "
          f"{time.perf_counter() - start:.0f} s")  # fmt: skip


if __name__ == "__main__":
    main()

"""Is a method's pass@k better than a reference method's? A paired bootstrap over seeds and problems.

Both methods are evaluated, seed by seed, on the same held-out problems, so the comparison is
paired: for seed s and problem i,

    d[s, i] = pass@k(method, s, i) - pass@k(reference, s, i)

The per-seed difference is the mean over problems, D_s = mean_i d[s, i], and the estimate is their
mean, D = mean_s D_s (with the same problems in every seed: the mean of d).

The 95% interval is a two-level percentile bootstrap: each of `resamples` replicates draws S seeds
with replacement from the S seeds, then, within each drawn seed, P problems with replacement from
its P problems (the same problem indices for both methods, which is what keeps the pairing), and
takes the mean of d over the drawn cells; the interval is the 2.5th and 97.5th percentile of the
replicates. It covers the two sources of noise a comparison has: which problems happened to be in
the held-out set, and which seeds the runs happened to get. With a single seed only the problems
are resampled. The generator is seeded, so a report is reproducible.
"""

from __future__ import annotations

import numpy as np

RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CHUNK = 500
"""Replicates drawn at once (bounds memory to CHUNK * seeds * problems indices)."""


def paired_bootstrap_interval(
    differences: np.ndarray, *, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """The percentile bootstrap interval of mean(differences) (module docstring for the procedure).

    differences: (seeds, problems) float array, d[s, i] = method minus reference on problem i of
        seed s; every seed has the same number of problems.
    confidence: in (0, 1); the interval runs from the (1 - confidence) / 2 to the
        (1 + confidence) / 2 quantile of the replicates.
    Returns (low, high).

    Raises:
        ValueError: `differences` is not 2-D with at least one seed and one problem, holds a
            non-finite value, or `confidence` / `resamples` is out of range.
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 2 or 0 in d.shape:
        raise ValueError(f"differences must be a (seeds, problems) array with both sizes >= 1; got shape {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("differences holds a NaN or infinite value; every pass@k difference must be finite")
    if not 0 < confidence < 1 or resamples < 1:
        raise ValueError(f"confidence={confidence} must lie in (0, 1) and resamples={resamples} must be >= 1")
    num_seeds, num_problems = d.shape
    rng = np.random.default_rng(seed)
    replicates = []
    for start in range(0, resamples, CHUNK):
        count = min(CHUNK, resamples - start)
        drawn_seeds = rng.integers(0, num_seeds, size=(count, num_seeds, 1))  # (count, S, 1)
        drawn_problems = rng.integers(0, num_problems, size=(count, num_seeds, num_problems))  # (count, S, P)
        replicates.append(d[drawn_seeds, drawn_problems].mean(axis=(1, 2)))
    tail = (1 - confidence) / 2
    low, high = np.quantile(np.concatenate(replicates), [tail, 1 - tail])
    return float(low), float(high)


def excludes_zero(interval: tuple[float, float]) -> bool:
    """True when the interval lies wholly above or wholly below 0 (the difference is significant at
    the interval's level)."""
    low, high = interval
    return low > 0 or high < 0

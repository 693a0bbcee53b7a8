"""Is a method's pass@k better than a reference method's? A paired interval over seeds.

Both methods are evaluated, seed by seed, on the same held-out problems, so the comparison is
paired: for seed s and problem i,

    d[s, i] = pass@k(method, s, i) - pass@k(reference, s, i)

The per-seed difference is the mean over problems, D_s = mean_i d[s, i], and the estimate is their
mean, D = mean_s D_s.

Why seeds are the units. Two runs of one method differ by more than their samples: each run's
policy lands somewhere of its own (a per-run shift), which moves every problem of that run at once,
so the P problems of a seed are not P independent observations of the difference. D_1 .. D_S are
independent (each seed's pair of runs is trained and evaluated apart), and each is a mean of P
differences, close to normal. The interval is Student's t on them:

    D ± t_{S-1, (1+confidence)/2} · sd(D_s) / √S        (sd with S - 1 degrees of freedom)

It is about the benchmark's own problems (what the table reports), not about problems one might
have drawn instead. Simulated A/A comparisons (two runs of one method: per-problem success
probabilities shifted per run by N(0, 0.1²–0.15²) on the logit scale, 91 problems, 16 samples) show
what this buys: it covers the true difference 0 in 95% of comparisons at 3, 5 and 10 seeds, where a
two-level percentile bootstrap over seeds and problems covered 83–85% at 3 seeds (`tests/
test_significance.py` checks the coverage; `benchmarks/interval_coverage.py` prints both). The price
is width at few seeds: t with 2 degrees of freedom is 4.3 standard errors wide on each side.

With one seed the run-to-run spread cannot be seen at all: the interval is then t over problems,
which covers only which problems were drawn and sampled, and is too narrow by the per-run shift;
`pacs compare` warns below 3 seeds.

`minimum_detectable_difference` and `seeds_needed` turn the per-seed spread into a plan: the
smallest true difference S seeds find with a given power, and how many seeds a difference needs.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import stats

FEW_SEEDS = 3
"""Below this many seeds a comparison's interval is too wide (2 seeds) or blind to the run-to-run
spread (1 seed); `pacs compare` warns."""
POWER = 0.8
"""The chance of finding a true difference that `minimum_detectable_difference` and `seeds_needed` plan for."""
MAX_SEEDS_PLANNED = 1000
"""`seeds_needed` gives up above this many seeds (returns None)."""


def _checked(differences: np.ndarray, confidence: float) -> np.ndarray:
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 2 or 0 in d.shape:
        raise ValueError(f"differences must be a (seeds, problems) array with both sizes >= 1; got shape {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("differences holds a NaN or infinite value; every pass@k difference must be finite")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} must lie in (0, 1)")
    return d


def difference_interval(differences: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The t interval of the mean difference over seeds (module docstring for why).

    differences: (seeds, problems) float array, d[s, i] = method minus reference on problem i of
        seed s; every seed has the same number of problems.
    confidence: in (0, 1).
    Returns (low, high), around mean(differences). With one seed, t over its problems; with one
    seed of one problem, (d, d).

    Raises:
        ValueError: `differences` is not 2-D with at least one seed and one problem, holds a
            non-finite value, or `confidence` is out of (0, 1).
    """
    d = _checked(differences, confidence)
    units = d.mean(axis=1) if d.shape[0] > 1 else d[0]
    center = float(units.mean())
    if len(units) == 1:
        return center, center
    half_width = _t_quantile((1 + confidence) / 2, len(units) - 1) * units.std(ddof=1) / math.sqrt(len(units))
    return center - float(half_width), center + float(half_width)


@lru_cache(maxsize=256)
def _t_quantile(probability: float, degrees: int) -> float:
    """Student's t quantile (a report asks for the same few many times)."""
    return float(stats.t.ppf(probability, degrees))


def excludes_zero(interval: tuple[float, float]) -> bool:
    """True when the interval lies wholly above or wholly below 0 (the difference is significant at
    the interval's level)."""
    low, high = interval
    return low > 0 or high < 0


def minimum_detectable_difference(seed_sd: float, seeds: int, *, confidence: float = 0.95, power: float = POWER) -> float:
    """The smallest true difference that `difference_interval` over `seeds` seeds excludes 0 for
    with probability `power`, when per-seed differences spread with standard deviation `seed_sd`:

        (t_{S-1, (1+confidence)/2} + t_{S-1, power}) · seed_sd / √S

    (the usual approximation: the interval's half-width taken at its expected size). `seeds` >= 2.
    """
    if seeds < 2:
        raise ValueError(f"a detectable difference needs at least 2 seeds, got {seeds}")
    degrees = seeds - 1
    return (_t_quantile((1 + confidence) / 2, degrees) + _t_quantile(power, degrees)) * seed_sd / math.sqrt(seeds)


def seeds_needed(difference: float, seed_sd: float, *, confidence: float = 0.95, power: float = POWER) -> int | None:
    """The fewest seeds (>= 2) whose `minimum_detectable_difference` is at most |difference|; None
    when that takes more than MAX_SEEDS_PLANNED."""
    for seeds in range(2, MAX_SEEDS_PLANNED + 1):
        if minimum_detectable_difference(seed_sd, seeds, confidence=confidence, power=power) <= abs(difference):
            return seeds
    return None

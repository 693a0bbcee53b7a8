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

Ties. At large k pass@k is 0 or 1 on most problems, so the per-seed differences are multiples of
1/P and two or three seeds often agree exactly: sd(D_s) = 0, and the t interval would be (D, D),
"significant" for any D ≠ 0. A spread of 0 there is chance, not certainty: each D_s is a mean of P
noisy differences and varies at least by its sampling error. So when the seeds' spread is 0 the
interval falls back to the within-seed standard error,

    sd = sqrt(mean_s var_i(d[s, i]) / P)        (var with P − 1 degrees of freedom)

and when that is 0 too (every difference equal: nothing varies) the interval is undetermined,
(−1, 1), the whole range of a pass@k difference. Only the zero case falls back: flooring every
spread at the within-seed error would make the interval far too wide (the within-seed variance
includes how problems differ, which pairing removes). The same holds with one seed (problems as
units). `benchmarks/interval_coverage.py` checks both at pass@1, 8 and 16.

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
UNDETERMINED = (-1.0, 1.0)
"""`difference_interval` when no difference varies at all: the whole range of a pass@k difference."""


def _checked(differences: np.ndarray, confidence: float) -> np.ndarray:
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 2 or 0 in d.shape:
        raise ValueError(f"differences must be a (seeds, problems) array with both sizes >= 1; got shape {d.shape}")
    if not np.isfinite(d).all():
        raise ValueError("differences holds a NaN or infinite value; every pass@k difference must be finite")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence} must lie in (0, 1)")
    return d


def _units(d: np.ndarray) -> np.ndarray:
    """The interval's units: each seed's mean difference, or with one seed its problems."""
    return d.mean(axis=1) if d.shape[0] > 1 else d[0]


def _spread(d: np.ndarray) -> float:
    """sd of the units (ddof 1), or the within-seed standard error when that is 0 (module
    docstring); 0.0 when nothing varies (or there is a single unit)."""
    units = _units(d)
    if len(units) < 2:
        return 0.0
    spread = float(units.std(ddof=1))
    if spread > 0 or d.shape[0] == 1 or d.shape[1] == 1:
        return spread
    return math.sqrt(float(d.var(axis=1, ddof=1).mean()) / d.shape[1])


def seed_spread(differences: np.ndarray) -> float:
    """The standard deviation of the per-seed differences that `difference_interval` uses: sd_s(D_s),
    or with a spread of 0 (tied seeds) the within-seed standard error sqrt(mean_s var_i(d[s, i]) / P);
    0.0 when neither varies (undetermined). Pass it to `minimum_detectable_difference` and
    `seeds_needed`; `differences` as in `difference_interval`, with at least 2 seeds."""
    d = _checked(differences, 0.95)
    if d.shape[0] < 2:
        raise ValueError(f"a spread over seeds needs at least 2 seeds, got {d.shape[0]}")
    return _spread(d)


def difference_interval(differences: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """The t interval of the mean difference over seeds (module docstring for why).

    Formula (D the mean of the units, S their number, sd as `seed_spread`):
        D ± t_{S−1, (1+confidence)/2} · sd / √S

    differences: (seeds, problems) float array, d[s, i] = method minus reference on problem i of
        seed s; every seed has the same number of problems.
    confidence: in (0, 1).
    Returns (low, high), around mean(differences), never of width 0: with the seeds tied, the
    within-seed error stands in for their spread; when nothing varies (every difference equal, or
    one seed of one problem), UNDETERMINED = (−1, 1). With one seed, t over its problems.

    Raises:
        ValueError: `differences` is not 2-D with at least one seed and one problem, holds a
            non-finite value, or `confidence` is out of (0, 1).
    """
    d = _checked(differences, confidence)
    units = _units(d)
    spread = _spread(d)
    if spread == 0:
        return UNDETERMINED
    center = float(units.mean())
    half_width = _t_quantile((1 + confidence) / 2, len(units) - 1) * spread / math.sqrt(len(units))
    return center - float(half_width), center + float(half_width)


@lru_cache(maxsize=256)
def _t_quantile(probability: float, degrees: int) -> float:
    """Student's t quantile (a report asks for the same few many times)."""
    return float(stats.t.ppf(probability, degrees))


def excludes_zero(interval: tuple[float, float]) -> bool:
    """True when the interval has a width and lies wholly above or wholly below 0 (the difference
    is significant at the interval's level); an interval of width 0 says nothing."""
    low, high = interval
    return low < high and (low > 0 or high < 0)


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
    when that takes more than MAX_SEEDS_PLANNED, or when `seed_sd` is 0 (tied seeds say nothing of
    the spread: pass `seed_spread`, 0 only when nothing varies)."""
    if not seed_sd > 0:
        return None
    for seeds in range(2, MAX_SEEDS_PLANNED + 1):
        if minimum_detectable_difference(seed_sd, seeds, confidence=confidence, power=power) <= abs(difference):
            return seeds
    return None

"""The interval `pacs compare` puts on each method's difference from the baseline
(`pacs.eval.significance`): Student's t over seeds, checked on simulated A/A comparisons."""

from __future__ import annotations

import numpy as np
import pytest
from interval_coverage import RUN_SDS, simulate_aa_differences, simulate_passk_differences

from pacs.eval.significance import (
    UNDETERMINED,
    difference_interval,
    excludes_zero,
    minimum_detectable_difference,
    seed_spread,
    seeds_needed,
)

T_2_DF_975 = 4.302652729911275
"""The 97.5% quantile of Student's t with 2 degrees of freedom (printed tables: 4.303)."""
T_1_DF_975 = 12.706204736174707


def test_three_seeds_give_the_t_interval_of_their_means():
    # per-seed means 0, 1/2, 1: mean 1/2, sd 1/2; half-width t_{2, 0.975} * (1/2) / sqrt(3)
    low, high = difference_interval(np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    half = T_2_DF_975 * 0.5 / np.sqrt(3)
    assert (low, high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))


def test_seeds_are_the_units_however_problems_spread_within_them():
    # Within each seed every problem agrees; two seeds of means 1 and -1 (sd sqrt 2) give t with 1
    # degree of freedom: 0 ± 12.706 * sqrt(2) / sqrt(2).
    assert difference_interval(np.array([[1.0, 1.0], [-1.0, -1.0]])) == (pytest.approx(-T_1_DF_975), pytest.approx(T_1_DF_975))
    spread_within = np.array([[3.0, -1.0], [-3.0, 1.0]])  # the same seed means
    assert difference_interval(spread_within) == difference_interval(np.array([[1.0, 1.0], [-1.0, -1.0]]))


def test_one_seed_takes_its_problems_as_the_units():
    low, high = difference_interval(np.array([[0.0, 0.0, 1.0]]))
    half = T_2_DF_975 * np.std([0.0, 0.0, 1.0], ddof=1) / np.sqrt(3)
    assert (low, high) == (pytest.approx(1 / 3 - half), pytest.approx(1 / 3 + half))


def test_equal_differences_everywhere_give_no_interval_and_nothing_significant():
    """The issue's case: three seeds, 91 problems, every difference 1/91. Nothing varies, so the
    interval is the whole range, not (1/91, 1/91)."""
    for differences in (np.full((3, 91), 1 / 91), np.full((1, 4), 0.25), np.array([[0.5]])):
        assert difference_interval(differences) == UNDETERMINED
        assert not excludes_zero(difference_interval(differences))


def test_tied_seeds_fall_back_to_the_within_seed_standard_error():
    """Both seeds gain one problem of 30 (D_s = 1/30 each, sd 0): the spread used is
    sqrt(mean_s var_i(d[s, i]) / P) = sqrt((1/30) / 30), var over 30 problems of one 1 = 1/30."""
    differences = np.zeros((2, 30))
    differences[0, 3] = differences[1, 17] = 1.0
    spread = np.sqrt(np.var([1.0] + [0.0] * 29, ddof=1) / 30)
    assert seed_spread(differences) == pytest.approx(spread, rel=1e-12)
    low, high = difference_interval(differences)
    assert (low, high) == (
        pytest.approx(1 / 30 - T_1_DF_975 * spread / np.sqrt(2)),
        pytest.approx(1 / 30 + T_1_DF_975 * spread / np.sqrt(2)),
    )
    assert not excludes_zero((low, high))


def test_an_interval_of_width_zero_is_never_significant():
    assert not excludes_zero((0.011, 0.011)) and excludes_zero((0.011, 0.012))


def test_seeds_needed_is_undetermined_without_a_spread():
    assert seeds_needed(0.02, 0.0) is None
    assert seed_spread(np.full((3, 91), 1 / 91)) == 0.0


def test_a_consistent_gain_gives_an_interval_that_excludes_zero():
    gains = np.random.default_rng(1).uniform(0.0, 0.2, size=(3, 50))
    interval = difference_interval(gains)
    assert 0 < interval[0] < gains.mean() < interval[1]
    assert excludes_zero(interval)


def test_gains_and_losses_that_cancel_give_an_interval_that_includes_zero():
    differences = np.array([[0.1] * 4, [-0.1] * 4, [0.05] * 4])
    interval = difference_interval(differences)
    assert interval[0] < 0 < interval[1]
    assert not excludes_zero(interval)


SIMULATED_COMPARISONS = 4_000
"""A/A comparisons simulated per per-run spread: the coverage's Monte Carlo error is 0.34 points."""


@pytest.fixture(scope="module", params=RUN_SDS, ids=[f"run-sd-{sd}" for sd in RUN_SDS])
def aa_differences(request) -> np.ndarray:
    """(comparisons, 10 seeds, problems) pass@1 differences of two runs of the same method
    (benchmarks/interval_coverage.py: 91 problems, a per-run logit shift of N(0, run_sd²), 16
    samples a problem); the true difference is 0."""
    return simulate_aa_differences(np.random.default_rng(int(request.param * 100)), SIMULATED_COMPARISONS, 10, request.param)


@pytest.mark.parametrize("seeds", [3, 5, 10])
def test_the_interval_covers_a_true_zero_95_percent_of_the_time_in_aa_comparisons(aa_differences, seeds):
    """Coverage within [0.94, 0.96] over the simulated comparisons' first `seeds` seeds. A two-level
    bootstrap over seeds and problems covers 83-85% at 3 seeds here (benchmarks/interval_coverage.py);
    an interval too wide to be useful would pass 0.96."""
    covered = [low <= 0 <= high for low, high in map(difference_interval, aa_differences[:, :seeds])]
    assert 0.94 <= np.mean(covered) <= 0.96


def test_the_minimum_detectable_difference_is_the_t_quantiles_times_the_standard_error():
    # 3 seeds: t_{2, 0.975} = 4.303 and t_{2, 0.8} = 1.061 (tables)
    assert minimum_detectable_difference(0.03, 3) == pytest.approx((T_2_DF_975 + 1.0606601717798212) * 0.03 / np.sqrt(3))


def test_seeds_needed_is_the_fewest_whose_detectable_difference_is_small_enough():
    needed = seeds_needed(0.02, 0.03)
    assert minimum_detectable_difference(0.03, needed) <= 0.02 < minimum_detectable_difference(0.03, needed - 1)
    assert seeds_needed(-0.02, 0.03) == needed
    assert seeds_needed(1e-9, 0.03) is None


@pytest.mark.parametrize("shape", [(5,), (0, 3), (2, 0)])
def test_differences_that_are_not_seeds_by_problems_are_refused(shape):
    with pytest.raises(ValueError, match=r"\(seeds, problems\) array"):
        difference_interval(np.zeros(shape))


@pytest.mark.parametrize(("problems", "seeds"), [(30, 2), (91, 2), (30, 3)])
def test_tied_seeds_at_pass_at_16_neither_lose_coverage_nor_call_ties_significant(problems, seeds):
    """pass@16 of 16 samples is 0 or 1 per problem, so seeds tie often (benchmarks/interval_coverage.py,
    heavy-tailed family): coverage at least 0.94 and no interval of width 0 called significant."""
    simulated = simulate_passk_differences(np.random.default_rng(problems + seeds), 3000, seeds, problems, 16, "heavy")
    intervals = [difference_interval(d) for d in simulated]
    assert np.mean([d.mean(axis=1).std(ddof=1) == 0 for d in simulated]) > 0.01  # ties do happen
    assert np.mean([low <= 0 <= high for low, high in intervals]) >= 0.94
    assert not any(low == high and excludes_zero((low, high)) for low, high in intervals)

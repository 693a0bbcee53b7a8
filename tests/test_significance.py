"""The paired bootstrap interval `pacs compare` puts on each method's difference from the baseline."""

from __future__ import annotations

import numpy as np
import pytest

from pacs.eval.significance import excludes_zero, paired_bootstrap_interval


def test_one_seed_of_three_problems_gives_the_hand_computed_interval():
    # Resampling 3 problems of differences (0, 0, 1): the mean is 0, 1/3, 2/3 or 1 with
    # probabilities 8/27, 12/27, 6/27, 1/27. P(mean <= 2/3) = 26/27 = 0.963 >= 0.95, so the 90%
    # interval's upper end is 2/3; P(mean = 0) = 0.296 > 0.05, so its lower end is 0.
    low, high = paired_bootstrap_interval(np.array([[0.0, 0.0, 1.0]]), confidence=0.90)
    assert (low, high) == (0.0, pytest.approx(2 / 3))


def test_seeds_are_resampled_as_well_as_problems():
    # Within each seed every problem agrees, so resampling problems alone would give [1, 1] or
    # [-1, -1]; drawing 2 of the 2 seeds gives a mean of -1, 0 or 1 (1/4, 1/2, 1/4).
    assert paired_bootstrap_interval(np.array([[1.0, 1.0], [-1.0, -1.0]])) == (-1.0, 1.0)


def test_equal_differences_everywhere_give_a_zero_width_interval():
    assert paired_bootstrap_interval(np.full((3, 4), 0.25)) == (0.25, 0.25)


def test_a_consistent_gain_gives_an_interval_that_excludes_zero():
    gains = np.random.default_rng(1).uniform(0.0, 0.2, size=(3, 50))
    interval = paired_bootstrap_interval(gains)
    assert 0 < interval[0] < gains.mean() < interval[1]
    assert excludes_zero(interval)


def test_gains_and_losses_that_cancel_give_an_interval_that_includes_zero():
    differences = np.tile([1.0, -1.0], (3, 25))
    interval = paired_bootstrap_interval(differences)
    assert interval[0] < 0 < interval[1]
    assert not excludes_zero(interval)


def test_the_interval_is_reproducible():
    differences = np.random.default_rng(2).normal(size=(2, 30))
    assert paired_bootstrap_interval(differences) == paired_bootstrap_interval(differences)


@pytest.mark.parametrize("shape", [(5,), (0, 3), (2, 0)])
def test_differences_that_are_not_seeds_by_problems_are_refused(shape):
    with pytest.raises(ValueError, match=r"\(seeds, problems\) array"):
        paired_bootstrap_interval(np.zeros(shape))

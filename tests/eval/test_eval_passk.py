"""Unbiased pass@k = 1 - C(n-c, k) / C(n, k), averaged over problems, without overflow."""

from __future__ import annotations

import math

import pytest

from pacs.eval.passk import mean_pass_at_k, pass_at_k, report_ks


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_matches_the_binomial_formula(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = 1.0 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_large_sample_counts_do_not_overflow():
    value = pass_at_k(1024, 3, 256)
    expected = 1.0 - math.comb(1021, 256) / math.comb(1024, 256)
    assert value == pytest.approx(expected, rel=1e-9)


def test_pass_at_1_is_the_fraction_correct():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


def test_reported_ks_are_powers_of_two_up_to_n_and_n():
    assert report_ks(8) == [1, 2, 4, 8]
    assert report_ks(12) == [1, 2, 4, 8, 12]
    assert report_ks(1) == [1]


def test_mean_over_problems():
    assert mean_pass_at_k([0, 4], 4) == {"pass@1": 0.5, "pass@2": 0.5, "pass@4": 0.5}


def test_invalid_counts_are_rejected():
    with pytest.raises(ValueError, match="num_correct=5"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)

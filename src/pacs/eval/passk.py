"""Unbiased pass@k (Chen et al., 2021): the chance that at least one of k samples, drawn without
replacement from n samples of which c are correct, is correct.

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

The product form never builds a binomial coefficient, so it cannot overflow for n in the
thousands (C(256, 128) alone has 76 digits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k for one problem with `num_correct` of `num_samples` samples correct."""
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"num_correct={num_correct} must lie in [0, num_samples={num_samples}]")
    if not 1 <= k <= num_samples:
        raise ValueError(f"k={k} must lie in [1, num_samples={num_samples}]")
    if num_samples - num_correct < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(num_samples - num_correct + 1, num_samples + 1))


def report_ks(num_samples: int) -> list[int]:
    """The k values reported for n samples: 1, 2, 4, ... up to n, and n itself."""
    ks = [2**p for p in range(num_samples.bit_length()) if 2**p <= num_samples]
    return ks if ks[-1] == num_samples else ks + [num_samples]


def mean_pass_at_k(correct_counts: Sequence[int], num_samples: int) -> dict[str, float]:
    """{"pass@k": mean over problems} for every k in `report_ks(num_samples)`."""
    return {
        f"pass@{k}": sum(pass_at_k(num_samples, c, k) for c in correct_counts) / len(correct_counts)
        for k in report_ks(num_samples)
    }

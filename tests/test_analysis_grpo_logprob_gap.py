"""`coevo_jax.analysis.grpo_logprob_gap`'s summary of one dtype pair's gaps against a direct float64 count."""

import numpy as np
from seeds import fresh_seed

from coevo_jax.analysis.grpo_logprob_gap import gap_row


def test_gap_row_against_a_direct_count():
    rng = np.random.default_rng(fresh_seed())
    gap = rng.normal(scale=0.1, size=501).astype(np.float32)
    gap[:4] = np.log([0.7, 1.3, 0.85, 1.0])  # two ratios the first update would clip, two it would not
    row = gap_row("float32", "bfloat16", gap)
    exact = gap.astype(np.float64)
    magnitudes = np.sort(np.abs(exact))
    assert (row["sample_dtype"], row["compute_dtype"], row["tokens"]) == ("float32", "bfloat16", 501)
    np.testing.assert_allclose(row["mean_abs_gap"], magnitudes.sum() / 501, rtol=1e-12)
    assert row["p99_abs_gap"] == magnitudes[495]  # 0.99 * (501 - 1): an exact rank, no interpolation
    assert row["max_abs_gap"] == magnitudes[-1]
    np.testing.assert_allclose(row["mean_ratio"], np.exp(exact).sum() / 501, rtol=1e-12)
    clipped = sum(1 for g in exact if g < np.log(0.8) or g > np.log(1.28))
    assert clipped >= 2 and row["outside_clip"] == clipped / 501

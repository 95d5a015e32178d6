"""InterCode-SQL's reward (`envs.intercode_sql.reward`): Kendall tau-b and the reward, against references."""

import math

import numpy as np
import pytest
import scipy.stats
from seeds import fresh_seed

from coevo_jax.envs.intercode_sql.reward import intercode_reward, kendall_tau_b


def _tau_reference(x, y) -> float:
    """Kendall's tau-b from its definition over all pairs, in float64."""
    x, y = np.asarray(x), np.asarray(y)
    dx = (x[:, None] < x[None, :]).astype(np.float64) - (x[:, None] > x[None, :])
    dy = (y[:, None] < y[None, :]).astype(np.float64) - (y[:, None] > y[None, :])
    upper = np.triu(np.ones_like(dx, dtype=bool), 1)
    numerator = (dx * dy)[upper].sum()
    nx, ny = (dx != 0)[upper].sum(), (dy != 0)[upper].sum()
    return math.nan if nx == 0 or ny == 0 else numerator / math.sqrt(nx * ny)


@pytest.mark.filterwarnings("ignore:One or more sample arguments is too small")
def test_kendall_tau_b_matches_the_definition_and_scipy_on_random_ranks():
    rng = np.random.default_rng(fresh_seed())
    for _ in range(200):
        n, k = int(rng.integers(0, 60)), int(rng.integers(1, 12))
        x = [f"v{v:02d}" for v in rng.integers(0, k, n)]
        y = [f"v{v:02d}" for v in rng.integers(0, k, n)]
        ours = kendall_tau_b(x, y)
        for expected in (
            _tau_reference(x, y) if n >= 2 else math.nan,
            scipy.stats.kendalltau(x, y).statistic,
        ):
            assert (math.isnan(ours) and math.isnan(expected)) or abs(ours - expected) < 1e-12


def _intercode_reference(agent, gold) -> float:
    """InterCode's get_reward, transcribed with scipy's kendalltau and explicit multiset loops."""
    if not isinstance(agent, list) or not isinstance(gold, list):
        return 0.0
    a, g = [str(r) for r in agent], [str(r) for r in gold]
    keys = set(a) | set(g)
    if not keys:
        return 1.0
    inter = {k: min(a.count(k), g.count(k)) for k in keys}
    reward = sum(inter.values()) / sum(max(a.count(k), g.count(k)) for k in keys)
    if sum(inter.values()) == 0:
        return reward

    def keep(items):
        left, out = dict(inter), []
        for item in items:
            if left.get(item, 0) > 0:
                left[item] -= 1
                out.append(item)
        return out

    tau = scipy.stats.kendalltau(keep(a), keep(g), nan_policy="omit").statistic
    return reward if math.isnan(tau) else float(np.round(tau * reward, 2))


@pytest.mark.filterwarnings("ignore:One or more sample arguments is too small")
def test_intercode_reward_matches_the_reference_on_random_row_lists():
    rng = np.random.default_rng(fresh_seed())
    for _ in range(300):
        pool = [(int(rng.integers(0, 6)), str(rng.choice(["a", "b", "c"]))) for _ in range(8)]
        agent = [pool[i] for i in rng.integers(0, len(pool), int(rng.integers(0, 10)))]
        gold = [pool[i] for i in rng.integers(0, len(pool), int(rng.integers(0, 10)))]
        assert intercode_reward(agent, gold) == pytest.approx(_intercode_reference(agent, gold), abs=1e-12)


def test_intercode_reward_cases():
    rows = [(1, "x"), (2, "y"), (3, "z")]
    assert intercode_reward([], []) == 1.0
    assert intercode_reward("Error executing query: boom", rows) == 0.0
    assert intercode_reward(None, rows) == 0.0
    assert intercode_reward(rows, rows) == 1.0
    assert intercode_reward(rows[::-1], rows) == -1.0  # InterCode's own value; the environment clamps it
    assert intercode_reward(rows[:2], rows) == 0.67  # IoU 2/3 times tau 1, rounded as InterCode does
    assert intercode_reward([rows[0]], rows) == pytest.approx(1 / 3)  # tau undefined: IoU unrounded
    assert intercode_reward([(1, "x"), (1, "x")], [(1, "x")]) == 0.5

"""InterCode-SQL's reward: intersection over union of result rows, scaled by Kendall's tau of their order.

InterCode (`intercode/envs/sql/sql_env.py`, `get_reward`) scores a submission by the rows of the agent's last
query against the rows of the gold query:

1. both outputs must be row lists (an error message or a statement without rows scores 0);
2. rows are compared as their `str()`, as multisets: IoU = sum of min counts / sum of max counts, and two
   empty outputs score 1;
3. when the two share a row, the rows of the intersection are taken in each side's order and the IoU is
   multiplied by Kendall's tau-b between the two sequences (rows ranked by their string), rounded to 2
   decimals; a tau that is undefined (one shared row, or all tied) leaves the IoU unscaled.

Note that step 3 applies whether or not the gold query has an ORDER BY: a right answer in another order
scores less than 1. A tau below 0 (reversed order) would make InterCode's reward negative; `intercode_reward`
returns it as is and the environment clamps its score to [0, 1].
"""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

import numpy as np


def _dense_ranks(values: Sequence[str]) -> np.ndarray:
    """Rank of each value among the distinct values (0-based, equal values share a rank)."""
    order = sorted(set(values))
    index = {v: i for i, v in enumerate(order)}
    return np.array([index[v] for v in values], dtype=np.int64)


def _tie_pairs(ranks: np.ndarray) -> int:
    counts = np.bincount(ranks)
    return int((counts * (counts - 1) // 2).sum())


def _discordant_pairs(x: np.ndarray, y: np.ndarray) -> int:
    """Pairs i < j with x_i < x_j and y_i > y_j, in O(n log n) (a Fenwick tree over y's ranks)."""
    order = np.lexsort((y, x))  # by x, ties in x by y: tied-x pairs are then never counted
    y_sorted = y[order]
    size = int(y.max()) + 2 if len(y) else 1
    tree = [0] * size
    discordant = 0
    for seen, value in enumerate(y_sorted.tolist()):
        # how many earlier values are <= value
        i, not_greater = value + 1, 0
        while i > 0:
            not_greater += tree[i]
            i -= i & -i
        discordant += seen - not_greater
        i = value + 1
        while i < size:
            tree[i] += 1
            i += i & -i
    return discordant


def kendall_tau_b(x: Sequence[str], y: Sequence[str]) -> float:
    """Kendall's tau-b of two equally long sequences ranked by value; NaN when undefined."""
    if len(x) != len(y):
        raise ValueError(f"sequences of different lengths: {len(x)} and {len(y)}")
    n = len(x)
    if n < 2:
        return math.nan
    rx, ry = _dense_ranks(x), _dense_ranks(y)
    total = n * (n - 1) // 2
    x_ties, y_ties = _tie_pairs(rx), _tie_pairs(ry)
    joint = collections.Counter(zip(rx.tolist(), ry.tolist(), strict=True))
    both_ties = sum(c * (c - 1) // 2 for c in joint.values())
    if total == x_ties or total == y_ties:
        return math.nan
    concordant_minus_discordant = total - x_ties - y_ties + both_ties - 2 * _discordant_pairs(rx, ry)
    return concordant_minus_discordant / math.sqrt(total - x_ties) / math.sqrt(total - y_ties)


def _intersection_in_order(items: list[str], shared: collections.Counter) -> list[str]:
    remaining, kept = shared.copy(), []
    for item in items:
        if remaining[item] > 0:
            remaining[item] -= 1
            kept.append(item)
    return kept


def intercode_reward(agent_rows: object, gold_rows: object) -> float:
    """InterCode's reward of `agent_rows` (the last query's output) against the gold query's output."""
    if not isinstance(agent_rows, list) or not isinstance(gold_rows, list):
        return 0.0
    agent = [str(row) for row in agent_rows]
    gold = [str(row) for row in gold_rows]
    agent_counts, gold_counts = collections.Counter(agent), collections.Counter(gold)
    shared = agent_counts & gold_counts
    union = agent_counts | gold_counts
    if not union:
        return 1.0
    reward = sum(shared.values()) / sum(union.values())
    if shared:
        tau = kendall_tau_b(_intersection_in_order(agent, shared), _intersection_in_order(gold, shared))
        if not math.isnan(tau):
            reward = float(np.round(np.float64(tau) * reward, 2))
    return reward

"""How many hard negatives the pair phases of runs trained on, at several reward thresholds.

    python -m coevo_jax.analysis hard_negatives WORKDIR [WORKDIR ...] [--thresholds 0.6 0.7 0.8]

A pair's rejected side is a hard negative when its reward is at least the threshold: 0.6 in the paper, 0.7 its
"super-hard" open question. The threshold enters no loss (eq. 6-9 pair every two trajectories of a task with
different rewards), so a run at another threshold trains on exactly the same pairs: what it changes is which of
them are counted, and this counts them again from each run's own pairs (rebuilt from its explorations as the
export does, `experiment.run_data.pair_splits`), by method and agent, summed over iterations; with several
workdirs (seeds) the mean and standard deviation over them.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence

from coevo_jax.data.pair_pool import PreferencePair
from coevo_jax.experiment import run_data
from coevo_jax.experiment.config import METHOD_TITLES
from coevo_jax.experiment.reuse import policy_family
from coevo_jax.reporting.results import agent_label
from coevo_jax.reporting.tables import mean_std_cell

DEFAULT_THRESHOLDS = (0.6, 0.7, 0.8)
SUCCESS = 1.0  # a trajectory is a failure below it (the paper's r < 1)


def threshold_counts(pairs: Iterable[PreferencePair], thresholds: Sequence[float]) -> dict:
    """Pairs, failure pairs (both sides failed, r < 1: eq. 6's across agents, within one agent, dead groups'),
    and per threshold the pairs whose rejected reward reaches it (all pairs, and failure pairs only)."""
    pairs = list(pairs)
    failure_pairs = [p for p in pairs if p.chosen.reward < SUCCESS]
    hard = lambda group, t: sum(p.rejected.reward >= t for p in group)  # noqa: E731
    return {
        "pairs": len(pairs),
        "failure_pairs": len(failure_pairs),
        "hard": {t: hard(pairs, t) for t in thresholds},
        "hard_failure_pairs": {t: hard(failure_pairs, t) for t in thresholds},
    }


def _phase_key(policy: str) -> str:
    """'CoEvolving target' for `coevo_it2_target`: the method and agent a pair phase trained, as the report
    names them."""
    family = policy_family(policy)
    return agent_label(METHOD_TITLES.get(family, family), policy.rsplit("_", 1)[-1])


def run_counts(workdir: str, thresholds: Sequence[float]) -> dict[str, dict]:
    """`threshold_counts` of one run's pairs by method and agent, summed over its iterations."""
    grouped: dict[str, list[PreferencePair]] = defaultdict(list)
    for policy, split in run_data.pair_splits(workdir).items():
        grouped[_phase_key(policy)].extend(split.dataset.pairs)
    return {key: threshold_counts(pairs, thresholds) for key, pairs in sorted(grouped.items())}


def table(runs: Sequence[dict[str, dict]], thresholds: Sequence[float]) -> str:
    """A markdown table: per method and agent, pairs and hard negatives at each threshold, mean ± std over
    runs (a method missing from a run counts as absent there, not as zero)."""
    head = ["policy", "runs", "pairs", "failure pairs"]
    head += [f"rejected ≥ {t:g}" for t in thresholds]
    head += [f"failure pairs, rejected ≥ {t:g}" for t in thresholds]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for key in sorted({k for run in runs for k in run}):
        present = [run[key] for run in runs if key in run]
        cells = [key, str(len(present)), mean_std_cell([r["pairs"] for r in present])]
        cells.append(mean_std_cell([r["failure_pairs"] for r in present]))
        cells += [mean_std_cell([r["hard"][t] for r in present]) for t in thresholds]
        cells += [mean_std_cell([r["hard_failure_pairs"][t] for r in present]) for t in thresholds]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coevo_jax.analysis hard_negatives", description=__doc__.split("\n")[0]
    )
    parser.add_argument("workdirs", nargs="+", help="runs' workdirs (e.g. one per seed)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS))
    args = parser.parse_args(argv)
    try:
        runs = [run_counts(workdir, args.thresholds) for workdir in args.workdirs]
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(table(runs, args.thresholds))
    return 0

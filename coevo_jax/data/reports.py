"""What a built preference dataset contains: counts by pair type, hard negatives, and rejected-reward histogram.

`DatasetReport` is the small JSON-serialisable summary every pair builder returns with its pairs; its
histogram of rejected-side rewards (one count per pair, fixed bins over [0, 1]) is what the paper's Figure 2
compares between ETO and co-evolution.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

HISTOGRAM_BINS = 10


def reward_bin(reward: float, num_bins: int = HISTOGRAM_BINS) -> int:
    """Bin k holds [k/num_bins, (k+1)/num_bins); the last bin also holds 1.0. Exact at the edges (0.6 -> 6)."""
    return min(math.floor(round(reward * num_bins, 9)), num_bins - 1)


def reward_histogram(rewards: Iterable[float], num_bins: int = HISTOGRAM_BINS) -> tuple[int, ...]:
    counts = [0] * num_bins
    for reward in rewards:
        counts[reward_bin(reward, num_bins)] += 1
    return tuple(counts)


@dataclass(frozen=True)
class DatasetReport:
    """Counts describing one built dataset (after deduplication, tie skipping and the per-task cap)."""

    name: str
    num_pairs: int
    pairs_by_kind: Mapping[str, int]
    num_hard_negatives: int
    hard_negative_threshold: float
    duplicates_removed: Mapping[str, int]  # per input pool (expert / target / failure agent ...)
    ties_skipped: int  # candidate pairs with equal rewards
    identical_skipped: int  # candidate pairs whose two sides have the same messages
    dropped_by_cap: int  # pairs removed by max_pairs_per_task
    rejected_reward_histogram: tuple[int, ...]
    histogram_edges: tuple[float, ...]

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["pairs_by_kind"] = dict(self.pairs_by_kind)
        out["duplicates_removed"] = dict(self.duplicates_removed)
        out["rejected_reward_histogram"] = list(self.rejected_reward_histogram)
        out["histogram_edges"] = list(self.histogram_edges)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> DatasetReport:
        """The report `to_dict` gave (a stage record's `dataset`, a TFDS pair split's saved report)."""
        return cls(
            **{
                **data,
                "rejected_reward_histogram": tuple(data["rejected_reward_histogram"]),
                "histogram_edges": tuple(data["histogram_edges"]),
            }
        )


def dataset_report(
    name: str,
    pairs: Sequence,
    *,
    hard_negative_threshold: float,
    duplicates_removed: Mapping[str, int],
    ties_skipped: int,
    identical_skipped: int,
    dropped_by_cap: int,
    num_bins: int = HISTOGRAM_BINS,
) -> DatasetReport:
    """Summarise `pairs` (objects with `kind`, `hard_negative` and `rejected.reward`)."""
    return DatasetReport(
        name=name,
        num_pairs=len(pairs),
        pairs_by_kind=dict(sorted(Counter(p.kind for p in pairs).items())),
        num_hard_negatives=sum(p.hard_negative for p in pairs),
        hard_negative_threshold=hard_negative_threshold,
        duplicates_removed=dict(sorted(duplicates_removed.items())),
        ties_skipped=ties_skipped,
        identical_skipped=identical_skipped,
        dropped_by_cap=dropped_by_cap,
        rejected_reward_histogram=reward_histogram((p.rejected.reward for p in pairs), num_bins),
        histogram_edges=tuple(k / num_bins for k in range(num_bins + 1)),
    )

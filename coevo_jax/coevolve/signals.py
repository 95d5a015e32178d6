"""CoEvolve's weakness signals (paper section 3.1): forgetting, boundary and rare, pure functions of rollouts.

Rollouts are the project's `Trajectory` records; a rollout's training step is its `iteration` (the main job
writes the step that sampled it), and records without one are refused. A task's *score at a step* is the mean
reward of its rollouts at that step (its one reward when K = 1): the paper's task-level score s. Each signal
is one `Signal` per (task, step) that carries the rollouts it marks; a rollout may be marked by several.

* Forgetting: the task's score now is < 0.5 while one of its previous `window` scores is >= 0.5 (the paper's
  H_recent = {s_{t-W+1}, ..., s_t} with s_now = s_t, read as the W scores before the current one, so that
  W = 1 means "it succeeded last time"). The window counts the task's own visits, not training steps. Marked:
  the rollouts of the current step that score < 0.5.
* Boundary: the task's K rollouts in one step hold a reward > 0.5 and one < 0.5 (all K marked).
* Rare: a pattern p (`patterns`) with count c_p > 0 and c_p / N < theta / 100, once N >= n_min: c_p counts
  the rollouts whose pattern set holds p and N the rollouts seen (with a pattern set a trajectory, dividing by
  all occurrences would let long trajectories dilute every share). Counts accumulate over training, this
  step's rollouts included. Marked: the step's rollouts of the task that show a rare pattern, rarest first.
The paper gives theta = 5 as an example and leaves W and n_min open; the defaults say why theirs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from coevo_jax.data.records import Trajectory

SIGNAL_KINDS = ("forgetting", "boundary", "rare")
# A success within the task's last three visits: one noisy visit ago still counts, and with signals every
# F = 10 steps three visits reach back about one or two rounds, so the success was a recent policy's.
DEFAULT_WINDOW = 3
DEFAULT_THETA = 5.0  # the paper's example
# At N = 200 a share near the 5 % cut is known to +-1.5 points (sqrt(0.05 * 0.95 / 200)); with fewer a 5 % cut
# mostly flags what happened not to come up yet. What it flags per environment: studies/coevolve/README.md.
DEFAULT_MIN_SEEN = 200
SUCCESS = 0.5  # the paper's threshold between success and failure


@dataclasses.dataclass(frozen=True)
class Signal:
    """One signal: its kind, the task and step it fired at, the rollouts it marks, and why."""

    kind: str
    task_id: str
    step: int
    trajectories: tuple[Trajectory, ...]
    patterns: tuple[str, ...] = ()  # rare: the rare patterns the marked rollouts show, rarest first
    detail: str = ""

    @property
    def evidence(self) -> Trajectory:
        """The rollout to reflect on: the lowest-scoring one marked (the first of the rarest for rare)."""
        return min(self.trajectories, key=lambda t: t.reward)

    def to_json(self) -> dict:
        """Everything but the rollouts' text (their ids instead)."""
        return {
            "kind": self.kind,
            "task_id": self.task_id,
            "step": self.step,
            "trajectories": [t.traj_id for t in self.trajectories],
            "patterns": list(self.patterns),
            "detail": self.detail,
        }


@dataclasses.dataclass(frozen=True)
class SignalMemory:
    """What the signals remember between rounds: each task's last W scores and the rare counts."""

    scores: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    pattern_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
    seen: int = 0  # N: rollouts whose patterns were counted

    def to_json(self) -> dict:
        return {
            "scores": {k: list(v) for k, v in sorted(self.scores.items())},
            "pattern_counts": dict(sorted(self.pattern_counts.items())),
            "seen": self.seen,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> SignalMemory:
        return cls(
            {k: tuple(float(s) for s in v) for k, v in data.get("scores", {}).items()},
            {k: int(v) for k, v in data.get("pattern_counts", {}).items()},
            int(data.get("seen", 0)),
        )


def steps_of(records: Iterable[Trajectory]) -> list[tuple[int, list[Trajectory]]]:
    """The rollouts grouped by training step (their `iteration`), steps in order, rollouts in record order."""
    by_step: dict[int, list[Trajectory]] = {}
    for trajectory in records:
        if trajectory.iteration is None:
            raise ValueError(
                f"rollout {trajectory.traj_id}: no iteration; signals need the training step of each rollout"
            )
        by_step.setdefault(trajectory.iteration, []).append(trajectory)
    return sorted(by_step.items())


def by_task(trajectories: Iterable[Trajectory]) -> dict[str, list[Trajectory]]:
    """Rollouts grouped by task, tasks in first-seen order."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.task_id, []).append(trajectory)
    return groups


def task_score(trajectories: Sequence[Trajectory]) -> float:
    """The task-level score at one step: the mean reward of its rollouts there."""
    return sum(t.reward for t in trajectories) / len(trajectories)


def forgetting_signals(
    records: Iterable[Trajectory],
    scores: Mapping[str, Sequence[float]] | None = None,
    window: int = DEFAULT_WINDOW,
) -> tuple[list[Signal], dict[str, tuple[float, ...]]]:
    """Forgetting signals of `records`, after the earlier scores `scores` (task -> oldest first); also the
    scores to carry on (each task's last `window`)."""
    if window < 1:
        raise ValueError(f"forgetting window must be >= 1, got {window}")
    history = {task: tuple(s)[-window:] for task, s in (scores or {}).items()}
    signals = []
    for step, trajectories in steps_of(records):
        for task_id, group in by_task(trajectories).items():
            now, recent = task_score(group), history.get(task_id, ())
            if now < SUCCESS and any(s >= SUCCESS for s in recent):
                failed = tuple(t for t in group if t.reward < SUCCESS)
                detail = f"score {now:.2f} after {', '.join(f'{s:.2f}' for s in recent)}"
                signals.append(Signal("forgetting", task_id, step, failed, detail=detail))
            history[task_id] = (*recent, now)[-window:]
    return signals, history


def boundary_signals(records: Iterable[Trajectory]) -> list[Signal]:
    """Boundary signals: tasks whose rollouts in one step hold a reward > 0.5 and one < 0.5."""
    signals = []
    for step, trajectories in steps_of(records):
        for task_id, group in by_task(trajectories).items():
            rewards = [t.reward for t in group]
            if max(rewards) > SUCCESS and min(rewards) < SUCCESS:
                detail = f"rewards {', '.join(f'{r:.2f}' for r in rewards)}"
                signals.append(Signal("boundary", task_id, step, tuple(group), detail=detail))
    return signals


def rare_signals(
    records: Iterable[Trajectory],
    patterns_of: Callable[[Trajectory], frozenset[str]],
    counts: Mapping[str, int] | None = None,
    seen: int = 0,
    theta: float = DEFAULT_THETA,
    min_seen: int = DEFAULT_MIN_SEEN,
) -> tuple[list[Signal], dict[str, int], int]:
    """Rare signals of `records` after the counts so far (`counts`, `seen`); also the updated counts."""
    if not 0 < theta < 100:
        raise ValueError(f"rare threshold theta must be in (0, 100), got {theta}")
    counts, signals = Counter(counts or {}), []
    for step, trajectories in steps_of(records):
        found = [(t, patterns_of(t)) for t in trajectories]
        for _, patterns in found:
            counts.update(patterns)
        seen += len(found)
        if seen < min_seen:
            continue
        rare = {p for p, c in counts.items() if 0 < c and c / seen < theta / 100}
        shown_by_task: dict[str, set[str]] = {}
        for trajectory, patterns in found:
            if patterns & rare:
                shown_by_task.setdefault(trajectory.task_id, set()).update(patterns & rare)
        for task_id, shown in shown_by_task.items():
            marked = tuple(t for t, patterns in found if t.task_id == task_id and patterns & rare)
            ordered = tuple(sorted(shown, key=lambda p: (counts[p], p)))
            detail = ", ".join(f"{p} {counts[p]}/{seen}" for p in ordered)
            signals.append(Signal("rare", task_id, step, marked, patterns=ordered, detail=detail))
    return signals, dict(counts), seen


def detect(
    records: Sequence[Trajectory],
    memory: SignalMemory,
    patterns_of: Callable[[Trajectory], frozenset[str]],
    *,
    kinds: Sequence[str] = SIGNAL_KINDS,
    window: int = DEFAULT_WINDOW,
    theta: float = DEFAULT_THETA,
    min_seen: int = DEFAULT_MIN_SEEN,
) -> tuple[list[Signal], SignalMemory]:
    """The signals of `kinds` in `records` after `memory`, and the memory to carry on. Memory is updated
    whatever `kinds` holds, so that switching a signal off (an ablation) changes nothing else."""
    unknown = set(kinds) - set(SIGNAL_KINDS)
    if unknown:
        raise ValueError(f"unknown signal kinds {sorted(unknown)}; kinds: {SIGNAL_KINDS}")
    forgetting, scores = forgetting_signals(records, memory.scores, window)
    rare, counts, seen = rare_signals(
        records, patterns_of, memory.pattern_counts, memory.seen, theta, min_seen
    )
    found = {"forgetting": forgetting, "boundary": boundary_signals(records), "rare": rare}
    signals = [s for kind in SIGNAL_KINDS if kind in kinds for s in found[kind]]
    return signals, SignalMemory(scores, counts, seen)

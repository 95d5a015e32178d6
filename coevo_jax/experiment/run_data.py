"""A run's data as named splits: its trajectories, stage by stage, and the pairs each DPO phase trained on.

What `python -m coevo_jax.experiment.export` publishes, read from a workdir (`config.json`, `stages.json`,
`experts.jsonl`, `rollouts/`) and nothing written there. Only finished stages count (those with a record in
`stages.json`, GRPO steps listed in their `history.json`), so a partial run gives what it has finished; a
record file with a bad record is refused with a `DataFormatError` naming the file and the record.

Trajectory splits (`trajectory_splits`), named after what wrote them:
* `experts`: the run's `experts.jsonl`, the trajectories its SFT phases cloned and its pairs used;
* `explore_<policy>_it<k>[_x<n>]`: exploration stage `explore/<policy>/it<k>[_x<n>]` (sampled, train tasks);
* `eval_<policy>_<split>`: evaluation stage `eval/<policy>/<split>` (greedy, one episode per task);
* `explore_<method>_step<n>`: GRPO step n of method `grpo` or a CoEvolve method.

Pair splits (`pair_splits`) are named after the policy their phase trained (`eto_it1_target`,
`coevo_it2_failure`: stage `train/<policy>`). They are rebuilt here from the explorations, so that runs from
before the job kept a phase's pairs (`pairs/<policy>.jsonl`) export too, by replaying the run's own method code
(`experiment.methods.METHOD_RUNNERS`, the CoEvolve methods aside: they train no pairs) on a `Stages` whose
store answers from the stage records: `Stages.explore` reads each exploration as the job read it, and each
phase's pairs come from the method's own builder call (the same function, the same arguments); nothing is
played or trained. A rebuilt set whose report differs from the recorded one is refused (ValueError naming
`stages.json` and the stage), so the published pairs are those the phase trained on.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import types

from coevo_jax.data.pair_pool import PreferenceDataset
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Trajectory
from coevo_jax.experiment.config import COEVOLVE_METHODS, ExperimentConfig
from coevo_jax.experiment.experts import EXPERTS_FILE
from coevo_jax.experiment.grpo import rollout_file
from coevo_jax.experiment.methods import METHOD_RUNNERS
from coevo_jax.experiment.stages import ROLLOUTS_DIR, Stages, stage_outputs
from coevo_jax.experiment.store import CONFIG_FILE, STAGES_FILE, read_json

EXPERTS_SPLIT = "experts"


@dataclasses.dataclass(frozen=True)
class TrajectorySplit:
    """One trajectory split: the workdir-relative file it was read from, and its trajectories in file order."""

    source: str
    trajectories: list[Trajectory]


@dataclasses.dataclass(frozen=True)
class PairSplit:
    """One pair split: the training stage that trained on it, and its pairs with their report."""

    stage: str
    dataset: PreferenceDataset


def split_name(name: str) -> str:
    """A stage or policy name as a TFDS split name: every character but letters, digits and '_' -> '_'."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def _add(splits: dict, name: str, value) -> None:
    split = split_name(name)
    if split in splits:
        raise ValueError(f"{name}: its split name {split!r} is taken by another split")
    splits[split] = value


def read_run(workdir: str) -> tuple[ExperimentConfig, dict]:
    """The run's config (as the job reads it: fields it lacks at their defaults) and its stage records.
    FileNotFoundError naming what is missing from a directory that is not a started run's workdir."""
    for name in (CONFIG_FILE, STAGES_FILE):
        if not os.path.isfile(os.path.join(workdir, name)):
            raise FileNotFoundError(f"{os.path.join(workdir, name)}: missing; not a started run's workdir")
    config = ExperimentConfig.from_mapping(read_json(os.path.join(workdir, CONFIG_FILE)))
    return config, read_json(os.path.join(workdir, STAGES_FILE))


def trajectory_splits(workdir: str) -> dict[str, TrajectorySplit]:
    """The run's finished trajectory files as splits (see the module docstring): the experts, the stages'
    files in the order the stages finished, then the GRPO steps'."""
    config, records = read_run(workdir)
    files = [(EXPERTS_SPLIT, EXPERTS_FILE)] if os.path.isfile(os.path.join(workdir, EXPERTS_FILE)) else []
    for stage in records:
        if stage.startswith(("explore/", "eval/")):
            files.append((stage, stage_outputs(stage)[1]))
    for method in config.methods:
        history = os.path.join(workdir, method, "history.json")
        if os.path.isfile(history):  # GRPO's (`experiment.grpo`): a record per finished step
            for step in sorted({int(record["step"]) for record in read_json(history)}):
                files.append((f"explore/{method}/step{step}", f"{ROLLOUTS_DIR}/{rollout_file(method, step)}"))
    splits: dict[str, TrajectorySplit] = {}
    for name, path in files:
        _add(splits, name, TrajectorySplit(path, read_trajectories(os.path.join(workdir, path))))
    return splits


def unfinished_files(workdir: str, exported: set[str]) -> list[str]:
    """The workdir's rollout files (workdir-relative) not among `exported`: rollouts of unfinished stages,
    a pending evaluation's joint file, the per-process parts of an unmerged rollout."""
    found = glob.glob(os.path.join(workdir, ROLLOUTS_DIR + "*", "**", "*.jsonl"), recursive=True)
    return sorted(p for p in (os.path.relpath(f, workdir) for f in found) if p not in exported)


class _Unfinished(Exception):
    """A stage the run has not finished: the replay of its method stops there."""


class _RecordedStore:
    """A read-only `RunStore` stand-in: the records of finished stages, `_Unfinished` for any other."""

    def __init__(self, workdir: str, records: dict):
        self.workdir, self._records = workdir, records

    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    def has_stage(self, name: str) -> bool:
        return name in self._records

    def stage(self, name: str, run) -> dict:
        if name not in self._records:
            raise _Unfinished(name)
        return self._records[name]


class _Replay(Stages):
    """`Stages` over a run's records: finished stages give their records, and each pair phase's pairs are
    built by the method's own `make_pairs`, checked against the phase's recorded report and kept."""

    def __init__(self, config: ExperimentConfig, store: _RecordedStore, experts: list[Trajectory]):
        # all a replay reads of the policy set-up; it replays one stage at a time
        setup = types.SimpleNamespace(cfg=config, concurrent_agents=False)
        super().__init__(setup, store, None, experts, train_tasks=(), eval_tasks={})
        self.pair_splits: dict[str, PairSplit] = {}

    def train_pairs(self, name, start, make_pairs, *, kind, iteration):
        name, record = super().train_pairs(name, start, make_pairs, kind=kind, iteration=iteration)
        stage, dataset = f"train/{name}", make_pairs()
        rebuilt = json.loads(json.dumps(dataset.report.to_dict()))
        recorded = record.get("dataset")
        if rebuilt != recorded:
            where = os.path.join(self.store.workdir, STAGES_FILE)
            if recorded is None:
                raise ValueError(f"{where}: {stage}: no pair report recorded; its pairs cannot be checked")
            differ = {k: (recorded.get(k), rebuilt[k]) for k in rebuilt if recorded.get(k) != rebuilt[k]}
            raise ValueError(
                f"{where}: {stage}: the pairs rebuilt from the explorations are not those the phase "
                f"trained on ((recorded, rebuilt): {differ})"
            )
        _add(self.pair_splits, name, PairSplit(stage, dataset))
        return name, record


def pair_splits(workdir: str) -> dict[str, PairSplit]:
    """The pairs of every finished DPO phase, by the policy it trained (see the module docstring)."""
    config, records = read_run(workdir)
    experts_path = os.path.join(workdir, EXPERTS_FILE)
    if not any(stage.startswith("explore/") for stage in records):
        return {}  # no phase can have trained on pairs (and the experts may not be saved yet)
    replay = _Replay(config, _RecordedStore(workdir, records), read_trajectories(experts_path))
    for method in config.methods:
        if method not in COEVOLVE_METHODS:
            try:
                METHOD_RUNNERS[method](replay, config.iterations, lambda entry: None)
            except _Unfinished:
                pass  # the method's later phases are not done: what it finished is kept
    return replay.pair_splits

"""The resumable building blocks every method is made of: base SFT, explore, evaluate, train a phase.

Policies are named (`sft_target`, `eto_it2_target`, `coevo_it1_failure`, ...) and saved in the workdir;
stages are keyed by what they compute, so methods share them: every method's iteration 0 is the SFT
target's evaluation, and at iteration 1 ETO and co-evolution explore with the same SFT policies and the
same sampling seed, so those episodes are played once. A pair phase keeps the pairs it trained on in
`pairs/<policy>.jsonl` (`save_pairs`), for the HTML report's pair browser.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Sequence

from coevo_jax.atomic_files import atomic_path
from coevo_jax.data.formats import pair_to_record
from coevo_jax.data.pair_pool import PreferenceDataset, PreferencePair
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment
from coevo_jax.experiment import grpo, phases, processes, rollouts
from coevo_jax.experiment.agent_pairs import run_pair
from coevo_jax.experiment.policy import PolicySetup
from coevo_jax.experiment.store import POLICIES_DIR, RunStore
from coevo_jax.train import StepKind

log = logging.getLogger(__name__)

SEEDS = {"target": 0, "failure": 1}  # the two base policies differ by initialisation / data-order seed
SFT_TARGET = "sft_target"
BASE = "base"  # the starting parameters, untrained: the checkpoint's (a scratch model's: the target's init)
ROLLOUTS_DIR = "rollouts"
PAIRS_DIR = "pairs"


def explore_file(policy: str, iteration: int, suffix: str = "") -> str:
    """The workdir-relative rollout file of stage `explore/<policy>/it<iteration><suffix>`."""
    return f"{ROLLOUTS_DIR}/{policy}_it{iteration}{suffix}_explore.jsonl"


def eval_file(policy: str, split: str) -> str:
    """The workdir-relative rollout file of stage `eval/<policy>/<split>`."""
    return f"{ROLLOUTS_DIR}/{policy}_{split}.jsonl"


def joint_eval_file(policy: str) -> str:
    """The workdir-relative rollout file `Stages.evaluate` plays every pending split into (removed once each
    split has its own file and stage record)."""
    return f"{ROLLOUTS_DIR}/{policy}.eval_splits.jsonl"


def pairs_file(policy: str) -> str:
    """The workdir-relative file of the pairs that stage `train/<policy>` (a pair phase) trained on."""
    return f"{PAIRS_DIR}/{policy}.jsonl"


def save_pairs(
    path: str, pairs: Sequence[PreferencePair], reference_logps: Sequence[tuple[float, float] | None] | None
) -> None:
    """Writes a phase's pairs to `path` (atomically): one `formats.pair_to_record` line per pair, in the
    phase's order, without the sides' token traces, and with `reference_logps` [chosen, rejected], the
    reference policy's log-probs the phase computed for it, where it has them (`phases.kept_reference_logps`)."""
    reference = list(reference_logps) if reference_logps is not None else [None] * len(pairs)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as file:
        for pair, logps in zip(pairs, reference, strict=True):
            sides = {
                side: dataclasses.replace(getattr(pair, side), tokens=None) for side in ("chosen", "rejected")
            }
            record = pair_to_record(dataclasses.replace(pair, **sides))
            if logps is not None:
                record["reference_logps"] = list(logps)
            file.write(json.dumps(record, ensure_ascii=False) + "\n")


def stage_outputs(stage: str) -> tuple[str, str]:
    """(policy, workdir-relative output path) of a stage named by `Stages`: a `train/` stage's saved policy
    directory, an `explore/` or `eval/` stage's rollout file. ValueError for any other name."""
    kind, _, rest = stage.partition("/")
    if kind == "train" and rest and "/" not in rest:
        return rest, f"{POLICIES_DIR}/{rest}"
    policy, _, tail = rest.partition("/")
    if kind == "eval" and policy and tail and "/" not in tail:
        return policy, eval_file(policy, tail)
    match = re.fullmatch(r"it(\d+)((?:_x\d+)?)", tail)
    if kind == "explore" and policy and match:
        return policy, explore_file(policy, int(match.group(1)), match.group(2))
    raise ValueError(f"{stage!r} is not a train/, explore/ or eval/ stage name")


class Stages:
    """Named, resumable stages over one workdir (see the module docstring)."""

    def __init__(
        self,
        setup: PolicySetup,
        store: RunStore,
        env_factory: Callable[[], Environment],
        experts: Sequence[Trajectory],
        train_tasks: Sequence[str],
        eval_tasks: dict[str, list[str]],
        on_scalars: Callable[[str, int, dict], None] = lambda tag, step, values: None,
    ):
        self.setup, self.store, self.env_factory = setup, store, env_factory
        self.experts, self.train_tasks, self.eval_tasks = list(experts), list(train_tasks), eval_tasks
        self.on_scalars = on_scalars
        self.seed = setup.cfg.seed
        self._loaded: dict[str, dict] = {}
        self._sft_failed: dict[int, frozenset[str]] = {}  # repeat -> train tasks SFT failed at iteration 1
        self._log_lock = threading.Lock()

    def pair(self, first: Callable, second: Callable) -> tuple:
        """(first(), second()) for two independent stages, side by side where the run allows it
        (`experiment.agent_pairs`)."""
        return run_pair(first, second, concurrent=self.setup.concurrent_agents)

    # --- policies ------------------------------------------------------------------------------------------

    def params(self, name: str) -> dict:
        """The saved policy `name`, or for `BASE` the target agent's starting parameters, never saved (kept
        in memory while it is the latest one asked for)."""
        loaded = self._loaded  # one read: the other agent's stage may replace it meanwhile
        if name in loaded:
            return loaded[name]
        if name == BASE:
            params = self.setup.base_params(self.seed * 2 + SEEDS["target"])
        else:
            saved = self.store.load_policy(name, self.setup.abstract_params, base=self.setup.base_fingerprint)
            params = self.setup.policy(saved)
        self._loaded = {name: params}
        return params

    def _keep(self, name: str, params: dict) -> None:
        self.store.save_policy(name, self.setup.trainable(params), base=self.setup.base_fingerprint)
        self._loaded = {name: params}

    def base_sft(self, agent: str) -> str:
        """Behavioural cloning of the experts from the agent's own seed (eq. 3/5); returns 'sft_<agent>'."""
        name = f"sft_{agent}"

        def run():
            seed = self.seed * 2 + SEEDS[agent]
            params, summary = phases.sft_phase(
                self.setup, self.store, f"train/{name}", self.setup.base_params(seed), self.experts, seed=seed
            )
            self._keep(name, params)
            self.store.clear_scratch(f"train/{name}")
            return summary

        self._log_train(name, self.store.stage(f"train/{name}", run))
        return name

    def base_sfts(self) -> tuple[str, str]:
        """`base_sft` of the target and of the failure agent: ('sft_target', 'sft_failure')."""
        return self.pair(lambda: self.base_sft("target"), lambda: self.base_sft("failure"))

    # --- episodes ------------------------------------------------------------------------------------------

    def explore(self, policy: str, iteration: int, *, repeat: int = 1) -> tuple[list[Trajectory], dict]:
        """Sampled episodes of `policy` on the train tasks at `iteration` (trajectories, summary).

        Each task is played `repeat` x `rollout.samples_per_task` times. The summary also covers, under
        `on_sft_failed_tasks`, only the train tasks the SFT target policy failed when it explored them at
        iteration 1 (with the same `repeat`): the tasks of the paper's Figure 2.
        """
        trajectories, summary = self._explore(policy, iteration, repeat)
        if repeat not in self._sft_failed:  # read the SFT exploration once per repeat, not every call
            if (policy, iteration) == (SFT_TARGET, 1):
                baseline = trajectories
            else:
                baseline = self._explore(SFT_TARGET, 1, repeat)[0]
            self._sft_failed[repeat] = frozenset(t.task_id for t in baseline if t.reward < 1.0)
        failed = self._sft_failed[repeat]
        on_failed = rollouts.summarize([t for t in trajectories if t.task_id in failed])
        return trajectories, {**summary, "on_sft_failed_tasks": on_failed}

    def explore_pair(self, first: str, second: str, iteration: int) -> tuple[tuple, tuple]:
        """`explore` of two policies at `iteration`: their episodes are played side by side
        (`pair`), then each is summarised as `explore` summarises it."""
        self.pair(lambda: self._explore(first, iteration, 1), lambda: self._explore(second, iteration, 1))
        return self.explore(first, iteration), self.explore(second, iteration)

    def _explore(self, policy: str, iteration: int, repeat: int) -> tuple[list[Trajectory], dict]:
        suffix = "" if repeat == 1 else f"_x{repeat}"
        name = f"explore/{policy}/it{iteration}{suffix}"
        path = self.store.path(explore_file(policy, iteration, suffix))
        agent = policy.rsplit("_", 1)[-1]
        samples = repeat * self.setup.cfg.rollout.samples_per_task

        def run():
            trajectories = rollouts.play(
                self.setup,
                self.params(policy),
                self.env_factory,
                self.train_tasks,
                path,
                greedy=False,
                samples_per_task=samples,
                seed=rollouts.stage_seed(self.seed, name),
                agent=agent,
                iteration=iteration,
            )
            return rollouts.summarize(trajectories)

        summary = self.store.stage(name, run)
        # by id, not in file order: that is the order episodes finished in, which a resumed rollout changes
        return sorted(read_trajectories(path), key=lambda t: t.traj_id), summary

    def evaluate(self, policy: str) -> dict[str, dict]:
        """Greedy episodes of `policy` on every evaluation split: {split: summary}.

        The splits not yet done play in one rollout (each task once, in split order), so a slot whose episode
        ends takes the next split's task instead of idling until its own split's longest episode ends; each
        split's episodes then go to its own file (`eval_file`) and its summary to its stage record."""
        names = {split: f"eval/{policy}/{split}" for split in self.eval_tasks}
        pending = [split for split in self.eval_tasks if not self.store.has_stage(names[split])]
        by_task: dict[str, Trajectory] = {}
        joint = self.store.path(joint_eval_file(policy))
        if pending:
            task_ids = list(dict.fromkeys(task for split in pending for task in self.eval_tasks[split]))
            trajectories = rollouts.play(
                self.setup,
                self.params(policy),
                self.env_factory,
                task_ids,
                joint,
                greedy=True,
                samples_per_task=1,
                seed=0,
                agent="target" if policy == BASE else policy.rsplit("_", 1)[-1],
                iteration=None,
            )
            by_task = {t.task_id: t for t in trajectories}
            for split in pending:
                episodes = [by_task[task] for task in self.eval_tasks[split]]
                path = self.store.path(eval_file(policy, split))
                processes.on_primary(f"write {path}", lambda p=path, e=episodes: rollouts.write_atomic(p, e))
        out = {}
        for split, task_ids in self.eval_tasks.items():
            out[split] = self.store.stage(
                names[split], lambda ids=task_ids: rollouts.summarize_eval([by_task[task] for task in ids])
            )
        if pending:
            processes.on_primary(f"remove {joint}", lambda: os.path.exists(joint) and os.remove(joint))
        return out

    # --- training ------------------------------------------------------------------------------------------

    def train_pairs(
        self,
        name: str,
        start: str,
        make_pairs: Callable[[], PreferenceDataset],
        *,
        kind: StepKind,
        iteration: int,
    ) -> tuple[str, dict]:
        """A pair phase (`StepKind.DPO`: eq. 7; `StepKind.COEVO`: eq. 9) of policy `start` saved as `name`."""
        stage = f"train/{name}"
        dpo = self.setup.cfg.dpo

        def run():
            pairs = make_pairs()
            seed = rollouts.stage_seed(self.seed, stage)
            params, summary = phases.dpo_phase(
                self.setup,
                self.store,
                stage,
                self.params(start),
                pairs.pairs,
                kind=kind,
                learning_rate=dpo.learning_rate(iteration),
                beta=dpo.beta(iteration),
                seed=seed,
            )
            path = self.store.path(pairs_file(name))
            reference = lambda: phases.kept_reference_logps(self.store, stage, len(pairs), summary)
            processes.on_primary(f"write {path}", lambda: save_pairs(path, pairs.pairs, reference()))
            self._keep(name, params)
            self.store.clear_scratch(stage)
            return {**summary, "dataset": pairs.report.to_dict()}

        record = self.store.stage(stage, run)
        self._log_train(name, record)
        return name, record

    def train_sft(
        self, name: str, start: str, trajectories: Sequence[Trajectory], iteration: int
    ) -> tuple[str, dict]:
        """An SFT phase of policy `start` on `trajectories` (RFT, `sft.rft_epochs`), saved as `name`."""
        stage = f"train/{name}"

        def run():
            seed = rollouts.stage_seed(self.seed, stage)
            params, summary = phases.sft_phase(
                self.setup,
                self.store,
                stage,
                self.params(start),
                trajectories,
                seed=seed,
                epochs=self.setup.cfg.sft.rft_epochs,
            )
            self._keep(name, params)
            self.store.clear_scratch(stage)
            return summary

        record = self.store.stage(stage, run)
        self._log_train(name, record)
        return name, record

    def train_grpo(
        self, name: str, start: str, iteration: int, run: grpo.GrpoRun | None = None
    ) -> tuple[str, dict]:
        """Iteration `iteration`'s GRPO steps (`experiment.grpo`) of `run` (default: the `grpo` method's, on
        the train tasks) from policy `start`, saved as `name`; the KL term's reference is the SFT target."""
        stage = f"train/{name}"
        run = grpo.FixedTasks(self.train_tasks, self.env_factory) if run is None else run

        def run_stage():
            reference = self.params(SFT_TARGET) if self.setup.cfg.grpo.beta > 0 else None
            params, summary = grpo.grpo_phase(
                self.setup,
                self.store,
                stage,
                self.params(start),
                reference,
                run,
                iteration=iteration,
                seed=self.seed,
            )
            self._keep(name, params)
            return summary

        record = self.store.stage(stage, run_stage)
        self._log_train(name, record)
        return name, record

    def _log_train(self, name: str, record: dict) -> None:
        with self._log_lock:
            for metrics in record.get("history", []):
                self.on_scalars(f"train/{name}", int(metrics["step"]), metrics)

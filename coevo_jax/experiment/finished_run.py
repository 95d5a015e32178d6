"""A run's working directory opened for analysis: its config, experts, policy set-up and saved policies.

What the scripts that replay a finished run's policies (`coevo_jax.analysis`'s `sampled_eval` and
`grpo_logprob_gap`, a study's replay of GRPO's steps) share: the run's own `config.json` and `experts.jsonl`, so the tokenizer,
architecture and environment are the ones the run trained with.
"""

from __future__ import annotations

import dataclasses
import os

from coevo_jax import envs
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Trajectory
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.experiment.experts import EXPERTS_FILE
from coevo_jax.experiment.policy import PolicySetup, build_setup
from coevo_jax.experiment.store import CONFIG_FILE, RunStore, read_json


@dataclasses.dataclass
class FinishedRun:
    """A workdir's config, experts, policy set-up and store (see `open_run`)."""

    workdir: str
    config: ExperimentConfig
    experts: list[Trajectory]
    setup: PolicySetup
    store: RunStore

    def make_env(self) -> envs.Environment:
        """A fresh environment as the run configured it (the caller closes it)."""
        return envs.make(self.config.env.name, **dict(self.config.env.kwargs))

    def policy(self, name: str) -> dict:
        """The policy the run saved under `name` (e.g. `sft_target`, `grpo_it2_target`), ready for
        `setup`'s programs (the base included under LoRA)."""
        setup = self.setup
        return setup.policy(self.store.load_policy(name, setup.abstract_params, base=setup.base_fingerprint))

    def close(self) -> None:
        """Waits for and releases the store's checkpointer."""
        self.store.close()


def open_run(workdir: str) -> FinishedRun:
    """Opens `workdir` (a run's, finished or partly: its config and experts saved) for analysis."""
    workdir = os.path.abspath(workdir)
    for name in (CONFIG_FILE, EXPERTS_FILE):
        if not os.path.exists(os.path.join(workdir, name)):
            raise FileNotFoundError(f"{os.path.join(workdir, name)}: missing; not a started run's workdir")
    config = ExperimentConfig.from_mapping(read_json(os.path.join(workdir, CONFIG_FILE)))
    experts = read_trajectories(os.path.join(workdir, EXPERTS_FILE))
    return FinishedRun(workdir, config, experts, build_setup(config, workdir, experts), RunStore(workdir))

"""The expert trajectories a run clones (SFT) and pairs against (ETO, eq. 8), per environment.

Built once per workdir and saved there (`experts.jsonl`), so a resumed run trains on the same set even if
the environment's expert generator changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from coevo_jax.atomic_files import atomic_path
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Trajectory, write_trajectories
from coevo_jax.data.sources import read_trajectory_source
from coevo_jax.envs.base import Environment
from coevo_jax.experiment.config import EnvConfig

EXPERTS_FILE = "experts.jsonl"


def generate_experts(env: Environment, spec: EnvConfig) -> list[Trajectory]:
    """The first `spec.expert_tasks` trajectories of `spec.experts_path`, else the environment's own.

    `spec.experts_path` is a trajectory file or a TFDS trajectory split, such as the `experts` of a run
    exported by `python -m coevo_jax.experiment.export` (`data.sources.read_trajectory_source`). The environment's
    are `Environment.expert_trajectories` on the train split, at most `spec.expert_tasks`.
    """
    if spec.experts_path:
        experts = list(read_trajectory_source(spec.experts_path))[: spec.expert_tasks]
    else:
        experts = env.expert_trajectories(spec.train_split, limit=spec.expert_tasks)
    if not experts:
        raise ValueError(f"{env.name}: no expert trajectories (experts_path={spec.experts_path!r})")
    return experts


def load_or_generate_experts(
    env: Environment,
    spec: EnvConfig,
    workdir: str,
    check: Callable[[list[Trajectory]], None] | None = None,
) -> list[Trajectory]:
    """The workdir's saved experts, generated (and saved atomically) on the first run.

    `check` (raising on experts the run cannot use) runs before a first run saves them, so a refused set
    leaves nothing behind."""
    path = os.path.join(workdir, EXPERTS_FILE)
    saved = os.path.exists(path)
    experts = read_trajectories(path) if saved else generate_experts(env, spec)
    if check is not None:
        check(experts)
    if not saved:
        os.makedirs(workdir, exist_ok=True)
        with atomic_path(path) as tmp:
            write_trajectories(tmp, experts)
    return experts

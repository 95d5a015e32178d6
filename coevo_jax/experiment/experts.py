"""The expert trajectories a run clones (SFT) and pairs against (ETO, eq. 8), per environment.

Built once per workdir and saved there (`experts.jsonl`), so a resumed run trains on the same set even if
the environment's expert generator changes.
"""

from __future__ import annotations

import os

from coevo_jax.data.records import Trajectory, read_trajectories, write_trajectories
from coevo_jax.envs.base import Environment
from coevo_jax.experiment.config import EnvConfig

EXPERTS_FILE = "experts.jsonl"


def generate_experts(env: Environment, spec: EnvConfig) -> list[Trajectory]:
    """The environment's own experts on the train split (or the file `spec.experts_path`)."""
    if spec.experts_path:
        experts = read_trajectories(spec.experts_path)
    elif env.name == "intercode_sql":
        from coevo_jax.envs.intercode_sql.experts import replay_experts

        experts, _ = replay_experts(env, spec.train_split)
    elif env.name == "sciworld":
        experts = env.expert_trajectories(spec.train_split, limit=spec.expert_tasks)
    elif hasattr(env, "expert_trajectories"):
        experts = env.expert_trajectories(spec.train_split)
    else:
        raise ValueError(
            f"{env.name}: no built-in expert trajectories; set env.experts_path to a trajectory file"
        )
    experts = list(experts)[: spec.expert_tasks]
    if not experts:
        raise ValueError(f"{env.name}: no expert trajectories (experts_path={spec.experts_path!r})")
    return experts


def load_or_generate_experts(env: Environment, spec: EnvConfig, workdir: str) -> list[Trajectory]:
    """The workdir's saved experts, generated (and saved atomically) on the first run."""
    path = os.path.join(workdir, EXPERTS_FILE)
    if os.path.exists(path):
        return read_trajectories(path)
    experts = generate_experts(env, spec)
    tmp = os.path.join(workdir, ".experts.tmp.jsonl")
    write_trajectories(tmp, experts)
    os.replace(tmp, path)
    return experts

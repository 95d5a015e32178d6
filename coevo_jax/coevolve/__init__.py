"""CoEvolve (arXiv 2604.15840): weakness signals from rollouts, signal-guided re-exploration, task synthesis
and verification by execution, and the task pool they feed.

* `patterns`: each environment's action patterns (the rare signal's unit).
* `signals`: the forgetting, boundary and rare signals, pure functions of rollout records.
* `synthesis`: what a synthesizer does; `builtin_synthesis`, `sql_synthesis` (with `sql_templates`),
  `bfcl_synthesis`: one per environment.
* `pool`: the synthesized tasks with their provenance, persisted in the workdir.
* `rounds`: `round`, one round of signals -> exploration -> abstraction -> verification -> pool.
* `config`: `CoEvolveConfig`, its defaults and ablations.
* `llm`, `prompts`, `generation`: the LLM path (reflection, exploration, abstraction by a local model).
"""

from coevo_jax.coevolve.config import ABLATIONS, CoEvolveConfig
from coevo_jax.coevolve.pool import PoolTask, TaskPool
from coevo_jax.coevolve.rounds import RoundReport, round  # noqa: A004

__all__ = ["ABLATIONS", "CoEvolveConfig", "PoolTask", "RoundReport", "TaskPool", "round"]

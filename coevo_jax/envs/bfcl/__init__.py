"""BFCL's multi-turn function calling (`BfclEnv`), from the PyPI package `bfcl-eval` (Apache-2.0), offline.

* `env`: `BfclEnv`, the environment: categories, our splits, turns, steps and the reward.
* `data`: the tasks, ground truth and function docs read from the installed package.
* `docs`: the function docs shown to the agent, compact or BFCL's full JSON.
* `calls`: the agent's action read with `ast` into canonical calls of the task's functions.
* `backend`: BFCL's executor and multi-turn checker on those calls, per-turn results.
* `experts`: BFCL's ground truth as expert demonstrations.
"""

from coevo_jax.envs.bfcl.env import BfclEnv

__all__ = ["BfclEnv"]

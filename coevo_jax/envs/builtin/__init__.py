"""The built-in environment (`BuiltinEnv`): small procedural ScienceWorld-like tasks in pure Python.

* `env`: `BuiltinEnv`, the environment: splits, graded reward, step budget.
* `world`: the house's state and rules (rooms, things, actions).
* `tasks`: task families, their procedural generation and subgoals.
* `experts`: the planner that solves a task, with a thought per action.
"""

from coevo_jax.envs.builtin.env import BuiltinEnv

__all__ = ["BuiltinEnv"]

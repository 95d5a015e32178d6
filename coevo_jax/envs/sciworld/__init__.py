"""ScienceWorld with ETO's splits, prompt, step limits and reward (`SciWorldEnv`).

* `env`: `SciWorldEnv`, the environment, one supervised JVM per instance.
* `data`: ETO's task splits, step limits, instruction and in-context example (shipped files, validated).
* `jvm`: one ScienceWorld JVM behind a thread with time limits.
* `supervisor`: restarts a crashed or hung JVM and replays the episode.
* `gold`: expert demonstrations from ScienceWorld's gold action paths, with templated thoughts.
* `experts`: CLI writing a split's demonstrations to a trajectory file, several JVMs at once, resumable.
"""

from coevo_jax.envs.sciworld.env import SciWorldEnv

__all__ = ["SciWorldEnv"]

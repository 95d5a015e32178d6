"""Environment throughput: expert/gold replays, one environment in one thread, reset and step timed apart.

    python bench/env_steps.py                          # builtin, intercode_sql, sciworld
    python bench/env_steps.py --envs intercode_sql --episodes 200

What each environment replays:
- builtin: the planner's expert solutions of `train` tasks;
- intercode_sql: every GPT-4 action of InterCode's recorded episodes (each step runs the statement in the
  sandbox and scores it against the cached gold rows), for tasks in file order;
- sciworld: ScienceWorld's gold action paths of `train` tasks, one JVM (`-Xmx384m`), task loads included in
  reset time.
Prints a table and writes JSON to bench/results/env_steps.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path


def _builtin(count):
    from coevo_jax.envs import make

    env = make("builtin")
    tasks = env.tasks("train")[:count]
    return env, [(t, [s.action for s in env.expert_steps(t)]) for t in tasks]


def _intercode_sql(count):
    from coevo_jax.envs.intercode_sql import InterCodeSqlEnv
    from coevo_jax.envs.intercode_sql.experts import HARNESS_REJECTION, load_episodes

    env = InterCodeSqlEnv()
    episodes = load_episodes()[:count]
    plans = [
        (
            e.task_id,
            [
                a
                for a, o in zip(e.actions, e.observations, strict=True)
                if not o.startswith(HARNESS_REJECTION)
            ],
        )
        for e in episodes
    ]
    return env, plans


def _sciworld(count):
    from coevo_jax.envs import make

    env = make("sciworld")
    tasks = env.tasks("train")
    step = max(len(tasks) // count, 1)
    chosen = tasks[::step][:count]  # spread over task types
    return env, [(t, [s.action for s in env.expert_steps(t)]) for t in chosen]


SOURCES = {"builtin": _builtin, "intercode_sql": _intercode_sql, "sciworld": _sciworld}


def measure(env, plans) -> dict:
    reset_s = step_s = 0.0
    steps = 0
    for task_id, actions in plans:
        start = time.perf_counter()
        env.reset(task_id)
        reset_s += time.perf_counter() - start
        start = time.perf_counter()
        for action in actions:
            _, _, done, _ = env.step(action)
            steps += 1
            if done:
                break
        step_s += time.perf_counter() - start
    return {
        "episodes": len(plans),
        "steps": steps,
        "reset_ms": 1e3 * reset_s / max(len(plans), 1),
        "step_ms": 1e3 * step_s / max(steps, 1),
        "steps_per_s": steps / max(step_s, 1e-9),
        "steps_per_s_with_resets": steps / max(step_s + reset_s, 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envs", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    parser.add_argument("--episodes", type=int, default=100)
    args = parser.parse_args()
    results = {}
    print(
        f"{'env':>14} {'episodes':>8} {'steps':>6} {'reset ms':>9} {'step ms':>8} {'steps/s':>8} {'w/ resets':>9}"
    )
    for name in args.envs:
        env, plans = SOURCES[name](args.episodes)
        try:
            measure(env, plans[:2])  # warm-up: JVM JIT, SQLite page cache, gold queries of those tasks
            row = measure(env, plans)
        finally:
            env.close()
        results[name] = row
        print(
            f"{name:>14} {row['episodes']:8d} {row['steps']:6d} {row['reset_ms']:9.2f} {row['step_ms']:8.3f}"
            f" {row['steps_per_s']:8.0f} {row['steps_per_s_with_resets']:9.0f}"
        )
    out = Path(__file__).parent / "results" / "env_steps.json"
    out.parent.mkdir(exist_ok=True)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()

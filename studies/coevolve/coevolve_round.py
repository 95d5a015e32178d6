"""CoEvolve rounds on each environment, its own train experts replayed as fake rollouts: signals, explored,
synthesized, verified, pass rate and time.

    python -m studies.coevolve.coevolve_round          # builtin, intercode_sql, bfcl
    python -m studies.coevolve.coevolve_round --envs builtin --rounds 2 --max-signals 24 --method coevolve_unguided

The rollout history is three training steps of the environment's train experts (all of them; InterCode-SQL's
are the GPT-4 wins that replay to 1.0): at step 0 every expert succeeds, at step 1 every third task fails (its
expert cut to half its actions, reward 0: forgetting), at step 2 every fourth task has two rollouts, the expert
and the cut one (boundary). The rare signal fires on what the experts themselves do rarely. The first round
sees steps 0-1, the second step 2; each further round sees the same three steps again (shifted in time), so
forgetting and boundary fire again on other explorations. Also reported: the share of expert rollouts
with a rare pattern at the default theta and n_min (`signals`' docstring quotes these). `--method` runs one
of the ablations (`coevolve.ABLATIONS`). Why: the rounds' yield and cost on real task data, and the signals'
defaults checked against what the experts do (`coevolve.signals`' docstring quotes the rare shares). Prints a
table and writes JSON to `--out` (default `coevolve_round.json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from coevo_jax import coevolve, envs
from coevo_jax.coevolve.patterns import trajectory_patterns
from coevo_jax.coevolve.signals import rare_signals


def failed(trajectory, suffix):
    """The trajectory cut to half its actions (at least one), reward 0: a forgetting or boundary failure."""
    actions = max(1, len(trajectory.actions) // 2)
    messages = trajectory.messages[: trajectory.prompt_len + 2 * actions - 1]
    return dataclasses.replace(trajectory, traj_id=trajectory.traj_id + suffix, messages=messages, reward=0.0)


def at(trajectory, step, suffix=""):
    """The trajectory as a rollout of training step `step`."""
    return dataclasses.replace(trajectory, traj_id=f"{trajectory.traj_id}_s{step}{suffix}", iteration=step)


def history(experts, offset=0):
    """Steps offset..offset+2 (see the module docstring)."""
    records = [at(t, offset) for t in experts]
    records += [at(failed(t, "_f") if i % 3 == 0 else t, offset + 1) for i, t in enumerate(experts)]
    for i, t in enumerate(experts):
        records.append(at(t, offset + 2, "a"))
        if i % 4 == 0:
            records.append(at(failed(t, "_f"), offset + 2, "b"))
    return records


def rare_share(experts, env_name, config):
    """The share of expert rollouts that show a rare pattern at the config's theta, counted over two steps of
    all the experts (so that N passes n_min = 200 even for BFCL's 150): the second step's marked share."""
    records = [at(t, 0) for t in experts] + [at(t, 1) for t in experts]
    signals, counts, seen = rare_signals(
        records, lambda t: trajectory_patterns(t, env_name), theta=config.theta, min_seen=config.min_seen
    )
    marked = sum(len(s.trajectories) for s in signals if s.step == 1)
    rare = sorted(p for p, c in counts.items() if c / seen < config.theta / 100)
    return {
        "rollouts": len(experts),
        "with_rare_pattern": marked,
        "share": marked / len(experts),
        "rare": rare,
    }


def main(argv: list[str] | None = None) -> dict:
    """Runs the rounds on every environment; returns the results it writes."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envs", nargs="+", default=["builtin", "intercode_sql", "bfcl"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-signals", type=int, default=None, help="default: CoEvolveConfig's")
    parser.add_argument("--method", default="coevolve", choices=sorted(coevolve.ABLATIONS))
    parser.add_argument("--out", default="coevolve_round.json")
    args = parser.parse_args(argv)
    config = coevolve.CoEvolveConfig().for_method(args.method)
    if args.max_signals is not None:
        config = dataclasses.replace(config, max_signals=args.max_signals)
    results = {"platform": platform.platform(), "config": dataclasses.asdict(config), "envs": {}}
    for name in args.envs:
        factory = lambda name=name: envs.make(name)  # noqa: E731
        start = time.perf_counter()
        experts = factory().expert_trajectories("train")
        experts_s = time.perf_counter() - start
        steps = [
            [r for r in history(experts) if r.iteration < 2],
            [r for r in history(experts) if r.iteration == 2],
        ]
        steps += [history(experts, offset=3 * k) for k in range(1, args.rounds - 1)]
        with tempfile.TemporaryDirectory() as workdir:
            pool = coevolve.TaskPool.open(workdir)
            reports = [
                coevolve.round(records, pool, factory, config, seed=0).to_json()
                for records in steps[: args.rounds]
            ]
            pool_bytes = os.path.getsize(os.path.join(workdir, coevolve.pool.POOL_FILE))
        results["envs"][name] = {
            "experts": len(experts),
            "experts_s": experts_s,
            "rare_share": rare_share(experts, name, config),
            "rounds": reports,
            "pool_file_bytes": pool_bytes,
        }
        for r in reports:
            rate = "-" if r["pass_rate"] is None else f"{r['pass_rate']:.2f}"
            print(
                f"{name:14s} round {r['round']}: signals {r['signals']}, explored {r['explored']}, "
                f"synthesized {r['synthesized']} (dup {r['duplicates']}), verified {r['verified']}, pass {rate}, "
                f"pool {r['pool_size']}, {r['seconds']:.1f}s; no task: {r['not_synthesized']}; "
                f"failed: {r['failed_verification']}"
            )
        print(f"{name:14s} rare share of expert rollouts: {results['envs'][name]['rare_share']}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()

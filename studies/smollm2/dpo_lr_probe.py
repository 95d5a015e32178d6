"""Which DPO learning rate for a SmolLM2 config? ETO's phase at several rates, judged on held-out train tasks.

    python -m studies.smollm2.dpo_lr_probe --config configs/sql_smollm2.py --run /work/runs/sql_smollm2_v2 \
        --lrs 1e-6,5e-6,2e-5 --dev 16
    python -m studies.smollm2.dpo_lr_probe --config configs/sciworld_smollm2.py --run WORKDIR --dev 8 \
        --config.dpo.updates_per_phase=12          # the config's phase, with 12 updates

Starts from a finished run's SFT target policy (`policies/sft_target`) and its iteration-1 exploration
(`rollouts/sft_target_it1_explore.jsonl`), builds ETO's pairs from them exactly as the main job does, and
for each learning rate trains the main job's DPO phase (`experiment.phases.dpo_phase`: the config's
updates, pairs per batch, beta, buckets and micro-batches; the run's own data-order seed) from that same SFT
policy. Each policy, and the SFT policy itself (lr 0), then plays the `--dev` train-split tasks that follow
the run's expert tasks: held out from SFT and from exploration, never a test split. Reported per rate:
greedy success and average reward, how many episodes ran to the step limit (a policy that stops
submitting), and the phase's last reward accuracy and margin. One JSON line per rate, appended to `--out`
as it finishes, so a killed probe keeps what it measured.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import resource
import tempfile
import time

import jax

from coevo_jax import envs
from coevo_jax.data.pairs import build_eto_pairs
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.experiment import rollouts
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.experiment.phases import dpo_phase
from coevo_jax.experiment.policy import build_setup
from coevo_jax.experiment.stages import SFT_TARGET
from coevo_jax.experiment.store import RunStore
from coevo_jax.train import StepKind


def load_config(path: str, overrides: dict) -> ExperimentConfig:
    """The `get_config()` of the config file `path`, with `overrides` ({"dpo.updates_per_phase": 12, ...})
    set on it."""
    spec = importlib.util.spec_from_file_location("probed_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for dotted, value in overrides.items():
        node = config
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return ExperimentConfig.from_mapping(config)


def parse_overrides(items: list[str]) -> dict:
    """`--config.FIELD=VALUE` items (the main job's override syntax) as {FIELD: VALUE}; VALUE is read as a
    Python literal, or kept as a string when it is none."""
    overrides = {}
    for item in items:
        field, sep, value = item.removeprefix("--config.").partition("=")
        if not item.startswith("--config.") or not sep or not field:
            raise ValueError(f"{item!r}: expected --config.FIELD=VALUE")
        try:
            overrides[field] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[field] = value
    return overrides


def main(argv: list[str] | None = None) -> list[dict]:
    """Trains and judges ETO's phase at every rate; returns the result lines it appends to `--out`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--config", default="configs/sql_smollm2.py")
    parser.add_argument("--run", required=True, help="workdir of a run whose SFT and exploration are done")
    parser.add_argument("--lrs", default="1e-6,5e-6,2e-5")
    parser.add_argument("--dev", type=int, default=16, help="held-out train-split tasks played greedily")
    parser.add_argument("--out", default="dpo_lr_probe.jsonl")
    parser.add_argument("--skip-sft", action="store_true", help="do not evaluate the SFT policy (lr 0)")
    args, items = parser.parse_known_args(argv)
    try:
        overrides = {"show_progress": False, **parse_overrides(items)}
    except ValueError as error:
        parser.error(str(error))

    cfg = load_config(args.config, overrides)
    run_store = RunStore(args.run)
    run_experts = read_trajectories(run_store.path("experts.jsonl"))
    env_kwargs = dict(cfg.env.kwargs)
    make_env = lambda: envs.make(cfg.env.name, **env_kwargs)
    env = make_env()
    experts = env.expert_trajectories(cfg.env.train_split, limit=len(run_experts) + args.dev)
    env.close()
    if [t.task_id for t in experts[: len(run_experts)]] != [t.task_id for t in run_experts]:
        raise SystemExit(f"{args.run}/experts.jsonl: not the first experts of {cfg.env.name}'s train split")
    dev_tasks = [t.task_id for t in experts[len(run_experts) :]]
    explored = rollouts.usable(
        read_trajectories(run_store.path("rollouts", f"{SFT_TARGET}_it1_explore.jsonl"))
    )
    if set(dev_tasks) & {t.task_id for t in explored}:
        raise SystemExit("the dev tasks overlap the exploration tasks")
    pairs = build_eto_pairs(run_experts, explored, max_pairs_per_task=cfg.dpo.max_pairs_per_task)
    print(f"dev tasks {len(dev_tasks)}; pairs {pairs.report.to_dict()}", flush=True)

    workdir = tempfile.mkdtemp(prefix="dpo_lr_probe_")
    setup = build_setup(cfg, workdir, run_experts)
    store = RunStore(workdir)
    saved = run_store.load_policy(SFT_TARGET, setup.abstract_params, base=setup.base_fingerprint)
    sft_params = setup.policy(saved)
    stage = "train/eto_it1_target"
    seed = rollouts.stage_seed(cfg.seed, stage)
    rates = ([] if args.skip_sft else [0.0]) + [float(x) for x in args.lrs.split(",")]
    results = []
    for lr in rates:
        t0 = time.perf_counter()
        summary = {}
        params = sft_params
        if lr > 0:
            params, summary = dpo_phase(
                setup,
                store,
                f"{stage}_lr{lr:g}",
                sft_params,
                pairs.pairs,
                kind=StepKind.DPO,
                learning_rate=lr,
                beta=cfg.dpo.beta(1),
                seed=seed,
            )
            jax.block_until_ready(params)
        train_s = time.perf_counter() - t0
        episodes = rollouts.play(
            setup,
            params,
            make_env,
            dev_tasks,
            os.path.join(workdir, f"dev_lr{lr:g}.jsonl"),
            greedy=True,
            samples_per_task=1,
            seed=0,
            agent="target",
            iteration=None,
        )
        result = {
            "config": args.config,
            "overrides": items,
            "learning_rate": lr,
            "updates": summary.get("steps", 0),
            "pairs": summary.get("pairs", 0),
            "final_reward_accuracy": summary.get("final_reward_accuracy"),
            "final_reward_margin": summary.get("final_reward_margin"),
            "dev": rollouts.summarize(episodes),
            "train_s": round(train_s, 1),
            "total_s": round(time.perf_counter() - t0, 1),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        }
        print("RESULT " + json.dumps(result), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
        results.append(result)
    store.close()
    run_store.close()
    return results


if __name__ == "__main__":
    main()

"""Which learns more per CPU hour on a real environment: full fine-tuning or LoRA? SmolLM2-135M SFT.

    python bench/lora_vs_full_sft.py --config configs/sql_smollm2.py          # full, then LoRA r=16
    python bench/lora_vs_full_sft.py --config configs/sql_smollm2.py --train 96 --dev 32 --batch-size 4

The main job's own SFT phase (`experiment.phases.sft_phase`, the config's dtype policy and buckets,
`--batch-size` sequences per update) on the first `--train` expert trajectories of the environment's train
split, from the bundled SmolLM2-135M-Instruct, once per mode in its own process (peak RSS is the mode's own).
Judged on held-out train-split tasks, never the test splits: the next `--dev` experts' action-token NLL
(before and after) and the greedy success and average reward of the trained policy on those same `--dev`
tasks. CPU seconds (user + system of the process) and wall seconds are measured for the SFT phase alone, so
the verdict is 'NLL drop and success per CPU hour'.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

MODES = ("full", "lora")


def _load_config(path: str, overrides: dict):
    from coevo_jax.experiment.config import ExperimentConfig

    spec = importlib.util.spec_from_file_location("bench_config", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    config = module.get_config()
    for dotted, value in overrides.items():
        node = config
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return ExperimentConfig.from_mapping(config)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _dev_nll(setup, params, trajectories) -> float:
    """Mean negative log-likelihood per action token of `trajectories` under `params`."""
    import jax
    import numpy as np

    from coevo_jax.data.batching import collate_sft, plan_batches, tokenize_sft_examples
    from coevo_jax.models.decoder import bind
    from coevo_jax.train.objectives import token_logprobs

    examples, _ = tokenize_sft_examples(
        trajectories, setup.tokenizer, setup.chat_format, max_length=setup.cfg.max_length
    )
    graphdef = setup.graphdef

    @jax.jit
    def summed(params, batch):
        logps = token_logprobs(bind(graphdef, params), batch, 256)
        return jax.numpy.sum(-logps * batch["loss_mask"]), jax.numpy.sum(batch["loss_mask"])

    nll, count = 0.0, 0.0
    plan = plan_batches([len(e) for e in examples], 4, setup.cfg.buckets(), seed=0)
    for length, idx in plan:
        batch = collate_sft(
            [examples[i] for i in idx], length=length, batch_size=4, pad_id=setup.tokenizer.pad_token_id
        )
        total, tokens = summed(params, {k: np.asarray(v) for k, v in batch.items()})
        nll, count = nll + float(total), count + float(tokens)
    return nll / count


def run_mode(args) -> dict:
    import jax

    from coevo_jax import envs
    from coevo_jax.experiment import rollouts
    from coevo_jax.experiment.phases import sft_phase
    from coevo_jax.experiment.policy import build_setup
    from coevo_jax.experiment.store import RunStore

    overrides = {"sft.epochs": args.epochs, "sft.batch_size": args.batch_size, "show_progress": False}
    if args.mode == "lora":
        overrides |= {
            "model.lora_rank": args.rank,
            "model.lora_alpha": 2.0 * args.rank,
            "sft.learning_rate": args.lora_lr,
        }
    else:
        overrides |= {"model.lora_rank": 0, "sft.learning_rate": args.full_lr}
    cfg = _load_config(args.config, overrides)
    env_kwargs = dict(cfg.env.kwargs)
    make_env = lambda: envs.make(cfg.env.name, **env_kwargs)
    env = make_env()
    experts = env.expert_trajectories(cfg.env.train_split, limit=args.train + args.dev)
    train, dev = experts[: args.train], experts[args.train :]
    workdir = tempfile.mkdtemp(prefix=f"lora_vs_full_{args.mode}_")
    setup = build_setup(cfg, workdir, train)
    store = RunStore(workdir)
    params = setup.base_params(0)
    nll_before = _dev_nll(setup, params, dev)
    cpu0, wall0 = _cpu_seconds(), time.perf_counter()
    params, summary = sft_phase(setup, store, "train/bench", params, train, seed=0)
    jax.block_until_ready(params)
    cpu, wall = _cpu_seconds() - cpu0, time.perf_counter() - wall0
    nll_after = _dev_nll(setup, params, dev)
    episodes = rollouts.play(
        setup,
        params,
        make_env,
        [t.task_id for t in dev],
        os.path.join(workdir, "dev.jsonl"),
        greedy=True,
        samples_per_task=1,
        seed=0,
        agent="target",
        iteration=0,
    )
    rewards = [t.reward for t in episodes]
    store.close()
    return {
        "mode": args.mode,
        "rank": args.rank if args.mode == "lora" else 0,
        "learning_rate": cfg.sft.learning_rate,
        "steps": summary["steps"],
        "examples": summary["examples"],
        "sft_cpu_s": round(cpu, 1),
        "sft_wall_s": round(wall, 1),
        "dev_nll_before": round(nll_before, 4),
        "dev_nll_after": round(nll_after, 4),
        "dev_success": sum(r >= 1.0 for r in rewards) / len(rewards),
        "dev_avg_reward": round(sum(rewards) / len(rewards), 4),
        "dev_episodes": len(rewards),
        "context_cutoffs": sum(t.extra.get("terminate_reason") == "context_limit" for t in episodes),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/sql_smollm2.py")
    parser.add_argument("--train", type=int, default=120, help="expert trajectories trained on")
    parser.add_argument("--dev", type=int, default=40, help="held-out train-split experts / tasks")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4, help="SFT sequences per update")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--full-lr", type=float, default=2e-5)
    parser.add_argument("--lora-lr", type=float, default=2e-4)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in this process
    args = parser.parse_args()
    if args.mode:
        print("RESULT " + json.dumps(run_mode(args)), flush=True)
        return
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--mode", mode, *sys.argv[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode or not lines:
            sys.stderr.write(out.stderr[-4000:])
            raise SystemExit(f"{mode}: exit {out.returncode}")
        result = json.loads(lines[-1][len("RESULT ") :])
        result["nll_drop_per_cpu_hour"] = round(
            (result["dev_nll_before"] - result["dev_nll_after"]) / (result["sft_cpu_s"] / 3600), 3
        )
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

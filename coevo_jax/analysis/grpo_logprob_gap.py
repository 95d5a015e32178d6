"""GRPO's sampler/trainer log-prob gap: the same sampled tokens scored by the sampler and by the trainer.

The sampler records each drawn token's log-prob under softmax(logits / T) computed in `model.sample_dtype`;
the GRPO train step recomputes it in `model.compute_dtype` (from hidden states, chunked). Before any update
their ratio should be 1; this measures how far it is, per (sample dtype, compute dtype), on episodes that a
saved policy of a finished run plays on its train tasks:

    python -m coevo_jax.analysis grpo_logprob_gap --workdir WORKDIR [--policy sft_target] [--tasks 8] [--samples 4]

Prints, per pair of dtypes, |log-prob gap| over the sampled tokens (mean, 99th percentile, max), the mean
ratio, and the fraction of tokens whose ratio already lies outside [1 - 0.2, 1 + 0.28] (tokens the first
update would clip, were their advantage of the clipped sign). Writes `grpo_logprob_gap.json` under `--out`
(default: the workdir).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import jax
import numpy as np

from coevo_jax.data.batching import bucket_for
from coevo_jax.data.grpo_rows import collate_grpo, sampled_sequence
from coevo_jax.experiment.finished_run import open_run
from coevo_jax.models import abstract_model, bind
from coevo_jax.rollout import ModelActor, RolloutConfig, run_rollouts
from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig
from coevo_jax.train.objectives import token_logprobs

DTYPES = ("float32", "bfloat16")
CLIP_RANGE = (0.8, 1.28)  # [1 - 0.2, 1 + 0.28]: the ratios a first update with either sign of advantage clips


def gap_row(sample_dtype: str, compute_dtype: str, gap: np.ndarray) -> dict:
    """The summary of one dtype pair's gaps (trainer minus sampler log-prob, one per sampled token)."""
    gap = np.asarray(gap, np.float64)
    ratio = np.exp(gap)
    return {
        "sample_dtype": sample_dtype,
        "compute_dtype": compute_dtype,
        "tokens": int(gap.size),
        "mean_abs_gap": float(np.mean(np.abs(gap))),
        "p99_abs_gap": float(np.quantile(np.abs(gap), 0.99)),
        "max_abs_gap": float(np.max(np.abs(gap))),
        "mean_ratio": float(np.mean(ratio)),
        "outside_clip": float(np.mean((ratio < CLIP_RANGE[0]) | (ratio > CLIP_RANGE[1]))),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Samples the policy's episodes in each sample dtype, scores them in each compute dtype; returns the
    rows it writes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--policy", default="sft_target")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.9)
    parser.add_argument(
        "--out", default=None, help="directory of grpo_logprob_gap.json (default: the workdir)"
    )
    args = parser.parse_args(argv)

    run = open_run(args.workdir)
    cfg, setup, env_factory = run.config, run.setup, run.make_env
    env = env_factory()
    tasks = env.tasks(cfg.env.train_split)[: args.tasks]
    env.close()
    params = run.policy(args.policy)
    spec, temperature = cfg.rollout, args.temperature
    rows = []
    for sample_dtype in DTYPES:
        sampler = Sampler(
            setup.model_cfg.replace(dtype=sample_dtype),
            batch_size=spec.rows,
            cache_len=spec.cache_len,
            sampling=SamplingConfig(temperature=temperature, max_new_tokens=spec.max_new_tokens),
            stops=StopConfig(stop_ids=setup.codec.end_of_turn_ids),
        )
        actor = ModelActor(sampler, params, setup.codec, stop_strings=spec.stop_strings, seed=0)
        with tempfile.TemporaryDirectory() as tmp:
            trajectories, _ = run_rollouts(
                env_factory,
                actor,
                tasks,
                os.path.join(tmp, "t.jsonl"),
                RolloutConfig(samples_per_task=args.samples, show_progress=False),
            )
        examples = [sampled_sequence(t, 0.0, max_length=spec.cache_len) for t in trajectories if t.tokens]
        for compute_dtype in DTYPES:
            graphdef, _ = abstract_model(setup.model_cfg.replace(dtype=compute_dtype))
            score = jax.jit(
                lambda p, b, g=graphdef: token_logprobs(bind(g, p), b, 1024, temperature=temperature)
            )
            gaps = []
            for example in examples:
                length = bucket_for(len(example), cfg.buckets())
                batch = collate_grpo(
                    [example], length=length, batch_size=1, pad_id=setup.tokenizer.pad_token_id
                )
                trainer = np.asarray(
                    score(params, {k: batch[k] for k in ("input_ids", "attention_mask", "targets")})
                )
                keep = batch["loss_mask"] > 0
                gaps.append((trainer - batch["old_logps"])[keep])
            rows.append(gap_row(sample_dtype, compute_dtype, np.concatenate(gaps)))
    print(
        f"policy {args.policy} of {args.workdir} ({cfg.model.source}, {cfg.model.num_layers} layers, "
        f"hidden {cfg.model.hidden_size}); T = {temperature}"
    )
    print("| sample dtype | compute dtype | tokens | mean abs gap | p99 | max | mean ratio | outside clip |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['sample_dtype']} | {r['compute_dtype']} | {r['tokens']} | {r['mean_abs_gap']:.2e} | "
            f"{r['p99_abs_gap']:.2e} | {r['max_abs_gap']:.2e} | {r['mean_ratio']:.5f} | {r['outside_clip']:.4f} |"
        )
    out = args.out or run.workdir
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "grpo_logprob_gap.json"), "w") as f:
        json.dump(
            {"workdir": run.workdir, "policy": args.policy, "temperature": temperature, "rows": rows},
            f,
            indent=1,
        )
    run.close()
    return rows

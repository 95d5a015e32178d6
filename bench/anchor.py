"""Issue 8's anchor configuration and its synthetic data, shared by our benchmarks and the peers'.

Only the standard library and NumPy: the peer scripts import this module from their own virtual
environments (TRL, tunix), where coevo_jax is not installed. Every script that benchmarks the anchor
config takes its shapes and its token ids from here, so all frameworks see identical inputs.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

# Llama-shaped, random init, untied embeddings.
MODEL = dict(
    vocab_size=8192,
    hidden_size=256,
    intermediate_size=688,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
    head_dim=32,
    rope_theta=1e4,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_TOKEN_ID = 3  # random tokens are drawn from [3, vocab)

# DPO: 8 pairs per step, prompt 256 + response 256, beta 0.1, AdamW lr 1e-5, float32.
DPO = dict(pairs_per_step=8, prompt_length=256, response_length=256, beta=0.1, learning_rate=1e-5)
PHASE_EPOCHS = 3  # a DPO phase: every pair seen 3 times (the paper's E)
PHASE_PAIRS = 64  # 8 steps per epoch, 24 steps per phase

# Decode: prompt 256, 128 new tokens, greedy, no early stop.
DECODE = dict(prompt_length=256, new_tokens=128, batch_sizes=(1, 8, 32))

WARMUP_STEPS = 3
TIMED_STEPS = 12

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def dpo_pairs(num_pairs: int = PHASE_PAIRS, seed: int = 0) -> dict[str, np.ndarray]:
    """int32 token ids: prompt [N, 256], chosen [N, 256], rejected [N, 256]; no padding, no special tokens."""
    rng = np.random.RandomState(seed)
    shape = lambda length: (num_pairs, length)
    draw = lambda length: rng.randint(FIRST_TOKEN_ID, MODEL["vocab_size"], size=shape(length)).astype(
        np.int32
    )
    return {
        "prompt": draw(DPO["prompt_length"]),
        "chosen": draw(DPO["response_length"]),
        "rejected": draw(DPO["response_length"]),
    }


def decode_prompts(batch_size: int, seed: int = 0) -> np.ndarray:
    """int32 prompt ids [batch, 256] (no padding)."""
    rng = np.random.RandomState(1000 + seed)
    return rng.randint(
        FIRST_TOKEN_ID, MODEL["vocab_size"], size=(batch_size, DECODE["prompt_length"])
    ).astype(np.int32)


def machine() -> dict:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def write_result(name: str, payload: dict, out_dir: Path | str | None = None) -> Path:
    """Writes `payload` (plus machine and time) as JSON to <out_dir or bench/results>/<name>.json."""
    out = Path(out_dir) if out_dir else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    record = {"machine": machine(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), **payload}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)
    return path


def summarize(seconds: list[float]) -> dict:
    """Median, min and max of timed repetitions (seconds)."""
    arr = np.asarray(seconds, dtype=np.float64)
    return {
        "median_s": float(np.median(arr)),
        "min_s": float(arr.min()),
        "max_s": float(arr.max()),
        "n": len(seconds),
    }


def decode_result(dtype: str, batch: int, run: dict, first_token: dict | None) -> dict:
    """One decode row of the peers' JSON: `run` times 128 new tokens, `first_token` (optional) times 1;
    decode-only tokens/s = batch * 127 / (their median difference)."""
    new = DECODE["new_tokens"]
    decode_only = None
    if first_token is not None:
        gap = run["median_s"] - first_token["median_s"]
        decode_only = batch * (new - 1) / gap if gap > 0 else None
    return {
        "dtype": dtype,
        "batch": batch,
        "run": run,
        "new_tokens_per_s": batch * new / run["median_s"],
        "decode_only_new_tokens_per_s": decode_only,
    }


def print_decode_header() -> None:
    print(
        f"{'dtype':<9} {'batch':>5} {'median s':>9} {'min s':>7} {'max s':>7} {'new tok/s':>10} {'decode tok/s':>12}"
    )


def print_decode_row(r: dict) -> None:
    d = r["decode_only_new_tokens_per_s"]
    print(
        f"{r['dtype']:<9} {r['batch']:>5} {r['run']['median_s']:>9.3f} {r['run']['min_s']:>7.3f} "
        f"{r['run']['max_s']:>7.3f} {r['new_tokens_per_s']:>10.0f} {'-' if d is None else f'{d:.0f}':>12}"
    )

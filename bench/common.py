"""What the benchmark scripts share: issue 8's anchor configuration, its synthetic data, timing and results.

Every script in `bench/` and `bench/peers/` takes its shapes, token ids and result files from here, so all
frameworks see identical inputs and write comparable JSON. The scripts run as `python bench/<script>.py`
(Python puts `bench/` first on the path, so `import common` finds this module); the peers' model modules
(`peers/torch_llama.py`, `peers/tunix_llama.py`) put `bench/` on the path for the same import.

Importing this module needs only the standard library and NumPy: the peers import it from their own
virtual environments (TRL, tunix), where coevo_jax is not installed. The helpers that build coevo_jax
objects (model configs, the DPO step) import JAX and the package when called.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

# The anchor model (issue 8): Llama-shaped, random init, untied embeddings.
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

DECODE_MODELS = ("anchor", "smollm2")  # the shapes the decode profiler takes by name


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


def anchor_config(dtype="float32", vocab_size: int | None = None):
    """The anchor model (`MODEL`) as a coevo_jax `ModelConfig`: float32 parameters, `dtype` compute.

    `vocab_size` replaces the anchor's 8192 for scripts that bring their own tokenizer.
    """
    from coevo_jax.models import ModelConfig

    fields = dict(MODEL) if vocab_size is None else {**MODEL, "vocab_size": vocab_size}
    return ModelConfig(**fields, dtype=dtype)


def smollm2_config(dtype="float32", **changes):
    """SmolLM2-135M's architecture (30 layers, width 576, 9 query / 3 kv heads, vocabulary 49,152, tied
    embeddings), read from the bundled GGUF's metadata only: no tensor is decoded.

    `changes` replace fields (e.g. `remat=True`); parameters are float32, compute `dtype`.
    """
    from coevo_jax.checkpoint_formats import gguf
    from coevo_jax.checkpoint_formats.bundled import smollm2_gguf_path
    from coevo_jax.models import ModelConfig

    reader = gguf.open_gguf_reader(smollm2_gguf_path())
    architecture = gguf.require_metadata(reader, "general.architecture")
    names = [tensor.name for tensor in reader.tensors]
    hf_config = gguf.hf_config_from_metadata(reader, gguf.ARCHITECTURES[architecture], architecture, names)
    return ModelConfig.from_hf(hf_config, dtype=dtype, **changes)


def decode_model_config(name: str):
    """The float32 config of one of `DECODE_MODELS` (the anchor's or SmolLM2's architecture)."""
    if name not in DECODE_MODELS:
        raise ValueError(f"unknown model {name!r}: expected one of {DECODE_MODELS}")
    return anchor_config("float32") if name == "anchor" else smollm2_config("float32")


def build_dpo_steps(cfg, learning_rate: float, beta: float, objective=None, device=None):
    """(steps, phase scalars, optimizer, state shardings, mesh, rules) of model `cfg` on one device (default
    the first): the main job's steps built for a constant-lr AdamW phase without weight decay.
    `objective`: an ObjectiveConfig (default the main job's)."""
    import jax

    from coevo_jax import sharding
    from coevo_jax.models import abstract_model
    from coevo_jax.train import ObjectiveConfig, OptimizerConfig, build_steps, make_optimizer, phase_scalars
    from coevo_jax.train.state import state_shardings

    mesh = sharding.make_mesh(
        sharding.MeshConfig(axes=(("data", 1), ("fsdp", 1), ("tensor", 1))), [device or jax.devices()[0]]
    )
    rules = sharding.ShardingRules()
    opt = OptimizerConfig(learning_rate=learning_rate, warmup_steps=0, weight_decay=0.0)
    tx, scalars = make_optimizer(opt.adamw_settings()), phase_scalars(opt, beta)
    graphdef, _ = abstract_model(cfg)
    shardings = state_shardings(cfg, tx, mesh, rules)
    steps = build_steps(graphdef, tx, shardings, mesh, rules, objective or ObjectiveConfig())
    return steps, scalars, tx, shardings, mesh, rules


def setup_steps(cfg, learning_rate: float, beta: float, objective=None):
    """(steps, phase scalars, train state, mesh, rules): `build_dpo_steps` on the first device, the state
    randomly initialised."""
    import jax

    from coevo_jax.train.state import init_train_state

    steps, scalars, tx, shardings, mesh, rules = build_dpo_steps(cfg, learning_rate, beta, objective)
    state = init_train_state(cfg, tx, shardings, jax.random.key(0))
    return steps, scalars, state, mesh, rules


def time_steps(step, state, batch, scalars, warmup: int, timed: int):
    """(state, last metrics, seconds of the first call, seconds of each of `timed` calls) of `step` on one
    batch: the first call (it compiles), `warmup - 1` more untimed, then `timed`; each blocked until its
    metrics are ready."""
    import jax

    start = time.perf_counter()
    state, metrics = step(state, batch, scalars)
    jax.block_until_ready(metrics)
    first_s = time.perf_counter() - start
    for _ in range(max(warmup - 1, 0)):
        state, metrics = step(state, batch, scalars)
        jax.block_until_ready(metrics)
    times = []
    for _ in range(timed):
        start = time.perf_counter()
        state, metrics = step(state, batch, scalars)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return state, metrics, first_s, times

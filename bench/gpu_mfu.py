"""Model FLOPs utilisation (MFU) of the DPO step on one accelerator: SmolLM2-135M and a 1B-shaped model.

    python bench/gpu_mfu.py                                   # both models, the default grid, JSON to bench/results
    python bench/gpu_mfu.py --case llama_1b,off,8,cudnn --case llama_1b,on,8,blocked   # chosen cases, in order
    python bench/gpu_mfu.py --case smollm2_135m,off,8,cudnn --case smollm2_135m,off,8,cudnn,unroll,right_padded
    python bench/gpu_mfu.py --check --case smollm2_135m,off,8,cudnn   # cuDNN against block-wise attention first
    python bench/gpu_mfu.py --models smollm2_135m --pairs 4 --length 256 --steps 2 --attention blocked   # a CPU check

The step is the eq. 7 DPO step as the main job trains it: bfloat16 compute, float32 parameters and AdamW
moments, reference log-probs cached (attached to the batch), one micro-batch, random initialisation (the
shapes are what matter). The cached reference log-probs are a uniform policy's, which is about what a random
initialisation gives: their values do not change the step's work, and the scoring pass that `--reference-pass`
runs instead costs a compilation of its own. Each case records its set-up, reference and first-step seconds.
A case without options attends through the checked cuDNN dispatch, as `bench/README.md`'s H200 tables
measured it; the main job now assumes right padding, so add the option `right_padded` to time exactly its step.
`--profile STEPS` also traces that many steps (`bench/op_profile.py`: time by XLA op, JAX primitive and, on a
GPU, kernel family) and writes the compiled program beside the JSON (`bench/hlo_traffic.py` reads it). Every pair has two sequences of
`--length` tokens, the second half of each marked as action tokens. Per model, remat, pairs per step,
attention (`ModelConfig.attention`: the block-wise kernel or cuDNN's fused one) and options (`OPTIONS`:
layers unrolled, right padding assumed, the forward's logits kept for the backward pass): `--warmup` untimed steps (the first compiles), then the median of `--steps` steps, each
blocked until its metrics are ready. The JSON is rewritten after every case, so a run cut short keeps the cases
it finished.

`--check` first compares the two attention paths on a 2-layer SmolLM2-shaped model in bfloat16 (right-padded
rows of several lengths): the logits and gradients of each against a float32 block-wise reference.

Useful FLOPs are `bench/flops.py`'s (weight matmuls with the unembedding, causal attention's lower triangle,
3x the forward; a rematerialised forward is not useful work). MFU is those over the step time, as a fraction
of the chip's dense bfloat16 peak from its datasheet (`PEAK_BF16_TFLOPS`), and beside it the fraction of the
bfloat16 matmul ceiling XLA reaches on an 8192^3 product in the same process (`bench/ceiling.py`).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import time
from pathlib import Path

import ceiling
import common
import flops
import numpy as np
import op_profile

# Dense bfloat16 tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's datasheets.
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}

# The architectures, without their weights: SmolLM2-135M-Instruct's as the bundled GGUF declares it
# (bench/tests/test_gpu_mfu.py checks that they agree), and Llama-3.2-1B's (hidden 2048, 16 layers, 32/8
# heads, SwiGLU 8192, vocabulary 128,256, tied embeddings).
MODELS = {
    "smollm2_135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "llama_1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
    ),
}


# A case's options: the flag each sets, of the ModelConfig or of the ObjectiveConfig (the main job's defaults:
# `right_padded` on, layers scanned, logits kept up to chunked_logprobs.KEEP_LOGITS_MAX_BYTES, i.e. not at these
# sizes).
OPTIONS = {
    "unroll": ("model", "unroll_layers"),
    "right_padded": ("model", "right_padded"),
    "keep_logits": ("objective", "keep_logits"),
}


def _flags(options: tuple[str, ...], config: str) -> dict:
    return {OPTIONS[option][1]: True for option in options if OPTIONS[option][0] == config}


def model_config(name: str, remat: bool, attention: str = "auto", options: tuple[str, ...] = ()):
    """`MODELS[name]` as a ModelConfig: bfloat16 compute, float32 parameters, its `OPTIONS` named set."""
    import jax.numpy as jnp

    from coevo_jax.models import ModelConfig

    flags = _flags(options, "model")
    return ModelConfig(**MODELS[name], dtype=jnp.bfloat16, remat=remat, attention=attention, **flags)


def objective_config(options: tuple[str, ...] = (), logprob_chunk: int | None = None):
    """The main job's ObjectiveConfig with its `OPTIONS` named set and, if given, `logprob_chunk_size`."""
    from coevo_jax.train import ObjectiveConfig

    chunk = {} if logprob_chunk is None else {"logprob_chunk_size": logprob_chunk}
    return ObjectiveConfig(**chunk, **_flags(options, "objective"))


def peak_tflops(device_kind: str) -> float | None:
    """The datasheet bfloat16 peak of a device kind such as 'NVIDIA H100 80GB HBM3', or None."""
    for chip, peak in PEAK_BF16_TFLOPS.items():
        if chip in device_kind:
            return peak
    return None


def dpo_batch(pairs: int, length: int, vocab_size: int, seed: int = 0) -> dict:
    """A collated DPO batch of random ids: `pairs` chosen/rejected sequences, the second half action tokens."""
    from coevo_jax.data.batching import TokenizedPair, collate_dpo
    from coevo_jax.data.chat_format import TokenizedTrajectory

    rng = np.random.RandomState(seed)
    mask = np.zeros(length, bool)
    mask[length // 2 :] = True
    side = lambda: TokenizedTrajectory(
        rng.randint(common.FIRST_TOKEN_ID, vocab_size, size=length).astype(np.int32), mask
    )
    data = [TokenizedPair(side(), side(), 1.0, 0.0) for _ in range(pairs)]
    return collate_dpo(data, length=length, pairs_per_batch=pairs, pad_id=common.PAD_ID)


def uniform_reference_logps(batch: dict, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rejected) reference log-probs of a uniform policy over `vocab_size` tokens for a collated
    DPO batch (rows: chosen, rejected, chosen, ...)."""
    uniform = -np.sum(batch["loss_mask"], axis=-1) * np.log(vocab_size)
    return uniform[0::2], uniform[1::2]


def bench_case(
    name: str,
    remat: bool,
    pairs: int,
    length: int,
    warmup: int,
    timed: int,
    attention: str = "auto",
    logprob_chunk: int | None = None,
    profile_calls: int = 0,
    hlo_dir: str | None = None,
    reference_pass: bool = False,
    options: tuple[str, ...] = (),
) -> dict:
    """Step time, tokens/s and useful TFLOP/s of one (model, remat, pairs, attention) DPO step; with
    `profile_calls`, also where the time of that many traced steps goes (`op_profile`)."""
    import jax

    from coevo_jax import sharding

    cfg = model_config(name, remat, attention, options)
    objective = objective_config(options, logprob_chunk)
    start = time.perf_counter()
    steps, scalars, state, mesh, rules = common.setup_steps(
        cfg, learning_rate=1e-6, beta=0.1, objective=objective
    )
    jax.block_until_ready(state)
    setup_s = time.perf_counter() - start
    batch = dpo_batch(pairs, length, cfg.vocab_size)
    if reference_pass:  # the main job's way: one scoring pass of the (here initial) policy
        start = time.perf_counter()
        placed = sharding.place_batch(sharding.device_layout(batch), mesh, rules)
        chosen, rejected = jax.device_get(steps.reference(state.params, placed))
        reference_s = time.perf_counter() - start
    else:  # a uniform policy's log-probs: the step does the same work, without compiling the scoring pass
        chosen, rejected = uniform_reference_logps(batch, cfg.vocab_size)
        reference_s = 0.0
    batch["ref_chosen_logps"], batch["ref_rejected_logps"] = np.ravel(chosen), np.ravel(rejected)
    placed = sharding.place_batch(sharding.device_layout(batch), mesh, rules)
    state, metrics, first_s, times = common.time_steps(steps.dpo, state, placed, scalars, warmup, timed)
    step = common.summarize(times)
    useful = flops.dpo_step_flops(flops.model_fields(cfg), pairs, length, reference_forward=False)
    memory = jax.devices()[0].memory_stats() or {}
    profile = None
    if profile_calls:
        hlo_text, run, _ = op_profile.train_step_calls(steps.dpo, state, placed, scalars)
        if hlo_dir is not None:  # the compiled program, to read its fusions afterwards
            path = Path(hlo_dir) / f"hlo_{case_label(name, remat, pairs, attention, options)}.txt.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            with gzip.open(path, "wt") as f:
                f.write(hlo_text)
        try:
            profile = op_profile.profile_ops(run, hlo_text, profile_calls)
        except Exception as error:  # the timing above stands without the breakdown
            profile = {"error": repr(error)[:500], "ops": []}
            print(f"profile failed: {profile['error']}", flush=True)
        else:
            op_profile.print_summary(profile, f"{name} remat={remat} pairs={pairs} attention={attention}", 30)
    return {
        "model": name,
        "remat": remat,
        "attention": attention,
        "options": list(options),
        "pairs": pairs,
        "length": length,
        "setup_s": setup_s,
        "reference_s": reference_s,
        "first_step_s": first_s,
        "step": step,
        "tokens_per_s": 2 * pairs * length / step["median_s"],
        "useful_tflop_per_step": useful / 1e12,
        "useful_tflops": useful / step["median_s"] / 1e12,
        "peak_bytes_in_use": memory.get("peak_bytes_in_use"),  # the process's so far, not this case's
        "final_loss": float(metrics["loss"]),
        "logprob_chunk_size": objective.logprob_chunk_size,
        "profile": op_profile.for_json(profile),
    }


def attention_check(length: int = 512, seed: int = 0) -> dict:
    """Both attention paths in bfloat16 against the block-wise one in float32, on a 2-layer SmolLM2 shape.

    Four right-padded rows of different lengths; the loss is the sum of the real tokens' log-probs (as the
    train steps' is). Returns, per path, max |x - reference| / max |reference| over the real positions'
    logits and over all gradients: cuDNN passes when its errors are within 2x the block-wise path's.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from coevo_jax.models import ModelConfig, blocks
    from coevo_jax.models.decoder import Decoder

    implementation = "cudnn" if jax.default_backend() == "gpu" else "xla"  # no cuDNN: a dry run with XLA's
    reference_cfg = ModelConfig(**dict(MODELS["smollm2_135m"], num_layers=2), attention="blocked")
    params = nnx.to_pure_dict(nnx.state(Decoder(reference_cfg, rngs=nnx.Rngs(seed))))
    rng = np.random.RandomState(seed)
    lengths = np.array([length, 3 * length // 4, length // 2, length // 4 + 3])
    ids = rng.randint(common.FIRST_TOKEN_ID, reference_cfg.vocab_size, size=(len(lengths), length))
    mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
    ids, mask = jnp.asarray(np.where(mask > 0, ids, common.PAD_ID), jnp.int32), jnp.asarray(mask)
    real = mask[:, 1:] > 0

    def run(dtype, attention):
        cfg = reference_cfg.replace(dtype=dtype, attention=attention)
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))

        def loss(p):
            logits = nnx.merge(graphdef, p)(ids, mask)[:, :-1].astype(jnp.float32)
            token_logps = jnp.take_along_axis(jax.nn.log_softmax(logits), ids[:, 1:, None], axis=-1)[..., 0]
            return jnp.sum(jnp.where(real, token_logps, 0.0)), logits

        (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
        flat = jnp.concatenate([g.astype(jnp.float32).ravel() for g in jax.tree.leaves(grads)])
        return np.asarray(jnp.where(real[..., None], logits, 0.0)), np.asarray(flat)

    reference = run(jnp.float32, "blocked")
    errors = {}
    default_implementation, blocks._FUSED_IMPLEMENTATION = blocks._FUSED_IMPLEMENTATION, implementation
    try:
        for attention in ("blocked", "cudnn"):
            got = run(jnp.bfloat16, attention)
            errors[attention] = {
                name: float(np.max(np.abs(x - ref)) / np.max(np.abs(ref)))
                for name, x, ref in zip(("logits", "grads"), got, reference, strict=True)
            }
    finally:  # the timed cases run what the main job runs
        blocks._FUSED_IMPLEMENTATION = default_implementation
    passed = all(errors["cudnn"][k] <= 2 * errors["blocked"][k] + 1e-6 for k in ("logits", "grads"))
    return {
        "implementation": implementation,
        "lengths": lengths.tolist(),
        "relative_errors": errors,
        "passed": passed,
    }


def case_label(name: str, remat: bool, pairs: int, attention: str, options: tuple[str, ...]) -> str:
    """A case's name in file names: `smollm2_135m_remat-off_8_cudnn`, then its options (`_unroll`...)."""
    return "_".join((f"{name}_remat-{'on' if remat else 'off'}_{pairs}_{attention}", *options))


def cases_from_args(args, attention_choices: tuple[str, ...]) -> list[tuple[str, bool, int, str, tuple]]:
    """(model, remat, pairs, attention, options) in run order: each `--case`, else the grid of the flags
    (every grid case with the `--options` set)."""
    if not args.case:
        options = _options(args.options.split(",") if args.options else [], f"--options {args.options}")
        remats = [r == "on" for r in args.remat]
        return list(itertools.product(args.models, remats, args.pairs, args.attention, [options]))
    cases = []
    for spec in args.case:
        fields = spec.split(",")
        if (
            len(fields) < 4
            or fields[0] not in MODELS
            or fields[1] not in ("on", "off")
            or not fields[2].isdigit()
            or fields[3] not in attention_choices
        ):
            raise SystemExit(
                f"--case {spec!r}: expected MODEL,on|off,PAIRS,ATTENTION[,OPTION...] with MODEL in "
                f"{list(MODELS)}, ATTENTION in {list(attention_choices)} and OPTION in {list(OPTIONS)}"
            )
        cases.append((fields[0], fields[1] == "on", int(fields[2]), fields[3], _options(fields[4:], spec)))
    return cases


def _options(words: list[str], where: str) -> tuple[str, ...]:
    """The `OPTIONS` named, in `OPTIONS`' order; an unknown one stops the script."""
    unknown = sorted(set(words) - set(OPTIONS))
    if unknown:
        raise SystemExit(f"{where}: unknown option(s) {unknown}; the options are {list(OPTIONS)}")
    return tuple(option for option in OPTIONS if option in words)


def main() -> None:
    from coevo_jax.models.config import ATTENTION_CHOICES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--pairs", nargs="+", type=int, default=[4, 16])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--remat", nargs="+", default=["on", "off"], choices=["on", "off"])
    parser.add_argument("--attention", nargs="+", default=["auto"], choices=ATTENTION_CHOICES)
    parser.add_argument(
        "--options", default="", help=f"comma-separated, for every grid case: {list(OPTIONS)}"
    )
    parser.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="MODEL,REMAT,PAIRS,ATTENTION[,OPTION...]",
        help="one case, e.g. llama_1b,off,8,cudnn,unroll,right_padded (repeatable; replaces the grid)",
    )
    parser.add_argument("--check", action="store_true", help="compare cuDNN and block-wise attention first")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=None, help="results directory (default bench/results)")
    parser.add_argument(
        "--logprob-chunk",
        type=int,
        default=None,
        help="ObjectiveConfig.logprob_chunk_size (positions per row)",
    )
    parser.add_argument(
        "--reference-pass",
        action="store_true",
        help="score the batch with the policy for the reference log-probs (default: a uniform policy's)",
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="STEPS", help="also trace this many steps per case"
    )
    args = parser.parse_args()
    cases = cases_from_args(args, ATTENTION_CHOICES)
    import jax

    device_kind = str(jax.devices()[0].device_kind)
    peak = peak_tflops(device_kind)
    ceiling_tflops = ceiling.matmul_gflops("bfloat16") / 1e3
    print(
        f"{device_kind}: datasheet bf16 peak {peak} TFLOP/s, XLA 8192^3 bf16 matmul {ceiling_tflops:.0f} TFLOP/s",
        flush=True,
    )
    record = {
        "device": device_kind,
        "jax": jax.__version__,
        "peak_bf16_tflops": peak,
        "xla_bf16_matmul_tflops": ceiling_tflops,
        "models": {name: MODELS[name] for name in sorted({case[0] for case in cases})},
        "cases": [],
    }
    if args.check:
        try:
            record["attention_check"] = attention_check()
        except Exception as error:  # recorded; the timed cases still run
            record["attention_check"] = {"error": repr(error)[:500]}
        print(f"attention check: {record['attention_check']}", flush=True)
        common.write_result("gpu_mfu", record, args.out)
    for name, remat, pairs, attention, options in cases:
        label = f"{name:13s} remat={'on' if remat else 'off':3s} pairs={pairs:3d} attention={attention:7s}"
        label += "".join(f" {option}" for option in options)
        try:
            case = bench_case(
                name,
                remat,
                pairs,
                args.length,
                args.warmup,
                args.steps,
                attention,
                args.logprob_chunk,
                args.profile,
                args.out,
                args.reference_pass,
                options,
            )
        except Exception as error:  # e.g. out of device memory: recorded, the grid goes on
            case = {
                "model": name,
                "remat": remat,
                "pairs": pairs,
                "attention": attention,
                "options": list(options),
            }
            case["error"] = repr(error)[:500]
            print(f"{label}: {case['error']}", flush=True)
        else:
            case["mfu"] = case["useful_tflops"] / peak if peak else None
            case["fraction_of_ceiling"] = case["useful_tflops"] / ceiling_tflops
            mfu = f"{case['mfu']:.1%}" if peak else "n/a"
            peak_gib = (case["peak_bytes_in_use"] or 0) / 2**30
            print(
                f"{label} x {args.length}: "
                f"{case['step']['median_s'] * 1e3:8.1f} ms/step (first {case['first_step_s']:.1f} s) "
                f"{case['tokens_per_s']:9.0f} tok/s {case['useful_tflops']:7.1f} TFLOP/s MFU {mfu} "
                f"({case['fraction_of_ceiling']:.1%} of the matmul ceiling), process peak {peak_gib:.1f} GiB",
                flush=True,
            )
        record["cases"].append(case)
        common.write_result("gpu_mfu", record, args.out)


if __name__ == "__main__":
    main()

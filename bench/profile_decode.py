"""Where a decode step's time goes: the sampler's decode loop profiled op by op, against its memory floor.

    python bench/profile_decode.py                                     # the anchor, 8 rows, 384 slots
    python bench/profile_decode.py --model smollm2 --rows 16 --live 1500 --window 2048

Random-init weights (the anchor's, or SmolLM2-135M's shapes); the cache is filled with random keys and values
up to `--live` tokens per row (no prefill), then one `Sampler.decode` call of `--new` greedy tokens runs
under `jax.profiler`. Each XLA op of the decode program (the trace's `hlo_module` names it) is summed over
the call and named by the JAX operation it came from (`op_name` metadata), so the dots of attention (scores
`btkge,bkse`, values `bkgts,bkse`) and of the projections (`...k,kn`) show apart. Printed beside it: the
step's floor, the bytes a step must read (`flops.decode_step_bytes`: every matmul weight once, the K and V
of every row's window) over the streaming bandwidth measured in the same run (`ceiling.memory_gbps`). Ops of
the two CPU threads overlap, so op time may exceed wall time; read shares, not totals. Profiling slows the
step a little.
"""

from __future__ import annotations

import argparse
import collections
import time

import ceiling
import common
import flops
import numpy as np
from op_profile import op_names, primitive, trace_events


def _cache_filler(sampler, live: int, seed: int):
    """A function returning the sampler's empty cache with `live` random keys and values per row (RoPE
    positions 0..live-1): a fresh copy each call, since `decode` donates its cache."""
    import jax.numpy as jnp

    from coevo_jax.models.kv_cache import KVCache

    empty = sampler.init_cache()
    shape = empty.values.shape  # [L, B, K, S, E]; keys are [L, B, K, E, S]
    rng = np.random.default_rng(seed)
    host = []
    for _ in range(2):  # keys, values
        filled = np.zeros(shape, np.float32)
        filled[..., :live, :] = rng.standard_normal((*shape[:3], live, shape[4]), np.float32)
        host.append(filled)
    host[0] = np.ascontiguousarray(host[0].swapaxes(-1, -2))  # keys: slots last

    def fill() -> KVCache:
        ids = empty.token_ids_BxS
        return KVCache(
            keys=jnp.asarray(host[0]),
            values=jnp.asarray(host[1]),
            lengths_B=jnp.full(shape[1], live, jnp.int32),
            token_ids_BxS=None if ids is None else jnp.zeros_like(ids),
        )

    return fill


def _origin(described: str) -> str:
    """An op's JAX primitive (`op_profile.primitive`), a dot's with its einsum spec, so the projections,
    the unembedding and attention's two products show apart."""
    kind = primitive(described)
    if kind != "dot_general":
        return kind
    path = described.split(maxsplit=1)[1].split(";")[0].rstrip("/").split("/")
    return f"dot {path[-2]}" if len(path) > 1 else kind


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=common.DECODE_MODELS, default="anchor")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--live", type=int, default=256, help="cached tokens per row before decoding")
    parser.add_argument("--window", type=int, default=384, help="cache slots the decode attends over")
    parser.add_argument("--new", type=int, default=32, help="tokens decoded in the profiled call")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    if args.live + args.new > args.window:
        parser.error(f"--live {args.live} + --new {args.new} exceed --window {args.window}")
    import jax
    from flax import nnx

    from coevo_jax.models import Decoder
    from coevo_jax.sampling import Sampler, SamplingConfig

    gbps = ceiling.memory_gbps()
    cfg = common.decode_model_config(args.model)
    sampler, params = Sampler.for_model(
        Decoder(cfg, rngs=nnx.Rngs(0)),
        batch_size=args.rows,
        cache_len=args.window,
        sampling=SamplingConfig(max_new_tokens=args.new),
        window_buckets=(args.window,),
    )
    logits = jax.numpy.asarray(
        np.random.default_rng(1).standard_normal((args.rows, cfg.vocab_size), np.float32)
    )
    active = [True] * args.rows
    fill = _cache_filler(sampler, args.live, seed=2)
    cache = fill()
    names = op_names(
        sampler._decode.lower(
            params, cache, logits, jax.numpy.asarray(active), jax.random.key(0), window=args.window
        )
        .compile()
        .as_text()
    )

    def decode_once(key: int) -> float:
        fresh = fill()  # decode donates its cache
        jax.block_until_ready(fresh)
        start = time.perf_counter()
        result, _ = sampler.decode(params, fresh, logits, active, jax.random.key(key))
        jax.block_until_ready(result.tokens_BxN)
        return time.perf_counter() - start

    decode_once(0)  # compile
    steps = args.new - 1  # the first token comes from the given logits
    walls = [decode_once(k) / steps for k in (1, 2, 3)]
    events = trace_events(lambda: decode_once(4), calls=1)
    per_op, calls = collections.Counter(), collections.Counter()
    for event in events:
        op_args = event.get("args") or {}
        name = event.get("name", "")
        # a `while` op's span holds its body's ops: counted through them
        if event.get("ph") == "X" and op_args.get("hlo_module") == "jit_decode" and name in names:
            if name.startswith("while"):
                continue
            per_op[name] += event["dur"] / steps  # µs per step
            calls[name] += 1
    total = sum(per_op.values())
    model = flops.model_fields(cfg)
    step_bytes = flops.decode_step_bytes(model, args.rows, args.window)
    floor_ms = step_bytes / (gbps * 1e9) * 1e3
    print(
        f"{args.model}: {args.rows} rows, {args.live} live tokens, window {args.window}, {args.new} new tokens; "
        f"streaming read {gbps:.1f} GB/s"
    )
    print(
        f"decode step {np.median(walls) * 1e3:.2f} ms (unprofiled, median of 3); floor {floor_ms:.2f} ms "
        f"({step_bytes / 1e6:.0f} MB a step); "
        f"{sum(calls.values()) / steps:.0f} ops a step, {total / 1e3:.2f} ms of op time a step"
    )
    per_kind, kind_calls = collections.Counter(), collections.Counter()
    for name, us in per_op.items():
        kind = _origin(names[name])
        per_kind[kind] += us
        kind_calls[kind] += calls[name] / steps
    print(f"\n{'ms/step':>8} {'share':>6} {'ops/step':>8} {'µs/op':>7}  JAX origin")
    for kind, us in per_kind.most_common(args.top):
        print(
            f"{us / 1e3:8.3f} {us / total:6.1%} {kind_calls[kind]:8.1f} {us / kind_calls[kind]:7.1f}  {kind}"
        )
    print(f"\n{'ms/step':>8} {'share':>6}  op  shape  JAX op (the {args.top} longest)")
    for name, us in per_op.most_common(args.top):
        described = " ".join(names[name].split())[:120]
        print(f"{us / 1e3:8.3f} {us / total:6.1%}  {name}  {described}")


if __name__ == "__main__":
    main()

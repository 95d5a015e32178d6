"""Decode attention over a KV cache held stacked ([L, B, K, S, E], the layer scan's layout; the cache now puts
the keys' slots last) against one buffer per layer, A/B in one run: where a long-context decode step's time goes.

    python bench/kv_layout.py [--layers 6] [--rows 16] [--slots 3072] [--rounds 5]

One query token per row attends every slot of each layer's keys and values (float32, SmolLM2's 3 KV heads of
64 with 3 query heads each), layer after layer, the output feeding the next layer's query. Variants:
- `scan, stacked`: a `lax.scan` over layers reading layer i with `dynamic_index_in_dim` (what `Decoder` does);
- `unrolled, stacked`: a Python loop reading `cache[i]` (a static slice);
- `unrolled, per layer`: a Python loop over L separate arrays (the layout before the scan).
XLA materialises a layer's slice of a stacked array before the attention's dot, so the stacked variants read the
cache about three times (slice read, slice write, dot read). Prints the median time and the cache bytes read
once over that time.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--slots", type=int, default=3072)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    layers, kv_heads, group, head_dim = args.layers, 3, 3, 64
    rng = np.random.RandomState(0)
    shape = (layers, args.rows, kv_heads, args.slots, head_dim)
    keys = jnp.asarray(rng.randn(*shape).astype(np.float32))
    values = jnp.asarray(rng.randn(*shape).astype(np.float32))
    query = jnp.asarray(rng.randn(args.rows, kv_heads, group, head_dim).astype(np.float32) / 8)

    def attend(q_BxKxGxE, k_BxKxSxE, v_BxKxSxE):
        scores = jnp.einsum("bkge,bkse->bkgs", q_BxKxGxE, k_BxKxSxE)
        return q_BxKxGxE + jnp.einsum("bkgs,bkse->bkge", jax.nn.softmax(scores, -1), v_BxKxSxE)

    @jax.jit
    def scan_stacked(q, keys, values):
        def step(x, layer):
            take = lambda a: jax.lax.dynamic_index_in_dim(a, layer, 0, keepdims=False)  # noqa: E731
            return attend(x, take(keys), take(values)), None

        return jax.lax.scan(step, q, jnp.arange(layers))[0]

    @jax.jit
    def unrolled_stacked(q, keys, values):
        for layer in range(layers):
            q = attend(q, keys[layer], values[layer])
        return q

    @jax.jit
    def unrolled_per_layer(q, keys, values):
        for k, v in zip(keys, values, strict=True):
            q = attend(q, k, v)
        return q

    per_layer = ([keys[i] for i in range(layers)], [values[i] for i in range(layers)])
    variants = {
        "scan, stacked": (scan_stacked, (query, keys, values)),
        "unrolled, stacked": (unrolled_stacked, (query, keys, values)),
        "unrolled, per layer": (unrolled_per_layer, (query, *per_layer)),
    }
    expected = np.asarray(scan_stacked(query, keys, values))
    for name, (fn, inputs) in variants.items():
        np.testing.assert_allclose(np.asarray(fn(*inputs)), expected, rtol=1e-4, atol=1e-4, err_msg=name)
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (fn, inputs) in variants.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(*inputs))
            times[name].append(time.perf_counter() - start)
    cache_mb = 2 * keys.size * 4 / 1e6
    print(f"{layers} layers x {args.rows} rows x {args.slots} slots: {cache_mb:.0f} MB of keys and values")
    for name, samples in times.items():
        median = float(np.median(samples))
        print(f"{name:>20}: {1e3 * median:8.1f} ms  {cache_mb / median / 1e3:5.1f} GB/s")


if __name__ == "__main__":
    main()

"""A decode step's products, XLA:CPU's against the hand-written `cpu_kernels.small_matmul`, in one run.

    python bench/small_matmul.py                          # the anchor's and SmolLM2's decode shapes
    python bench/small_matmul.py --shapes 8x256x688,16x576x1536
    python bench/small_matmul.py --shapes 16x576x49152t   # a tied unembedding: `small_matmul_nt`

A shape ending in `t` stores its weight transposed ([features, depth], a tied embedding table) and pits
XLA's product by the transpose (the decoder's einsum) against `cpu_kernels.small_matmul_nt`.

Each shape (rows x depth x features) multiplies distinct float32 weights, 64 MB of them in all, one after
another in one program, so every weight comes from memory as in a decode step. Both programs are compiled
first, then timed alternately (median of `--repeats` rounds): microseconds a product and the weight's bytes
over that time, beside the streaming read bandwidth measured in the same run (`ceiling.memory_gbps`).
"""

from __future__ import annotations

import argparse
import time

import ceiling
import numpy as np

# the anchor (8 rows): q, k/v, o, gate/up, down, unembedding; SmolLM2 (16 rows): q/o, k/v, gate/up, down,
# its tied unembedding (and at 8 rows)
DEFAULT_SHAPES = (
    "8x256x256,8x256x128,8x256x688,8x688x256,8x256x8192,16x576x576,16x576x192,16x576x1536,16x1536x576,"
    "16x576x49152t,8x576x49152t"
)


def chained_products(matmul, weights, rows: int, features: int):
    """A jitted program applying `matmul(x, w)` for every w in turn (each product's input depends on the
    last, so none is skipped or reordered)."""
    import jax
    import jax.numpy as jnp

    def run(x):
        total = jnp.zeros((rows, features), jnp.float32)
        for w in weights:
            total = total + matmul(x + 0 * total[:, :1], w)
        return total

    return jax.jit(run)


def bench_shape(
    rows: int, depth: int, features: int, repeats: int, seed: int, transposed: bool = False
) -> dict:
    import jax.numpy as jnp

    from coevo_jax.models import cpu_kernels

    if not cpu_kernels.small_matmul_applies(jnp.float32, jnp.float32, rows):
        raise SystemExit(f"the kernel does not serve {rows} rows here (no compiler, or kernels off)")
    rng = np.random.default_rng(seed)
    count = max(2, int(64e6 // (depth * features * 4)))
    stored = (features, depth) if transposed else (depth, features)
    weights = [jnp.asarray(rng.standard_normal(stored, np.float32)) for _ in range(count)]
    x = jnp.asarray(rng.standard_normal((rows, depth), np.float32))
    if transposed:
        xla = lambda x, w: jnp.einsum("md,dv->mv", x, w.T, preferred_element_type=jnp.float32)
        kernel = cpu_kernels.small_matmul_nt
    else:
        xla, kernel = jnp.matmul, cpu_kernels.small_matmul
    programs = {
        "xla": chained_products(xla, weights, rows, features),
        "kernel": chained_products(kernel, weights, rows, features),
    }
    outputs = {name: np.asarray(program(x)) for name, program in programs.items()}
    error = np.abs(outputs["kernel"] - outputs["xla"]).max() / np.abs(outputs["xla"]).max()
    times = {name: [] for name in programs}
    for _ in range(repeats):
        for name, program in programs.items():
            start = time.perf_counter()
            program(x).block_until_ready()
            times[name].append((time.perf_counter() - start) / count)
    row = {"shape": [rows, depth, features], "transposed": transposed, "relative_difference": float(error)}
    for name, seconds in times.items():
        median = float(np.median(seconds))
        row[f"{name}_us"] = median * 1e6
        row[f"{name}_gbps"] = depth * features * 4 / median / 1e9
    return row


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"streaming read {ceiling.memory_gbps():.1f} GB/s")
    print(
        f"{'rows x depth x features':>24}  {'XLA µs':>8} {'GB/s':>5}  {'kernel µs':>9} {'GB/s':>5}  speed-up"
    )
    for text in args.shapes.split(","):
        transposed = text.endswith("t")
        rows, depth, features = (int(part) for part in text.removesuffix("t").split("x"))
        row = bench_shape(rows, depth, features, args.repeats, args.seed, transposed)
        print(
            f"{text:>24}  {row['xla_us']:8.1f} {row['xla_gbps']:5.1f}  {row['kernel_us']:9.1f} "
            f"{row['kernel_gbps']:5.1f}  {row['xla_us'] / row['kernel_us']:7.2f}x"
        )


if __name__ == "__main__":
    main()

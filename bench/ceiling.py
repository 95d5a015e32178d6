"""The measured matmul ceiling of XLA on this machine: square products, float32 and bfloat16 inputs.

    python bench/ceiling.py            # prints GFLOP/s, writes bench/results/ceiling_xla.json

Float32 products accumulate in float32 (on a GPU XLA's default precision may use TF32); bfloat16
products take bfloat16 inputs and give a float32 result (as our bf16-compute steps do). Median of 10
timed products after 2 warm-ups, 2048^3 each on the CPU, 8192^3 on an accelerator (where 2048^3 is too
small to keep it busy). The memory bandwidth is a streaming read of a 256 MiB buffer (a jitted sum),
the bound on decoding (see `bench/flops.py`).
"""

from __future__ import annotations

import argparse
import time

import common
import numpy as np


def default_size() -> int:
    import jax

    return 2048 if jax.default_backend() == "cpu" else 8192


def _median_seconds(run, repeats: int) -> float:
    """Median wall time of `run()` (blocked until its result is ready) after 2 untimed warm-up calls."""
    for _ in range(2):
        run().block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run().block_until_ready()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def matmul_gflops(dtype_name: str, size: int | None = None, repeats: int = 10) -> float:
    """Median GFLOP/s of a jitted [size, size] x [size, size] product."""
    import jax
    import jax.numpy as jnp

    size = size or default_size()
    dtype = jnp.dtype(dtype_name)
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32).astype(dtype)
    product = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    return 2 * size**3 / _median_seconds(lambda: product(a, b), repeats) / 1e9


def memory_gbps(megabytes: int = 256, repeats: int = 10) -> float:
    """Median GB/s of a jitted sum over a float32 buffer far larger than the caches (a streaming read)."""
    import jax
    import jax.numpy as jnp

    values = jnp.ones((megabytes * 2**20 // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    return values.nbytes / _median_seconds(lambda: total(values), repeats) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="results directory (default bench/results)")
    args = parser.parse_args()
    import jax

    size = default_size()
    results = {name: matmul_gflops(name, size) for name in ("float32", "bfloat16")}
    for name, gflops in results.items():
        print(f"XLA {name:8s} {size}^3 matmul: {gflops:7.0f} GFLOP/s")
    bandwidth = memory_gbps()
    print(f"XLA streaming read: {bandwidth:7.1f} GB/s")
    common.write_result(
        "ceiling_xla",
        {
            "device": str(jax.devices()[0].device_kind),
            "jax": jax.__version__,
            "size": size,
            "gflops": results,
            "memory_gbps": bandwidth,
        },
        args.out,
    )


if __name__ == "__main__":
    main()

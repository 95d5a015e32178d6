"""The sampler's greedy argmax, A/B in one run: `jnp.argmax` against `sampling.first_argmax`.

`first_argmax` is the CPU kernel `cpu_kernels.logit_stats` for float32 logits on the CPU, XLA's two passes
elsewhere or with `COEVO_JAX_CPU_KERNELS=0`.

    python bench/argmax.py [--rounds 10] [--steps 50]

Each variant runs `--steps` times inside a `fori_loop`, as in the decode loop, on float32 logits of the
shapes sampling meets: the rollout benchmark's policy (8 rows, vocabulary 620), the anchor (8 × 8,192) and
SmolLM2's ScienceWorld job (16 × 49,152). A third variant, `loop only`, takes no argmax: the loop's own cost,
to subtract. Variants are compiled first, then timed alternately; the median over rounds is printed in µs a
step. Both argmax variants are checked to give the same tokens first.
"""

from __future__ import annotations

import argparse
import time

SHAPES = ((8, 620), (8, 8192), (16, 49152))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from coevo_jax.sampling import first_argmax

    variants = {
        "jnp.argmax": lambda x: jnp.argmax(x, axis=-1).astype(jnp.int32),
        "first_argmax": first_argmax,
        "loop only": lambda x: x[:, 0].astype(jnp.int32),
    }

    def looped(pick):
        def run(logits_BxV):
            def body(_, carry):
                x_BxV, total = carry
                token_B = pick(x_BxV)  # the next step's logits depend on this step's tokens
                return x_BxV + 1e-6 * token_B[:, None].astype(x_BxV.dtype), total + token_B.sum()

            return jax.lax.fori_loop(0, args.steps, body, (logits_BxV, 0))

        return jax.jit(run)

    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; µs a step, median of {args.rounds}")
    print(f"{'rows':>4} {'vocab':>6} " + " ".join(f"{name:>13}" for name in variants))
    for rows, vocab in SHAPES:
        logits = jnp.asarray(np.random.default_rng(0).standard_normal((rows, vocab), np.float32))
        np.testing.assert_array_equal(np.asarray(first_argmax(logits)), np.argmax(np.asarray(logits), -1))
        programs = {name: looped(pick) for name, pick in variants.items()}
        for program in programs.values():
            jax.block_until_ready(program(logits))
        times = {name: [] for name in programs}
        for _ in range(args.rounds):
            for name, program in programs.items():
                start = time.perf_counter()
                jax.block_until_ready(program(logits))
                times[name].append((time.perf_counter() - start) / args.steps * 1e6)
        print(f"{rows:>4} {vocab:>6} " + " ".join(f"{float(np.median(t)):13.1f}" for t in times.values()))


if __name__ == "__main__":
    main()

"""`cpu_kernels.small_matmul` (or `small_matmul_nt`) of another git revision against this checkout's, in one
process, interleaved.

    python bench/small_matmul_ab.py --rev HEAD~1
    python bench/small_matmul_ab.py --rev main --shapes 16x576x576,16x1536x576 --rounds 25
    python bench/small_matmul_ab.py --rev HEAD~1 --kernel small_matmul_nt --shapes 16x576x49152

On a noisy machine, runs minutes apart (checkout against checkout) differ by more than most kernel changes:
the streaming read of one 2-core machine swung between 36 and 84 GB/s. Here both kernels run in the same
process, one product after the other in every round (which goes first alternates), so both see the same
machine, and each round gives a ratio. The revision's kernel source is compiled as `cpu_kernels` compiles its
own (the same flags and compiler, `$CXX` or `c++`), its handler symbol renamed, and registered under a target
of its own.
`small_matmul_nt` takes its weight stored transposed ([features, depth], a tied embedding table).

Each shape (rows x depth x features) multiplies distinct float32 weights, 64 MB of them, one after another
in one program (`small_matmul.chained_products`), so every weight comes from memory as in a decode step.
Printed: the medians of microseconds a product, and the median, minimum and maximum over rounds of the
revision's time over this checkout's (above 1: this checkout is faster).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
from small_matmul import chained_products

CSRC = "coevo_jax/models/csrc"
DEFAULT_SHAPES = "16x576x576,16x576x192,16x576x1536,16x1536x576,8x256x688"
OTHER_TARGET = "coevo_jax_small_matmul_ab_other"
HANDLERS = {"small_matmul": "SmallMatmulF32", "small_matmul_nt": "SmallMatmulNtF32"}  # kernel: its symbol


def build_revision_kernel(rev: str, kernel: str, workdir: Path) -> Path:
    """The shared library of `rev`'s `kernel`.cc, its handler renamed (`HANDLERS[kernel]` + "Other")."""
    import jax

    from coevo_jax.models import cpu_kernels

    repo = Path(__file__).resolve().parent.parent
    archive = workdir / "csrc.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(repo), "archive", rev, CSRC], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(workdir, filter="data")
    source, handler = workdir / CSRC / f"{kernel}.cc", HANDLERS[kernel]
    if not source.exists():
        raise SystemExit(f"{rev} has no {CSRC}/{kernel}.cc")
    text = source.read_text()
    if f"{handler}," not in text:
        raise SystemExit(f"{rev}:{CSRC}/{kernel}.cc defines no {handler} handler")
    source.write_text(text.replace(f"{handler},", f"{handler}Other,"))
    library = workdir / "other.so"
    compiler = os.environ.get("CXX", "c++")
    command = [compiler, *cpu_kernels._FLAGS, f"-I{jax.ffi.include_dir()}", str(source), "-o", str(library)]
    subprocess.run(command, check=True)
    return library


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rev", required=True, help="the git revision to compare this checkout against")
    parser.add_argument("--kernel", choices=sorted(HANDLERS), default="small_matmul")
    parser.add_argument(
        "--shapes", help="rows x depth x features, comma-separated (default: SmolLM2's and the anchor's)"
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp

    from coevo_jax.models import cpu_kernels

    if not cpu_kernels.small_matmul_applies(jnp.float32, jnp.float32, 1):
        raise SystemExit("this checkout's kernels are off here (no compiler, or COEVO_JAX_CPU_KERNELS=0)")
    transposed = args.kernel == "small_matmul_nt"
    shapes = args.shapes or ("16x576x49152,8x576x49152" if transposed else DEFAULT_SHAPES)
    with tempfile.TemporaryDirectory() as workdir:
        library = ctypes.cdll.LoadLibrary(str(build_revision_kernel(args.rev, args.kernel, Path(workdir))))
    handler = getattr(library, HANDLERS[args.kernel] + "Other")
    jax.ffi.register_ffi_target(OTHER_TARGET, jax.ffi.pycapsule(handler), platform="cpu")

    def other(x, w):
        features = w.shape[0] if transposed else w.shape[1]
        call = jax.ffi.ffi_call(OTHER_TARGET, jax.ShapeDtypeStruct((x.shape[0], features), jnp.float32))
        return call(x, w) if transposed else call(x, w[None], jnp.asarray(0, jnp.int32))

    this = cpu_kernels.small_matmul_nt if transposed else cpu_kernels.small_matmul

    print(f"{'rows x depth x features':>24}  {args.rev + ' µs':>12} {'this µs':>9}  ratio: median (min-max)")
    for text in shapes.split(","):
        rows, depth, features = (int(part) for part in text.split("x"))
        rng = np.random.default_rng(args.seed)
        count = max(2, int(64e6 // (depth * features * 4)))
        stored = (features, depth) if transposed else (depth, features)
        weights = [jnp.asarray(rng.standard_normal(stored, np.float32)) for _ in range(count)]
        x = jnp.asarray(rng.standard_normal((rows, depth), np.float32))
        programs = {
            "other": chained_products(other, weights, rows, features),
            "this": chained_products(this, weights, rows, features),
        }
        outputs = {name: np.asarray(program(x)) for name, program in programs.items()}
        scale = np.abs(outputs["other"]).max()
        if np.abs(outputs["this"] - outputs["other"]).max() > 1e-4 * scale:
            raise SystemExit(f"{text}: the two kernels' products differ")
        times = {name: [] for name in programs}
        for round_index in range(args.rounds):
            order = list(programs) if round_index % 2 == 0 else list(programs)[::-1]  # neither always first
            for name in order:
                program = programs[name]
                start = time.perf_counter()
                program(x).block_until_ready()
                times[name].append((time.perf_counter() - start) / count * 1e6)
        other_us, this_us = np.array(times["other"]), np.array(times["this"])
        ratios = other_us / this_us
        print(
            f"{text:>24}  {np.median(other_us):12.1f} {np.median(this_us):9.1f}  {np.median(ratios):.2f} "
            f"({ratios.min():.2f}-{ratios.max():.2f})"
        )


if __name__ == "__main__":
    main()

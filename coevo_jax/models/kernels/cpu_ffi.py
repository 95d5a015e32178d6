"""Hand-written XLA:CPU kernels (XLA FFI), built from `csrc/` by the machine's C++ compiler on first use.

- `prefix_attention` attends each query over the first `limit` cached slots of its row only, scores,
  softmax and values in one pass split over XLA's intra-op threads. XLA itself must read every slot of the
  cache window, however short each row's live context (static shapes).
- `small_matmul` multiplies a few rows (a decode step's) by a weight matrix, streaming the weight from
  memory on both threads: 1.2-2.5x XLA's one-thread product at 8 rows. `small_matmul_nt` does the same
  with the weight stored transposed (a tied embedding table as the unembedding).
- `logit_stats` gives each row's first argmax and log-sum-exp in one call: a decode step's greedy token
  and its log-prob normaliser.

This module only builds and calls them; when they serve (float32 operands, shapes their buffers hold) is
the CPU kernel set's business (`kernels.cpu.CpuKernels`), and whether a model uses that set is decided
once, when it is built (`kernels.resolve`).

The shared library is compiled once per source, compiler, CPU and jaxlib (`-O3 -march=native`: the machine
that runs it builds it), into `$COEVO_JAX_KERNEL_DIR` (default `~/.cache/coevo_jax/kernels`); the compiler
is `$CXX` (default `c++`). Without a working compiler `available()` is False, and one warning says why.
Nothing is downloaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.atomic_files import atomic_path

log = logging.getLogger(__name__)

SOURCES = tuple(
    Path(__file__).with_name("csrc") / name
    for name in ("prefix_attention.cc", "small_matmul.cc", "small_matmul_nt.cc", "logit_stats.cc")
)
HEADERS = tuple(  # included by the sources
    Path(__file__).with_name("csrc") / name for name in ("parallel_parts.h", "vector_math.h")
)
TARGET = "coevo_jax_prefix_attention_f32"
SMALL_MATMUL_TARGET = "coevo_jax_small_matmul_f32"
SMALL_MATMUL_NT_TARGET = "coevo_jax_small_matmul_nt_f32"
LOGIT_STATS_TARGET = "coevo_jax_logit_stats_f32"
MAX_HEAD_DIM = 256  # the kernel's query buffers
# Up to here the kernel streams the weights faster than XLA:CPU's product; beyond,
# its arithmetic (every weight times every row) rather than the memory traffic sets the pace.
SMALL_MATMUL_MAX_ROWS = 16
_FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-w")


def _cpu_signature() -> str:
    """What `-march=native` depends on: the CPU model and flags (a shared home may span machines)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
        return "\n".join(wanted) or platform.processor()
    except OSError:
        return platform.machine() + platform.processor()


def _library_path(compiler: str) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256()
    parts = (
        *(source.read_bytes() for source in SOURCES + HEADERS),
        version.encode(),
        " ".join(_FLAGS).encode(),
    )
    for part in (*parts, _cpu_signature().encode()):
        digest.update(part)
    digest.update(jax.__version__.encode())
    directory = Path(os.environ.get("COEVO_JAX_KERNEL_DIR", Path.home() / ".cache" / "coevo_jax" / "kernels"))
    return directory / f"cpu_kernels-{digest.hexdigest()[:16]}.so"


def _build(compiler: str) -> Path:
    """The compiled library, built now unless already there; written under a temporary name, then renamed,
    so concurrent builds (test workers) never load a half-written file."""
    path = _library_path(compiler)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as partial:
        command = [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", partial]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return path


def _load_and_register(compiler: str) -> bool:
    """Builds (if needed), loads and registers the kernel; False, with a warning saying why, if that fails."""
    try:
        library = ctypes.cdll.LoadLibrary(str(_build(compiler)))
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.PrefixAttentionF32), platform="cpu")
        jax.ffi.register_ffi_target(
            SMALL_MATMUL_TARGET, jax.ffi.pycapsule(library.SmallMatmulF32), platform="cpu"
        )
        jax.ffi.register_ffi_target(
            SMALL_MATMUL_NT_TARGET, jax.ffi.pycapsule(library.SmallMatmulNtF32), platform="cpu"
        )
        jax.ffi.register_ffi_target(
            LOGIT_STATS_TARGET, jax.ffi.pycapsule(library.LogitStatsF32), platform="cpu"
        )
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning("CPU kernels unavailable, XLA's path serves instead: %s", error)
        return False
    return True


@functools.cache
def available() -> bool:
    """Whether the kernels are built and registered: `_load_and_register` once per process, with `$CXX`
    (default `c++`)."""
    return _load_and_register(os.environ.get("CXX", "c++"))


def _require() -> None:
    if not available():
        raise RuntimeError("the CPU kernels could not be built; see the warning above")


def logit_stats(x_BxV: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(int32 [...] first argmax, float32 [...] log-sum-exp) over the last axis of float32 `x`, in one call.
    The argmax is `jnp.argmax`'s (a NaN counts as the largest); the log-sum-exp is
    NaN for a row holding a NaN, -inf for a row of -inf, +inf for one holding +inf. No autodiff rule."""
    _require()
    *lead, vocab = x_BxV.shape
    rows = int(np.prod(lead, dtype=np.int64))
    shapes = (jax.ShapeDtypeStruct((rows,), jnp.int32), jax.ShapeDtypeStruct((rows,), jnp.float32))
    call = jax.ffi.ffi_call(LOGIT_STATS_TARGET, shapes, vmap_method="sequential")
    argmax, lse = call(x_BxV.reshape(rows, vocab))
    return argmax.reshape(lead), lse.reshape(lead)


def _few_rows_product(target: str, x_MxK: jax.Array, features: int, *weights) -> jax.Array:
    """x [..., K] with its leading axes flattened into rows, through kernel `target` (operands: the rows,
    then `weights`), giving float32 [..., features]."""
    _require()
    *lead, depth = x_MxK.shape
    rows = int(np.prod(lead, dtype=np.int64))
    out_shape = jax.ShapeDtypeStruct((rows, features), jnp.float32)
    call = jax.ffi.ffi_call(target, out_shape, vmap_method="sequential")
    return call(x_MxK.reshape(rows, depth), *weights).reshape(*lead, features)


def small_matmul(x_MxK: jax.Array, w_KxN: jax.Array, layer=None) -> jax.Array:
    """x [..., K] @ w [K, N] -> [..., N] in float32, both threads streaming w (up to `SMALL_MATMUL_MAX_ROWS`
    rows).

    With `layer`, `w` is a stack [L, K, N] and its layer `layer` is the weight, read in place (slicing it out
    first would copy it). No autodiff rule: callers that differentiate wrap it (`models.dense`)."""
    w_LxKxN = w_KxN[None] if layer is None else w_KxN
    layer = jnp.asarray(0 if layer is None else layer, jnp.int32)
    return _few_rows_product(SMALL_MATMUL_TARGET, x_MxK, w_LxKxN.shape[-1], w_LxKxN, layer)


def small_matmul_nt(x_MxK: jax.Array, w_NxK: jax.Array) -> jax.Array:
    """x [..., K] @ w [N, K].T -> [..., N] in float32 (up to `SMALL_MATMUL_MAX_ROWS` rows): the product by a
    weight stored transposed (a tied embedding table as the unembedding), each output a dot product of two
    contiguous rows, both threads streaming w. No autodiff rule."""
    return _few_rows_product(SMALL_MATMUL_NT_TARGET, x_MxK, w_NxK.shape[0], w_NxK)


def prefix_attention(
    q_BxKxQxE: jax.Array,
    keys_LxBxKxExS: jax.Array,
    values_LxBxKxSxE: jax.Array,
    layer,
    limits_BxT: jax.Array,
) -> jax.Array:
    """Grouped-query attention over slot prefixes of layer `layer` of a stacked cache (read in place): query j
    of (row b, kv head k) attends slots [0, limits[b, j % T]) with softmax(q . k / sqrt(E)); a limit of 0
    gives zeros. Queries come g-major (Q = G * T: the T positions of the group's head 0, then of head 1, ...).
    float32, head_dim up to `MAX_HEAD_DIM`."""
    _require()
    head_dim = q_BxKxQxE.shape[-1]
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q_BxKxQxE.shape, jnp.float32))
    layer = jnp.asarray(layer, jnp.int32)
    limits = limits_BxT.astype(jnp.int32)
    return call(q_BxKxQxE, keys_LxBxKxExS, values_LxBxKxSxE, layer, limits, scale=np.float32(head_dim**-0.5))

"""Hand-written XLA:CPU kernels (XLA FFI), built from `csrc/` by the machine's C++ compiler on first use.

`prefix_attention` attends each query over the first `limit` cached slots of its row only, scores,
softmax and values in one pass split over XLA's intra-op threads. XLA itself must read every slot of the
cache window, however short each row's live context (static shapes). Every attention over the cache (a
prefill chunk, a decode step) uses it on the CPU in float32 (`layers.attend_cached_rows`); other backends
and dtypes keep the XLA path.

The shared library is compiled once per source, compiler, CPU and jaxlib (`-O3 -march=native`: the machine
that runs it builds it), into `$COEVO_JAX_KERNEL_DIR` (default `~/.cache/coevo_jax/kernels`); the compiler
is `$CXX` (default `c++`). Without a working compiler the XLA path runs, and one warning says why.
`COEVO_JAX_CPU_KERNELS=0` turns the kernels off for programs traced after it is set (for A/B runs).
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
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "prefix_attention.cc"
TARGET = "coevo_jax_prefix_attention_f32"
MAX_HEAD_DIM = 256  # the kernel's query buffers
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
    for part in (SOURCE.read_bytes(), version.encode(), " ".join(_FLAGS).encode(), _cpu_signature().encode()):
        digest.update(part)
    digest.update(jax.__version__.encode())
    directory = Path(os.environ.get("COEVO_JAX_KERNEL_DIR", Path.home() / ".cache" / "coevo_jax" / "kernels"))
    return directory / f"prefix_attention-{digest.hexdigest()[:16]}.so"


def _build(compiler: str) -> Path:
    """The compiled library, built now unless already there; written under a temporary name, then renamed,
    so concurrent builds (test workers) never load a half-written file."""
    path = _library_path(compiler)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=path.parent, suffix=".so.partial")
    os.close(handle)
    command = [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", partial]
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def _load_and_register(compiler: str) -> bool:
    """Builds (if needed), loads and registers the kernel; False, with a warning saying why, if that fails."""
    try:
        library = ctypes.cdll.LoadLibrary(str(_build(compiler)))
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.PrefixAttentionF32), platform="cpu")
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning("CPU kernels unavailable, attention stays on XLA's path: %s", error)
        return False
    return True


@functools.cache
def _registered() -> bool:
    """`_load_and_register` once per process, with `$CXX` (default `c++`)."""
    return _load_and_register(os.environ.get("CXX", "c++"))


def prefix_attention_applies(q_dtype, cache_dtype, head_dim: int) -> bool:
    """Whether `prefix_attention` serves this call: float32, the CPU backend, no mesh of several devices
    active (XLA cannot partition a custom call: it would gather the sharded cache), kernels on and built."""
    if os.environ.get("COEVO_JAX_CPU_KERNELS", "1") == "0" or jax.default_backend() != "cpu":
        return False
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        return False
    if jnp.dtype(q_dtype) != jnp.float32 or jnp.dtype(cache_dtype) != jnp.float32:
        return False
    return head_dim <= MAX_HEAD_DIM and _registered()


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
    float32, CPU only (`prefix_attention_applies`)."""
    if not _registered():
        raise RuntimeError("the CPU kernels could not be built; see the warning above")
    head_dim = q_BxKxQxE.shape[-1]
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(q_BxKxQxE.shape, jnp.float32))
    layer = jnp.asarray(layer, jnp.int32)
    limits = limits_BxT.astype(jnp.int32)
    return call(q_BxKxQxE, keys_LxBxKxExS, values_LxBxKxSxE, layer, limits, scale=np.float32(head_dim**-0.5))

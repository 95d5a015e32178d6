"""The one switch between platform-specific implementations of the decoder's operations.

A `ModelConfig` names the backend its programs are compiled for (`platform`) and the kernel set that computes
them (`kernels`); `resolve` turns their 'auto' into concrete choices once, where a decoder is built
(`Decoder.__init__`), so that nothing reads the backend while tracing:

- platform 'auto' -> `jax.default_backend()` ('cpu', 'gpu', 'tpu');
- kernels 'auto' -> 'cpu' on the CPU platform when the C++ kernels build (`cpu_ffi.available`) and
  `COEVO_JAX_CPU_KERNELS` is not '0', else 'xla'; an explicit 'cpu' must be on the CPU and build;
- attention 'auto' -> 'blocked' on a GPU platform whose device has no cuDNN flash attention (before
  Ampere, ROCm, or not a GPU at all when compiling ahead of time elsewhere); elsewhere 'auto' stays, and
  `fused_attention.uses_fused` decides from the platform, dtype and head_dim.

`kernel_set(cfg)` is the resolved config's kernel set: `xla.XlaKernels` or `cpu.CpuKernels`, which takes
the C++ kernels of `cpu_ffi` where they serve. The decoder, its blocks, `dense`, the LoRA adapters and the
sampler call one method of it per operation.
"""

from __future__ import annotations

import os

import jax

from coevo_jax.models.config import ModelConfig
from coevo_jax.models.kernels import cpu_ffi
from coevo_jax.models.kernels.cpu import CpuKernels
from coevo_jax.models.kernels.xla import XlaKernels

__all__ = ["CpuKernels", "XlaKernels", "kernel_set", "resolve"]

KERNELS_ENV = "COEVO_JAX_CPU_KERNELS"  # '0' keeps 'auto' off the C++ kernels (A/B runs)


def resolve(cfg: ModelConfig) -> ModelConfig:
    """`cfg` with `platform`, `kernels` and `attention` resolved for the machine building the decoder (see
    the module docstring); a resolved config is returned unchanged."""
    platform = jax.default_backend() if cfg.platform == "auto" else cfg.platform
    kernels = cfg.kernels
    if kernels == "auto":
        wanted = platform == "cpu" and os.environ.get(KERNELS_ENV, "1") != "0"
        kernels = "cpu" if wanted and cpu_ffi.available() else "xla"
    elif kernels == "cpu" and platform != "cpu":
        raise ValueError(f"kernels='cpu' runs on the CPU, not on platform={platform!r}")
    elif kernels == "cpu" and not cpu_ffi.available():
        raise RuntimeError("kernels='cpu': the CPU kernels could not be built; see the warning above")
    attention = cfg.attention
    if attention == "auto" and platform == "gpu" and not cudnn_flash_device(jax.devices()[0]):
        attention = "blocked"
    if (platform, kernels, attention) == (cfg.platform, cfg.kernels, cfg.attention):
        return cfg
    return cfg.replace(platform=platform, kernels=kernels, attention=attention)


def kernel_set(cfg: ModelConfig) -> XlaKernels:
    """The kernel set of a resolved config."""
    if cfg.platform == "auto" or cfg.kernels == "auto":
        raise ValueError(f"unresolved platform={cfg.platform!r}, kernels={cfg.kernels!r}: `resolve` it first")
    if cfg.kernels == "cpu":
        return CpuKernels(cfg.platform)
    return XlaKernels(cfg.platform)


def cudnn_flash_device(device) -> bool:
    """Whether `device` is an NVIDIA GPU of compute capability 8.0 or newer (cuDNN's flash attention needs
    Ampere). ROCm GPUs are a 'gpu' backend too, without cuDNN: their capability is a 'gfx...' name, not a
    number."""
    if device.platform != "gpu":
        return False
    capability = getattr(device, "compute_capability", None)
    try:
        major = int(str(capability).split(".")[0])
    except ValueError:
        return False
    return major >= 8

"""The main job: `python -m coevo_jax.main --config=configs/quickstart.py --workdir=DIR`.

Runs SFT and the configured methods (RFT, ETO, co-evolving agents, ablations) on one environment,
evaluating after every iteration; rerunning the same command on the same workdir resumes. Override any
config field with `--config.some.field=value` (the config is locked: a misspelt field is an error).
`--reuse_from=OTHER_WORKDIR` starts a new workdir from another run's stages that the config's differences
cannot change (a DPO learning-rate sweep without redoing SFT, say). Compiled programs are kept in JAX's
persistent compilation cache (`--compilation_cache`, by default one under `~/.cache/coevo_jax/` for every
run of the user on this CPU), so a resumed job, another seed or another config of the same policy reads its
train steps and samplers back instead of compiling them again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
from collections.abc import Mapping

from absl import app, flags
from ml_collections import config_flags

from coevo_jax import hugepage_malloc

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path of a configs/<name>.py file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, trajectories and results.")
_REUSE_FROM = flags.DEFINE_string(
    "reuse_from",
    None,
    "A run's workdir whose finished stages the config's differences cannot change (e.g. everything but the "
    "pair-trained methods when only dpo.* differs) seed the new --workdir (coevo_jax.experiment.reuse).",
)
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache",
    None,
    "Directory of JAX's persistent compilation cache (default: $XDG_CACHE_HOME or ~/.cache, then "
    "coevo_jax/compilation_cache; 'none': off). "
    "Ignored when JAX_COMPILATION_CACHE_DIR is set.",
)
flags.mark_flags_as_required(["config", "workdir"])

CACHE_SUBDIR = "compilation_cache"


def compilation_cache_dir(flag: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """Where the job keeps compiled programs: JAX_COMPILATION_CACHE_DIR when set (JAX reads it itself: None
    here), else the flag's directory ('none': no cache), else the user's cache directory's
    `coevo_jax/compilation_cache`, shared by every run (JAX keys each program by its HLO, compile options,
    versions and devices)."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    if flag is not None:
        return None if flag.lower() == "none" else flag
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "coevo_jax", CACHE_SUBDIR, host_cpu_key())


def host_cpu_key(cpuinfo: str = "/proc/cpuinfo") -> str:
    """A short hash of the CPU's model and instruction-set flags: programs XLA compiled for one CPU are
    kept apart from another's (an AVX-512 program must never be loaded on an AVX2-only machine)."""
    try:
        with open(cpuinfo) as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
    except OSError:
        lines = []
    text = "".join(sorted(set(lines))) or platform.machine()
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def main(argv) -> None:
    del argv
    import jax

    from coevo_jax import sharding
    from coevo_jax.experiment.config import ExperimentConfig
    from coevo_jax.experiment.run import run
    from coevo_jax.reporting.tables import table_markdown

    cache = compilation_cache_dir(_COMPILATION_CACHE.value)
    if cache is not None:
        jax.config.update("jax_compilation_cache_dir", cache)
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax reports every save at INFO
    sharding.maybe_initialize_distributed()
    logging.info(
        "process %d of %d, %d local / %d global devices (%s)",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
        jax.devices()[0].platform,
    )
    results = run(ExperimentConfig.from_mapping(_CONFIG.value), _WORKDIR.value, reuse_from=_REUSE_FROM.value)
    print(table_markdown(results))


if __name__ == "__main__":
    hugepage_malloc.reexec_with_hugepage_malloc()
    app.run(main)

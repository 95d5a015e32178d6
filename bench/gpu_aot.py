"""The DPO step of `bench/gpu_mfu.py` compiled for an H100 or H200 without one: peak memory and traffic.

    python bench/gpu_aot.py --case smollm2_135m,off,8,cudnn --case smollm2_135m,off,8,cudnn,unroll,right_padded
    python bench/gpu_aot.py --target h200 --case llama_1b,on,8,cudnn --top 20

XLA compiles for a GPU from a description of the chip (`TARGETS`: the fields XLA's `GpuDeviceInfoProto`
needs, from NVIDIA's datasheets), so a CPU machine can see the program a GPU would run: what XLA fused,
how much memory it needs (`memory_analysis`), and what each kernel moves (`bench/hlo_traffic.py`). It cannot
time anything; the memory-bound families' bytes over an effective bandwidth estimate their time, and
`bench/gpu_mfu.py` on a GPU measures it. The H200 profiles (`bench/README.md`) put the effective
bandwidth of those kernels at 3.46-3.59 TB/s, 72-75 % of the datasheet's: `--efficiency` 0.73 by default.

Needs the CUDA plugin, which compiles but never runs here, in its own environment so that nothing else
sees it:

    python -m venv --system-site-packages /tmp/gpu-aot
    /tmp/gpu-aot/bin/pip install "jax-cuda12-plugin[with-cuda]==$(python -c 'import jax; print(jax.__version__)')" \\
        "jax-cuda12-pjrt==$(python -c 'import jax; print(jax.__version__)')"
    /tmp/gpu-aot/bin/python bench/gpu_aot.py --case ...

(the script sets `JAX_PLATFORMS=cpu`, `JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1` and `CUDA_VISIBLE_DEVICES=-1`
itself: the plugin then loads without a driver). Each case's compiled program is written beside the JSON.
"""

from __future__ import annotations

import argparse
import gzip
import os
import time
from pathlib import Path

import common
import gpu_mfu
import hlo_traffic
import numpy as np

# Datasheet figures: 132 SMs at 1.98 GHz boost, 50 MB of L2, HBM3 3.35 TB/s (H100 SXM 80 GB) or HBM3e
# 4.8 TB/s (H200, 141 GB).
TARGETS = {
    "h100": dict(description="NVIDIA H100 80GB HBM3", bandwidth=3.35e12, memory=85_520_809_984),
    "h200": dict(description="NVIDIA H200", bandwidth=4.8e12, memory=150_754_820_096),
}


def target_config(name: str) -> str:
    """XLA's GPU target description (text proto) of one of `TARGETS`."""
    chip = TARGETS[name]
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(chip["bandwidth"])}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {chip["memory"]}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{
    major: 9
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 8
}}
runtime_version {{
  major: 12
  minor: 8
}}
device_description_str: "{chip["description"]}"
"""


def compile_case(device, name: str, remat: bool, pairs: int, length: int, attention: str, options=()):
    """(compiled DPO step, compile seconds) of one case on `device` (one GPU of the target): as
    `gpu_mfu.bench_case` builds it, with abstract arguments."""
    import jax

    from coevo_jax import sharding
    from coevo_jax.train.state import abstract_state

    cfg = gpu_mfu.model_config(name, remat, attention, options).replace(platform="gpu")  # not this machine's
    objective = gpu_mfu.objective_config(options)
    steps, scalars, tx, shardings, mesh, _ = common.build_dpo_steps(cfg, 1e-6, 0.1, objective, device)
    state = abstract_state(cfg, tx, shardings)
    batch = gpu_mfu.dpo_batch(pairs, length, cfg.vocab_size)
    batch["ref_chosen_logps"], batch["ref_rejected_logps"] = gpu_mfu.uniform_reference_logps(
        batch, cfg.vocab_size
    )
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    place = lambda tree: jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype, sharding=replicated), tree
    )
    start = time.perf_counter()
    compiled = steps.dpo.lower(state, place(sharding.device_layout(batch)), place(scalars)).compile()
    return compiled, time.perf_counter() - start


def main() -> None:
    from coevo_jax.models.config import ATTENTION_CHOICES

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="h100", choices=list(TARGETS))
    parser.add_argument(
        "--case",
        action="append",
        required=True,
        metavar="MODEL,REMAT,PAIRS,ATTENTION[,OPTION...]",
        help="as bench/gpu_mfu.py's --case (repeatable)",
    )
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--efficiency", type=float, default=0.73, help="of the datasheet bandwidth")
    parser.add_argument(
        "--top", type=int, default=15, help="list this many kernels per case, most bytes first"
    )
    parser.add_argument("--out", default=None, help="results directory (default bench/results)")
    args = parser.parse_args()
    cases = gpu_mfu.cases_from_args(args, ATTENTION_CHOICES)
    os.environ.update(JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1", CUDA_VISIBLE_DEVICES="-1")
    import jax
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="cuda", target_config=target_config(args.target), topology="1x1x1"
    )
    bandwidth = TARGETS[args.target]["bandwidth"] * args.efficiency
    out = Path(args.out) if args.out else common.RESULTS_DIR
    record = {"jax": jax.__version__, "target": args.target, "effective_bandwidth": bandwidth, "cases": []}
    for name, remat, pairs, attention, options in cases:
        label = gpu_mfu.case_label(name, remat, pairs, attention, options)
        compiled, seconds = compile_case(
            topology.devices[0], name, remat, pairs, args.length, attention, options
        )
        text = compiled.as_text()
        out.mkdir(parents=True, exist_ok=True)
        with gzip.open(out / f"hlo_{args.target}_{label}.txt.gz", "wt") as f:
            f.write(text)
        kernels = hlo_traffic.Program(text).kernels()
        memory = compiled.memory_analysis()
        gigabytes = hlo_traffic.memory_bound_gb(kernels)
        case = {
            "case": label,
            "compile_s": seconds,
            "temp_gib": memory.temp_size_in_bytes / 2**30,
            "argument_gib": memory.argument_size_in_bytes / 2**30,
            "families": hlo_traffic.summary(kernels),
            "memory_bound_gb": gigabytes,
            "memory_bound_ms": gigabytes * 1e9 / bandwidth * 1e3,
        }
        record["cases"].append(case)
        print(
            f"\n{label} for {args.target}: compiled in {seconds:.0f} s, temporaries {case['temp_gib']:.1f} GiB, "
            f"memory-bound kernels {gigabytes:.1f} GB = {case['memory_bound_ms']:.1f} ms at "
            f"{bandwidth / 1e12:.2f} TB/s",
            flush=True,
        )
        hlo_traffic.print_report(kernels, args.top)
        common.write_result(f"gpu_aot_{args.target}", record, out)


if __name__ == "__main__":
    main()

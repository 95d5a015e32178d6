"""Where a compiled step's time goes: XLA ops ranked by time from a `jax.profiler` trace, on CPU or GPU.

`profile_ops(run, hlo_text, calls)` traces `calls` invocations of `run()`, then sums each XLA op's time
per call and names it by the JAX operation it came from (the `op_name` metadata of the compiled HLO).

Which trace events count:
- GPU: the kernels on the device's streams, each attributed to its HLO op (`hlo_op` argument, else the
  kernel's name when it is an HLO instruction's). Beside the ops it reports how busy the streams were:
  kernel time over the traced span, so gaps (host syncs, launch latency) show.
- CPU: the host threads' events named after an HLO instruction.
Profiling slows a step; read the shares, not the totals.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile


def op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> 'shape  JAX op_name' from a compiled module's text."""
    out = {}
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT )?%?([\w.-]+) = (\S+)", line)
        if match:
            op_name = re.search(r'op_name="([^"]*)"', line)
            out[match.group(1)] = f"{match.group(2)}  {op_name.group(1) if op_name else ''}"
    return out


def primitive(described: str) -> str:
    """The JAX primitive an op came from ('dot_general', 'exp', ...), from its `op_name` path."""
    parts = described.split(maxsplit=1)
    if len(parts) < 2 or not parts[1].strip():
        return "(no op_name: layout copy or XLA-inserted)"
    return parts[1].split(";")[0].rstrip("/").split("/")[-1]


def kernel_family(kernel: str) -> str:
    """What a GPU kernel is, from its name: cuDNN, a matmul (cuBLAS, CUTLASS, XLA's Triton GEMM), a copy, or
    another XLA fusion."""
    name = kernel.lower()
    if "cudnn" in name:
        return "cuDNN"
    if name.startswith(("nvjet", "cutlass", "sm90_xmma", "sm80_xmma", "gemm_fusion", "ampere_", "cublas")):
        return "matmul"
    if "memcpy" in name or name.startswith("copy"):
        return "copy"
    return "other XLA fusions and kernels"


def _hlo_instruction(event: dict, names: dict[str, str]) -> str | None:
    """The HLO instruction a GPU kernel event ran: its `hlo_op` argument, else its name, where XLA wrote
    'fusion.12' as 'fusion_12'."""
    candidates = [event.get("args", {}).get("hlo_op"), event["name"]]
    candidates.append(re.sub(r"_(\d+)$", r".\1", event["name"]))
    return next((c for c in candidates if c in names), None)


def trace_events(run, calls: int) -> list[dict]:
    """The trace events of `calls` calls of `run()` under `jax.profiler` (each blocked until ready)."""
    import jax

    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        for _ in range(calls):
            jax.block_until_ready(run())
        jax.profiler.stop_trace()
        trace = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
        with gzip.open(trace) as f:
            events = json.load(f)
    return events["traceEvents"] if isinstance(events, dict) else events


def summarize_events(events: list[dict], names: dict[str, str], calls: int) -> dict:
    """Per-op and per-primitive ms per call, and (GPU) stream busy time, from trace events."""
    process = {
        e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    thread = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    gpu_pids = {pid for pid, name in process.items() if "/device:GPU" in name}
    per_op: collections.Counter = collections.Counter()
    stream_ms, first, last, unattributed = 0.0, float("inf"), 0.0, collections.Counter()
    family: collections.Counter = collections.Counter()
    for event in events:
        if event.get("ph") != "X" or "dur" not in event:
            continue
        if gpu_pids:
            if event["pid"] not in gpu_pids or not thread.get((event["pid"], event["tid"]), "").startswith(
                "Stream"
            ):
                continue
            stream_ms += event["dur"] / 1e3
            first, last = min(first, event["ts"]), max(last, event["ts"] + event["dur"])
            family[kernel_family(event["name"])] += event["dur"] / 1e3 / calls
            op = _hlo_instruction(event, names)
            if op is None:
                unattributed[event["name"][:80]] += event["dur"] / 1e3 / calls
                continue
        else:
            op = event.get("name")
            if op not in names:
                continue
        per_op[op] += event["dur"] / 1e3 / calls
    per_kind: collections.Counter = collections.Counter()
    for op, ms in per_op.items():
        per_kind[primitive(names[op])] += ms
    out = {
        "ms_per_call": sum(per_op.values()),
        "ops": [(op, ms, names[op][:200]) for op, ms in per_op.most_common()],
        "primitives": per_kind.most_common(),
        "threads": sorted({f"{process.get(p, p)} | {t}" for (p, _), t in thread.items()})[:40],
    }
    if gpu_pids:
        out["stream_kernel_ms_per_call"] = stream_ms / calls
        out["traced_span_ms_per_call"] = (last - first) / 1e3 / calls if last > first else 0.0
        out["unattributed"] = unattributed.most_common(15)
        out["kernel_families"] = family.most_common()
    return out


def profile_ops(run, hlo_text: str, calls: int = 2) -> dict:
    """`summarize_events` of `calls` traced calls of `run()` (already compiled and warmed up)."""
    return summarize_events(trace_events(run, calls), op_names(hlo_text), calls)


def train_step_calls(step, state, batch, scalars):
    """(the compiled HLO text of a train step, a `run()` that calls it on one batch, the dict whose "state"
    each call replaces): what `profile_ops` traces of `step(state, batch, scalars) -> (state, metrics)`, which
    donates its state."""
    hlo_text = step.lower(state, batch, scalars).compile().as_text()
    carry = {"state": state}

    def run():
        carry["state"], metrics = step(carry["state"], batch, scalars)
        return metrics

    return hlo_text, run, carry


def for_json(summary: dict | None, top: int = 60) -> dict | None:
    """A `summarize_events` summary with only its `top` ops, as the benchmarks' JSON keeps it."""
    if summary is None:
        return None
    return {key: value for key, value in summary.items() if key != "ops"} | {"top_ops": summary["ops"][:top]}


def print_summary(summary: dict, title: str, top: int = 25) -> None:
    """The ranked ops and primitives of `summarize_events`, as text."""
    total = summary["ms_per_call"] or 1e-9
    print(f"{title}: {summary['ms_per_call']:.1f} ms of XLA ops per call")
    if "stream_kernel_ms_per_call" in summary:
        print(
            f"  GPU streams: {summary['stream_kernel_ms_per_call']:.1f} ms of kernels over a "
            f"{summary['traced_span_ms_per_call']:.1f} ms span per call"
        )
    print(f"{'ms/call':>8} {'share':>6}  op  shape  JAX op")
    for op, ms, described in summary["ops"][:top]:
        print(f"{ms:8.2f} {ms / total:6.1%}  {op}  {described[:140]}")
    print(f"by JAX primitive (last part of the op name):\n{'ms/call':>8} {'share':>6}  primitive")
    for kind, ms in summary["primitives"][:top]:
        print(f"{ms:8.2f} {ms / total:6.1%}  {kind}")
    for family, ms in summary.get("kernel_families", []):
        print(f"  {ms:8.2f} ms/call  {family}")
    for name, ms in summary.get("unattributed", [])[:5]:
        print(f"  unattributed kernel {ms:.2f} ms/call: {name}")
    if not summary["ops"]:
        print("  no op matched; trace threads:", summary["threads"])

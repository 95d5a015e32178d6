"""Side-by-side tables of the benchmark JSON files, and issue 8's targets checked against them.

    python bench/compare.py                 # reads bench/results/*.json, prints Markdown
    python bench/compare.py --results DIR --out DIR/summary.md

Reads what `bench/run_all.sh` wrote: dpo_{coevo_jax,trl,tunix}.json, decode_{coevo_jax,transformers,tunix}.json,
rollout_builtin.json. A missing file leaves its rows out (and its targets unchecked).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import common


def _load(results: Path, name: str) -> dict | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _dpo_rows(runs: dict[str, dict]) -> list[str]:
    rows = [
        "| framework | variant | ms/step (median [min–max]) | tokens/s | 3-epoch phase (24 steps) s | useful GFLOP/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for framework, run in runs.items():
        for v in run["variants"]:
            s = v["step"]
            gflops = v.get("useful_gflops")
            rows.append(
                f"| {framework} | {v['name']} | {s['median_s'] * 1e3:.0f} [{s['min_s'] * 1e3:.0f}–{s['max_s'] * 1e3:.0f}] "
                f"| {v['tokens_per_s']:.0f} | {v['phase_s']:.2f} | {'' if gflops is None else f'{gflops:.0f}'} |"
            )
    return rows


def _decode_rows(runs: dict[str, dict]) -> list[str]:
    rows = [
        "| framework | dtype | batch | new tokens/s (prefill included) | decode-only tokens/s |",
        "|---|---|---:|---:|---:|",
    ]
    for framework, run in runs.items():
        for r in run["results"]:
            decode_only = r.get("decode_only_new_tokens_per_s")
            rows.append(
                f"| {framework} | {r['dtype']} | {r['batch']} | {r['new_tokens_per_s']:.0f} "
                f"| {'' if decode_only is None else f'{decode_only:.0f}'} |"
            )
    return rows


def _best_phase(run: dict | None, dtype: str) -> tuple[float, str] | None:
    if run is None:
        return None
    candidates = [(v["phase_s"], v["name"]) for v in run["variants"] if v["dtype"] == dtype]
    return min(candidates) if candidates else None


def _decode_at(run: dict | None, batch: int, dtype: str = "float32") -> float | None:
    if run is None:
        return None
    found = [r["new_tokens_per_s"] for r in run["results"] if r["batch"] == batch and r["dtype"] == dtype]
    return max(found) if found else None


def targets(dpo: dict[str, dict], decode: dict[str, dict]) -> list[str]:
    """One line per target of issue 8: measured ratio, the target, met or missed."""
    lines = []

    def check(label, value, target):
        if value is None:
            lines.append(f"- {label}: not measured")
        else:
            lines.append(
                f"- {label}: **{value:.2f}** (target >= {target}) — {'met' if value >= target else 'missed'}"
            )

    ours = dpo.get("coevo_jax")
    for dtype, peers in (("float32", {"trl": 1.2, "tunix": 1.8}), ("bfloat16", {"trl": 1.0})):
        mine = _best_phase(ours, dtype)
        for peer, target in peers.items():
            theirs = _best_phase(dpo.get(peer), dtype)
            ratio = None if mine is None or theirs is None else theirs[0] / mine[0]
            suffix = "" if theirs is None else f" (vs {peer}'s best {dtype} variant: {theirs[1]})"
            check(f"{dtype} DPO phase speed-up over {peer}{suffix}", ratio, target)
    if ours is not None:
        for v in ours["variants"]:
            target = {"float32": 0.7, "bfloat16": 0.5}[v["dtype"]]
            check(
                f"{v['dtype']} train step, fraction of the XLA {v['dtype']} matmul ceiling",
                v["fraction_of_ceiling"],
                target,
            )
    mine = _decode_at(decode.get("coevo_jax"), 8)
    for peer in ("transformers", "tunix"):
        theirs = _decode_at(decode.get(peer), 8)
        ratio = None if mine is None or theirs is None else mine / theirs
        check(f"float32 decode at batch 8, speed-up over {peer}", ratio, 3)
    lines += _decode_bound_lines(decode)
    return lines


def _decode_bound_lines(decode: dict[str, dict]) -> list[str]:
    """How far the float32 batch-8 decode is from the memory-bandwidth / matmul-ceiling bound."""
    ours = decode.get("coevo_jax")
    found = [r for r in (ours or {}).get("results", []) if r["batch"] == 8 and r["dtype"] == "float32"]
    if not found or "bounds" not in found[0]:
        return []
    r, bound = found[0], found[0]["bounds"]
    peers = [
        f"{bound['max_new_tokens_per_s'] / theirs:.1f}x {peer}"
        for peer in ("transformers", "tunix")
        if (theirs := _decode_at(decode.get(peer), 8))
    ]
    return [
        f"- float32 decode at batch 8 against its bound: a step takes {r['decode_step_ms']:.2f} ms, the floor "
        f"is {bound['decode_step_floor_ms']:.2f} ms ({bound['decode_step_bytes'] / 1e6:.0f} MB per step at "
        f"{ours['memory_gbps']:.0f} GB/s); with the prefill floor ({bound['prefill_floor_s'] * 1e3:.0f} ms) at "
        f"most {bound['max_new_tokens_per_s']:.0f} new tokens/s end to end"
        + (f", i.e. at most {', '.join(peers)}" if peers else "")
        + f"; measured {r['new_tokens_per_s']:.0f} ({r['new_tokens_per_s'] / bound['max_new_tokens_per_s']:.0%} of it)"
    ]


def summary(results: Path) -> str:
    dpo = {k: r for k in ("coevo_jax", "trl", "tunix") if (r := _load(results, f"dpo_{k}"))}
    decode = {k: r for k in ("coevo_jax", "transformers", "tunix") if (r := _load(results, f"decode_{k}"))}
    rollout = _load(results, "rollout_builtin")
    machine = next((r["machine"] for r in (*dpo.values(), *decode.values())), common.machine())
    out = [f"Machine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}.", ""]
    versions = {k: r.get("versions", {}) for k, r in {**dpo, **decode}.items()}
    out += [f"Versions: {json.dumps(versions)}", ""]
    ours = dpo.get("coevo_jax")
    if ours is not None:
        ceilings = ", ".join(f"{k} {v:.0f}" for k, v in ours["ceilings_gflops"].items())
        out += [f"XLA matmul ceiling (GFLOP/s, see bench/ceiling.py): {ceilings}", ""]
    out += ["DPO on the anchor config (8 pairs x 512 tokens per step):", "", *_dpo_rows(dpo), ""]
    out += ["Decoding (prompt 256, 128 new tokens, greedy):", "", *_decode_rows(decode), ""]
    if rollout is not None:
        groups = rollout["args"]["groups"]
        out += [
            f"Rollout loop (built-in environment, tiny policy, {groups} group(s) of {rollout['args']['rows']} rows):",
            "",
        ]
        for split in ("test_seen", "test_unseen"):
            r = rollout[split]
            waits = r["host_wait_device_fraction"]
            idle = f"; the device waits on the host {1 - waits:.0%} of wall time" if groups == 1 else ""
            out.append(
                f"- {split}: the host waits on the device {waits:.0%} of wall time, on environments "
                f"{r['host_wait_env_fraction']:.0%}{idle}; {r['generated_tokens_per_s']:.0f} generated tokens/s"
            )
        out.append("")
    out += ["Targets:", "", *targets(dpo, decode), ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", default=str(common.RESULTS_DIR))
    parser.add_argument("--out", default=None, help="also write the Markdown here")
    args = parser.parse_args()
    text = summary(Path(args.results))
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

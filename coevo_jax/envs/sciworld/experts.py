"""CLI: ScienceWorld expert trajectories of a split from the gold paths, several JVMs at once, resumable.

    python -m coevo_jax.envs.sciworld.experts --split train --out experts/sciworld_train.jsonl \\
        [--limit N] [--workers N] [--java-max-heap 384m]

Each worker thread owns a `SciWorldEnv` (one JVM) and turns tasks into demonstrations (`gold`).
Demonstrations that reach reward 1.0 go to OUT (one trajectory record a line, `TrajectoryStream`, readable
with `coevo_jax.data.record_reader.read_trajectories`); tasks that do not go to OUT.failures.jsonl with the reason.
A rerun skips the tasks already in either file. The summary printed at the end gives how many reached 1.0,
how many failed and why, and the simulator's throughput (steps/s of the replays, load time apart).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from coevo_jax.data.stream import TrajectoryStream
from coevo_jax.envs.sciworld.env import SPLITS, SciWorldEnv
from coevo_jax.envs.sciworld.gold import ExpertResult

log = logging.getLogger(__name__)


@dataclass
class ExpertRunSummary:
    """Counts and timings of one `generate_experts` call (the files may hold earlier runs' tasks too)."""

    split: str
    tasks: int = 0
    skipped: int = 0  # already in the output or failures file
    kept: int = 0
    failures: dict[str, str] = field(default_factory=dict)  # task id -> reason
    steps: int = 0  # simulator steps of this run (gold-path cuts and recorded replays)
    step_seconds: float = 0.0
    resets: int = 0
    reset_seconds: float = 0.0
    gold_seconds: float = 0.0  # generating gold paths (load with generateGoldPath=True) and cutting them
    wall_seconds: float = 0.0
    jvm_rss_bytes: list[int] = field(default_factory=list)

    def text(self) -> str:
        """A human-readable report."""
        kinds = collections.Counter(reason.split(":")[0] for reason in self.failures.values())
        lines = [
            f"sciworld {self.split}: {self.tasks} tasks, {self.skipped} already done, "
            f"{self.kept} reached reward 1.0, {len(self.failures)} did not",
            f"  simulator: {self.steps} steps in {self.step_seconds:.1f} s "
            f"({self.steps / max(self.step_seconds, 1e-9):.1f} steps/s per JVM), "
            f"{self.resets} loads in {self.reset_seconds:.1f} s "
            f"({self.reset_seconds / max(self.resets, 1):.3f} s each)",
            f"  gold paths generated and cut: {self.gold_seconds:.1f} s summed over workers; wall time {self.wall_seconds:.1f} s "
            f"({(self.kept + len(self.failures)) / max(self.wall_seconds, 1e-9):.2f} tasks/s)",
        ]
        if self.jvm_rss_bytes:
            rss = ", ".join(f"{b / 2**20:.0f}" for b in self.jvm_rss_bytes)
            lines.append(f"  JVM resident memory at the end (MB): {rss}")
        lines += [f"  failures of kind {kind!r}: {count}" for kind, count in kinds.most_common()]
        lines += [f"    {task_id}: {reason}" for task_id, reason in sorted(self.failures.items())[:50]]
        return "\n".join(lines)


def _read_failures(path: str) -> dict[str, str]:
    failures: dict[str, str] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for index, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    failures[record["task_id"]] = record["reason"]
                except (json.JSONDecodeError, KeyError, TypeError) as error:
                    raise ValueError(f"{path}: line {index + 1}: not a failure record ({error})") from error
    return failures


def generate_experts(
    split: str,
    out: str,
    *,
    limit: int | None = None,
    workers: int = 2,
    show_progress: bool = True,
    **env_kwargs,
) -> ExpertRunSummary:
    """Writes the gold-path demonstrations of the first `limit` tasks of `split` to `out` (see the module doc)."""
    start = time.perf_counter()
    summary = ExpertRunSummary(split)
    tasks = SciWorldEnv(**env_kwargs).tasks(split)[:limit]  # reads the data files; no JVM yet
    failures_path = f"{out}.failures.jsonl"
    failed_before = _read_failures(failures_path)
    local, envs, lock = threading.local(), [], threading.Lock()

    def run(task_id: str) -> ExpertResult:
        if not hasattr(local, "env"):
            local.env = SciWorldEnv(**env_kwargs)
            with lock:
                envs.append(local.env)
        return local.env.expert_result(task_id)

    with TrajectoryStream(out) as stream, open(failures_path, "a", encoding="utf-8") as failures_file:
        done = {t.task_id for t in stream.trajectories} | set(failed_before)
        todo = [task_id for task_id in tasks if task_id not in done]
        summary.tasks, summary.skipped = len(tasks), len(tasks) - len(todo)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        try:
            futures = [pool.submit(run, task_id) for task_id in todo]
            progress = tqdm(
                concurrent.futures.as_completed(futures),
                total=len(todo),
                disable=not show_progress,
                desc=f"sciworld {split} experts",
                unit="task",
            )
            for future in progress:
                result = future.result()
                summary.gold_seconds += result.gold_seconds
                if result.ok:
                    stream.write(result.trajectory)
                    summary.kept += 1
                else:
                    record = {"task_id": result.task_id, "reason": result.reason, "steps": result.steps}
                    failures_file.write(json.dumps(record) + "\n")
                    failures_file.flush()
                    summary.failures[result.task_id] = result.reason
                progress.set_postfix(kept=summary.kept, failed=len(summary.failures))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for env in envs:
                timings = env.timings
                summary.steps += timings.steps
                summary.step_seconds += timings.step_seconds
                summary.resets += timings.resets
                summary.reset_seconds += timings.reset_seconds
                if env.simulator.started and (rss := env.simulator.jvm.rss_bytes()) is not None:
                    summary.jvm_rss_bytes.append(rss)
                env.close()
    summary.wall_seconds = time.perf_counter() - start
    return summary


def main(argv: list[str] | None = None) -> ExpertRunSummary:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", choices=SPLITS, default="train")
    parser.add_argument("--out", required=True, help="trajectory JSONL file (appended to, resumable)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks of the split")
    parser.add_argument("--workers", type=int, default=2, help="parallel JVMs")
    parser.add_argument("--java-max-heap", default="384m", help="-Xmx of each JVM")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    summary = generate_experts(
        args.split, args.out, limit=args.limit, workers=args.workers, java_max_heap=args.java_max_heap
    )
    print(summary.text())
    return summary


if __name__ == "__main__":
    main()

"""The main job with a CoEvolve boundary signal on every task of a round's records, besides the signals found:
`python tests/signal_every_task.py [main job flags]` (what `local_processes.sh` runs as MAIN in
`tests/test_multiprocess.py`). A tiny untrained policy shows no weakness a signal would catch, so without this
its rounds would explore nothing and a test of how processes share a round out would test nothing."""

from __future__ import annotations

import sys

from coevo_jax.coevolve import rounds
from coevo_jax.coevolve.signals import Signal

_detect = rounds.detect


def detect_and_mark_every_task(records, memory, patterns_of, **kwargs):
    signals, memory = _detect(records, memory, patterns_of, **kwargs)
    by_task: dict[str, list] = {}
    for record in records:
        by_task.setdefault(record.task_id, []).append(record)
    marked = [
        Signal("boundary", task, max(r.iteration for r in episodes), tuple(episodes), detail="every task")
        for task, episodes in sorted(by_task.items())
    ]
    return [*signals, *marked], memory


def install() -> None:
    rounds.detect = detect_and_mark_every_task


if __name__ == "__main__":
    install()
    from absl import app

    from coevo_jax import main as job

    app.run(job.main, argv=["coevo_jax.main", *sys.argv[1:]])

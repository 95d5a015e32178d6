"""Trajectories streamed to a JSON Lines file as episodes end, with resume after a crash.

Each finished episode is one line, written with a single `write`, flushed and fsynced, so a crash loses at
most the episodes still in flight. Reopening the file keeps every complete record, drops a torn last line
(a crash in the middle of a write), and reports which episodes are already done so they are not redone.
"""

from __future__ import annotations

import json
import logging
import os

from coevo_jax.data.record_reader import parse_record
from coevo_jax.data.records import Trajectory, trajectory_to_record

log = logging.getLogger(__name__)


class TrajectoryStream:
    """Append-only trajectory file; `done_ids` holds the ids of the episodes it already contains."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        self.trajectories: list[Trajectory] = []
        if os.path.exists(self.path):
            self._recover()
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    @property
    def done_ids(self) -> set[str]:
        return {t.traj_id for t in self.trajectories}

    def _recover(self) -> None:
        with open(self.path, "rb") as f:
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) < len(data):
            log.warning("%s: dropping a torn last line of %d bytes", self.path, len(data) - len(complete))
            with open(self.path, "r+b") as f:
                f.truncate(len(complete))
        for index, line in enumerate(complete.decode("utf-8").splitlines()):
            if line.strip():
                self.trajectories.append(parse_record(json.loads(line), source=self.path, index=index))

    def write(self, trajectory: Trajectory) -> None:
        self._file.write(json.dumps(trajectory_to_record(trajectory), ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.trajectories.append(trajectory)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TrajectoryStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""The main job with one SIGKILL planted: `python launch/kill_at.py POINT N NOTE_FILE [main job flags]`.

Used by `kill_resume_drill.py`. Patches, in this process only, the function on one path of the main job so
that its N-th call (counted from this process's start) writes a one-line JSON note to NOTE_FILE and then
SIGKILLs the process: no exception, no `finally`, no flush - what a power cut or the OOM killer leaves.

* `sft` / `dpo`: the placement of the N-th SFT / DPO (ETO or eq. 9) training batch, i.e. before update N
  of the phases run in this process (the phase's earlier updates may still be in flight, and so may an
  asynchronous mid-phase checkpoint).
* `explore` / `eval`: the N-th episode written to an exploration / evaluation trajectory file, killed
  after half of its line is on disk (a torn last line).
* `save`: the N-th policy save (`RunStore.save_policy`), killed once every file is in Orbax's temporary
  directory but before the rename that commits it.
"""

from __future__ import annotations

import json
import os
import signal
import sys

POINTS = ("sft", "dpo", "explore", "eval", "save")


def _killer(note_path: str, point: str, at: int):
    def kill(detail: str) -> None:
        with open(note_path, "w") as f:
            json.dump({"point": point, "call": at, "detail": detail}, f)
        os.kill(os.getpid(), signal.SIGKILL)

    return kill


def _plant_in_training(point: str, at: int, kill) -> None:
    from coevo_jax.experiment import train_loop

    place, calls = train_loop.place_batch, [0]
    key = "example_mask" if point == "sft" else "ref_chosen_logps"  # a DPO reference pass has neither

    def place_or_kill(setup, batch):
        if key in batch:
            calls[0] += 1
            if calls[0] == at:
                kill(f"before {point} update {at} of this process")
        return place(setup, batch)

    train_loop.place_batch = place_or_kill


def _plant_in_rollouts(point: str, at: int, kill) -> None:
    from coevo_jax.data.records import trajectory_to_record
    from coevo_jax.data.stream import TrajectoryStream

    write, calls = TrajectoryStream.write, [0]

    def write_or_kill(self, trajectory):
        if self.path.endswith("_explore.jsonl") == (point == "explore"):
            calls[0] += 1
            if calls[0] == at:
                line = json.dumps(trajectory_to_record(trajectory), ensure_ascii=False) + "\n"
                self._file.write(line[: len(line) // 2])
                self._file.flush()
                os.fsync(self._file.fileno())
                name = os.path.basename(self.path)
                kill(f"{name}: episode {len(self.trajectories) + 1} torn after half its line")
        return write(self, trajectory)

    TrajectoryStream.write = write_or_kill


def _plant_in_policy_save(at: int, kill) -> None:
    import orbax.checkpoint as ocp

    atomic = ocp.path.atomicity.AtomicRenameTemporaryPath
    finalize, calls = atomic.finalize, [0]

    async def finalize_or_kill(self):
        final = os.fspath(self.get_final())
        if os.path.basename(os.path.dirname(final)) == "policies":
            calls[0] += 1
            if calls[0] == at:
                tmp = os.fspath(self.get())
                files = sum(len(names) for _, _, names in os.walk(tmp))
                kill(f"policies/{os.path.basename(final)}: {files} files written, not committed")
        return await finalize(self)

    atomic.finalize = finalize_or_kill


def main() -> None:
    point, at, note_path, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
    if point not in POINTS:
        raise SystemExit(f"unknown kill point {point!r}; one of {', '.join(POINTS)}")
    kill = _killer(note_path, point, at)
    if point in ("sft", "dpo"):
        _plant_in_training(point, at, kill)
    elif point in ("explore", "eval"):
        _plant_in_rollouts(point, at, kill)
    else:
        _plant_in_policy_save(at, kill)

    from absl import app

    from coevo_jax import main as job

    app.run(job.main, argv=["coevo_jax.main", *flags])


if __name__ == "__main__":
    main()

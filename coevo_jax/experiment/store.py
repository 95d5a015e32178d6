"""The run's working directory: finished-stage records, saved policies, and atomic JSON writes.

A run is a sequence of named stages (an SFT phase, one exploration, one evaluation, ...). A stage is done
once its record is in `stages.json`; rerunning the same command skips done stages and reuses their outputs,
so work is never redone. Records are written after the stage's outputs (policy checkpoints, trajectory
files) are complete, and every file write is atomic (`coevo_jax.atomic_files.atomic_path`: a temporary, then
a rename), so a kill at any moment leaves either the old or the new state, never half of one.

On several processes (`experiment.processes`) every process runs every stage and calls the collective
Orbax saves and restores; process 0 alone writes the records and the config and removes directories, and
the other processes take each new stage record from `stages.json` once it is written.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

import orbax.checkpoint as ocp

from coevo_jax import checkpoints
from coevo_jax.atomic_files import atomic_path
from coevo_jax.checkpoints import check_metadata, checkpoint_metadata
from coevo_jax.experiment import processes

STAGES_FILE = "stages.json"
CONFIG_FILE = "config.json"
POLICIES_DIR = "policies"


def write_json_atomic(path: str, data: Any) -> None:
    """Writes `data` as JSON to `path` (parent directories created) through `atomic_path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)


def read_json(path: str) -> Any:
    """The JSON in `path`; ValueError naming the file when it is not valid JSON."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from error


class RunStore:
    """Stage records, policy checkpoints and file paths under one workdir."""

    def __init__(self, workdir: str):
        self.workdir = os.path.abspath(workdir)  # made by the first write: a refused start leaves nothing
        self._stages_path = os.path.join(self.workdir, STAGES_FILE)
        self._stages: dict[str, Any] = (
            read_json(self._stages_path) if os.path.exists(self._stages_path) else {}
        )
        self._checkpointer = ocp.StandardCheckpointer()
        self._lock = threading.Lock()  # the stage records of two agents' stages finishing at once

    def path(self, *parts: str) -> str:
        """A path inside the workdir (parent directories created)."""
        path = os.path.join(self.workdir, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path

    def check_config(
        self,
        config_json: dict,
        defaults: dict | None = None,
        execution_fields: tuple[str, ...] = (),
        *,
        record: bool = True,
    ) -> None:
        """Records the config on the first run; a resumed run must use the same one. A field the saved
        config lacks (added to the code since the workdir began) is the same when the run leaves it at its
        value in `defaults` (the code's default config), which is what the older code did. The top-level
        `execution_fields` (how the run executes, not what it computes) may change; the record follows.
        `record=False` only checks, writing nothing: the job checks before it writes anything else."""
        path = os.path.join(self.workdir, CONFIG_FILE)
        if not os.path.exists(path):
            if record and processes.is_primary():
                os.makedirs(self.workdir, exist_ok=True)
                write_json_atomic(path, config_json)
            return
        saved = read_json(path)
        if saved != config_json:
            changed = sorted(
                set(config_differences(saved, config_json, defaults or {})) - set(execution_fields)
            )
            if changed:
                raise ValueError(
                    f"{path}: this workdir was started with a different config (changed: "
                    f"{', '.join(changed)}); use a new --workdir or the original config"
                )
            if record and processes.is_primary():  # new fields at their defaults, execution fields as now
                write_json_atomic(path, config_json)

    def has_stage(self, name: str) -> bool:
        """Whether stage `name` is done (has a record)."""
        return name in self._stages

    def stage(self, name: str, run: Callable[[], Any]) -> Any:
        """The record of stage `name`: stored if it is done, else `run()`'s (then stored)."""
        if name not in self._stages:
            record = run()
            with self._lock:  # the two agents' stages may finish at once (`experiment.agent_pairs`)
                self._stages[name] = record
                processes.on_primary(f"stage {name}", self._write_stages)
            if processes.count() > 1:  # every process goes on with the record as written (JSON)
                self._stages[name] = read_json(self._stages_path)[name]
        return self._stages[name]

    def _write_stages(self) -> None:
        os.makedirs(self.workdir, exist_ok=True)
        write_json_atomic(self._stages_path, self._stages)

    # --- policies ------------------------------------------------------------------------------------------

    def policy_dir(self, name: str) -> str:
        return os.path.join(self.workdir, POLICIES_DIR, name)

    def has_policy(self, name: str) -> bool:
        return os.path.isdir(self.policy_dir(name))

    def save_policy(self, name: str, params: dict, *, base: str | None = None) -> None:
        """Saves parameters (Orbax, atomic: a temporary directory is renamed when complete); LoRA adapters
        with `base`, the fingerprint of the base they belong to (`checkpoints.base_fingerprint`)."""
        path = self.policy_dir(name)

        def clear():
            if os.path.exists(path):
                shutil.rmtree(path)
            os.makedirs(os.path.dirname(path), exist_ok=True)

        with checkpoints.ORBAX_LOCK:  # one save or restore at a time (`checkpoints.ORBAX_LOCK`)
            processes.on_primary(f"save {name}", clear)
            self._checkpointer.save(path, params, custom_metadata=checkpoint_metadata(base))
            self._checkpointer.wait_until_finished()

    def load_policy(self, name: str, abstract_params: dict, *, base: str | None = None) -> dict:
        """Parameters saved under `name`, placed as `abstract_params` (ShapeDtypeStructs with shardings);
        LoRA adapters saved for a base other than `base` are an error (`checkpoints.BaseMismatchError`)."""
        path = self.policy_dir(name)
        if not self.has_policy(name):
            raise FileNotFoundError(f"{path}: no saved policy {name!r}")
        with checkpoints.ORBAX_LOCK:
            check_metadata(self._checkpointer.metadata(path).custom_metadata, base, path)
            return self._checkpointer.restore(path, abstract_params)

    def scratch_dir(self, name: str) -> str:
        """A directory for a stage's partial state (mid-phase checkpoints), removed by `clear_scratch`."""
        path = os.path.join(self.workdir, "partial", name.replace("/", "_"))
        os.makedirs(path, exist_ok=True)
        return path

    def clear_scratch(self, name: str) -> None:
        processes.barrier(f"clear {name}")  # no process still reads it
        if processes.is_primary():
            shutil.rmtree(os.path.join(self.workdir, "partial", name.replace("/", "_")), ignore_errors=True)

    def close(self) -> None:
        self._checkpointer.close()


_ABSENT = object()


def config_differences(saved: Any, current: Any, defaults: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ; a field absent from `saved` differs only when `current` moves
    it off its value in `defaults`."""
    if isinstance(saved, dict) and isinstance(current, dict):
        defaults = defaults if isinstance(defaults, dict) else {}
        out = []
        for key in sorted(set(saved) | set(current)):
            out += config_differences(
                saved.get(key, _ABSENT),
                current.get(key, _ABSENT),
                defaults.get(key, _ABSENT),
                f"{prefix}{key}.",
            )
        return out
    if saved is _ABSENT and current is not _ABSENT and current == defaults:
        return []
    return [] if saved == current else [prefix.rstrip(".")]

"""Trajectories and preference pairs read by path: a JSONL/JSON record file or a split of a TFDS dataset.

A TFDS source is `DIR` or `DIR:SPLIT`. DIR is a dataset's version directory
(`<data_dir>/coevo_trajectories/1.2.0`, as `python -m coevo_jax.experiment.export` writes it) or the data_dir that
holds the dataset (its newest version is read); without `:SPLIT` the caller's default split is read
(`experts` for a run's expert trajectories, `env.experts_path`). Anything else is a record file.
tensorflow_datasets is imported only when a TFDS source is read, so the main job does not pay for it otherwise.

    read_trajectory_source("published/run1:experts")  # a run's experts, exported
    read_pair_source("published/run1:coevo_it1_target")  # the pairs a phase trained on, with its report
"""

from __future__ import annotations

import os
import re

from coevo_jax.data.pair_pool import PreferenceDataset
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Trajectory

SPLIT_NAME = re.compile(r"[A-Za-z0-9_]+")  # a split name that TFDS file names and split specs take as is
DATASET_INFO = "dataset_info.json"


def tfds_source(path: str | os.PathLike[str]) -> tuple[str, str | None] | None:
    """(directory, split or None) when `path` names a TFDS source (an existing directory, with `:SPLIT` or
    not); None for anything else (a record file)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return path, None
    directory, sep, split = path.rpartition(":")
    if sep and SPLIT_NAME.fullmatch(split) and os.path.isdir(directory):
        return directory, split
    return None


def version_dir(directory: str, dataset: str) -> str:
    """The version directory of `dataset` that `directory` names: itself, or the newest under
    `<directory>/<dataset>/`. FileNotFoundError naming the directory when there is none."""
    if os.path.isfile(os.path.join(directory, DATASET_INFO)):
        return directory
    base = os.path.join(directory, dataset)
    versions = [
        v
        for v in (os.listdir(base) if os.path.isdir(base) else [])
        if re.fullmatch(r"\d+\.\d+\.\d+", v) and os.path.isfile(os.path.join(base, v, DATASET_INFO))
    ]
    if not versions:
        raise FileNotFoundError(
            f"{directory}: neither a TFDS dataset version directory nor a data_dir holding {dataset}/<version>"
        )
    return os.path.join(base, max(versions, key=lambda v: tuple(map(int, v.split(".")))))


def _trajectory_split(found: tuple[str, str | None], default_split: str):
    """(tfds_builders, version directory, split) of a TFDS trajectory source, the split checked."""
    from coevo_jax.data import tfds_builders

    directory, split = found
    path = version_dir(directory, tfds_builders.TRAJECTORIES)
    split = split or default_split
    tfds_builders.open_split(path, tfds_builders.TRAJECTORIES, split)
    return tfds_builders, path, split


def check_trajectory_source(path: str | os.PathLike[str], *, default_split: str = "experts") -> None:
    """FileNotFoundError (ValueError for a missing split) naming `path` unless it is a record file or a
    trajectory split that exists; for the checks a run makes before it writes anything."""
    found = tfds_source(path)
    if found is not None:
        _trajectory_split(found, default_split)
    elif not os.path.isfile(path):
        raise FileNotFoundError(f"{os.fspath(path)}: no such file or TFDS dataset directory")


def read_trajectory_source(
    path: str | os.PathLike[str], *, default_split: str = "experts"
) -> list[Trajectory]:
    """The trajectories of a record file (`read_trajectories`, strict) or of a `coevo_trajectories` split."""
    found = tfds_source(path)
    if found is None:
        return read_trajectories(path)
    tfds_builders, directory, split = _trajectory_split(found, default_split)
    return tfds_builders.read_trajectories_dataset(directory, split)


def read_pair_source(path: str | os.PathLike[str]) -> PreferenceDataset:
    """The `coevo_preference_pairs` split `DIR:SPLIT` with its saved report, ready for a DPO phase
    (`Stages.train_pairs`; its `.pairs` for `phases.dpo_phase`)."""
    found = tfds_source(path)
    if found is None or found[1] is None:
        raise ValueError(f"{os.fspath(path)}: not DIR:SPLIT of a TFDS coevo_preference_pairs dataset")
    from coevo_jax.data import tfds_builders

    directory, split = found
    return tfds_builders.read_preference_dataset(version_dir(directory, tfds_builders.PAIRS), split)

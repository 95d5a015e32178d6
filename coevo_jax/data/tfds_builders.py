"""TFDS builders that store trajectories and preference pairs as `array_record`, readable without TensorFlow.

`GeneratorBasedBuilder` with `file_format="array_record"` writes and `as_data_source()` /
`tfds.data_source(...)` / `tfds.builder_from_directory(...)` read random-access `ArrayRecordDataSource`s in
plain NumPy/bytes; TensorFlow is never imported (it is not a dependency of this project). tfds itself needs
`importlib_resources` (a project dependency) and builder classes that live in an importable package, which is
why they are here in `coevo_jax.data` rather than in a script.

The builders take their records in the constructor (they are produced by our own rollouts, there is nothing
to download), write one split per entry of `splits`, and keep insertion order (shuffling disabled), so
record i of a split is the i-th trajectory / pair given. Text comes back as bytes; `decode_trajectory` and
`decode_pair` turn rows into `Trajectory` / `PreferencePair` again, refusing a reward or a loss weight that
is not a finite number (a `DataFormatError` naming the dataset directory and split, the record and field).
A pair split given as a `PreferenceDataset` keeps its `DatasetReport` in the dataset's metadata
(`metadata.json`), so `read_preference_dataset` gives back the dataset a DPO phase trains on, report included.
`python -m coevo_jax.experiment.export` writes a run's data with these builders; `coevo_jax.data.sources` reads a
split back by path (`env.experts_path`).

    write_trajectories_dataset({"train": trajs}, data_dir)      # -> <data_dir>/coevo_trajectories/1.2.0
    source = tfds.data_source("coevo_trajectories", data_dir=data_dir, split="train")
    trajectories = [decode_trajectory(source[i]) for i in range(len(source))]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds

from coevo_jax.data.json_files import DataFormatError
from coevo_jax.data.pair_pool import PreferenceDataset, PreferencePair
from coevo_jax.data.record_reader import parse_reward, parse_token_trace, parse_weight
from coevo_jax.data.records import Message, Trajectory
from coevo_jax.data.reports import DatasetReport

ARRAY_RECORD = "array_record"
REPORTS = "reports"  # metadata key: {split: DatasetReport.to_dict()} of the pair splits built with one


def trajectory_features() -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict(
        {
            "traj_id": tfds.features.Text(),
            "task_id": tfds.features.Text(),
            "env": tfds.features.Text(),
            "agent": tfds.features.Text(),
            "iteration": np.int32,  # -1 for None (expert data)
            "reward": np.float32,  # for numeric filtering; tf.Example stores floats as float32
            "reward_repr": tfds.features.Text(),  # the exact float64 value, which decoding uses
            "prompt_len": np.int32,
            "roles": tfds.features.Sequence(tfds.features.Text()),
            "contents": tfds.features.Sequence(tfds.features.Text()),
            "sampling_json": tfds.features.Text(),
            "extra_json": tfds.features.Text(),
            "tokens_json": tfds.features.Text(),  # the sampled episode's `TokenTrace` record; "" for none
        }
    )


def encode_trajectory(trajectory: Trajectory) -> dict[str, object]:
    return {
        "traj_id": trajectory.traj_id,
        "task_id": trajectory.task_id,
        "env": trajectory.env,
        "agent": trajectory.agent,
        "iteration": np.int32(-1 if trajectory.iteration is None else trajectory.iteration),
        "reward": np.float32(trajectory.reward),
        "reward_repr": repr(float(trajectory.reward)),
        "prompt_len": np.int32(trajectory.prompt_len),
        "roles": [m.role for m in trajectory.messages],
        "contents": [m.content for m in trajectory.messages],
        "sampling_json": json.dumps(dict(trajectory.sampling), ensure_ascii=False),
        "extra_json": json.dumps(dict(trajectory.extra), ensure_ascii=False, sort_keys=True),
        "tokens_json": "" if trajectory.tokens is None else json.dumps(trajectory.tokens.to_record()),
    }


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _reward(text: str, source: str, index: int) -> float:
    """The float64 reward from its repr; 'nan' and 'inf' parse here and are refused by `parse_reward`."""
    try:
        value = float(text)
    except ValueError:
        raise DataFormatError(source, index, "reward", f"not a number: {text!r}") from None
    return parse_reward(value, source, index)


def decode_trajectory(row: Mapping[str, object], *, source: str = "<row>", index: int = 0) -> Trajectory:
    """A data-source row back to a `Trajectory` (`source`, `index`: where it was read, for errors)."""
    messages = tuple(
        Message(_text(role), _text(content))
        for role, content in zip(row["roles"], row["contents"], strict=True)
    )
    iteration = int(row["iteration"])
    tokens = _text(row.get("tokens_json", ""))  # "": no trace (and every row before 1.2.0)
    return Trajectory(
        traj_id=_text(row["traj_id"]),
        task_id=_text(row["task_id"]),
        messages=messages,
        reward=_reward(_text(row["reward_repr"]), source, index),
        agent=_text(row["agent"]),
        prompt_len=int(row["prompt_len"]),
        env=_text(row["env"]),
        iteration=None if iteration < 0 else iteration,
        sampling=json.loads(_text(row["sampling_json"])),
        extra=json.loads(_text(row["extra_json"])),
        tokens=parse_token_trace(json.loads(tokens) if tokens else None, source, index),
    )


def pair_features() -> tfds.features.FeaturesDict:
    return tfds.features.FeaturesDict(
        {
            "pair_id": tfds.features.Text(),
            "task_id": tfds.features.Text(),
            "kind": tfds.features.Text(),
            "lambda_dpo": np.float32,
            "lambda_sft": np.float32,
            "lambdas_repr": tfds.features.Text(),  # exact "(lambda_dpo, lambda_sft)", which decoding uses
            "hard_negative": np.bool_,
            "chosen": trajectory_features(),
            "rejected": trajectory_features(),
        }
    )


def encode_pair(pair: PreferencePair) -> dict[str, object]:
    return {
        "pair_id": pair.pair_id,
        "task_id": pair.task_id,
        "kind": pair.kind,
        "lambda_dpo": np.float32(pair.lambda_dpo),
        "lambda_sft": np.float32(pair.lambda_sft),
        "lambdas_repr": json.dumps([float(pair.lambda_dpo), float(pair.lambda_sft)]),
        "hard_negative": bool(pair.hard_negative),
        "chosen": encode_trajectory(pair.chosen),
        "rejected": encode_trajectory(pair.rejected),
    }


def decode_pair(row: Mapping[str, object], *, source: str = "<row>", index: int = 0) -> PreferencePair:
    """A data-source row back to a `PreferencePair` (`source`, `index`: where it was read, for errors)."""
    try:  # JSON's NaN and Infinity parse here; parse_weight refuses them
        lambdas = json.loads(_text(row["lambdas_repr"]))
    except json.JSONDecodeError:
        lambdas = None
    if not (isinstance(lambdas, list) and len(lambdas) == 2):
        raise DataFormatError(
            source, index, "lambdas_repr", f"expected [lambda_dpo, lambda_sft], got {lambdas!r}"
        )
    sides = {}
    for side in ("chosen", "rejected"):
        try:
            sides[side] = decode_trajectory(row[side], source=source, index=index)
        except DataFormatError as err:
            raise DataFormatError(source, index, f"{side}.{err.field_name}", err.problem) from err
    return PreferencePair(
        task_id=_text(row["task_id"]),
        chosen=sides["chosen"],
        rejected=sides["rejected"],
        kind=_text(row["kind"]),
        lambda_dpo=parse_weight(lambdas[0], source, index, "lambda_dpo"),
        lambda_sft=parse_weight(lambdas[1], source, index, "lambda_sft"),
        hard_negative=bool(row["hard_negative"]),
    )


class _InMemoryBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Shared machinery: splits given as {split: items}, array_record files, insertion order kept, and
    `metadata` (JSON-able) saved with the dataset."""

    def __init__(
        self,
        *,
        splits: Mapping[str, Sequence[object]] | None = None,
        metadata: Mapping[str, object] | None = None,
        **kwargs,
    ):
        self._items_by_split = dict(splits or {})
        self._saved_metadata = dict(metadata or {})
        kwargs.setdefault("file_format", ARRAY_RECORD)
        super().__init__(**kwargs)

    def _features(self) -> tfds.features.FeaturesDict:
        raise NotImplementedError

    def _encode(self, item: object) -> tuple[str, dict[str, object]]:
        raise NotImplementedError

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=self.__doc__,
            features=self._features(),
            disable_shuffling=True,
            metadata=tfds.core.MetadataDict(self._saved_metadata) if self._saved_metadata else None,
        )

    def _split_generators(self, dl_manager):
        if not self._items_by_split:
            raise ValueError(f"{self.name}: no splits given to write")
        return {split: self._generate_examples(items) for split, items in self._items_by_split.items()}

    def _generate_examples(self, items):
        for item in items:
            yield self._encode(item)

    def _log_download_bytes(self) -> None:
        """Silent: tfds prints "Downloading and preparing ..." to stdout; nothing is downloaded here."""

    def _log_download_done(self) -> None:
        """Silent: the writers return the directory they prepared."""


class CoevoTrajectories(_InMemoryBuilder):
    """Agent trajectories (conversation records with env, agent, iteration, reward, prompt length, sampling)."""

    VERSION = tfds.core.Version("1.2.0")
    RELEASE_NOTES = {
        "1.0.0": "First release.",
        "1.1.0": "env, agent (was source), iteration, sampling.",
        "1.2.0": "tokens: the sampled episode's token trace.",
    }

    def _features(self):
        return trajectory_features()

    def _encode(self, item):
        return item.traj_id, encode_trajectory(item)


class CoevoPreferencePairs(_InMemoryBuilder):
    """Preference pairs (eq. 6 / eq. 8 / ETO) with both trajectories and the eq. 9 weights."""

    VERSION = tfds.core.Version("1.2.0")
    RELEASE_NOTES = {
        "1.0.0": "First release.",
        "1.1.0": "Trajectory metadata; hard_negative; exact lambdas.",
        "1.2.0": "Token traces of sampled trajectories; the build report of each split in the metadata.",
    }

    def _features(self):
        return pair_features()

    def _encode(self, item):
        return item.pair_id, encode_pair(item)


TRAJECTORIES = CoevoTrajectories.name  # "coevo_trajectories" (TFDS names a dataset after its builder class)
PAIRS = CoevoPreferencePairs.name  # "coevo_preference_pairs"


def write_trajectories_dataset(
    splits: Mapping[str, Sequence[Trajectory]],
    data_dir: str | os.PathLike[str],
    *,
    metadata: Mapping[str, object] | None = None,
) -> str:
    """Build `coevo_trajectories` under data_dir (with `metadata`, JSON-able); returns the version directory."""
    builder = CoevoTrajectories(splits=splits, metadata=metadata, data_dir=os.fspath(data_dir))
    builder.download_and_prepare()
    return os.fspath(builder.data_dir)


def write_pairs_dataset(
    splits: Mapping[str, Sequence[PreferencePair]],
    data_dir: str | os.PathLike[str],
    *,
    metadata: Mapping[str, object] | None = None,
) -> str:
    """Build `coevo_preference_pairs` under data_dir; returns the version directory. The report of each split
    given as a `PreferenceDataset` is saved in the metadata (under `REPORTS`) beside `metadata`."""
    reports = {s: p.report.to_dict() for s, p in splits.items() if isinstance(p, PreferenceDataset)}
    metadata = {**(metadata or {}), **({REPORTS: reports} if reports else {})}
    builder = CoevoPreferencePairs(splits=splits, metadata=metadata, data_dir=os.fspath(data_dir))
    builder.download_and_prepare()
    return os.fspath(builder.data_dir)


def open_dataset(version_dir: str | os.PathLike[str], name: str):
    """The built dataset `name` in version_dir (a read-only builder); ValueError naming the directory when it
    holds another dataset."""
    builder = tfds.builder_from_directory(os.fspath(version_dir))
    if builder.info.name != name:
        raise ValueError(f"{os.fspath(version_dir)}: a {builder.info.name} dataset, not {name}")
    return builder


def split_sizes(version_dir: str | os.PathLike[str], name: str) -> dict[str, int]:
    """{split: number of records} of the built dataset `name` in version_dir."""
    return {s: info.num_examples for s, info in open_dataset(version_dir, name).info.splits.items()}


def open_split(version_dir: str | os.PathLike[str], name: str, split: str):
    """The built dataset `name` in version_dir (`open_dataset`); ValueError naming the directory and its
    splits when it has no `split`."""
    builder = open_dataset(version_dir, name)
    if split not in builder.info.splits:
        raise ValueError(
            f"{os.fspath(version_dir)}: no split {split!r} (its splits: {', '.join(builder.info.splits)})"
        )
    return builder


def _rows(version_dir: str | os.PathLike[str], name: str, split: str):
    """(builder, random-access rows of `split`, the "<dir> [<split>]" that errors name)."""
    builder = open_split(version_dir, name, split)
    return builder, builder.as_data_source(split=split), f"{os.fspath(version_dir)} [{split}]"


def read_trajectories_dataset(version_dir: str | os.PathLike[str], split: str = "train") -> list[Trajectory]:
    """Read a built trajectory split back (no builder class or TensorFlow needed)."""
    _, source, name = _rows(version_dir, TRAJECTORIES, split)
    return [decode_trajectory(source[i], source=name, index=i) for i in range(len(source))]


def _decode_pairs(source, name: str) -> list[PreferencePair]:
    return [decode_pair(source[i], source=name, index=i) for i in range(len(source))]


def read_pairs_dataset(version_dir: str | os.PathLike[str], split: str = "train") -> list[PreferencePair]:
    """Read a built pair split back (no builder class or TensorFlow needed)."""
    return _decode_pairs(*_rows(version_dir, PAIRS, split)[1:])


def read_preference_dataset(version_dir: str | os.PathLike[str], split: str) -> PreferenceDataset:
    """A built pair split with the report saved beside it: what `Stages.train_pairs` trains on. ValueError
    for a split written without one (plain pairs: `read_pairs_dataset` reads those)."""
    builder, source, name = _rows(version_dir, PAIRS, split)
    report = dict(builder.info.metadata or {}).get(REPORTS, {}).get(split)
    if report is None:
        raise ValueError(f"{name}: no dataset report saved with this split (read its pairs alone instead)")
    return PreferenceDataset(tuple(_decode_pairs(source, name)), DatasetReport.from_dict(report))

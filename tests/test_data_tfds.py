"""TFDS array_record datasets of trajectories and pairs: build into tmp_path, read back, no TensorFlow."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow_datasets as tfds

from coevo_jax.data import tfds_builders
from coevo_jax.data.json_files import DataFormatError
from coevo_jax.data.pairs import build_target_pairs
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import TokenTrace, Trajectory
from coevo_jax.data.tfds_builders import (
    read_pairs_dataset,
    read_preference_dataset,
    read_trajectories_dataset,
    write_pairs_dataset,
    write_trajectories_dataset,
)

RECORDS = os.path.join(os.path.dirname(__file__), "data", "eto_records.jsonl")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def real_trajectories():
    return read_trajectories(RECORDS)


def test_trajectories_round_trip(tmp_path):
    trajectories = real_trajectories()
    version_dir = write_trajectories_dataset({"train": trajectories[3:], "icl": trajectories[:3]}, tmp_path)
    assert version_dir == os.fspath(tmp_path / "coevo_trajectories" / "1.2.0")
    assert any(name.startswith("coevo_trajectories-train.array_record") for name in os.listdir(version_dir))
    assert read_trajectories_dataset(version_dir, "train") == trajectories[3:]  # order and values kept
    assert read_trajectories_dataset(version_dir, "icl") == trajectories[:3]
    back = read_trajectories_dataset(version_dir, "train")
    assert [t.extra for t in back] == [t.extra for t in trajectories[3:]]
    assert back[3].reward == 2 / 3  # InterCode task 40; float64: partial rewards come back exactly
    source = tfds.data_source("coevo_trajectories", data_dir=os.fspath(tmp_path), split="icl")
    assert len(source) == 3 and source[0]["traj_id"] == b"alfworld_icl_0"
    assert "tensorflow" not in sys.modules


def test_pairs_round_trip(tmp_path):
    expert = next(t for t in real_trajectories() if t.traj_id == "intercode_sql_0_gpt-4")
    target = Trajectory(
        "sql0_tgt", expert.task_id, expert.messages[:4], 0.25, "target", prompt_len=3, iteration=0
    )
    failure = Trajectory(
        "sql0_fail",
        expert.task_id,
        expert.messages[:6],
        0.7,
        "failure",
        prompt_len=3,
        env="intercode_sql",
        iteration=2,
        sampling={"temperature": 0.1 + 0.2, "model": "smöl", "stop": ["\n"]},
    )
    pairs = build_target_pairs([expert], [target], [failure])
    assert [p.kind for p in pairs] == ["expert_vs_failure", "expert_vs_target", "failure_vs_failure"]
    assert [p.hard_negative for p in pairs] == [True, False, False]
    version_dir = write_pairs_dataset({"train": pairs}, tmp_path)
    back = read_pairs_dataset(version_dir)
    assert back == list(pairs)
    assert back[0].rejected.sampling["temperature"] == 0.1 + 0.2 and back[1].rejected.iteration == 0
    assert back[0].chosen.iteration is None
    assert "tensorflow" not in sys.modules


@pytest.mark.parametrize("reward_repr", ["nan", "inf", "-inf"])
def test_a_non_finite_reward_is_refused_naming_dataset_record_and_field(tmp_path, monkeypatch, reward_repr):
    trajectories = real_trajectories()[:3]
    encode = tfds_builders.encode_trajectory

    def corrupt_second(trajectory):  # a Trajectory cannot hold NaN: write it into the row directly
        row = encode(trajectory)
        if trajectory is trajectories[1]:
            row["reward_repr"] = reward_repr
        return row

    monkeypatch.setattr(tfds_builders, "encode_trajectory", corrupt_second)
    version_dir = write_trajectories_dataset({"train": trajectories}, tmp_path)
    with pytest.raises(
        DataFormatError, match=r"coevo_trajectories/1.2.0 \[train\]: record 1: field 'reward'"
    ):
        read_trajectories_dataset(version_dir, "train")


@pytest.mark.parametrize(
    "field_name, change, problem",
    [
        ("lambda_dpo", {"lambda_dpo": float("nan")}, "expected a finite number >= 0, got nan"),
        ("lambda_sft", {"lambda_sft": float("inf")}, "expected a finite number >= 0, got inf"),
        ("rejected.reward", {"rejected_reward": "nan"}, "expected a finite number, got nan"),
    ],
)
def test_a_pair_with_a_non_finite_weight_or_reward_is_refused(
    tmp_path, monkeypatch, field_name, change, problem
):
    expert = next(t for t in real_trajectories() if t.traj_id == "intercode_sql_0_gpt-4")
    target = Trajectory("sql0_tgt", expert.task_id, expert.messages[:4], 0.25, "target", prompt_len=3)
    pairs = [
        dataclasses.replace(p, **{k: v for k, v in change.items() if k.startswith("lambda")})
        for p in build_target_pairs([expert], [target], [])
    ]
    encode = tfds_builders.encode_trajectory

    def corrupt_rejected(trajectory):
        row = encode(trajectory)
        if trajectory is pairs[0].rejected and "rejected_reward" in change:
            row["reward_repr"] = change["rejected_reward"]
        return row

    monkeypatch.setattr(tfds_builders, "encode_trajectory", corrupt_rejected)
    version_dir = write_pairs_dataset({"train": pairs}, tmp_path)
    with pytest.raises(DataFormatError, match=rf"\[train\]: record 0: field '{field_name}'") as info:
        read_pairs_dataset(version_dir)
    assert info.value.problem == problem


def test_fresh_interpreter_builds_and_reads_without_importing_tensorflow(tmp_path):
    """Holds whether or not TensorFlow is installed: building and reading never import it.

    (A stronger "TF made unimportable" variant is not possible: etils decides whether TF is loaded by
    looking for "tensorflow" in sys.modules, so a `sys.modules["tensorflow"] = None` blocker misleads tfds.)
    """
    script = textwrap.dedent(
        f"""
        import sys

        from coevo_jax.data.record_reader import read_trajectories
        from coevo_jax.data.tfds_builders import read_trajectories_dataset, write_trajectories_dataset

        trajectories = read_trajectories({RECORDS!r})
        version_dir = write_trajectories_dataset({{"train": trajectories}}, {os.fspath(tmp_path)!r})
        assert read_trajectories_dataset(version_dir) == trajectories
        assert not any(name.split(".")[0] == "tensorflow" for name in sys.modules), "TensorFlow was imported"
        print("OK", len(trajectories))
        """
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("OK 10")


def test_a_pair_split_keeps_its_report_and_a_sampled_trajectory_its_token_trace(tmp_path):
    """A `PreferenceDataset` split reads back whole (`read_preference_dataset`: pairs and build report, what a
    DPO phase trains on); a split of plain pairs has no report to give; token traces come back exactly."""
    expert = next(t for t in real_trajectories() if t.traj_id == "intercode_sql_0_gpt-4")
    trace = TokenTrace((5, 6, 7, 8), ((1, 2), (3, 4)), (-0.1 - 0.2, -1 / 3))
    sampled = dict(prompt_len=3, iteration=1, tokens=trace)
    target = Trajectory("sql0_tgt", expert.task_id, expert.messages[:6], 0.25, "target", **sampled)
    built = build_target_pairs([expert], [target], [])
    version_dir = write_pairs_dataset({"built": built, "plain": list(built)}, tmp_path)
    back = read_preference_dataset(version_dir, "built")
    assert back.pairs == built.pairs and back.report == built.report
    assert back.pairs[0].rejected.tokens == trace and back.pairs[0].chosen.tokens is None
    with pytest.raises(ValueError, match=r"\[plain\]: no dataset report saved with this split"):
        read_preference_dataset(version_dir, "plain")
    assert read_pairs_dataset(version_dir, "plain") == list(built)
    with pytest.raises(ValueError, match=r"1.2.0: no split 'train' \(its splits: built, plain\)"):
        read_pairs_dataset(version_dir)
    with pytest.raises(ValueError, match="a coevo_preference_pairs dataset, not coevo_trajectories"):
        read_trajectories_dataset(version_dir, "built")

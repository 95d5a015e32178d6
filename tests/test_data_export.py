"""A run's data exported as TFDS datasets (`python -m coevo_jax.experiment.export`) and read back by the main job.

The workdir is synthetic but laid out as the job lays it out (`config.json`, `stages.json`, `experts.jsonl`,
`rollouts/`): a partial `sft, grpo, eto, coevo` run: one GRPO step done, ETO's two iterations, co-evolution's
first. The pairs each phase trained on are what the job's builders make from the explorations, built here
directly.
"""

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from coevo_jax.data.json_files import DataFormatError
from coevo_jax.data.pairs import build_eto_pairs, build_failure_pairs, build_target_pairs
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Message, TokenTrace, Trajectory, write_trajectories
from coevo_jax.data.sources import check_trajectory_source, read_pair_source, read_trajectory_source
from coevo_jax.experiment.config import EnvConfig, ExperimentConfig
from coevo_jax.experiment.experts import load_or_generate_experts
from coevo_jax.experiment.export import export_run
from coevo_jax.experiment.rollouts import pairable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASKS = ("t0", "t1", "t2")


def episode(traj_id, task, reward, agent, iteration, *, tokens=False, reason="done"):
    """A two-turn episode; its id in its messages, so no two episodes are identical."""
    messages = (
        Message("user", f"Task {task}: find the key."),
        Message("assistant", f"Thought: try.\nAction: look {traj_id}"),
        Message("user", "Observation: nothing."),
        Message("assistant", f"Thought: again.\nAction: take {traj_id}"),
    )
    trace = (
        TokenTrace((1, 2, 3, 4, 5, 6, 7), ((1, 3), (4, 7)), (-0.5, -0.25, -1 / 3, -0.1, -2.0))
        if tokens
        else None
    )
    return Trajectory(
        traj_id,
        task,
        messages,
        reward,
        agent,
        env="builtin",
        iteration=iteration,
        sampling={"temperature": 0.7, "sample": int(traj_id[-1])},
        extra={"terminate_reason": reason, "steps": 2},
        tokens=trace,
    )


def explored(policy, iteration, agent, rewards):
    """Two samples per task, ids out of order in the file (the job sorts them); one ended by an environment
    error, which no pair may use."""
    out = [
        episode(
            f"{policy}_it{iteration}_{task}_{s}", task, rewards[(i * 2 + s) % len(rewards)], agent, iteration
        )
        for i, task in enumerate(TASKS)
        for s in (1, 0)
    ]
    out[0] = episode(out[0].traj_id, out[0].task_id, 0.1, agent, iteration, tokens=True)
    out[1] = episode(out[1].traj_id, out[1].task_id, 0.2, agent, iteration, reason="env_error: crashed")
    return out


def _sorted(trajectories):
    return pairable(sorted(trajectories, key=lambda t: t.traj_id), context_limited=False)


def write_run(workdir) -> dict:
    """A partial run's workdir; returns its files by split name and the pairs each finished phase trained on."""
    config = ExperimentConfig(
        methods=("sft", "grpo", "eto", "coevo"), iterations=2, env=EnvConfig(eval_splits=("test",))
    )
    experts = [episode(f"expert_{task}_0", task, 1.0, "expert", None) for task in TASKS]
    files = {
        "experts": ("experts.jsonl", experts),
        "eval_sft_target_test": (
            "rollouts/sft_target_test.jsonl",
            explored("sft_target", 0, "target", [1.0])[:3],
        ),
        "explore_sft_target_it1": (
            "rollouts/sft_target_it1_explore.jsonl",
            explored("sft_target", 1, "target", [0.0, 0.5, 1.0, 0.7]),
        ),
        "explore_eto_it1_target_it2": (
            "rollouts/eto_it1_target_it2_explore.jsonl",
            explored("eto_it1_target", 2, "target", [0.3, 1.0, 0.6]),
        ),
        "explore_sft_failure_it1": (
            "rollouts/sft_failure_it1_explore.jsonl",
            explored("sft_failure", 1, "failure", [0.0, 0.4, 0.8, 0.9]),
        ),
        "explore_coevo_it1_target_it2": (
            "rollouts/coevo_it1_target_it2_explore.jsonl",
            explored("coevo_it1_target", 2, "target", [0.5]),
        ),
        "explore_grpo_step1": (
            "rollouts/grpo_step1_explore.jsonl",
            explored("grpo", 1, "target", [0.5, 1.0]),
        ),
    }
    # no stage record yet, GRPO step 2 not in its history
    in_progress = ["rollouts/coevo_it1_failure_it2_explore.jsonl", "rollouts/grpo_step2_explore.jsonl"]
    os.makedirs(workdir / "rollouts")
    os.makedirs(workdir / "grpo")
    (workdir / "grpo" / "history.json").write_text(json.dumps([{"step": 1, "reward": 0.75}]))
    for path, trajectories in files.values():
        write_trajectories(workdir / path, trajectories)
    for path in in_progress:
        write_trajectories(workdir / path, explored("coevo_it1_failure", 2, "failure", [0.0])[:2])
    target_it1, failure_it1 = (_sorted(files[f"explore_sft_{a}_it1"][1]) for a in ("target", "failure"))
    pairs = {
        "eto_it1_target": build_eto_pairs(experts, target_it1),
        "eto_it2_target": build_eto_pairs(experts, _sorted(files["explore_eto_it1_target_it2"][1])),
        "coevo_it1_failure": build_failure_pairs(target_it1, failure_it1, include_within_agent=False),
        "coevo_it1_target": build_target_pairs(experts, target_it1, failure_it1),
    }
    assert (
        all(len(p) for p in pairs.values())
        and len({tuple(q.pair_id for q in p) for p in pairs.values()}) == 4
    )
    trained = lambda name: {"steps": 3, "dataset": pairs[name].report.to_dict()}  # noqa: E731
    stages = {
        "train/sft_target": {"steps": 4},
        "eval/sft_target/test": {"episodes": 3},
        "explore/sft_target/it1": {"episodes": 6},
        "train/eto_it1_target": trained("eto_it1_target"),
        "explore/eto_it1_target/it2": {"episodes": 6},
        "train/eto_it2_target": trained("eto_it2_target"),
        "train/sft_failure": {"steps": 4},
        "explore/sft_failure/it1": {"episodes": 6},
        "train/coevo_it1_failure": trained("coevo_it1_failure"),
        "train/coevo_it1_target": trained("coevo_it1_target"),
        "explore/coevo_it1_target/it2": {"episodes": 6},
    }
    (workdir / "config.json").write_text(json.dumps(config.to_json()))
    (workdir / "stages.json").write_text(json.dumps(stages))
    return {"files": files, "pairs": pairs, "in_progress": in_progress}


@pytest.fixture
def run(tmp_path):
    workdir = tmp_path / "run"
    return types.SimpleNamespace(workdir=workdir, **write_run(workdir))


def test_a_run_exported_reads_back_equal(run, tmp_path):
    out = tmp_path / "published"
    report = export_run(run.workdir, out)
    trajectories, pairs = (
        os.fspath(out / "coevo_trajectories" / "1.2.0"),
        os.fspath(out / "coevo_preference_pairs" / "1.2.0"),
    )
    expected_sizes = {split: len(t) for split, (_, t) in run.files.items()}
    assert report["datasets"] == {
        trajectories: expected_sizes,
        pairs: {n: len(p) for n, p in run.pairs.items()},
    }
    assert report["left_out"] == [f"{path}: stage not finished" for path in run.in_progress]
    for split, (path, written) in run.files.items():
        back = read_trajectory_source(f"{out}:{split}")
        assert back == read_trajectories(run.workdir / path) == written  # file order, every field
        assert [t.extra for t in back] == [t.extra for t in written]  # (extra is not compared by ==)
    assert read_trajectory_source(f"{out}:explore_sft_target_it1")[0].tokens.logprobs[2] == -1 / 3
    for split, built in run.pairs.items():
        back = read_pair_source(f"{out}:{split}")
        assert back.pairs == built.pairs and back.report == built.report
        assert [p.chosen.extra for p in back] == [p.chosen.extra for p in built]
    assert sorted(os.listdir(out)) == ["coevo_preference_pairs", "coevo_trajectories"]  # no scratch left
    metadata = json.loads((out / "coevo_preference_pairs" / "1.2.0" / "metadata.json").read_text())
    assert metadata["stages"]["coevo_it1_target"] == "train/coevo_it1_target"
    assert "tensorflow" not in sys.modules


def test_the_cli_exports_what_it_is_asked_and_refuses_to_overwrite(run, tmp_path):
    out = tmp_path / "published"
    command = [sys.executable, "-m", "coevo_jax.experiment.export", os.fspath(run.workdir), os.fspath(out)]
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run([*command, "--what", "pairs"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        f"{out}/coevo_preference_pairs/1.2.0: 4 splits, {sum(map(len, run.pairs.values()))} records",
        *(f"  {name:<17}  {len(p)}" for name, p in run.pairs.items()),
    ]
    assert sorted(os.listdir(out)) == ["coevo_preference_pairs"]  # no trajectories, no scratch directory
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 1 and "coevo_preference_pairs/1.2.0: already exported" in again.stderr
    assert sorted(os.listdir(out)) == ["coevo_preference_pairs"]


def test_experts_read_from_an_exported_dataset_equal_those_of_the_jsonl(run, tmp_path):
    """`env.experts_path` as the main job reads it: a run started from a TFDS experts split clones (and saves
    in its workdir) the same experts as one started from the JSONL file."""
    out = tmp_path / "published"
    export_run(run.workdir, out, ["trajectories"])
    env = types.SimpleNamespace(name="builtin")  # used only to name the environment in errors

    def experts(path, workdir, **spec):
        os.makedirs(workdir)  # as the run's store makes it
        return load_or_generate_experts(
            env, EnvConfig(experts_path=os.fspath(path), **spec), os.fspath(workdir)
        )

    from_jsonl = experts(run.workdir / "experts.jsonl", tmp_path / "a")
    assert from_jsonl == run.files["experts"][1]
    sources = (
        out,
        f"{out}:experts",
        out / "coevo_trajectories" / "1.2.0",
        f"{out}/coevo_trajectories/1.2.0:experts",
    )
    for i, path in enumerate(sources):
        check_trajectory_source(path)
        from_tfds = experts(path, tmp_path / f"b{i}")
        assert (
            from_tfds == from_jsonl and read_trajectories(tmp_path / f"b{i}" / "experts.jsonl") == from_jsonl
        )
        assert [t.extra for t in from_tfds] == [t.extra for t in from_jsonl]
    two = experts(f"{out}:eval_sft_target_test", tmp_path / "c", expert_tasks=2)
    assert two == run.files["eval_sft_target_test"][1][:2]  # any split, the first expert_tasks


def test_the_main_job_imports_tensorflow_datasets_only_for_a_tfds_source(run, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, types
        from coevo_jax.experiment.config import EnvConfig
        from coevo_jax.experiment.experts import generate_experts
        from coevo_jax.experiment.run import run

        env = types.SimpleNamespace(name="builtin")
        generate_experts(env, EnvConfig(experts_path={os.fspath(run.workdir / "experts.jsonl")!r}))
        assert "tensorflow_datasets" not in sys.modules, "imported for a JSONL file"
        generate_experts(env, EnvConfig(experts_path={os.fspath(tmp_path / "published")!r}))
        assert "tensorflow_datasets" in sys.modules and "tensorflow" not in sys.modules
        print("OK")
        """
    )
    export_run(run.workdir, tmp_path / "published", ["trajectories"])
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-3000:]


def _left_behind(out) -> list[str]:
    return sorted(os.listdir(out)) if os.path.exists(out) else []


def test_a_bad_record_refuses_the_export_naming_file_and_record(run, tmp_path):
    path = run.workdir / "rollouts" / "sft_failure_it1_explore.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[2])
    record["reward"] = 1.5
    lines[2] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "published"
    with pytest.raises(DataFormatError, match=r"sft_failure_it1_explore.jsonl: record 2: field 'reward'"):
        export_run(run.workdir, out)
    assert not out.exists()
    existing = tmp_path / "shared_data_dir"
    (existing / "other_dataset").mkdir(parents=True)
    with pytest.raises(DataFormatError, match="sft_failure_it1_explore.jsonl: record 2"):
        export_run(run.workdir, existing, ["trajectories"])
    assert _left_behind(existing) == ["other_dataset"]


def test_pairs_that_are_not_those_the_phase_trained_on_are_refused(run, tmp_path):
    stages = json.loads((run.workdir / "stages.json").read_text())
    stages["train/coevo_it1_failure"]["dataset"]["num_pairs"] += 1
    (run.workdir / "stages.json").write_text(json.dumps(stages))
    out = tmp_path / "published"
    with pytest.raises(
        ValueError, match=r"stages.json: train/coevo_it1_failure: the pairs rebuilt .*{'num_pairs': "
    ):
        export_run(run.workdir, out)
    assert not out.exists()
    report = export_run(run.workdir, out, ["trajectories"])  # the trajectories alone need no pairs
    assert list(report["datasets"]) == [os.fspath(out / "coevo_trajectories" / "1.2.0")]


def test_a_failed_write_leaves_nothing_behind(run, tmp_path, monkeypatch):
    from coevo_jax.data import tfds_builders

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tfds_builders, "write_pairs_dataset", fail)  # after the trajectories are written
    out = tmp_path / "published"
    with pytest.raises(OSError, match="disk full"):
        export_run(run.workdir, out)
    assert not out.exists()
    monkeypatch.undo()
    real_rename = os.rename

    def fail_second(source, target):
        if os.fspath(target) == os.fspath(out / "coevo_preference_pairs" / "1.2.0"):
            raise OSError("rename failed")
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", fail_second)  # the trajectories moved into place, then undone
    (out / "keep").mkdir(parents=True)
    with pytest.raises(OSError, match="rename failed"):
        export_run(run.workdir, out)
    assert _left_behind(out) == ["keep"]


def test_a_run_with_no_finished_phase_exports_its_experts_and_no_pairs(tmp_path):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(json.dumps(ExperimentConfig().to_json()))
    (workdir / "stages.json").write_text(json.dumps({"train/sft_target": {"steps": 1}}))
    write_trajectories(workdir / "experts.jsonl", [episode("expert_t0_0", "t0", 1.0, "expert", None)])
    report = export_run(workdir, tmp_path / "out")
    assert report == {
        "datasets": {os.fspath(tmp_path / "out" / "coevo_trajectories" / "1.2.0"): {"experts": 1}},
        "left_out": [],
    }
    with pytest.raises(FileNotFoundError, match=r"config.json: missing; not a started run's workdir"):
        export_run(tmp_path / "out", tmp_path / "out2")


def test_a_tfds_source_that_is_not_there_or_not_trajectories_is_refused(run, tmp_path):
    out = tmp_path / "published"
    export_run(run.workdir, out)
    with pytest.raises(
        ValueError, match=r"1.2.0: no split 'nope' \(its splits: experts, eval_sft_target_test"
    ):
        read_trajectory_source(f"{out}:nope")
    with pytest.raises(ValueError, match=r"no split 'nope'"):
        check_trajectory_source(f"{out}:nope")
    with pytest.raises(ValueError, match="a coevo_preference_pairs dataset, not coevo_trajectories"):
        read_trajectory_source(out / "coevo_preference_pairs" / "1.2.0:eto_it1_target")
    with pytest.raises(FileNotFoundError, match="neither a TFDS dataset version directory nor a data_dir"):
        check_trajectory_source(run.workdir / "rollouts")
    with pytest.raises(FileNotFoundError, match="no such file or TFDS dataset directory"):
        check_trajectory_source(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="not DIR:SPLIT"):
        read_pair_source(out)

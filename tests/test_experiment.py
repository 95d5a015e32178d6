"""The main job's pieces: configs, the resumable training phases, rollout summaries, and a tiny run of
every method end to end in a temporary workdir (8 fake devices: sharded steps and samplers)."""

import collections
import dataclasses
import importlib.util
import json
import os
import pathlib

import jax
import numpy as np
import pytest
from seeds import fresh_seed

from coevo_jax import envs
from coevo_jax.coevolve import ABLATIONS
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import write_trajectories
from coevo_jax.experiment import phases, rollouts, train_loop
from coevo_jax.experiment.config import (
    EXECUTION_FIELDS,
    METHOD_TITLES,
    METHODS,
    PAPER_METHODS,
    ExperimentConfig,
    GRPOConfig,
    RolloutSpec,
    default_config,
)
from coevo_jax.experiment.experts import generate_experts
from coevo_jax.experiment.finished_run import open_run
from coevo_jax.experiment.policy import build_setup
from coevo_jax.experiment.programs import Programs, objective_config
from coevo_jax.experiment.run import run
from coevo_jax.experiment.stages import pairs_file
from coevo_jax.experiment.store import RunStore
from coevo_jax.experiment.tensorboard import read_scalars
from coevo_jax.reporting.results import load_results
from coevo_jax.reporting.run_files import read_pairs_file
from coevo_jax.train import StepKind
from coevo_jax.train.compiled_steps import JittedStep, JittedTrainStep, PolicySteps

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"


def tiny_config(**changes) -> ExperimentConfig:
    """`configs/tiny.py` (a one-layer policy on a handful of built-in tasks: seconds per stage), with each
    of `changes` replacing a top-level field or, given as a dict, updating that group's fields."""
    config = _load_config_module(CONFIGS / "tiny.py").get_config().to_dict()
    for key, value in changes.items():
        if isinstance(value, dict):
            config[key] = {**config.get(key, {}), **value}
        else:
            config[key] = value
    return ExperimentConfig.from_mapping(config)


def _load_config_module(path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name,arg",
    [
        ("quickstart", None),
        ("tiny", None),
        ("tiny", "drill"),
        ("builtin_study", None),
        ("grpo_credit_study", "episode"),
        ("grpo_credit_study", "both"),
        ("sql_smollm2", None),
        ("sciworld_smollm2", None),
        ("bfcl_smollm2", None),
        ("bfcl_credit_study", "episode"),
        ("bfcl_credit_study", "both"),
        ("paper_llama2_7b", "webshop"),
        ("paper_llama2_7b", "sciworld"),
        ("paper_llama2_7b", "sql"),
        ("paper_qwen3_4b", "sql"),
        ("scarcity_study", "300"),
        ("scarcity_study", "1500,dev"),
    ],
)
def test_every_config_file_builds_an_experiment_config(name, arg):
    module = _load_config_module(CONFIGS / f"{name}.py")
    config = module.get_config() if arg is None else module.get_config(arg)
    experiment = ExperimentConfig.from_mapping(config)
    assert ExperimentConfig.from_mapping(experiment.to_json()) == experiment
    if name == "builtin_study":  # the paper's Table 1 and ablations, one budget for every method
        assert experiment.methods == PAPER_METHODS and experiment.match_exploration
        assert experiment.dpo.updates_per_phase is None and experiment.dpo.epochs == 3  # the paper's phases
        assert experiment.env.eval_tasks is None and not experiment.sft_per_token
        assert experiment.sft.epochs == 24  # the dev splits' choice (studies/equal_budget/README.md)
    if name.endswith("credit_study"):  # a run's SFT policies (reused), GRPO with the variant's credit
        assert experiment.methods == ("sft", "grpo")
        assert experiment.env.eval_tasks == (16 if name.startswith("bfcl") else None)
        assert (experiment.grpo.advantage, experiment.grpo.dead_groups) == (
            ("episode", "none") if arg == "episode" else ("gigpo", "pairs")
        )
    if experiment.env.name == "intercode_sql":  # `--config.env.kwargs.backend=mariadb` needs the key there
        assert dict(experiment.env.kwargs)["backend"] == "sqlite"
        config.env.kwargs.backend = "mariadb"
        assert dict(ExperimentConfig.from_mapping(config).env.kwargs)["backend"] == "mariadb"
    if name == "scarcity_study":  # every train task with an expert explored; about 1,875 SFT steps at any K
        experts = int(arg.split(",")[0])
        assert experiment.env.expert_tasks == experts and experiment.env.explore_tasks == 0
        assert experiment.sft.epochs == {300: 50, 1500: 10}[experts]
        assert experiment.env.eval_splits == (
            ("dev", "dev_unseen") if arg.endswith("dev") else ("test_seen", "test_unseen")
        )
    if name.startswith("paper"):
        assert experiment.sft.learning_rate == 2e-5 and experiment.sft.epochs == 3
        assert experiment.dpo.betas == (0.1,) and experiment.iterations == (5 if arg == "sql" else 3)


@pytest.mark.parametrize("arg", ["", "three hundred", "300,test"])
def test_the_scarcity_config_refuses_an_argument_it_cannot_read(arg):
    with pytest.raises(ValueError, match="scarcity_study.py"):
        _load_config_module(CONFIGS / "scarcity_study.py").get_config(arg)


def _field_names(config, prefix=""):
    names = set()
    for key, value in config.items():
        if hasattr(value, "items") and key != "kwargs":
            names |= _field_names(value, f"{prefix}{key}.")
        else:
            names.add(prefix + key)
    return names


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.py")))
def test_every_config_file_has_every_field_so_any_can_be_overridden(name):
    config = _load_config_module(CONFIGS / f"{name}.py").get_config()
    assert _field_names(default_config()) == _field_names(config)


def test_a_field_no_config_file_sets_is_overridden_on_the_command_line():
    from absl import flags
    from ml_collections import config_flags

    unset = {"sft_per_token", "dpo.warmup_steps", "grpo.clip_low", "keep_logits"}
    for path in CONFIGS.glob("*.py"):  # none of the files sets these (the test would prove nothing)
        text = path.read_text()
        assert not any(f"config.{field} =" in text for field in unset), path
    argv = [
        "main",
        f"--config={CONFIGS / 'quickstart.py'}",
        "--config.sft_per_token=True",
        "--config.dpo.warmup_steps=4",
        "--config.grpo.clip_low=0.1",
        "--config.keep_logits=False",
    ]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True, sys_argv=argv)
    values(argv)
    experiment = ExperimentConfig.from_mapping(values.config)
    assert experiment.sft_per_token and experiment.dpo.warmup_steps == 4
    assert experiment.grpo.clip_low == 0.1 and experiment.keep_logits is False  # a typed placeholder
    assert ExperimentConfig.from_mapping(default_config()) == ExperimentConfig()


def test_config_errors_name_the_group_and_field():
    with pytest.raises(ValueError, match=r"unknown dpo options \['beta'\]"):
        ExperimentConfig.from_mapping({"dpo": {"beta": 0.2}})
    with pytest.raises(ValueError, match="methods"):
        ExperimentConfig.from_mapping({"methods": ("sft", "ppo")})


@pytest.mark.parametrize(
    "env_changes, error, message",
    [
        (
            {"name": "nosuchenv"},
            ValueError,
            r"unknown environment 'nosuchenv'; registered: bfcl, builtin, intercode_sql",
        ),
        (
            {"kwargs": {"num_trian": 8}},
            ValueError,
            r"environment 'builtin': got an unexpected keyword .*num_trian",
        ),
        ({"train_split": "training"}, ValueError, r"builtin: unknown split 'training'"),
        ({"eval_splits": ("test_seen", "validation")}, ValueError, r"builtin: unknown split 'validation'"),
        (
            {"experts_path": "/nonexistent/experts.jsonl"},
            FileNotFoundError,
            r"env.experts_path .*no such file",
        ),
    ],
)
def test_a_wrong_env_config_fails_before_anything_is_written(tmp_path, env_changes, error, message):
    workdir = tmp_path / "run"
    with pytest.raises(error, match=message):
        run(tiny_config(env=env_changes), str(workdir))
    assert not workdir.exists()  # so the corrected rerun is not refused as "a different config"


def _listing(workdir: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "saved, message",
    [
        (
            json.dumps(tiny_config(seed=9).to_json()),
            r"config.json: this workdir was started with a different config \(changed: seed\)",
        ),
        ("{not json", r"config.json: not valid JSON"),
    ],
    ids=["another_config", "not_json"],
)
def test_a_refused_start_leaves_the_workdir_as_it_was(tmp_path, saved, message):
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(saved)
    before = _listing(workdir)
    with pytest.raises(ValueError, match=message):
        run(tiny_config(), str(workdir))
    assert _listing(workdir) == before  # no experts.jsonl, no config rewritten


def test_experts_the_run_cannot_pair_are_refused_before_the_workdir_exists(tmp_path):
    """Experts none of whose tasks is explored: ETO would build no expert pair; nothing is written."""
    cfg = tiny_config()
    env = envs.make(cfg.env.name, **dict(cfg.env.kwargs))
    elsewhere = [
        dataclasses.replace(t, task_id=f"elsewhere-{t.task_id}") for t in generate_experts(env, cfg.env)
    ]
    write_trajectories(tmp_path / "experts.jsonl", elsewhere)
    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match="would build no expert pairs"):
        run(tiny_config(env={"experts_path": str(tmp_path / "experts.jsonl")}), str(workdir))
    assert not workdir.exists()


def test_dpo_learning_rate_and_beta_per_iteration_repeat_the_last_value():
    config = tiny_config(dpo={"learning_rates": (1e-6, 5e-7), "betas": (0.1, 0.5)})
    assert [config.dpo.learning_rate(k) for k in (1, 2, 3)] == [1e-6, 5e-7, 5e-7]
    assert [config.dpo.beta(k) for k in (1, 2, 3)] == [0.1, 0.5, 0.5]


def test_summarize_against_a_direct_count():
    rng = np.random.default_rng(fresh_seed())
    from coevo_jax.data.records import Message, Trajectory

    rewards = np.round(rng.random(40), 2)
    rewards[rng.choice(40, 10, replace=False)] = 1.0
    reasons = rng.choice(["done", "max_steps", "env_error: X", "context_limit"], 40)
    trajectories = [
        Trajectory(
            traj_id=f"t{i}",
            task_id=f"u{i % 7}",
            reward=float(r),
            messages=(Message("user", "u"), Message("assistant", "a")),
            extra={"terminate_reason": str(reason)},
        )
        for i, (r, reason) in enumerate(zip(rewards, reasons, strict=True))
    ]
    summary = rollouts.summarize(trajectories)
    failures = rewards[rewards < 1.0]
    assert summary["episodes"] == 40 and summary["failures"] == len(failures)
    assert summary["avg_reward"] == pytest.approx(float(np.mean(rewards)), abs=1e-12)
    assert summary["success_rate"] == pytest.approx(float(np.mean(rewards >= 1.0)))
    assert summary["failure_avg_reward"] == pytest.approx(float(np.mean(failures)))
    unusable = sum(str(r).startswith(("env_error", "context_limit")) for r in reasons)
    assert summary["unusable"] == unusable
    assert len(rollouts.usable(trajectories)) == 40 - unusable


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A float32 setup (data-parallel over the 8 test devices) with the built-in experts."""
    cfg = tiny_config()
    from coevo_jax import envs

    env = envs.make("builtin", **dict(cfg.env.kwargs))
    experts = generate_experts(env, cfg.env)
    workdir = str(tmp_path_factory.mktemp("setup"))
    return build_setup(cfg, workdir, experts), experts


def _expert_vs_corrupted_pairs(experts) -> list:
    """ETO pairs of each expert against itself with the last action replaced (reward 0.25)."""
    from coevo_jax.data.pairs import build_eto_pairs
    from coevo_jax.data.records import Message

    def corrupted(t):
        messages = list(t.messages)
        messages[-1] = Message("assistant", "Thought: I give up.\nAction: look around")
        return dataclasses.replace(t, traj_id=t.traj_id + "/bad", reward=0.25, messages=tuple(messages))

    return build_eto_pairs(experts, [corrupted(t) for t in experts]).pairs


class SimulatedKill(Exception):
    pass


def _interrupt_after(monkeypatch, calls: int):
    place, count = train_loop.place_batch, {"n": 0}

    def failing_place(setup, batch):
        count["n"] += 1
        if count["n"] > calls:
            raise SimulatedKill(f"killed before step {count['n']}")
        return place(setup, batch)

    monkeypatch.setattr(train_loop, "place_batch", failing_place)


@pytest.mark.slow  # 25 s each: a tiny phase end to end; the quick loop stays under 5 min
def test_sft_phase_killed_midway_resumes_to_the_same_parameters(tiny_setup, tmp_path, monkeypatch):
    setup, experts = tiny_setup
    params = setup.base_params(0)
    whole, summary = phases.sft_phase(setup, RunStore(str(tmp_path / "a")), "sft", params, experts, seed=3)
    assert summary["steps"] == 4  # 8 experts in 2 length buckets: 2 batches per epoch, 2 epochs
    store = RunStore(str(tmp_path / "b"))
    _interrupt_after(monkeypatch, 3)  # killed during step 4, after the checkpoint of step 2
    with pytest.raises(SimulatedKill):
        phases.sft_phase(setup, store, "sft", params, experts, seed=3)
    monkeypatch.undo()
    _interrupt_after(monkeypatch, 2)  # the resumed run takes steps 3 and 4 only
    resumed, _ = phases.sft_phase(setup, store, "sft", params, experts, seed=3)
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    moved = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(whole), strict=True)
    )
    assert moved > 0


@pytest.mark.slow  # 25 s each: a tiny phase end to end; the quick loop stays under 5 min
def test_dpo_phase_starts_at_log2_and_moves_the_policy(tiny_setup, tmp_path):
    setup, experts = tiny_setup
    params = setup.base_params(0)

    pairs = _expert_vs_corrupted_pairs(experts)
    assert len(pairs) == 8  # one batch of 8 pairs per epoch
    store = RunStore(str(tmp_path))
    cfg = setup.cfg.dpo
    new, summary = phases.dpo_phase(
        setup, store, "dpo", params, pairs, kind=StepKind.DPO, learning_rate=1e-3, beta=0.1, seed=0
    )
    first = summary["history"][0]
    assert first["step"] == 1 and first["loss"] == pytest.approx(np.log(2.0), abs=1e-5)
    assert summary["steps"] == cfg.epochs * 2  # the 8 pairs fall in 2 length buckets: 2 batches per epoch
    last = summary["history"][-1]
    assert last["loss"] < first["loss"] and last["reward_accuracy"] == 1.0
    assert any(
        float(np.max(np.abs(a - b))) > 0
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(new), strict=True)
    )


@pytest.mark.parametrize("num_pairs, epochs", [(43, 3), (16, 3), (5, 1), (90, 2)])
def test_a_dpo_phase_trains_its_epochs_over_every_pair(num_pairs, epochs):
    """The paper's scheme: `epochs` full passes, so the update count grows with the pair count."""
    rng = np.random.default_rng(fresh_seed())
    lengths = rng.integers(100, 1000, num_pairs).tolist()
    buckets, per_batch = (512, 1024), 8
    plans, total = phases.dpo_phase_plans(lengths, per_batch, buckets, epochs=epochs, updates=None, seed=3)
    short = sum(n <= 512 for n in lengths)
    per_epoch = -(-short // per_batch) + -(-(num_pairs - short) // per_batch)
    assert total == epochs * per_epoch and len(plans) == epochs
    for plan in plans:
        seen = sorted(i for _, idx in plan for i in idx)
        assert seen == list(range(num_pairs))  # each pair once an epoch
        assert all(len(idx) <= per_batch and all(lengths[i] <= b for i in idx) for b, idx in plan)
    assert plans[0] != plans[1 % epochs] or epochs == 1  # a fresh shuffle each epoch


def test_a_dpo_phase_with_fixed_updates_cycles_its_pairs():
    lengths = [300] * 20  # one bucket, 3 batches an epoch
    plans, total = phases.dpo_phase_plans(lengths, 8, (512,), epochs=3, updates=7, seed=0)
    assert total == 7 and len(plans) == 3  # 3 + 3 + the third epoch's first batch
    with pytest.raises(ValueError, match="dpo.epochs"):
        phases.dpo_phase_plans(lengths, 8, (512,), epochs=0, updates=None, seed=0)


@pytest.mark.slow  # 25 s each: a tiny phase end to end; the quick loop stays under 5 min
def test_dpo_phase_runs_a_fixed_number_of_updates(tiny_setup, tmp_path):
    setup, experts = tiny_setup
    setup = dataclasses.replace(
        setup, cfg=dataclasses.replace(setup.cfg, dpo=dataclasses.replace(setup.cfg.dpo, updates_per_phase=3))
    )

    pairs = _expert_vs_corrupted_pairs(experts)  # 2 batches per epoch
    _, summary = phases.dpo_phase(
        setup,
        RunStore(str(tmp_path)),
        "dpo",
        setup.base_params(0),
        pairs,
        kind=StepKind.DPO,
        learning_rate=1e-3,
        beta=0.1,
        seed=0,
    )
    assert summary["steps"] == 3 and summary["epochs"] == 2  # the second epoch stops after its first batch
    assert [h["step"] for h in summary["history"]] == [1, 2, 3]


@pytest.mark.slow  # 25 s: a tiny phase end to end
def test_a_dpo_phase_scores_the_reference_only_on_the_pairs_its_updates_see(tiny_setup, tmp_path):
    from coevo_jax.data.batching import plan_batches

    setup, experts = tiny_setup
    setup = dataclasses.replace(
        setup, cfg=dataclasses.replace(setup.cfg, dpo=dataclasses.replace(setup.cfg.dpo, updates_per_phase=1))
    )

    pairs = _expert_vs_corrupted_pairs(experts)  # 2 batches per epoch
    store = RunStore(str(tmp_path))
    _, summary = phases.dpo_phase(
        setup,
        store,
        "dpo",
        setup.base_params(0),
        pairs,
        kind=StepKind.DPO,
        learning_rate=1e-3,
        beta=0.1,
        seed=5,
    )
    assert summary["steps"] == 1
    assert summary["history"][0]["loss"] == pytest.approx(np.log(2.0), abs=1e-5)  # right references
    tokenized, _ = phases.tokenize_pairs(
        pairs, setup.tokenizer, setup.chat_format, max_length=setup.cfg.max_length
    )
    lengths = [len(p) for p in tokenized]
    first = plan_batches(lengths, setup.cfg.dpo.pairs_per_batch, setup.cfg.buckets(), seed=5 * 1000)[0][1]
    with np.load(os.path.join(store.scratch_dir("dpo"), phases.REFERENCE_FILE)) as saved:
        assert sorted(np.flatnonzero(saved["computed"]).tolist()) == sorted(first)
        assert 0 < len(first) < len(pairs) and np.all(saved["chosen"][~saved["computed"]] == 0)


def test_zero_shot_evaluates_the_starting_parameters_without_training_or_saving_them(tmp_path):
    results = run(tiny_config(methods=("zero_shot",), iterations=2), str(tmp_path))
    (entry,) = results["methods"]["Zero-shot"]["iterations"]
    assert entry["iteration"] == 0
    assert {split: summary["episodes"] for split, summary in entry["eval"].items()} == {
        "test_seen": 4,
        "test_unseen": 4,
    }
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert sorted(stages) == ["eval/base/test_seen", "eval/base/test_unseen"]  # no SFT: nothing needs it
    assert not (tmp_path / "policies").exists() or not os.listdir(tmp_path / "policies")
    assert "| Zero-shot |" in (tmp_path / "table.md").read_text()


@pytest.mark.slow  # a tiny two-iteration run end to end
def test_evaluation_at_the_sft_policy_and_the_last_iteration_only(tmp_path):
    config = tiny_config(methods=("eto",), iterations=2, env={"eval_every_iteration": False})
    results = run(config, str(tmp_path))
    evaluated = [bool(entry["eval"]) for entry in results["methods"]["ETO"]["iterations"]]
    assert evaluated == [True, False, True]
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert sorted(k for k in stages if k.startswith("eval/")) == [
        f"eval/{policy}/{split}"
        for policy in ("eto_it2_target", "sft_target")
        for split in ("test_seen", "test_unseen")
    ]
    assert "| ETO |" in (tmp_path / "table.md").read_text()


@pytest.mark.slow
def test_matched_exploration_plays_each_task_twice_for_single_explorer_methods(tmp_path):
    config = tiny_config(methods=("eto", "rft"), match_exploration=True, sft={"rft_epochs": 1})
    results = run(config, str(tmp_path))
    assert results["methods"]["RFT"]["iterations"][1]["train"]["target"]["epochs"] == 1  # SFT's are 2
    for title in ("ETO", "RFT"):
        explore = results["methods"][title]["iterations"][1]["explore"]["target"]
        assert explore["episodes"] == 16  # 8 train tasks, twice: as many as co-evolution's two agents
        failed = explore["on_sft_failed_tasks"]  # iteration 1 explores with the SFT policy itself
        assert failed["failures"] == explore["failures"]  # so each of its failures is on a task it failed
        assert (
            failed["episodes"] % 2 == 0 and failed["episodes"] >= failed["failures"]
        )  # both samples of a task
    stages = json.loads((tmp_path / "stages.json").read_text())
    assert [k for k in stages if k.startswith("explore/sft_target/")] == ["explore/sft_target/it1_x2"]


def _count_compilations(monkeypatch) -> dict:
    """Records every bundle of train steps the run builds and each program's distinct batch shapes; returns
    {program name: (compilations over all bundles, distinct batch shapes)} when called after the run."""
    bundles, shapes = [], collections.defaultdict(set)
    build = Programs._build_steps

    def recording_build(self, *args, **kwargs):
        built = build(self, *args, **kwargs)
        bundles.append(built[0])
        return built

    def recording(call):
        def recorded(self, first, batch, *rest, **kwargs):
            shapes[self].add(tuple(sorted((k, batch[k].shape) for k in self.keys)))
            return call(self, first, batch, *rest, **kwargs)

        return recorded

    monkeypatch.setattr(Programs, "_build_steps", recording_build)
    monkeypatch.setattr(JittedStep, "__call__", recording(JittedStep.__call__))
    monkeypatch.setattr(JittedTrainStep, "__call__", recording(JittedTrainStep.__call__))

    def counts() -> dict:
        names = [field.name for field in dataclasses.fields(PolicySteps)]
        programs = {name: [getattr(bundle, name) for bundle in bundles] for name in names}
        return {
            name: (sum(p.compilations for p in ps), len(set().union(*(shapes[p] for p in ps))))
            for name, ps in programs.items()
        }

    return counts


@pytest.mark.slow
def test_every_method_runs_end_to_end_and_reports(tmp_path, monkeypatch):
    # CoEvolve's ablations differ from `coevolve` only in its round's settings: tests/test_coevolve_loop.py runs
    # each through the method runner, and tests/test_coevolve_experiment.py one through the main job
    methods = tuple(m for m in METHODS if m not in ABLATIONS or m == "coevolve")
    # each iteration's DPO phases take another lr and beta, RFT's SFT phases are shorter than the base SFT
    dpo = {"learning_rates": (1e-3, 5e-4), "betas": (0.1, 0.5)}
    cfg = tiny_config(methods=methods, iterations=2, dpo=dpo, sft={"rft_epochs": 1})
    compilations = _count_compilations(monkeypatch)
    results = run(cfg, str(tmp_path))
    counts = compilations()
    print("compilations, batch shapes per program:", counts)
    # one compiled program per batch shape (bucket) over the whole run, whatever each phase's scalars
    assert all(shapes > 0 for _, shapes in counts.values()), counts
    assert all(compiled == shapes for compiled, shapes in counts.values()), counts
    assert list(results["methods"]) == [METHOD_TITLES[m] for m in methods]
    assert load_results(tmp_path / "results.json")["methods"].keys() == results["methods"].keys()
    for title, method in results["methods"].items():
        iterations = [e["iteration"] for e in method["iterations"]]
        assert iterations == ([0] if title in ("SFT", "Zero-shot") else [0, 1, 2])
        for entry in method["iterations"]:
            for split in ("test_seen", "test_unseen"):
                assert entry["eval"][split]["episodes"] == 4
    coevo = results["methods"]["CoEvolving"]["iterations"][1]
    assert set(coevo["explore"]) == {"target", "failure"} and coevo["explore"]["target"]["episodes"] == 8
    assert set(coevo["train"]) == {"target", "failure"}
    frozen = results["methods"]["CoEvolving (frozen failure agent)"]["iterations"][1]
    assert set(frozen["train"]) == {"target"}  # the frozen failure agent never trains
    stages = json.loads((tmp_path / "stages.json").read_text())
    # ETO and co-evolution share iteration 1's exploration of the SFT target policy and its evaluation;
    # Best-of-4 plays each task 4 times, a stage of its own.
    explored = sorted(k for k in stages if k.startswith("explore/sft_target/"))
    assert explored == ["explore/sft_target/it1", "explore/sft_target/it1_x4"]
    assert "explore/sft_failure/it2" in stages  # the frozen agent explores afresh
    # every pair phase keeps the pairs it trained on (for the HTML report), with the reference's log-probs
    kept = {
        name: read_pairs_file(str(tmp_path / pairs_file(name.removeprefix("train/"))))
        for name, record in stages.items()
        if name.startswith("train/") and "dataset" in record
    }
    assert "train/coevo_it2_failure" in kept and "train/eto_it1_target" in kept
    for name, pairs in kept.items():
        assert len(pairs) == stages[name]["dataset"]["num_pairs"], name
        assert all(logps is not None for _, logps in pairs) or stages[name]["fit"]["dropped"], name
    for name in ("table.md", "reward_curves.png", "failure_analysis.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "CoEvolving" in (tmp_path / "table.md").read_text()
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [step for step, _ in scalars["eval/eto/test_seen/avg_reward"]] == [0, 1, 2]
    assert any(tag.startswith("train/sft_target/") for tag in scalars)
    assert not os.listdir(tmp_path / "partial") or all(
        not os.listdir(tmp_path / "partial" / d) for d in os.listdir(tmp_path / "partial")
    )
    # The finished run opens for analysis with its own config, experts and saved policies.
    finished = open_run(str(tmp_path))
    assert finished.config == cfg and len(finished.experts) == len(
        read_trajectories(tmp_path / "experts.jsonl")
    )
    sft, eto = finished.policy("sft_target"), finished.policy("eto_it2_target")
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), sft, eto)
    assert any(jax.tree.leaves(moved))  # two iterations of DPO moved the SFT policy
    finished.close()
    # A second run of the same command does nothing new and gives the same results.
    assert run(cfg, str(tmp_path))["methods"] == results["methods"]
    with pytest.raises(ValueError, match="different config"):
        run(tiny_config(seed=1), str(tmp_path))


def test_a_workdir_resumes_under_code_with_new_config_fields_left_at_their_defaults(tmp_path):
    """A workdir begun before a field existed resumes when the run leaves that field at its default, and is
    refused when the run moves it (or any recorded field)."""
    defaults = ExperimentConfig().to_json()
    current = ExperimentConfig(seed=3).to_json()
    older = json.loads(json.dumps(current))
    del older["model"]["lora_rank"], older["match_exploration"]
    store = RunStore(str(tmp_path))
    store.check_config(older, defaults=defaults)
    store.check_config(current, defaults=defaults)  # accepted, and recorded with the new fields
    assert json.loads((tmp_path / "config.json").read_text()) == current
    (tmp_path / "config.json").write_text(json.dumps(older))
    moved = ExperimentConfig(seed=3, match_exploration=True).to_json()
    with pytest.raises(ValueError, match=r"changed: match_exploration\)"):
        store.check_config(moved, defaults=defaults)
    with pytest.raises(ValueError, match=r"changed: seed\)"):
        store.check_config(ExperimentConfig(seed=4).to_json(), defaults=defaults)
    store.close()


def test_the_run_config_sets_the_train_steps_loss_settings():
    cfg = ExperimentConfig(sft_per_token=False, keep_logits=True, grpo=GRPOConfig(beta=0.2, temperature=0.7))
    objective = objective_config(cfg)
    assert (objective.sft_per_token, objective.keep_logits) == (False, True)
    assert (objective.grpo.beta, objective.grpo.temperature) == (0.2, 0.7)
    assert objective_config(ExperimentConfig()).keep_logits is None  # kept up to KEEP_LOGITS_MAX_BYTES


def test_a_resumed_run_may_change_how_it_executes_but_not_what_it_computes(tmp_path):
    """Micro-batches, sampler rows, checkpoint and log cadence may change on resume (and are recorded);
    results fields not."""
    store = RunStore(str(tmp_path))
    store.check_config(ExperimentConfig(seed=3).to_json(), execution_fields=EXECUTION_FIELDS)
    rollout = RolloutSpec(rows=16, groups=1)
    faster = ExperimentConfig(
        seed=3,
        num_microbatches=2,
        keep_logits=True,
        checkpoint_every_steps=7,
        show_progress=False,
        rollout=rollout,
    )
    changed = (
        "checkpoint_every_steps, keep_logits, num_microbatches, rollout.groups, rollout.rows, show_progress"
    )
    with pytest.raises(ValueError, match=rf"changed: {changed}\)"):
        store.check_config(faster.to_json())  # without the allowance: refused
    store.check_config(faster.to_json(), execution_fields=EXECUTION_FIELDS)
    assert json.loads((tmp_path / "config.json").read_text()) == faster.to_json()
    with pytest.raises(ValueError, match=r"changed: iterations\)"):
        store.check_config(
            dataclasses.replace(faster, iterations=1).to_json(), execution_fields=EXECUTION_FIELDS
        )
    with pytest.raises(ValueError, match=r"changed: rollout.cache_len\)"):
        longer = dataclasses.replace(rollout, cache_len=2 * rollout.cache_len)
        store.check_config(
            dataclasses.replace(faster, rollout=longer).to_json(), execution_fields=EXECUTION_FIELDS
        )
    store.close()

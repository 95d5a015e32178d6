"""A new run seeded with another run's stages (`experiment.reuse`): which stages, which files, and the run."""

import dataclasses
import json
import os

import pytest
from test_experiment import tiny_config

from coevo_jax.experiment import phases, reuse
from coevo_jax.experiment.config import EXECUTION_FIELDS, DPOConfig, ExperimentConfig, SFTConfig
from coevo_jax.experiment.run import run
from coevo_jax.experiment.stages import stage_outputs

STAGES = [
    "train/sft_target",
    "train/sft_failure",
    "eval/sft_target/test_seen",
    "explore/sft_target/it1",
    "explore/sft_target/it1_x2",
    "explore/sft_failure/it1",
    "eval/base/test_unseen",  # zero-shot: the untrained starting parameters
    "train/rft_it1_target",
    "eval/rft_it1_target/test_seen",
    "explore/rft_it1_target/it2",
    "train/eto_it1_target",
    "eval/eto_it1_target/test_unseen",
    "train/coevo_it1_failure",
    "train/coevo_positive_it1_target",
    "explore/coevo_frozen_it1_target/it2",
    "train/grpo_it1_target",
    "train/coevolve_rare_it1_target",
    "train/bench",
]
SFT = STAGES[:7]
RFT = STAGES[7:10]
ETO = STAGES[10:12]
COEVO = STAGES[12:15]


def test_stage_outputs_name_the_policy_and_the_file_the_stages_write():
    assert stage_outputs("train/eto_it2_target") == ("eto_it2_target", "policies/eto_it2_target")
    assert stage_outputs("eval/sft_target/test_unseen") == (
        "sft_target",
        "rollouts/sft_target_test_unseen.jsonl",
    )
    assert stage_outputs("explore/sft_failure/it3_x2") == (
        "sft_failure",
        "rollouts/sft_failure_it3_x2_explore.jsonl",
    )
    for name in ("train/a/b", "explore/sft_target/three", "eval/sft_target", "score/x"):
        with pytest.raises(ValueError, match="not a train/, explore/ or eval/ stage"):
            stage_outputs(name)


@pytest.mark.parametrize(
    "changed, kept",
    [
        (["dpo.learning_rates"], SFT + RFT),
        (["dpo.betas", "dpo.updates_per_phase"], SFT + RFT),
        (["sft.rft_epochs"], SFT + ETO + COEVO),
        (["match_exploration"], SFT + COEVO),
        (["sft_per_token"], SFT + RFT + ETO),  # eq. 9 trains the co-evolving target only
        (["methods", "iterations"], SFT + RFT + ETO + COEVO),
        ([], SFT + RFT + ETO + COEVO),
        (["sft.learning_rate"], []),
        (["dpo.betas", "rollout.temperature"], STAGES[:3] + [STAGES[6]]),  # SFT's training and evaluations
        (["env.explore_tasks"], STAGES[:3] + [STAGES[6]]),
        (["rollout.temperature", "rollout.max_new_tokens"], []),  # evaluations read the latter too
        (["seed"], []),
        (["model.lora_rank"], []),
        (["grpo.learning_rate"], SFT + RFT + ETO + COEVO),  # GRPO's and CoEvolve's stages are never reused
        (["coevolve.theta"], SFT + RFT + ETO + COEVO),
        # other splits evaluated: every policy is kept, no evaluation
        (
            ["env.eval_splits", "env.eval_tasks"],
            [s for s in SFT + RFT + ETO + COEVO if not s.startswith("eval/")],
        ),
        (["env.eval_task_subset", "dpo.betas"], [s for s in SFT + RFT if not s.startswith("eval/")]),
    ],
)
def test_a_difference_keeps_exactly_the_stages_it_cannot_change(changed, kept):
    assert reuse.reusable_stages(STAGES, changed) == kept  # GRPO and unknown names are never reused


def _fake_run(root, config: ExperimentConfig, stages=STAGES[:4] + ETO) -> str:
    source = root / "source"
    (source / "tokenizer").mkdir(parents=True)
    (source / "tokenizer" / "tokenizer.json").write_text("{}")
    (source / "experts.jsonl").write_text("experts\n")
    (source / "config.json").write_text(json.dumps(config.to_json()))
    (source / "stages.json").write_text(json.dumps({name: {"name": name} for name in stages}))
    for name in stages:
        path = source / stage_outputs(name)[1]
        if name.startswith("train/"):
            path.mkdir(parents=True)
            (path / "params").write_text(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(name + "\n")
    return str(source)


def test_a_dpo_sweep_copies_the_sft_stages_and_their_outputs_and_nothing_else(tmp_path):
    base = ExperimentConfig(seed=3)
    source = _fake_run(tmp_path, base)
    sweep = dataclasses.replace(base, dpo=DPOConfig(learning_rates=(5e-6,)), num_microbatches=2)
    workdir = str(tmp_path / "new")
    record = reuse.seed_workdir(
        source,
        workdir,
        sweep.to_json(),
        defaults=ExperimentConfig().to_json(),
        execution_fields=EXECUTION_FIELDS,
    )
    assert record == {"source": source, "changed": ["dpo.learning_rates"], "stages": STAGES[:4]}
    assert json.loads(open(os.path.join(workdir, "reused.json")).read()) == record
    stages = json.loads(open(os.path.join(workdir, "stages.json")).read())
    assert stages == {name: {"name": name} for name in STAGES[:4]}
    assert open(os.path.join(workdir, "policies/sft_failure/params")).read() == "train/sft_failure"
    assert (
        open(os.path.join(workdir, "rollouts/sft_target_it1_explore.jsonl")).read()
        == "explore/sft_target/it1\n"
    )
    assert os.path.isfile(os.path.join(workdir, "tokenizer/tokenizer.json"))
    assert os.path.isfile(os.path.join(workdir, "experts.jsonl"))
    assert not os.path.exists(os.path.join(workdir, "policies/eto_it1_target"))
    assert not os.path.exists(os.path.join(workdir, "rollouts/eto_it1_target_test_unseen.jsonl"))
    # the seeded workdir resumes as it is; any other run there is refused
    assert reuse.seed_workdir(source, workdir, sweep.to_json()) == record
    with pytest.raises(ValueError, match="already holds a run"):
        reuse.seed_workdir(str(tmp_path / "elsewhere"), workdir, sweep.to_json())


def test_a_source_that_shares_nothing_or_lacks_an_output_is_refused_before_anything_is_written(tmp_path):
    base = ExperimentConfig(seed=3)
    source = _fake_run(tmp_path, base)
    workdir = tmp_path / "new"
    other_sft = dataclasses.replace(base, sft=SFTConfig(learning_rate=1e-4))
    with pytest.raises(ValueError, match=r"config.json: sft.learning_rate differ, and every stage depends"):
        reuse.seed_workdir(source, str(workdir), other_sft.to_json())
    with pytest.raises(FileNotFoundError, match=r"new/config.json: missing; is .* a run's workdir"):
        reuse.seed_workdir(str(tmp_path / "new"), str(tmp_path / "other"), base.to_json())
    os.remove(os.path.join(source, "rollouts", "sft_target_test_seen.jsonl"))
    with pytest.raises(
        FileNotFoundError, match=r"sft_target_test_seen.jsonl: a finished stage's output is missing"
    ):
        reuse.seed_workdir(source, str(workdir), base.to_json())
    assert not workdir.exists() or not os.listdir(workdir)


def _without_timings(tree):
    """`tree` without the throughput fields (wall-clock, so they differ between equal runs)."""
    if isinstance(tree, dict):
        return {k: _without_timings(v) for k, v in tree.items() if not k.endswith("per_second")}
    if isinstance(tree, list):
        return [_without_timings(v) for v in tree]
    return tree


@pytest.mark.slow  # three tiny runs, 2-3 min on 2 busy cores; which stages RFT keeps is tested above
def test_a_reused_run_gives_the_results_of_a_fresh_run_without_redoing_sft(tmp_path, monkeypatch):
    methods = ("sft", "eto")
    first = tiny_config(methods=methods, dpo={"learning_rates": (1e-3,)})
    second = tiny_config(methods=methods, dpo={"learning_rates": (1e-1,)})
    run(first, str(tmp_path / "first"))
    fresh = run(second, str(tmp_path / "fresh"))

    def no_sft(*args, **kwargs):
        raise AssertionError("an SFT phase ran in the reused run")

    monkeypatch.setattr(phases, "sft_phase", no_sft)
    reused = run(second, str(tmp_path / "reused"), reuse_from=str(tmp_path / "first"))
    assert _without_timings(reused["methods"]) == _without_timings(fresh["methods"])
    assert reused["reused"]["from"] == str(tmp_path / "first")
    stages = {d: json.loads((tmp_path / d / "stages.json").read_text()) for d in ("first", "fresh", "reused")}
    assert set(reused["reused"]["stages"]) == {
        "train/sft_target",
        "eval/sft_target/test_seen",
        "eval/sft_target/test_unseen",
        "explore/sft_target/it1",
    }
    assert stages["reused"]["train/sft_target"] == stages["first"]["train/sft_target"]  # copied
    assert stages["reused"]["train/eto_it1_target"]["learning_rate"] == 1e-1
    assert set(stages["reused"]) == set(stages["fresh"])


@pytest.mark.slow  # three tiny runs, 2-3 min on 2 busy cores
def test_a_run_evaluated_on_other_splits_trains_nothing_and_matches_a_fresh_run(tmp_path, monkeypatch):
    methods = ("sft", "eto")
    first = tiny_config(methods=methods, env={"eval_splits": ("test_seen",)})
    second = tiny_config(methods=methods, env={"eval_splits": ("test_unseen",)})
    run(first, str(tmp_path / "first"))
    fresh = run(second, str(tmp_path / "fresh"))

    def no_training(*args, **kwargs):
        raise AssertionError("a training phase ran in the run that only evaluates")

    for phase in ("sft_phase", "dpo_phase"):
        monkeypatch.setattr(phases, phase, no_training)
    reused = run(second, str(tmp_path / "reused"), reuse_from=str(tmp_path / "first"))
    assert _without_timings(reused["methods"]) == _without_timings(fresh["methods"])
    assert not any(name.startswith("eval/") for name in reused["reused"]["stages"])
    assert "train/eto_it1_target" in reused["reused"]["stages"]

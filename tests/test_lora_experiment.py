"""LoRA in the main job: the config reaches the model, both agents share one frozen base, phases train and
save only the adapters (with their base's fingerprint), and a killed LoRA phase resumes exactly."""

import dataclasses

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from test_experiment import CONFIGS, SimulatedKill, _interrupt_after, _load_config_module, tiny_config

from coevo_jax import checkpoints
from coevo_jax.experiment import phases
from coevo_jax.experiment.experts import generate_experts
from coevo_jax.experiment.policy import build_setup
from coevo_jax.experiment.store import RunStore
from coevo_jax.models import partition_trainable
from coevo_jax.train import StepKind

LORA = {"lora_rank": 4, "lora_alpha": 8.0, "lora_targets": ("q", "v", "o", "down")}


def test_lora_fields_are_overridable_on_the_locked_configs_and_reach_the_experiment():
    for name in ("tiny", "sql_smollm2", "sciworld_smollm2"):
        config = _load_config_module(CONFIGS / f"{name}.py").get_config()
        config.lock()
        config.model.lora_rank = 16  # what --config.model.lora_rank=16 does
        config.model.lora_targets = ("q", "v")
        config.rollout.merge_lora = False
        with pytest.raises(AttributeError):
            config.model.lora_rnak = 16
    spec = tiny_config(model=LORA, rollout={"merge_lora": False})
    assert (spec.model.lora_rank, spec.model.lora_targets, spec.rollout.merge_lora) == (
        4,
        LORA["lora_targets"],
        False,
    )


@pytest.fixture(scope="module")
def lora_setup(tmp_path_factory):
    cfg = tiny_config(model=LORA)
    from coevo_jax import envs

    env = envs.make("builtin", **dict(cfg.env.kwargs))
    experts = generate_experts(env, cfg.env)
    return build_setup(cfg, str(tmp_path_factory.mktemp("setup")), experts), experts


def _leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.slow  # 1-2 min: two tiny LoRA phases end to end, one killed and resumed
def test_lora_phases_train_adapters_on_one_shared_base_and_resume(lora_setup, tmp_path, monkeypatch):
    setup, experts = lora_setup
    assert setup.model_cfg.lora_rank == 4 and setup.base_fingerprint is not None
    target, failure = setup.base_params(0), setup.base_params(1)
    target_adapters, base = setup.trainable(target), setup.lora_base
    # One base for both agents (the same arrays, not copies); adapters of their own.
    failure_base = partition_trainable(failure, setup.model_cfg)[1]
    assert all(a is b for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(failure_base), strict=True))
    assert any(
        np.any(a != b)
        for a, b in zip(_leaves(target_adapters), _leaves(setup.trainable(failure)), strict=True)
    )
    base_before = _leaves(base)

    whole, summary = phases.sft_phase(setup, RunStore(str(tmp_path / "a")), "sft", target, experts, seed=3)
    assert summary["steps"] == 4
    store = RunStore(str(tmp_path / "b"))
    _interrupt_after(monkeypatch, 3)  # killed during step 4, after the checkpoint of step 2
    with pytest.raises(SimulatedKill):
        phases.sft_phase(setup, store, "sft", target, experts, seed=3)
    monkeypatch.undo()
    _interrupt_after(monkeypatch, 2)  # the resumed run takes steps 3 and 4 only
    resumed, _ = phases.sft_phase(setup, store, "sft", target, experts, seed=3)
    monkeypatch.undo()
    for a, b in zip(_leaves(whole), _leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(_leaves(setup.trainable(whole)), _leaves(target_adapters), strict=True):
        assert np.any(a != b)  # every adapter matrix trained ...
    for a, b in zip(_leaves(base), base_before, strict=True):
        np.testing.assert_array_equal(a, b)  # ... and the shared base did not move

    # A saved policy is its adapters plus the base's fingerprint; loading puts them back on the base.
    store.save_policy("sft_target", setup.trainable(whole), base=setup.base_fingerprint)
    # What was written is the adapter tree alone (read from the checkpoint's own metadata: the bytes on disk
    # also hold Orbax's bookkeeping, whose size varies from run to run).
    saved = ocp.StandardCheckpointer().metadata(store.policy_dir("sft_target")).item_metadata.tree
    adapters = setup.trainable(whole)
    assert jax.tree.structure(saved) == jax.tree.structure(adapters)
    for meta, leaf in zip(jax.tree.leaves(saved), jax.tree.leaves(adapters), strict=True):
        assert (tuple(meta.shape), np.dtype(meta.dtype)) == (leaf.shape, leaf.dtype)
    assert sum(x.nbytes for x in _leaves(adapters)) < sum(x.nbytes for x in base_before) / 4
    loaded = setup.policy(store.load_policy("sft_target", setup.abstract_params, base=setup.base_fingerprint))
    for a, b in zip(_leaves(loaded), _leaves(whole), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(checkpoints.BaseMismatchError):
        store.load_policy("sft_target", setup.abstract_params, base="another-base")

    # DPO from the trained policy: the reference is that policy (base + its adapters), so the first loss is
    # log 2, and the update moves the adapters only.
    from coevo_jax.data.pairs import build_eto_pairs
    from coevo_jax.data.records import Message, Trajectory

    def corrupted(t: Trajectory) -> Trajectory:
        messages = list(t.messages)
        messages[-1] = Message("assistant", "Thought: I give up.\nAction: look around")
        return dataclasses.replace(t, traj_id=t.traj_id + "/bad", reward=0.25, messages=tuple(messages))

    pairs = build_eto_pairs(experts, [corrupted(t) for t in experts]).pairs
    new, summary = phases.dpo_phase(
        setup,
        RunStore(str(tmp_path / "c")),
        "dpo",
        whole,
        pairs,
        kind=StepKind.DPO,
        learning_rate=1e-3,
        beta=0.1,
        seed=0,
    )
    assert summary["history"][0]["loss"] == pytest.approx(np.log(2.0), abs=1e-5)
    assert summary["history"][-1]["loss"] < summary["history"][0]["loss"]
    for a, b in zip(_leaves(setup.trainable(new)), _leaves(setup.trainable(whole)), strict=True):
        assert np.any(a != b)
    for a, b in zip(_leaves(base), base_before, strict=True):
        np.testing.assert_array_equal(a, b)

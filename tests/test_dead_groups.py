"""GRPO's dead groups as hard negatives: which groups are dead, how their failures are ranked and paired, and
the eq. 9 updates that train the pairs inside a GRPO step (tiny float32 policy)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from seeds import fresh_seed
from test_experiment import _expert_vs_corrupted_pairs, tiny_setup  # noqa: F401 (a fixture)

from coevo_jax.data.batching import collate_dpo, tokenize_pairs
from coevo_jax.data.records import Message, Trajectory
from coevo_jax.experiment import dead_groups
from coevo_jax.experiment.grpo import _optimizer
from coevo_jax.experiment.train_loop import place_batch
from coevo_jax.models import combine_trainable, partition_trainable
from coevo_jax.train import phase_scalars, train_state_from_params


def _episode(task: str, sample: int, reward: float, grade: float | None) -> Trajectory:
    messages = (Message("user", "u"), Message("assistant", f"Thought: t{sample}\nAction: a{sample}"))
    metrics = {} if grade is None else {"graded_score": grade}
    return Trajectory(f"{task}/{sample}", task, messages, reward, extra={"metrics": metrics})


def test_only_all_failed_equal_reward_groups_are_dead_and_their_failures_rank_by_grade():
    dead = [_episode("d", k, 0.0, g) for k, g in enumerate((0.2, 0.5, 0.5, 0.0))]
    live = [_episode("l", k, r, r) for k, r in enumerate((0.0, 1.0))]  # GRPO has signal here
    solved = [_episode("s", k, 1.0, 1.0) for k in range(3)]  # all succeeded: nothing to prefer
    flat = [_episode("f", k, 0.0, 0.3) for k in range(3)]  # dead, but no grade separates them
    made = dead_groups.dead_group_pairs([dead, live, solved, flat], max_pairs=10)
    assert made.dead_groups == 2
    expected = {("d/1", "d/3"), ("d/2", "d/3"), ("d/1", "d/0"), ("d/2", "d/0"), ("d/0", "d/3")}
    assert {(p.chosen.traj_id, p.rejected.traj_id) for p in made.pairs} == expected
    assert all((p.kind, p.lambda_dpo, p.lambda_sft) == ("dead_group", 1.0, 0.0) for p in made.pairs)
    np.testing.assert_allclose(sorted(made.margins), [0.2, 0.3, 0.3, 0.5, 0.5])
    capped = dead_groups.dead_group_pairs([dead], max_pairs=2)  # the largest margins first
    assert [(p.chosen.traj_id, p.rejected.traj_id) for p in capped.pairs] == [("d/1", "d/3"), ("d/2", "d/3")]
    assert capped.stats() == {
        "dead_groups": 1,
        "dead_group_pairs": 2,
        "dead_pair_margin_mean": 0.5,
        "dead_pair_margin_min": 0.5,
        "dead_pair_hard_negatives": 0,
    }


def test_without_a_graded_score_the_reward_ranks_and_a_high_failure_is_a_hard_negative():
    rng = np.random.default_rng(fresh_seed())
    reward = float(rng.uniform(0.6, 0.99))
    ungraded = [_episode("u", k, 0.0, None) for k in range(4)]
    assert dead_groups.dead_group_pairs([ungraded], max_pairs=4).pairs == ()  # the reward ranks nothing
    high = [_episode("h", k, reward, reward + 0.001 * k) for k in range(3)]
    made = dead_groups.dead_group_pairs([high], max_pairs=4)
    assert len(made.pairs) == 3 and all(p.hard_negative for p in made.pairs)


@pytest.mark.slow  # a tiny policy's reference and eq. 9 programs compile: about a minute
def test_dead_group_pairs_train_by_eq_9_in_the_grpo_optimizer(tiny_setup):  # noqa: F811
    """One pass over 8 pairs (2 length buckets: 2 updates) against the starting policy as reference: the
    implicit reward margin of the pairs rises above 0."""
    setup, experts = tiny_setup
    pairs = [dataclasses.replace(p, kind="dead_group") for p in _expert_vs_corrupted_pairs(experts)]
    params = setup.base_params(0)
    grpo = dataclasses.replace(setup.cfg.grpo, learning_rate=1e-3)
    steps, tx, shardings = setup.programs.steps(_optimizer(grpo).adamw_settings())
    trainable, frozen = partition_trainable(params, setup.model_cfg)
    state = train_state_from_params(jax.tree.map(jnp.copy, trainable), tx, shardings)
    reference = jax.tree.map(jnp.copy, params)
    scalars = phase_scalars(_optimizer(grpo), beta=0.1)
    place = lambda batch: place_batch(setup, batch)  # noqa: E731
    state, last, updates = dead_groups.train_pairs(
        setup,
        steps,
        state,
        frozen,
        reference,
        pairs,
        scalars,
        buckets=setup.cfg.buckets(),
        place=place,
        seed=0,
    )
    assert updates == 2 and last["loss"] < np.log(2.0) + 1e-4
    tokenized, _ = tokenize_pairs(pairs, setup.tokenizer, setup.chat_format, max_length=setup.cfg.max_length)
    batch = collate_dpo(tokenized, length=max(setup.cfg.buckets()), pairs_per_batch=8, pad_id=0)
    batch = place({k: v for k, v in batch.items() if k in steps.reference.keys})
    new_c, new_r = (
        np.asarray(x).reshape(-1) for x in steps.reference(combine_trainable(state.params, frozen), batch)
    )
    old_c, old_r = (np.asarray(x).reshape(-1) for x in steps.reference(reference, batch))
    assert np.mean((new_c - old_c) - (new_r - old_r)) > 0

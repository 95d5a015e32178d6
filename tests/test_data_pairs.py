"""Preference-pair builders (paper eq. 6 and eq. 8, ETO, RFT) on hand-built trajectory sets."""

import random

import pytest

from coevo_jax.data.pairs import (
    EXPERT_VS_FAILURE,
    EXPERT_VS_TARGET,
    FAILURE_VS_FAILURE,
    build_eto_pairs,
    build_failure_pairs,
    build_target_pairs,
    select_rft,
)
from coevo_jax.data.records import Message, Trajectory


def traj(traj_id, reward, action=None):
    """traj_id "<task>/<source><n>"; the prompt depends only on the task, the action on the trajectory."""
    task, name = traj_id.split("/")
    source = name.rstrip("0123456789")
    messages = (Message("user", f"Solve task {task}."), Message("assistant", action or f"Action: {name}"))
    return Trajectory(traj_id, task, messages, reward, source)


EXPERTS = [traj("A/exp0", 1.0), traj("B/exp0", 1.0), traj("C/exp0", 1.0), traj("D/exp0", 0.85)]
TARGET = [
    traj("A/tgt0", 0.5),
    traj("A/tgt1", 1.0),  # a success: never a failure, never below a perfect expert
    traj("A/tgt2", 0.2),
    traj("B/tgt0", 0.3),
    traj("C/tgt0", 0.0),
    traj("D/tgt0", 0.9),  # a failure that beats the (imperfect) expert
]
FAILURE_AGENT = [
    traj("A/fail0", 0.5),  # ties with A/tgt0: no pair between them
    traj("A/fail1", 0.8),
    traj("A/fail2", 0.0),
    traj("C/fail0", 1.0),  # a success: outside F_fail
    traj("D/fail0", 0.1),
]


def summary(pairs):
    return [(p.kind, p.chosen.traj_id, p.rejected.traj_id, p.lambda_dpo, p.lambda_sft) for p in pairs]


FF, ET, EF = FAILURE_VS_FAILURE, EXPERT_VS_TARGET, EXPERT_VS_FAILURE

EXPECTED_D_FAIL = [  # eq. 6: F_tgt x F_fail per task, higher reward chosen, ties dropped
    (FF, "A/fail0", "A/tgt2", 1.0, 0.0),
    (FF, "A/fail1", "A/tgt0", 1.0, 0.0),
    (FF, "A/fail1", "A/tgt2", 1.0, 0.0),
    (FF, "A/tgt0", "A/fail2", 1.0, 0.0),
    (FF, "A/tgt2", "A/fail2", 1.0, 0.0),
    (FF, "D/tgt0", "D/fail0", 1.0, 0.0),
]

EXPECTED_D_TGT = [  # eq. 8 with the eq. 9 weights
    (EF, "A/exp0", "A/fail0", 0.5, 0.5),
    (EF, "A/exp0", "A/fail1", 0.5, 0.5),
    (EF, "A/exp0", "A/fail2", 0.5, 0.5),
    (ET, "A/exp0", "A/tgt0", 0.5, 0.5),
    (ET, "A/exp0", "A/tgt2", 0.5, 0.5),
    *EXPECTED_D_FAIL[:5],
    (ET, "B/exp0", "B/tgt0", 0.5, 0.5),
    (ET, "C/exp0", "C/tgt0", 0.5, 0.5),
    (EF, "D/exp0", "D/fail0", 0.5, 0.5),
    EXPECTED_D_FAIL[5],
]


def test_failure_pairs_eq6():
    assert summary(build_failure_pairs(TARGET, FAILURE_AGENT)) == EXPECTED_D_FAIL


def test_target_pairs_eq8():
    pairs = build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT)
    assert summary(pairs) == EXPECTED_D_TGT
    assert all(p.chosen.reward > p.rejected.reward and p.task_id == p.chosen.task_id for p in pairs)


def test_eto_pairs():
    assert summary(build_eto_pairs(EXPERTS, TARGET)) == [
        (ET, "A/exp0", "A/tgt0", 1.0, 0.0),
        (ET, "A/exp0", "A/tgt2", 1.0, 0.0),
        (ET, "B/exp0", "B/tgt0", 1.0, 0.0),
        (ET, "C/exp0", "C/tgt0", 1.0, 0.0),
    ]
    assert summary(build_eto_pairs(EXPERTS[:1], TARGET[:1], weights=(0.5, 0.5))) == [
        (ET, "A/exp0", "A/tgt0", 0.5, 0.5)
    ]


def test_success_threshold():
    # With r >= 0.8 counted as success, A/fail1 (0.8) and D/tgt0 (0.9) leave the failure sets.
    got = summary(build_failure_pairs(TARGET, FAILURE_AGENT, success_threshold=0.8))
    assert got == [EXPECTED_D_FAIL[0], EXPECTED_D_FAIL[3], EXPECTED_D_FAIL[4]]


def test_rft_keeps_experts_and_distinct_successes():
    duplicate = traj("A/tgt3", 1.0, action="Action: exp0")  # same messages as A/exp0
    kept = select_rft(EXPERTS, [*TARGET, duplicate, traj("B/tgt9", 0.99)])
    assert [t.traj_id for t in kept] == ["A/exp0", "A/tgt1", "B/exp0", "C/exp0", "D/exp0"]
    assert [t.traj_id for t in select_rft(EXPERTS, TARGET, success_threshold=0.9)] == [
        "A/exp0",
        "A/tgt1",
        "B/exp0",
        "C/exp0",
        "D/exp0",
        "D/tgt0",
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_builders_ignore_input_order(seed):
    rng = random.Random(seed)
    shuffled = [rng.sample(x, len(x)) for x in (EXPERTS, TARGET, FAILURE_AGENT)]
    assert summary(build_target_pairs(*shuffled)) == EXPECTED_D_TGT
    assert summary(build_failure_pairs(shuffled[1], shuffled[2])) == EXPECTED_D_FAIL


def test_capped_pairs_are_a_seeded_subset():
    full = summary(build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT))
    subsets = {}
    for seed in range(6):
        capped = summary(build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT, max_pairs_per_task=3, seed=seed))
        again = summary(build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT, max_pairs_per_task=3, seed=seed))
        assert capped == again
        assert [p for p in full if p in capped] == capped  # a subset, still in canonical order
        per_task = [sum(p[1].startswith(t) for p in capped) for t in "ABCD"]
        assert per_task == [3, 1, 1, 2]  # A had 10 pairs, capped to 3; the others were under the cap
        subsets[seed] = tuple(capped)
        only_a = build_target_pairs(
            EXPERTS[:1], TARGET[:3], FAILURE_AGENT[:3], max_pairs_per_task=3, seed=seed
        )
        assert summary(only_a) == capped[:3]  # a task's subset does not depend on the other tasks
    assert len(set(subsets.values())) > 1


def test_pairs_need_the_same_instruction():
    other_prompt = Trajectory(
        "A/tgt9", "A", (Message("user", "another prompt"), Message("assistant", "x")), 0.0
    )
    with pytest.raises(ValueError, match="different instruction prompts"):
        build_eto_pairs(EXPERTS, [other_prompt])

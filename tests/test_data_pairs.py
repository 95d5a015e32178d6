"""Preference-pair builders (paper eq. 6 and eq. 8, ETO, positive agent, RFT) on hand-built trajectory sets.

Every expected pair is written out: (kind, chosen id, rejected id, lambda_dpo, lambda_sft, hard negative).
"""

import json
import random

import pytest

from coevo_jax.data.pair_pool import (
    EXPERT_VS_FAILURE,
    EXPERT_VS_POSITIVE,
    EXPERT_VS_TARGET,
    FAILURE_AGENT_VS_FAILURE_AGENT,
    FAILURE_VS_FAILURE,
    TARGET_VS_TARGET,
    deduplicate,
)
from coevo_jax.data.pairs import (
    build_best_of_n_pairs,
    build_eto_pairs,
    build_expert_failure_pairs,
    build_failure_pairs,
    build_positive_agent_pairs,
    build_target_pairs,
    select_rft,
)
from coevo_jax.data.records import Message, Trajectory

AGENT_OF = {"exp": "expert", "tgt": "target", "fail": "failure", "pos": "other"}


def traj(traj_id, reward, action=None):
    """traj_id "<task>/<agent><n>"; the prompt depends only on the task, the action on the trajectory."""
    task, name = traj_id.split("/")
    agent = AGENT_OF[name.rstrip("0123456789")]
    messages = (Message("user", f"Solve task {task}."), Message("assistant", action or f"Action: {name}"))
    return Trajectory(traj_id, task, messages, reward, agent)


EXPERTS = [traj("A/exp0", 1.0), traj("B/exp0", 1.0), traj("C/exp0", 1.0), traj("D/exp0", 0.85)]
TARGET = [
    traj("A/tgt0", 0.5),
    traj("A/tgt1", 1.0),  # a success: never a failure; ties with the perfect expert
    traj("A/tgt2", 0.2),
    traj("A/tgt3", 0.7),  # a near-success failure: a hard negative when rejected
    traj("A/tgt4", 0.2, action="Action: tgt2"),  # the same messages as A/tgt2: removed as a duplicate
    traj("B/tgt0", 0.3),
    traj("C/tgt0", 0.0),
    traj("D/tgt0", 0.9),  # a failure that beats the (imperfect) expert
]
FAILURE_AGENT = [
    traj("A/fail0", 0.5),  # ties with A/tgt0: no pair between them
    traj("A/fail1", 0.8),
    traj("A/fail2", 0.0),
    traj("C/fail0", 1.0),  # a success: outside F_fail; ties with the expert
    traj("D/fail0", 0.1),
]


def summary(pairs):
    return [
        (p.kind, p.chosen.traj_id, p.rejected.traj_id, p.lambda_dpo, p.lambda_sft, p.hard_negative)
        for p in pairs
    ]


FF, ET, EF, EP = FAILURE_VS_FAILURE, EXPERT_VS_TARGET, EXPERT_VS_FAILURE, EXPERT_VS_POSITIVE
TT, AA = TARGET_VS_TARGET, FAILURE_AGENT_VS_FAILURE_AGENT
HN = True  # rejected reward >= 0.6

EXPECTED_D_FAIL = [  # eq. 6: F_tgt x F_fail per task, higher reward chosen, ties dropped
    (FF, "A/fail0", "A/tgt2", 1.0, 0.0, False),
    (FF, "A/fail1", "A/tgt0", 1.0, 0.0, False),
    (FF, "A/fail1", "A/tgt2", 1.0, 0.0, False),
    (FF, "A/fail1", "A/tgt3", 1.0, 0.0, HN),
    (FF, "A/tgt0", "A/fail2", 1.0, 0.0, False),
    (FF, "A/tgt2", "A/fail2", 1.0, 0.0, False),
    (FF, "A/tgt3", "A/fail0", 1.0, 0.0, False),
    (FF, "A/tgt3", "A/fail2", 1.0, 0.0, False),
    (FF, "D/tgt0", "D/fail0", 1.0, 0.0, False),
]

EXPECTED_WITHIN = [  # include_within_agent: task A only (B, C, D have at most one failure per agent)
    (AA, "A/fail0", "A/fail2", 1.0, 0.0, False),
    (AA, "A/fail1", "A/fail0", 1.0, 0.0, False),
    (AA, "A/fail1", "A/fail2", 1.0, 0.0, False),
    *EXPECTED_D_FAIL[:8],
    (TT, "A/tgt0", "A/tgt2", 1.0, 0.0, False),
    (TT, "A/tgt3", "A/tgt0", 1.0, 0.0, False),
    (TT, "A/tgt3", "A/tgt2", 1.0, 0.0, False),
    EXPECTED_D_FAIL[8],
]

EXPECTED_D_TGT = [  # eq. 8 with the eq. 9 weights
    (EF, "A/exp0", "A/fail0", 0.5, 0.5, False),
    (EF, "A/exp0", "A/fail1", 0.5, 0.5, HN),
    (EF, "A/exp0", "A/fail2", 0.5, 0.5, False),
    (ET, "A/exp0", "A/tgt0", 0.5, 0.5, False),
    (ET, "A/exp0", "A/tgt2", 0.5, 0.5, False),
    (ET, "A/exp0", "A/tgt3", 0.5, 0.5, HN),
    *EXPECTED_D_FAIL[:8],
    (ET, "B/exp0", "B/tgt0", 0.5, 0.5, False),
    (ET, "C/exp0", "C/tgt0", 0.5, 0.5, False),
    (EF, "D/exp0", "D/fail0", 0.5, 0.5, False),
    (ET, "D/tgt0", "D/exp0", 0.5, 0.5, HN),  # the prediction beat the expert: it is the chosen side
    EXPECTED_D_FAIL[8],
]


def test_failure_pairs_eq6():
    dataset = build_failure_pairs(TARGET, FAILURE_AGENT)
    assert summary(dataset) == EXPECTED_D_FAIL
    assert dataset.report.num_pairs == len(dataset) == 9
    assert dataset.report.pairs_by_kind == {FF: 9}
    assert dataset.report.duplicates_removed == {"failure": 0, "target": 1}
    assert dataset.report.ties_skipped == 1  # A/tgt0 vs A/fail0
    assert dataset.report.num_hard_negatives == 1
    assert dataset.report.rejected_reward_histogram == (3, 1, 2, 0, 0, 2, 0, 1, 0, 0)


def test_failure_pairs_within_agent_option():
    dataset = build_failure_pairs(TARGET, FAILURE_AGENT, include_within_agent=True)
    assert summary(dataset) == EXPECTED_WITHIN
    assert dataset.report.pairs_by_kind == {AA: 3, FF: 9, TT: 3}


def test_hard_negative_threshold_is_configurable():
    at_half = build_failure_pairs(TARGET, FAILURE_AGENT, hard_negative_threshold=0.5)
    marked = [(p.chosen.traj_id, p.rejected.traj_id) for p in at_half if p.hard_negative]
    assert marked == [("A/fail1", "A/tgt0"), ("A/fail1", "A/tgt3"), ("A/tgt3", "A/fail0")]
    super_hard = build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT, hard_negative_threshold=0.7)
    assert [p.rejected.reward for p in super_hard if p.hard_negative] == [0.8, 0.7, 0.7, 0.85]
    assert super_hard.report.hard_negative_threshold == 0.7
    with pytest.raises(ValueError, match="outside"):
        build_failure_pairs(TARGET, FAILURE_AGENT, hard_negative_threshold=1.5)


def test_target_pairs_eq8_and_report():
    dataset = build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT)
    assert summary(dataset) == EXPECTED_D_TGT
    assert all(p.chosen.reward > p.rejected.reward and p.task_id == p.chosen.task_id for p in dataset)
    report = dataset.report
    assert report.to_dict() == {
        "name": "D_tgt",
        "num_pairs": 19,
        "pairs_by_kind": {EF: 4, ET: 6, FF: 9},
        "num_hard_negatives": 4,
        "hard_negative_threshold": 0.6,
        "duplicates_removed": {"expert": 0, "failure": 0, "target": 1},
        "ties_skipped": 3,  # A/exp0-A/tgt1, C/exp0-C/fail0, A/tgt0-A/fail0
        "identical_skipped": 0,
        "dropped_by_cap": 0,
        "rejected_reward_histogram": [5, 2, 3, 1, 0, 4, 0, 2, 2, 0],
        "histogram_edges": [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
    }
    assert json.loads(report.to_json()) == report.to_dict()


def test_expert_failure_pairs_are_eq8_without_failure_pairs_and_without_successes():
    success_over_expert = traj("D/tgt1", 1.0)  # beats D's imperfect expert: eq. 8 pairs it, this does not
    dataset = build_expert_failure_pairs(EXPERTS, [*TARGET, success_over_expert], FAILURE_AGENT)
    assert summary(dataset) == [p for p in EXPECTED_D_TGT if p[0] != FF]
    assert (ET, "D/tgt1", "D/exp0", 0.5, 0.5, HN) in summary(
        build_target_pairs(EXPERTS, [*TARGET, success_over_expert], FAILURE_AGENT)
    )
    report = dataset.report
    assert (report.name, report.num_pairs, report.pairs_by_kind) == (
        "D_tgt_expert_failure",
        10,
        {EF: 4, ET: 6},
    )
    assert (report.num_hard_negatives, report.ties_skipped) == (3, 0)  # A/fail1, A/tgt3, D/exp0 rejected
    assert report.duplicates_removed == {"expert": 0, "failure": 0, "target": 1}
    no_expert = build_expert_failure_pairs(EXPERTS[:1], [traj("B/tgt0", 0.3)], [traj("B/fail0", 0.2)])
    assert len(no_expert) == 0  # task B has no expert here


def test_best_of_n_rejects_the_highest_reward_failure_of_each_task():
    sampled = [
        traj("E/tgt0", 0.4),
        traj("E/tgt1", 1.0),  # a success: never the rejected side
        traj("E/tgt2", 0.6),
        traj("E/tgt3", 0.6),  # ties with E/tgt2: the smaller id is kept
        traj("F/tgt0", 1.0),
        traj("F/tgt1", 1.0),  # every episode of F succeeded: no pair
        traj("G/tgt0", 0.9),  # G has no expert
    ]
    experts = [*EXPERTS, traj("E/exp0", 1.0), traj("F/exp0", 1.0)]
    dataset = build_best_of_n_pairs(experts, [*TARGET, *sampled])
    assert summary(dataset) == [
        (ET, "A/exp0", "A/tgt3", 1.0, 0.0, HN),  # 0.7 beats A's other failures 0.5 and 0.2
        (ET, "B/exp0", "B/tgt0", 1.0, 0.0, False),
        (ET, "C/exp0", "C/tgt0", 1.0, 0.0, False),
        (ET, "D/tgt0", "D/exp0", 1.0, 0.0, HN),  # the failure beat the imperfect expert: it is chosen
        (ET, "E/exp0", "E/tgt2", 1.0, 0.0, HN),
    ]
    assert (dataset.report.name, dataset.report.duplicates_removed["predicted"]) == ("best_of_n", 1)
    assert all(p.rejected.traj_id != "E/tgt0" for p in build_best_of_n_pairs(experts, sampled))
    lenient = build_best_of_n_pairs(experts, sampled, success_threshold=0.6)  # 0.6 counts as success
    assert summary(lenient) == [(ET, "E/exp0", "E/tgt0", 1.0, 0.0, False)]


def test_eto_pairs_higher_reward_chosen_ties_skipped():
    dataset = build_eto_pairs(EXPERTS, TARGET)
    assert summary(dataset) == [
        (ET, "A/exp0", "A/tgt0", 1.0, 0.0, False),
        (ET, "A/exp0", "A/tgt2", 1.0, 0.0, False),
        (ET, "A/exp0", "A/tgt3", 1.0, 0.0, HN),
        (ET, "B/exp0", "B/tgt0", 1.0, 0.0, False),
        (ET, "C/exp0", "C/tgt0", 1.0, 0.0, False),
        (ET, "D/tgt0", "D/exp0", 1.0, 0.0, HN),
    ]
    assert (dataset.report.name, dataset.report.ties_skipped) == ("ETO", 1)
    assert summary(build_eto_pairs(EXPERTS[:1], TARGET[:1], weights=(0.5, 0.5))) == [
        (ET, "A/exp0", "A/tgt0", 0.5, 0.5, False)
    ]


def test_positive_agent_pairs_are_built_as_eto_does():
    positive = [traj("A/pos0", 0.4), traj("A/pos1", 1.0), traj("B/pos0", 0.6), traj("E/pos0", 0.1)]
    dataset = build_positive_agent_pairs(EXPERTS, positive)
    assert summary(dataset) == [
        (EP, "A/exp0", "A/pos0", 1.0, 0.0, False),
        (EP, "B/exp0", "B/pos0", 1.0, 0.0, HN),
    ]  # A/pos1 ties with the expert; task E has no expert
    assert dataset.report.name == "positive_agent"


def test_success_threshold():
    # With r >= 0.8 counted as success, A/fail1 (0.8) and D/tgt0 (0.9) leave the failure sets.
    got = summary(build_failure_pairs(TARGET, FAILURE_AGENT, success_threshold=0.8))
    assert got == [EXPECTED_D_FAIL[i] for i in (0, 4, 5, 6, 7)]


def test_duplicates_are_removed_before_pairing():
    kept, removed = deduplicate([TARGET[4], TARGET[2], TARGET[0]])
    assert ([t.traj_id for t in kept], removed) == (["A/tgt0", "A/tgt2"], 1)  # the smaller id stays
    twice = build_target_pairs(EXPERTS + EXPERTS[:1], TARGET, FAILURE_AGENT + FAILURE_AGENT[:2])
    assert summary(twice) == EXPECTED_D_TGT  # re-listed trajectories (same ids) are duplicates too
    assert twice.report.duplicates_removed == {"expert": 1, "failure": 2, "target": 1}


def test_identical_trajectories_from_two_pools_never_pair():
    echo = traj("B/fail9", 0.6, action="Action: tgt0")  # the failure agent repeated B/tgt0 word for word
    dataset = build_failure_pairs(TARGET, [echo])
    assert summary(dataset) == []
    assert dataset.report.identical_skipped == 1


def test_rft_keeps_experts_and_distinct_successes():
    duplicate = traj("A/tgt9", 1.0, action="Action: exp0")  # same messages as A/exp0
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
    expert_failure = build_expert_failure_pairs(EXPERTS, TARGET, FAILURE_AGENT)
    assert summary(build_expert_failure_pairs(*shuffled)) == summary(expert_failure)
    assert summary(build_best_of_n_pairs(shuffled[0], shuffled[1])) == summary(
        build_best_of_n_pairs(EXPERTS, TARGET)
    )


def test_capped_pairs_are_a_seeded_subset():
    full = summary(build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT))
    subsets = {}
    for seed in range(6):
        capped = build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT, max_pairs_per_task=3, seed=seed)
        again = build_target_pairs(EXPERTS, TARGET, FAILURE_AGENT, max_pairs_per_task=3, seed=seed)
        assert summary(capped) == summary(again)
        assert [p for p in full if p in summary(capped)] == summary(capped)  # a subset, canonical order
        per_task = [sum(p.task_id == t for p in capped) for t in "ABCD"]
        assert per_task == [3, 1, 1, 3]  # A had 14 pairs, capped to 3; the others were at most 3
        assert capped.report.dropped_by_cap == 11 and capped.report.num_pairs == 8
        subsets[seed] = tuple(summary(capped))
        only_a = build_target_pairs(
            EXPERTS[:1], TARGET[:5], FAILURE_AGENT[:3], max_pairs_per_task=3, seed=seed
        )
        assert summary(only_a) == summary(capped)[:3]  # a task's subset does not depend on the other tasks
    assert len(set(subsets.values())) > 1


def test_pairs_need_the_same_instruction():
    other_prompt = Trajectory(
        "A/tgt9", "A", (Message("user", "another prompt"), Message("assistant", "x")), 0.0
    )
    with pytest.raises(ValueError, match="different instruction prompts"):
        build_eto_pairs(EXPERTS, [other_prompt])

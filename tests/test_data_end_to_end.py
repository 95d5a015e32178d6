"""End to end: a trajectory JSONL file -> read -> D_fail and D_tgt -> tokenized, masked, bucketed DPO batches.

Experts are real InterCode-SQL GPT-4 episodes; the target and failure-agent rollouts are hand-made prefixes
of them (the first n actions) with assigned rewards, so every expected pair and count is written out below.
"""

import os

import numpy as np
import pytest

from coevo_jax.data.batching import collate_dpo, plan_batches, tokenize_pairs
from coevo_jax.data.chat_format import ChatTemplateFormat
from coevo_jax.data.pair_pool import EXPERT_VS_FAILURE, EXPERT_VS_TARGET, FAILURE_VS_FAILURE
from coevo_jax.data.pairs import build_failure_pairs, build_target_pairs
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import ASSISTANT, USER, Message, Trajectory, write_trajectories
from coevo_jax.tokenization.gguf import load_gguf_tokenizer

RECORDS = os.path.join(os.path.dirname(__file__), "data", "eto_records.jsonl")
EF, ET, FF = EXPERT_VS_FAILURE, EXPERT_VS_TARGET, FAILURE_VS_FAILURE
E0, E73 = "intercode_sql_0_gpt-4", "intercode_sql_73_gpt-4"


def rollout(expert, traj_id, agent, reward, seed, *, copied, own):
    """The expert's first `copied` turns, then the agent's `own` actions (each after a made-up observation)."""
    messages = list(expert.messages[: expert.prompt_len + 2 * copied])
    for i, action in enumerate(own):
        if i:
            messages.append(Message(USER, f"Observation: Error executing query (step {i})"))
        messages.append(Message(ASSISTANT, action))
    sampling = {"temperature": 0.7, "top_p": 1.0, "seed": seed, "model": f"{agent}-iteration-1"}
    return Trajectory(
        traj_id,
        expert.task_id,
        tuple(messages),
        reward,
        agent,
        prompt_len=3,
        env="intercode_sql",
        iteration=1,
        sampling=sampling,
    )


@pytest.fixture(scope="module")
def rollout_file(tmp_path_factory):
    experts = {t.traj_id: t for t in read_trajectories(RECORDS) if t.traj_id in (E0, E73)}
    e0, e73 = experts[E0], experts[E73]  # 5 and 10 actions, both reward 1.0
    trajectories = [
        e0,
        e73,
        rollout(e0, "sql0_tgt_a", "target", 0.0, 1, copied=0, own=["Action: SHOW DATABASES"]),
        rollout(e0, "sql0_tgt_b", "target", 0.4, 2, copied=1, own=["Action: SELECT * FROM people"]),
        rollout(
            e0, "sql0_tgt_c", "target", 0.4, 3, copied=1, own=["Action: SELECT * FROM people"]
        ),  # = tgt_b
        rollout(  # a near success (a hard negative when rejected), too long for 200 tokens: cut to 2 actions
            e0,
            "sql0_fail_a",
            "failure",
            0.7,
            4,
            copied=0,
            own=[
                "Action: SHOW TABLES",
                "Action: DESCRIBE people",
                "Action: SELECT Name FROM people ORDER BY Name",
            ],
        ),
        rollout(
            e0, "sql0_fail_b", "failure", 0.4, 5, copied=1, own=["Action: DESCRIBE people"]
        ),  # ties tgt_b
        rollout(e73, "sql73_tgt_a", "target", 1.0, 6, copied=10, own=[]),  # a success: ties with the expert
        rollout(e73, "sql73_fail_a", "failure", 0.2, 7, copied=0, own=["Action: SELECT 1"]),
    ]
    path = tmp_path_factory.mktemp("rollouts") / "iteration_1.jsonl"
    write_trajectories(path, trajectories)
    return path


def by_agent(trajectories, agent):
    return [t for t in trajectories if t.agent == agent]


def summary(pairs):
    return [
        (p.kind, p.chosen.traj_id, p.rejected.traj_id, p.lambda_dpo, p.lambda_sft, p.hard_negative)
        for p in pairs
    ]


def test_trajectory_file_to_weighted_dpo_batches(rollout_file, smollm2_gguf_path):
    trajectories = read_trajectories(rollout_file)
    assert [t.iteration for t in trajectories] == [None, None] + [1] * 7
    experts, target, failure = (by_agent(trajectories, a) for a in ("expert", "target", "failure"))

    d_fail = build_failure_pairs(target, failure)
    assert summary(d_fail) == [
        (FF, "sql0_fail_a", "sql0_tgt_a", 1.0, 0.0, False),
        (FF, "sql0_fail_a", "sql0_tgt_b", 1.0, 0.0, False),
        (FF, "sql0_fail_b", "sql0_tgt_a", 1.0, 0.0, False),
    ]
    d_tgt = build_target_pairs(experts, target, failure)
    assert summary(d_tgt) == [
        (EF, E0, "sql0_fail_a", 0.5, 0.5, True),
        (EF, E0, "sql0_fail_b", 0.5, 0.5, False),
        (ET, E0, "sql0_tgt_a", 0.5, 0.5, False),
        (ET, E0, "sql0_tgt_b", 0.5, 0.5, False),
        *summary(d_fail),
        (EF, E73, "sql73_fail_a", 0.5, 0.5, False),
    ]
    assert d_tgt.report.duplicates_removed == {"expert": 0, "failure": 0, "target": 1}
    assert (d_tgt.report.ties_skipped, d_tgt.report.num_hard_negatives) == (2, 1)
    assert d_tgt.report.rejected_reward_histogram == (3, 0, 1, 0, 3, 0, 0, 1, 0, 0)

    tokenizer = load_gguf_tokenizer(smollm2_gguf_path)
    chat_format = ChatTemplateFormat(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for dataset, expected in (
        (d_fail, dict(items=3, kept_whole=1, cut=2, trajectories_cut=1, turns_cut=1)),
        # Cut to fit 200 tokens: the task-0 expert 5 -> 2 actions, sql0_fail_a 3 -> 2, the task-73 expert 10 -> 1.
        (d_tgt, dict(items=8, kept_whole=1, cut=7, trajectories_cut=3, turns_cut=3 + 1 + 9)),
    ):
        tokenized, report = tokenize_pairs(dataset, tokenizer, chat_format, max_length=200)
        assert {k: report.to_dict()[k] for k in expected} == expected and report.dropped == 0

        expected_rows = []  # ((chosen scored text, rejected scored text), (lambda_dpo, lambda_sft)) per pair
        for pair, tokens in zip(dataset, tokenized, strict=True):
            key = tuple(
                tokenizer.decode(t.input_ids[t.action_mask]) for t in (tokens.chosen, tokens.rejected)
            )
            expected_rows.append((key, (pair.lambda_dpo, pair.lambda_sft)))
        by_actions = dict(expected_rows)
        assert len(by_actions) == len(expected_rows)  # each pair scores a distinct text

        plan = plan_batches([len(p) for p in tokenized], 3, (176, 200), seed=0)
        pad = tokenizer.pad_token_id
        batches = [
            collate_dpo([tokenized[i] for i in idx], length=length, pairs_per_batch=3, pad_id=pad)
            for length, idx in plan
        ]
        assert {b["input_ids"].shape for b in batches} == {(6, 176), (6, 200)}  # two shapes only
        seen = []
        for batch in batches:
            for r in np.flatnonzero(batch["pair_mask"]):
                chosen_row, rejected_row = 2 * r, 2 * r + 1
                scored = [
                    batch["targets"][row][batch["loss_mask"][row] == 1] for row in (chosen_row, rejected_row)
                ]
                assert all(s[-1] == im_end for s in scored)  # every scored row ends with an end-of-turn
                key = tuple(tokenizer.decode(s) for s in scored)
                assert (float(batch["lambda_dpo"][r]), float(batch["lambda_sft"][r])) == by_actions[key]
                first_action = [np.argmax(batch["loss_mask"][row]) for row in (chosen_row, rejected_row)]
                assert first_action[0] == first_action[1]  # one shared prompt
                np.testing.assert_array_equal(
                    batch["input_ids"][chosen_row, : first_action[0]],
                    batch["input_ids"][rejected_row, : first_action[0]],
                )
                seen.append((key, by_actions[key]))
        assert sorted(seen) == sorted(expected_rows)  # every pair exactly once
        real = [b["pair_mask"] == 1 for b in batches]
        lambda_dpo = np.concatenate([b["lambda_dpo"][m] for b, m in zip(batches, real, strict=True)])
        lambda_sft = np.concatenate([b["lambda_sft"][m] for b, m in zip(batches, real, strict=True)])
        weights = sorted(zip(lambda_dpo.tolist(), lambda_sft.tolist(), strict=True))
        assert weights == sorted((p.lambda_dpo, p.lambda_sft) for p in dataset)

"""Bucketed fixed-shape SFT/DPO batches: next-token alignment, the DPO pair layout, padding, determinism."""

import numpy as np
import pytest

from coevo_jax.data.batching import (
    DEFAULT_BUCKETS,
    TokenizedPair,
    bucket_for,
    check_right_padded,
    collate_dpo,
    collate_sft,
    fit_to_length,
    iter_sft_batches,
    plan_batches,
    power_of_two_buckets,
)
from coevo_jax.data.chat_format import TokenizedTrajectory

PAD = 0


def seq(ids, mask):
    return TokenizedTrajectory(np.asarray(ids, np.int32), np.asarray(mask, bool))


def test_buckets():
    assert DEFAULT_BUCKETS == (128, 256, 512, 1024, 2048, 4096)
    assert power_of_two_buckets(3000, 256) == (256, 512, 1024, 2048, 3000)
    assert [bucket_for(n, DEFAULT_BUCKETS) for n in (1, 128, 129, 4096)] == [128, 128, 256, 4096]
    with pytest.raises(ValueError, match="exceeds the largest bucket 4096"):
        bucket_for(4097, DEFAULT_BUCKETS)


def test_overflow_policies():
    tokens = seq([5, 6, 7, 8, 9, 10, 11], [0, 0, 1, 0, 1, 1, 0])  # prompt, a_1, o_1, a_2, trailing glue
    np.testing.assert_array_equal(tokens.action_ends, [3, 6])
    assert fit_to_length(tokens, 7, "error") is tokens
    cut = fit_to_length(tokens, 5, "cut_turns")  # whole turns from the end: a_2 and o_1 go
    assert cut.input_ids.tolist() == [5, 6, 7] and cut.action_mask.tolist() == [0, 0, 1]
    assert fit_to_length(tokens, 6, "cut_turns").input_ids.tolist() == [5, 6, 7, 8, 9, 10]
    assert fit_to_length(tokens, 2, "cut_turns") is None  # prompt + a_1 does not fit
    assert fit_to_length(tokens, 6, "drop") is None
    with pytest.raises(ValueError, match="exceeds max_length 4"):
        fit_to_length(tokens, 4, "error")
    with pytest.raises(ValueError, match="unknown overflow"):
        fit_to_length(tokens, 4, "truncate")


def test_sft_batch_targets_are_next_tokens_and_loss_mask_is_aligned_with_targets():
    examples = [seq([1, 2, 3, 4, 5], [0, 0, 1, 1, 0]), seq([7, 8, 9], [0, 1, 1])]
    batch = collate_sft(examples, length=8, batch_size=3, pad_id=PAD)
    np.testing.assert_array_equal(
        batch["input_ids"], [[1, 2, 3, 4, 5, 0, 0, 0], [7, 8, 9, 0, 0, 0, 0, 0]] + [[1, 2, 3, 4, 5, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        batch["targets"], [[2, 3, 4, 5, 0, 0, 0, 0], [8, 9, 0, 0, 0, 0, 0, 0], [2, 3, 4, 5, 0, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        batch["loss_mask"], [[0, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0], [0] * 8]
    )
    np.testing.assert_array_equal(
        batch["attention_mask"], [[1] * 5 + [0] * 3, [1] * 3 + [0] * 5, [1] * 5 + [0] * 3]
    )
    np.testing.assert_array_equal(batch["example_mask"], [1, 1, 0])
    assert {k: v.dtype.name for k, v in batch.items()} == {
        "input_ids": "int32",
        "attention_mask": "int32",
        "targets": "int32",
        "loss_mask": "float32",
        "example_mask": "float32",
    }
    # The scored targets are exactly the action tokens of each example, in order.
    for row, example in enumerate(examples):
        scored = batch["targets"][row][batch["loss_mask"][row] == 1]
        assert scored.tolist() == example.input_ids[example.action_mask].tolist()


def test_dpo_batch_holds_each_pair_in_two_adjacent_rows():
    pairs = [
        TokenizedPair(seq([1, 2, 3], [0, 1, 1]), seq([1, 2, 4, 4], [0, 1, 1, 1]), 0.5, 0.5),
        TokenizedPair(seq([1, 5, 6], [0, 0, 1]), seq([1, 7], [0, 1]), 1.0, 0.0),
        TokenizedPair(seq([1, 8], [0, 1]), seq([1, 9, 9, 9, 9], [0, 0, 1, 1, 1]), 1.0, 0.0),
    ]
    batch = collate_dpo(pairs, length=6, pairs_per_batch=4, pad_id=PAD)
    assert batch["input_ids"].shape == batch["targets"].shape == batch["loss_mask"].shape == (8, 6)
    np.testing.assert_array_equal(
        batch["input_ids"][:, :3],
        [[1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 7, 0], [1, 8, 0], [1, 9, 9], [1, 2, 3], [1, 2, 4]],
    )
    np.testing.assert_array_equal(batch["pair_mask"], [1, 1, 1, 0])
    np.testing.assert_array_equal(batch["lambda_dpo"], [0.5, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(batch["lambda_sft"], [0.5, 0.0, 0.0, 0.0])
    assert batch["loss_mask"][[6, 7]].sum() == 0  # padding pair: tokens of pair 0, nothing scored
    assert batch["attention_mask"][[6, 7]].sum() > 0  # ...but attention rows are never fully masked
    counts_Px2 = batch["loss_mask"].sum(axis=1).reshape(4, 2)  # the steps' view: (chosen, rejected) per pair
    np.testing.assert_array_equal(counts_Px2[:, 0], [2, 1, 1, 0])  # chosen action-token counts
    np.testing.assert_array_equal(counts_Px2[:, 1], [3, 1, 3, 0])  # rejected


def test_collated_batches_are_right_padded_and_other_masks_are_refused_by_row():
    pairs = [TokenizedPair(seq([1, 2, 3], [0, 1, 1]), seq([1, 2], [0, 1]), 1.0, 0.0)]
    batch = collate_dpo(pairs, length=8, pairs_per_batch=2, pad_id=PAD)
    check_right_padded(batch["attention_mask"])  # every collate function pads on the right
    check_right_padded(np.zeros((2, 4), np.int32))  # empty rows are prefixes too
    left = batch["attention_mask"].copy()
    left[2] = np.roll(left[2], 3)  # [0, 0, 0, 1, 1, 1, 0, 0]
    with pytest.raises(ValueError, match="batch row 2: attention_mask is not right-padded"):
        check_right_padded(left)
    holes = batch["attention_mask"].copy()
    holes[1, 0] = 0
    with pytest.raises(ValueError, match="batch row 1"):
        check_right_padded(holes)


def test_plan_batches_is_a_seeded_partition_into_buckets():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 1000, size=53).tolist()
    plan = plan_batches(lengths, 4, (128, 256, 512, 1024), seed=7)
    assert plan == plan_batches(lengths, 4, (128, 256, 512, 1024), seed=7)
    assert plan != plan_batches(lengths, 4, (128, 256, 512, 1024), seed=8)
    members = sorted(i for _, batch in plan for i in batch)
    assert members == list(range(53))
    for bucket, batch in plan:
        assert 1 <= len(batch) <= 4
        assert all(bucket_for(lengths[i], (128, 256, 512, 1024)) == bucket for i in batch)
    in_order = plan_batches([5, 300, 6, 7, 8, 301], 2, (128, 512), seed=0, shuffle=False)
    assert in_order == [(128, (0, 2)), (128, (3, 4)), (512, (1, 5))]


def dpo_epoch(pairs, *, pairs_per_batch, seed, buckets=DEFAULT_BUCKETS):
    """One epoch of DPO batches as the training phases build them: a seeded plan, then collation."""
    plan = plan_batches([len(p) for p in pairs], pairs_per_batch, buckets, seed=seed)
    return [
        collate_dpo([pairs[i] for i in idx], length=length, pairs_per_batch=pairs_per_batch, pad_id=PAD)
        for length, idx in plan
    ]


def test_batches_cover_every_item_once_with_few_shapes():
    rng = np.random.default_rng(1)
    pairs = []
    for k in range(21):
        n, m = rng.integers(3, 600, size=2)
        chosen = seq([100 + k] + [1] * (n - 1), [0] + [1] * (n - 1))
        rejected = seq([100 + k] + [2] * (m - 1), [0] + [1] * (m - 1))
        pairs.append(TokenizedPair(chosen, rejected, 1.0, 0.0))
    batches = dpo_epoch(pairs, pairs_per_batch=4, seed=3)
    shapes = {b["input_ids"].shape for b in batches}
    assert shapes <= {(8, 128), (8, 256), (8, 512), (8, 1024)}
    seen = sorted(int(b["input_ids"][2 * p, 0]) - 100 for b in batches for p in range(4) if b["pair_mask"][p])
    assert seen == list(range(21))
    for b in batches:  # rows 2p and 2p + 1 hold pair p
        np.testing.assert_array_equal(b["input_ids"][0::2, 0], b["input_ids"][1::2, 0])
    sft = list(iter_sft_batches([p.chosen for p in pairs], batch_size=5, pad_id=PAD, seed=3))
    assert sum(int(b["example_mask"].sum()) for b in sft) == 21
    assert {b["input_ids"].shape[0] for b in sft} == {5}


def test_collate_rejects_bad_sizes():
    pair = TokenizedPair(seq([1, 2], [0, 1]), seq([1, 3], [0, 1]), 1.0, 0.0)
    with pytest.raises(ValueError, match="3 items for a batch of 2"):
        collate_dpo([pair] * 3, length=8, pairs_per_batch=2, pad_id=PAD)
    with pytest.raises(ValueError, match="does not fit length 1"):
        collate_dpo([pair], length=1, pairs_per_batch=2, pad_id=PAD)

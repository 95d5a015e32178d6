"""Fixed-shape NumPy batches for SFT (eq. 5) and DPO / co-evolution (eq. 7, 9) training.

Shapes come from a small frozen set so a jitted step compiles a few times only: the sequence length is
the smallest bucket (default powers of two 128 ... 4096) that holds the longest row of the batch, and the
batch is always padded to a fixed number of rows (SFT) or pairs (DPO).

Alignment (the one convention every consumer must follow):
    logits = model(input_ids, attention_mask)            # logits[:, t] predicts the token after t
    sequence_logprobs(logits, targets, loss_mask)        # no further shifting
* `input_ids[r, t]`: token t of row r, right-padded with `pad_id`; `attention_mask[r, t] = 1` for real tokens.
* `targets[r, t] = input_ids[r, t + 1]` (the next token); the last column and padding hold `pad_id`.
* `loss_mask[r, t] = 1.0` iff `targets[r, t]` is an action token (float32), i.e. the unshifted
  `TokenizedTrajectory.action_mask` moved left by one. It is 0 wherever `targets` is padding.

SFT batch (`collate_sft`): the above [B, L] plus `example_mask[B]` (1.0 real row, 0.0 padding row).
DPO batch (`collate_dpo`): the above as [2B, L], rows 0..B-1 the chosen trajectories of pairs 0..B-1 and rows
B..2B-1 the rejected ones in the same order (one forward scores both; split with `x[:B]`, `x[B:]`), plus
per pair `lambda_dpo[B]`, `lambda_sft[B]`, `pair_mask[B]` (float32).

Padding rows/pairs repeat the first real row/pair's tokens, so no row is fully masked (a fully masked
attention row makes a softmax NaN that can leak into gradients), but carry zero `loss_mask`, zero lambdas and
a zero `example_mask` / `pair_mask`: they contribute nothing to any loss.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from coevo_jax.data.chat_format import TokenizedTrajectory, tokenize_trajectory
from coevo_jax.data.pairs import PreferencePair
from coevo_jax.data.records import Trajectory


def power_of_two_buckets(max_length: int = 4096, min_length: int = 128) -> tuple[int, ...]:
    """min_length, 2*min_length, ... up to and including max_length (added if not a power-of-two step)."""
    buckets, length = [], min_length
    while length < max_length:
        buckets.append(length)
        length *= 2
    return (*buckets, max_length)


DEFAULT_BUCKETS = power_of_two_buckets()


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= length."""
    for bucket in sorted(buckets):
        if length <= bucket:
            return bucket
    raise ValueError(f"length {length} exceeds the largest bucket {max(buckets)}")


def fit_to_length(tokens: TokenizedTrajectory, max_length: int, overflow: str) -> TokenizedTrajectory | None:
    """Apply the overflow policy: "truncate" (keep the first max_length tokens), "drop" (None) or "error".

    A truncated sequence left without any action token is dropped (None): it would train nothing.
    """
    if len(tokens) <= max_length:
        return tokens
    if overflow == "error":
        raise ValueError(f"sequence of {len(tokens)} tokens exceeds max_length {max_length}")
    if overflow == "drop":
        return None
    if overflow != "truncate":
        raise ValueError(f"unknown overflow policy {overflow!r}")
    cut = TokenizedTrajectory(tokens.input_ids[:max_length], tokens.action_mask[:max_length])
    return cut if cut.num_action_tokens else None


@dataclass(frozen=True)
class TokenizedPair:
    chosen: TokenizedTrajectory
    rejected: TokenizedTrajectory
    lambda_dpo: float
    lambda_sft: float

    def __len__(self) -> int:
        return max(len(self.chosen), len(self.rejected))


def tokenize_sft_examples(
    trajectories: Sequence[Trajectory], tokenizer, chat_format, *, max_length: int, overflow: str = "truncate"
) -> tuple[list[TokenizedTrajectory], dict[str, int]]:
    """Tokenize with action masks and apply the overflow policy; returns (examples, counts)."""
    examples, counts = [], {"kept": 0, "truncated": 0, "dropped": 0}
    for trajectory in trajectories:
        tokens = tokenize_trajectory(tokenizer, chat_format, trajectory)
        fitted = fit_to_length(tokens, max_length, overflow)
        counts["dropped" if fitted is None else "truncated" if fitted is not tokens else "kept"] += 1
        if fitted is not None:
            examples.append(fitted)
    return examples, counts


def tokenize_pairs(
    pairs: Sequence[PreferencePair], tokenizer, chat_format, *, max_length: int, overflow: str = "truncate"
) -> tuple[list[TokenizedPair], dict[str, int]]:
    """Tokenize both sides of each pair (each trajectory once); a pair with a dropped side is dropped."""
    cache: dict[str, TokenizedTrajectory | None] = {}
    counts = {"kept": 0, "truncated": 0, "dropped": 0}

    def tokens_of(trajectory: Trajectory) -> TokenizedTrajectory | None:
        if trajectory.traj_id not in cache:
            cache[trajectory.traj_id] = tokenize_trajectory(tokenizer, chat_format, trajectory)
        full = cache[trajectory.traj_id]
        return fit_to_length(full, max_length, overflow)

    result = []
    for pair in pairs:
        chosen, rejected = tokens_of(pair.chosen), tokens_of(pair.rejected)
        if chosen is None or rejected is None:
            counts["dropped"] += 1
            continue
        was_cut = len(chosen) < len(cache[pair.chosen.traj_id]) or len(rejected) < len(
            cache[pair.rejected.traj_id]
        )
        counts["truncated" if was_cut else "kept"] += 1
        result.append(TokenizedPair(chosen, rejected, pair.lambda_dpo, pair.lambda_sft))
    return result, counts


def next_token_targets(
    input_ids_RxL: np.ndarray, action_mask_RxL: np.ndarray, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """(targets, loss_mask): both shifted left by one, the last column padding with loss 0."""
    targets = np.full_like(input_ids_RxL, pad_id)
    targets[:, :-1] = input_ids_RxL[:, 1:]
    loss_mask = np.zeros(input_ids_RxL.shape, dtype=np.float32)
    loss_mask[:, :-1] = action_mask_RxL[:, 1:]
    return targets, loss_mask


def _sequence_arrays(rows: Sequence[TokenizedTrajectory], length: int, pad_id: int) -> dict[str, np.ndarray]:
    input_ids = np.full((len(rows), length), pad_id, dtype=np.int32)
    action_mask = np.zeros((len(rows), length), dtype=bool)
    attention_mask = np.zeros((len(rows), length), dtype=np.int32)
    for r, row in enumerate(rows):
        if len(row) > length:
            raise ValueError(f"row of {len(row)} tokens does not fit length {length}")
        input_ids[r, : len(row)] = row.input_ids
        action_mask[r, : len(row)] = row.action_mask
        attention_mask[r, : len(row)] = 1
    targets, loss_mask = next_token_targets(input_ids, action_mask, pad_id)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "targets": targets,
        "loss_mask": loss_mask,
    }


def _real_flags(num_real: int, size: int) -> np.ndarray:
    if not 1 <= num_real <= size:
        raise ValueError(f"{num_real} items for a batch of {size}")
    return (np.arange(size) < num_real).astype(np.float32)


def collate_sft(
    examples: Sequence[TokenizedTrajectory], *, length: int, batch_size: int, pad_id: int
) -> dict[str, np.ndarray]:
    """[batch_size, length] SFT batch; missing rows repeat row 0 with zero loss_mask and example_mask."""
    example_mask = _real_flags(len(examples), batch_size)
    rows = [*examples, *[examples[0]] * (batch_size - len(examples))]
    batch = _sequence_arrays(rows, length, pad_id)
    batch["loss_mask"] *= example_mask[:, None]
    batch["example_mask"] = example_mask
    return batch


def collate_dpo(
    pairs: Sequence[TokenizedPair], *, length: int, pairs_per_batch: int, pad_id: int
) -> dict[str, np.ndarray]:
    """[2 * pairs_per_batch, length] batch: chosen rows first, then rejected rows, same pair order."""
    pair_mask = _real_flags(len(pairs), pairs_per_batch)
    padded = [*pairs, *[pairs[0]] * (pairs_per_batch - len(pairs))]
    batch = _sequence_arrays([p.chosen for p in padded] + [p.rejected for p in padded], length, pad_id)
    batch["loss_mask"] *= np.concatenate([pair_mask, pair_mask])[:, None]
    batch["lambda_dpo"] = np.asarray([p.lambda_dpo for p in padded], dtype=np.float32) * pair_mask
    batch["lambda_sft"] = np.asarray([p.lambda_sft for p in padded], dtype=np.float32) * pair_mask
    batch["pair_mask"] = pair_mask
    return batch


def plan_batches(
    lengths: Sequence[int], batch_size: int, buckets: Sequence[int], *, seed: int, shuffle: bool = True
) -> list[tuple[int, tuple[int, ...]]]:
    """Group item indices into (bucket_length, indices) batches of at most `batch_size`, one bucket each.

    With `shuffle`, items are permuted before grouping and the batches are permuted after, both from
    `seed`; without, items keep their order within a bucket and buckets go shortest first.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    by_bucket: dict[int, list[int]] = defaultdict(list)
    for index in order.tolist():
        by_bucket[bucket_for(lengths[index], buckets)].append(index)
    batches = [
        (bucket, tuple(members[k : k + batch_size]))
        for bucket in sorted(by_bucket)
        for members in [by_bucket[bucket]]
        for k in range(0, len(members), batch_size)
    ]
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches)).tolist()]
    return batches


def iter_sft_batches(
    examples: Sequence[TokenizedTrajectory],
    *,
    batch_size: int,
    pad_id: int,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    seed: int = 0,
    shuffle: bool = True,
) -> Iterator[dict[str, np.ndarray]]:
    """One epoch of SFT batches (use a different seed per epoch)."""
    for length, indices in plan_batches(
        [len(e) for e in examples], batch_size, buckets, seed=seed, shuffle=shuffle
    ):
        yield collate_sft([examples[i] for i in indices], length=length, batch_size=batch_size, pad_id=pad_id)


def iter_dpo_batches(
    pairs: Sequence[TokenizedPair],
    *,
    pairs_per_batch: int,
    pad_id: int,
    buckets: Sequence[int] = DEFAULT_BUCKETS,
    seed: int = 0,
    shuffle: bool = True,
) -> Iterator[dict[str, np.ndarray]]:
    """One epoch of DPO batches; a pair's length is that of its longer side."""
    plan = plan_batches([len(p) for p in pairs], pairs_per_batch, buckets, seed=seed, shuffle=shuffle)
    for length, indices in plan:
        yield collate_dpo(
            [pairs[i] for i in indices], length=length, pairs_per_batch=pairs_per_batch, pad_id=pad_id
        )

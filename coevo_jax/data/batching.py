"""Fixed-shape NumPy batches for SFT (eq. 3/5), DPO / co-evolution (eq. 7, 9) and GRPO training.

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
DPO batch (`collate_dpo`): the above as [2B, L], row 2p the chosen and row 2p + 1 the rejected trajectory of
pair p (`x.reshape(B, 2)` gives (chosen, rejected)), plus per pair `lambda_dpo[B]`, `lambda_sft[B]`,
`pair_mask[B]` (float32): the one DPO layout, so that micro-batches, data shards and processes take whole
pairs by plain slicing (`coevo_jax.sharding.device_layout`, `place_batch`).
GRPO batches: `coevo_jax.data.grpo_rows`.

Over-long trajectories are cut or dropped by `fit_to_length`, counted in a `FitReport`, never silently.
Padding rows/pairs repeat the first real one's tokens (no fully masked attention row, whose softmax is NaN)
with zero `loss_mask`, lambdas and `example_mask` / `pair_mask`: they contribute nothing to any loss.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from coevo_jax.data.chat_format import TokenizedTrajectory, tokenize_trajectory
from coevo_jax.data.pair_pool import PreferencePair
from coevo_jax.data.records import Trajectory

log = logging.getLogger(__name__)


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


OVERFLOW_POLICIES = ("cut_turns", "drop", "error")


def fit_to_length(tokens: TokenizedTrajectory, max_length: int, overflow: str) -> TokenizedTrajectory | None:
    """Apply the over-long policy to one tokenized trajectory; None means dropped.

    * "cut_turns" (default): keep the prompt and cut whole turns from the end, as ETO truncates trajectories:
      the result is the longest prefix that ends right after some action's end-of-turn token and fits, so
      it is prompt, a_1, o_1, ..., a_k with k >= 1. If even prompt + a_1 does not fit, it is dropped.
    * "drop": drop every over-long trajectory. * "error": raise on the first one.
    """
    if overflow not in OVERFLOW_POLICIES:
        raise ValueError(f"unknown overflow policy {overflow!r}; expected one of {OVERFLOW_POLICIES}")
    if len(tokens) <= max_length:
        return tokens
    if overflow == "error":
        raise ValueError(f"sequence of {len(tokens)} tokens exceeds max_length {max_length}")
    fitting = tokens.action_ends[tokens.action_ends <= max_length]
    if overflow == "drop" or not len(fitting):
        return None
    end = int(fitting[-1])
    return TokenizedTrajectory(tokens.input_ids[:end], tokens.action_mask[:end])


@dataclass(frozen=True)
class FitReport:
    """What the over-long policy did: items are trajectories (SFT) or pairs (DPO; cut if either side was).

    `trajectories_cut` / `trajectories_dropped` count distinct trajectories, `turns_cut` the actions they lost.
    `dropped` includes the `identical_after_cut` pairs whose two sides became the same tokens (no preference
    left, e.g. a rollout that copied the expert's first turns and diverged only after the cut).
    """

    policy: str
    max_length: int
    items: int
    kept_whole: int
    cut: int
    dropped: int
    trajectories_cut: int
    trajectories_dropped: int
    turns_cut: int
    identical_after_cut: int = 0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class _Fitter:
    """Tokenizes each trajectory once, fits it, and keeps the counts for the `FitReport`."""

    def __init__(self, tokenizer, chat_format, max_length: int, overflow: str):
        self.tokenizer, self.chat_format = tokenizer, chat_format
        self.max_length, self.overflow = max_length, overflow
        self.fitted: dict[str, TokenizedTrajectory | None] = {}
        self.cut_turns: dict[str, int] = {}

    def __call__(self, trajectory: Trajectory) -> TokenizedTrajectory | None:
        key = trajectory.traj_id
        if key not in self.fitted:
            full = tokenize_trajectory(self.tokenizer, self.chat_format, trajectory)
            fitted = fit_to_length(full, self.max_length, self.overflow)
            self.fitted[key] = fitted
            if fitted is not None and fitted is not full:
                self.cut_turns[key] = len(full.action_ends) - len(fitted.action_ends)
        return self.fitted[key]

    def was_cut(self, trajectory: Trajectory) -> bool:
        return trajectory.traj_id in self.cut_turns

    def report(self, items: int, kept_whole: int, cut: int, dropped: int, identical: int = 0) -> FitReport:
        report = FitReport(
            policy=self.overflow,
            max_length=self.max_length,
            items=items,
            kept_whole=kept_whole,
            cut=cut,
            dropped=dropped,
            trajectories_cut=len(self.cut_turns),
            trajectories_dropped=sum(v is None for v in self.fitted.values()),
            turns_cut=sum(self.cut_turns.values()),
            identical_after_cut=identical,
        )
        if cut or dropped:
            log.warning("over-long (max_length %d, %s): %s", self.max_length, self.overflow, report)
        return report


@dataclass(frozen=True)
class TokenizedPair:
    chosen: TokenizedTrajectory
    rejected: TokenizedTrajectory
    lambda_dpo: float
    lambda_sft: float

    def __len__(self) -> int:
        return max(len(self.chosen), len(self.rejected))


def tokenize_sft_examples(
    trajectories: Sequence[Trajectory],
    tokenizer,
    chat_format,
    *,
    max_length: int,
    overflow: str = "cut_turns",
) -> tuple[list[TokenizedTrajectory], FitReport]:
    """Tokenize with action masks and apply the over-long policy; returns (examples, report)."""
    fitter = _Fitter(tokenizer, chat_format, max_length, overflow)
    examples, cut, dropped = [], 0, 0
    for trajectory in trajectories:
        fitted = fitter(trajectory)
        if fitted is None:
            dropped += 1
            continue
        cut += fitter.was_cut(trajectory)
        examples.append(fitted)
    return examples, fitter.report(len(trajectories), len(examples) - cut, cut, dropped)


def tokenize_pairs(
    pairs: Sequence[PreferencePair],
    tokenizer,
    chat_format,
    *,
    max_length: int,
    overflow: str = "cut_turns",
) -> tuple[list[TokenizedPair], FitReport]:
    """Tokenize both sides of each pair (each trajectory once) and fit each side by the same policy.

    "The same way" for chosen and rejected: each side is cut independently by the same rule (whole turns
    from its end until it fits; both keep the shared prompt); a pair with a dropped side is dropped, and so
    is a pair whose two sides were cut to identical tokens.
    """
    fitter = _Fitter(tokenizer, chat_format, max_length, overflow)
    result, cut, dropped, identical = [], 0, 0, 0
    for pair in pairs:
        chosen, rejected = fitter(pair.chosen), fitter(pair.rejected)
        if chosen is None or rejected is None:
            dropped += 1
            continue
        was_cut = fitter.was_cut(pair.chosen) or fitter.was_cut(pair.rejected)
        if was_cut and np.array_equal(chosen.input_ids, rejected.input_ids):
            dropped, identical = dropped + 1, identical + 1
            continue
        cut += was_cut
        result.append(TokenizedPair(chosen, rejected, pair.lambda_dpo, pair.lambda_sft))
    return result, fitter.report(len(pairs), len(result) - cut, cut, dropped, identical)


def next_token_targets(
    input_ids_RxL: np.ndarray, action_mask_RxL: np.ndarray, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """(targets, loss_mask): both shifted left by one, the last column padding with loss 0."""
    targets = np.full_like(input_ids_RxL, pad_id)
    targets[:, :-1] = input_ids_RxL[:, 1:]
    loss_mask = np.zeros(input_ids_RxL.shape, dtype=np.float32)
    loss_mask[:, :-1] = action_mask_RxL[:, 1:]
    return targets, loss_mask


def sequence_arrays(rows: Sequence[TokenizedTrajectory], length: int, pad_id: int) -> dict[str, np.ndarray]:
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


def check_right_padded(attention_mask_RxL: np.ndarray) -> None:
    """Raises ValueError naming the first row of `attention_mask` that is not ones then zeros: what a model
    with `ModelConfig.right_padded` assumes of every batch (the collate functions above build them so)."""
    mask = np.asarray(attention_mask_RxL) != 0
    lengths = mask.sum(axis=-1)
    prefix = np.arange(mask.shape[-1])[None, :] < lengths[:, None]
    bad = np.flatnonzero(np.any(mask != prefix, axis=-1))
    if bad.size:
        raise ValueError(
            f"batch row {bad[0]}: attention_mask is not right-padded (ones, then zeros), but the model's "
            "config says right_padded=True (set model.right_padded=False for other masks)"
        )


def real_flags(num_real: int, size: int) -> np.ndarray:
    if not 1 <= num_real <= size:
        raise ValueError(f"{num_real} items for a batch of {size}")
    return (np.arange(size) < num_real).astype(np.float32)


def collate_sft(
    examples: Sequence[TokenizedTrajectory], *, length: int, batch_size: int, pad_id: int
) -> dict[str, np.ndarray]:
    """[batch_size, length] SFT batch; missing rows repeat row 0 with zero loss_mask and example_mask."""
    example_mask = real_flags(len(examples), batch_size)
    rows = [*examples, *[examples[0]] * (batch_size - len(examples))]
    batch = sequence_arrays(rows, length, pad_id)
    batch["loss_mask"] *= example_mask[:, None]
    batch["example_mask"] = example_mask
    return batch


def collate_dpo(
    pairs: Sequence[TokenizedPair], *, length: int, pairs_per_batch: int, pad_id: int
) -> dict[str, np.ndarray]:
    """[2 * pairs_per_batch, length] batch: rows 2p and 2p + 1 are pair p's chosen and rejected sides."""
    pair_mask = real_flags(len(pairs), pairs_per_batch)
    padded = [*pairs, *[pairs[0]] * (pairs_per_batch - len(pairs))]
    batch = sequence_arrays([side for p in padded for side in (p.chosen, p.rejected)], length, pad_id)
    batch["loss_mask"] *= np.repeat(pair_mask, 2)[:, None]
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

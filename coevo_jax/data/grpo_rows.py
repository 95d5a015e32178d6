"""GRPO's rows and batches: sampled episodes as the GRPO step trains on them.

GRPO batch (`collate_grpo`): the [B, L] sequence entries of sampled episodes built from their recorded
`TokenTrace` (`sampled_sequence`: the exact ids the sampler saw and drew, never re-tokenized; the action mask
is exactly the sampled reply tokens, so prompt and observation tokens carry no loss), plus `old_logps` [B, L]
(the sampler's log-prob of `targets[r, t]`, aligned like `loss_mask`, 0 elsewhere), `advantages` [B, L]
(the advantage of `targets[r, t]`: the episode's on every action token for GRPO, per reply for GiGPO; 0 off
the mask) and `example_mask[B]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coevo_jax.data.batching import fit_to_length, real_flags, sequence_arrays
from coevo_jax.data.chat_format import TokenizedTrajectory
from coevo_jax.data.records import Trajectory


@dataclass(frozen=True)
class SampledSequence:
    """A sampled episode as GRPO trains on it: its tokens and action mask, the sampler's log-prob of each
    action token (float32 [n], aligned with `tokens.input_ids`, 0 off the mask), and its advantage: one
    number (the episode's), or float32 [n] per token (GiGPO: each reply's own, 0 off the mask)."""

    tokens: TokenizedTrajectory
    sampled_logps: np.ndarray
    advantage: float | np.ndarray

    def token_advantages(self) -> np.ndarray:
        """The advantage of each token, float32 [n] (0 off the action mask)."""
        if np.ndim(self.advantage) == 0:
            return np.where(self.tokens.action_mask, np.float32(self.advantage), np.float32(0.0))
        return np.asarray(self.advantage, np.float32)

    def __len__(self) -> int:
        return len(self.tokens)


def sampled_sequence(
    trajectory: Trajectory,
    advantage: float | Sequence[float],
    *,
    max_length: int,
    overflow: str = "cut_turns",
) -> SampledSequence | None:
    """The episode's recorded tokens (`Trajectory.tokens`) as a GRPO row, fitted to `max_length` by the
    over-long policy (None: dropped). `advantage`: the episode's, or one per reply (GiGPO), given to that
    reply's tokens. An episode without a token trace (a scripted or converted one) is an error: GRPO trains
    only on tokens a sampler drew."""
    trace = trajectory.tokens
    if trace is None:
        raise ValueError(f"{trajectory.traj_id}: no token trace; GRPO needs the sampler's own tokens")
    ids = np.asarray(trace.ids, dtype=np.int32)
    mask = np.zeros(len(ids), dtype=bool)
    logps = np.zeros(len(ids), dtype=np.float32)
    logprobs = np.asarray(trace.logprobs, dtype=np.float32)
    per_reply = np.ndim(advantage) > 0
    if per_reply and len(advantage) != len(trace.reply_spans):
        raise ValueError(
            f"{trajectory.traj_id}: {len(advantage)} reply advantages for {len(trace.reply_spans)} replies"
        )
    token_advantages = np.zeros(len(ids), dtype=np.float32)
    used = 0
    for reply, (start, end) in enumerate(trace.reply_spans):
        mask[start:end] = True
        logps[start:end] = logprobs[used : used + end - start]
        token_advantages[start:end] = advantage[reply] if per_reply else advantage
        used += end - start
    fitted = fit_to_length(TokenizedTrajectory(ids, mask), max_length, overflow)
    if fitted is None:
        return None
    kept = token_advantages[: len(fitted)] if per_reply else float(advantage)
    return SampledSequence(fitted, logps[: len(fitted)], kept)


def collate_grpo(
    examples: Sequence[SampledSequence], *, length: int, batch_size: int, pad_id: int
) -> dict[str, np.ndarray]:
    """[batch_size, length] GRPO batch; missing rows repeat row 0 with zero loss_mask and example_mask."""
    example_mask = real_flags(len(examples), batch_size)
    rows = [*examples, *[examples[0]] * (batch_size - len(examples))]
    batch = sequence_arrays([row.tokens for row in rows], length, pad_id)
    batch["loss_mask"] *= example_mask[:, None]
    old_logps = np.zeros((batch_size, length), dtype=np.float32)
    for r, row in enumerate(rows):
        old_logps[r, : len(row) - 1] = row.sampled_logps[1:]  # the log-prob of targets[r, t] = ids[t + 1]
    batch["old_logps"] = old_logps * (batch["loss_mask"] > 0)
    advantages = np.zeros((batch_size, length), dtype=np.float32)
    for r, row in enumerate(rows):
        advantages[r, : len(row) - 1] = row.token_advantages()[1:]  # the advantage of targets[r, t]
    batch["advantages"] = advantages * (batch["loss_mask"] > 0)
    batch["example_mask"] = example_mask
    return batch

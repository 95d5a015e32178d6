"""Pure loss functions of "Co-Evolving Agents" (arXiv 2511.22254), importable by any JAX project.

Plain arrays in and out: no Flax, no globals, safe under jit, vmap and grad; float32 math even from bfloat16
inputs. Entry points check shapes with chex when traced (free under jit): a mis-shaped input fails naming
the function instead of broadcasting silently.

Shape legend: B batch (sequences or pairs), T tokens, V vocabulary, D hidden size, N = B*T flattened tokens.

Masks: `loss_mask[b, t] = 1` means the log-prob of `targets[b, t]` counts, i.e. `targets[b, t]` is an action
token (assistant turn, its end-of-turn token included). It is not an attention mask: instruction and
observation tokens are attended to but carry no loss.

Paper equations: eq. 2/4 `sequence_logprobs`, eq. 3/5 `sft_loss` (SFT), eq. 7 `dpo_loss` (DPO),
eq. 9 `coevo_loss` (the target agent's weighted DPO + SFT, the paper's L_target). GRPO (CoEvolve, arXiv
2604.15840, eq. 1): `group_advantages` and `grpo_loss`; GiGPO's step-level credit (arXiv 2505.10978):
`discounted_returns` and `step_group_advantages`. `sequence_logprobs_from_hidden` and
`sft_terms_from_hidden` are eq. 2/4 and eq. 3/5 from final hidden states, through the chunked log-probs of
`coevo_jax.chunked_logprobs` (`token_logprobs_from_hidden`, which the train steps call from here too).
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from coevo_jax.chunked_logprobs import token_logprobs_from_hidden


def _at_least_float32(x: jax.Array) -> jax.Array:
    """Upcast bfloat16/float16 to float32; float32 and float64 (used by gradient checks) stay as they are."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def token_logprobs(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
    """log softmax(logits)[targets] per position, in float32 (or wider): [B, T]."""
    logits = _at_least_float32(logits_BxTxV)
    log_normaliser = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, targets_BxT[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return target_logits - log_normaliser


def _check_tokens(name: str, logits_BxTxV, targets_BxT, loss_mask_BxT) -> None:
    """Shape checks at trace time (no cost under jit): logits [B, T, V], targets and mask [B, T]."""
    message = f"{name}: logits [B, T, V], targets and loss_mask [B, T]"
    chex.assert_rank(logits_BxTxV, 3, custom_message=message)
    chex.assert_rank([targets_BxT, loss_mask_BxT], 2, custom_message=message)
    chex.assert_equal_shape([targets_BxT, loss_mask_BxT], custom_message=message)
    chex.assert_equal_shape_prefix([logits_BxTxV, targets_BxT], 2, custom_message=message)


def _check_pairs(name: str, *per_pair_B) -> None:
    """Shape check at trace time (no cost under jit): every per-pair array is [B], the same B."""
    message = f"{name}: every per-pair array [B], the same B"
    chex.assert_rank(list(per_pair_B), 1, custom_message=message)
    chex.assert_equal_shape(list(per_pair_B), custom_message=message)


def masked_sum(values_BxT: jax.Array, loss_mask_BxT: jax.Array) -> jax.Array:
    """Sum over T of `values` where the mask is set; masked entries never leak NaN or inf: [B]."""
    keep = loss_mask_BxT.astype(bool)
    return jnp.sum(jnp.where(keep, _at_least_float32(values_BxT), 0.0), axis=-1)


def sequence_logprobs(logits_BxTxV: jax.Array, targets_BxT: jax.Array, loss_mask_BxT: jax.Array) -> jax.Array:
    """log pi(e|u) of eq. 2/4: the sum of action-token log-probs of each sequence, [B]."""
    _check_tokens("sequence_logprobs", logits_BxTxV, targets_BxT, loss_mask_BxT)
    return masked_sum(token_logprobs(logits_BxTxV, targets_BxT), loss_mask_BxT)


class SFTTerms(NamedTuple):
    """Summed negative log-likelihood and action-token count of a batch.

    Adding these over micro-batches and dividing once gives the exact global per-token mean of eq. 3/5,
    which averaging per-micro-batch means does not when micro-batches hold different token counts.
    """

    nll_sum: jax.Array
    token_count: jax.Array

    def mean(self) -> jax.Array:
        """Per-token mean NLL; 0 when no token is masked in (never NaN)."""
        return self.nll_sum / jnp.maximum(self.token_count, 1.0)


def sft_terms_from_token_logprobs(token_logps_BxT: jax.Array, loss_mask_BxT: jax.Array) -> SFTTerms:
    """(sum of NLL, token count) over masked positions of already computed token log-probs."""
    nll_sum = -jnp.sum(masked_sum(token_logps_BxT, loss_mask_BxT))
    token_count = jnp.sum(loss_mask_BxT.astype(jnp.float32))
    return SFTTerms(nll_sum=nll_sum, token_count=token_count)


def sft_terms(logits_BxTxV: jax.Array, targets_BxT: jax.Array, loss_mask_BxT: jax.Array) -> SFTTerms:
    """(sum of NLL, token count) of eq. 3/5 over the action tokens of a batch."""
    _check_tokens("sft_terms", logits_BxTxV, targets_BxT, loss_mask_BxT)
    return sft_terms_from_token_logprobs(token_logprobs(logits_BxTxV, targets_BxT), loss_mask_BxT)


def sft_loss(logits_BxTxV: jax.Array, targets_BxT: jax.Array, loss_mask_BxT: jax.Array) -> jax.Array:
    """Eq. 3 (SFT) in the token form of eq. 5: mean negative log-likelihood per action token (scalar).

    Eq. 5 sums over action tokens; the mean per action token keeps the scale independent of the batch's
    trajectory lengths.
    """
    return sft_terms(logits_BxTxV, targets_BxT, loss_mask_BxT).mean()


class DPOOutput(NamedTuple):
    """Per-pair DPO loss with the usual metrics; all [B], float32. Metrics carry no gradient."""

    losses: jax.Array
    chosen_rewards: jax.Array
    rejected_rewards: jax.Array
    reward_margins: jax.Array
    reward_accuracies: jax.Array


def dpo_loss(
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    reference_chosen_logps: jax.Array,
    reference_rejected_logps: jax.Array,
    beta: float | jax.Array,
) -> DPOOutput:
    """Eq. 7: -log sigmoid(beta * ((pc - rc) - (pr - rr))) per pair, with implicit rewards and accuracy.

    The implicit reward of a trajectory is beta * (log pi(e|u) - log pi_ref(e|u)); accuracy is 1 where the
    chosen reward exceeds the rejected one.
    """
    _check_pairs(
        "dpo_loss",
        policy_chosen_logps,
        policy_rejected_logps,
        reference_chosen_logps,
        reference_rejected_logps,
    )
    chosen_log_ratio = _at_least_float32(policy_chosen_logps) - _at_least_float32(reference_chosen_logps)
    rejected_log_ratio = _at_least_float32(policy_rejected_logps) - _at_least_float32(
        reference_rejected_logps
    )
    losses = -jax.nn.log_sigmoid(beta * (chosen_log_ratio - rejected_log_ratio))
    chosen_rewards = jax.lax.stop_gradient(beta * chosen_log_ratio)
    rejected_rewards = jax.lax.stop_gradient(beta * rejected_log_ratio)
    return DPOOutput(
        losses=losses,
        chosen_rewards=chosen_rewards,
        rejected_rewards=rejected_rewards,
        reward_margins=chosen_rewards - rejected_rewards,
        reward_accuracies=(chosen_rewards > rejected_rewards).astype(jnp.float32),
    )


class CoevoLossOutput(NamedTuple):
    """Eq. 9 for a batch of pairs.

    `loss` is the mean over valid pairs; `loss_sum` and `pair_count` let gradient accumulation form the exact
    mean over all micro-batches. `per_pair` is lambda_dpo * dpo + lambda_sft * sft_nll (0 for padding pairs).
    """

    loss: jax.Array
    loss_sum: jax.Array
    pair_count: jax.Array
    per_pair: jax.Array
    dpo: DPOOutput
    sft_nll: jax.Array


def coevo_loss(
    policy_chosen_logps: jax.Array,
    policy_rejected_logps: jax.Array,
    reference_chosen_logps: jax.Array,
    reference_rejected_logps: jax.Array,
    chosen_token_counts: jax.Array,
    lambda_dpo: jax.Array,
    lambda_sft: jax.Array,
    beta: float | jax.Array,
    pair_mask: jax.Array | None = None,
    sft_per_token: bool = False,
) -> CoevoLossOutput:
    """Eq. 9: weighted DPO plus auxiliary SFT on the chosen trajectory, per pair.

    lambda_dpo/lambda_sft [B] are per-pair weights: (0.5, 0.5) for pairs with an expert side, (1.0, 0.0) for
    failure-failure pairs. The SFT term is eq. 9's -log pi(e_chosen|u), the sum over the chosen side's action
    tokens; `sft_per_token=True` divides it by that token count (an RPO-style per-token NLL, ~1/130 of the
    paper's anchor on the built-in experts). `pair_mask` [B] marks real pairs (1) against batch padding (0).
    """
    per_pair_inputs = [chosen_token_counts, lambda_dpo, lambda_sft] + (
        [] if pair_mask is None else [pair_mask]
    )
    _check_pairs(
        "coevo_loss",
        policy_chosen_logps,
        policy_rejected_logps,
        reference_chosen_logps,
        reference_rejected_logps,
        *per_pair_inputs,
    )
    dpo = dpo_loss(
        policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps, beta
    )
    chosen_nll = -_at_least_float32(policy_chosen_logps)
    if sft_per_token:
        chosen_nll = chosen_nll / jnp.maximum(_at_least_float32(chosen_token_counts), 1.0)
    per_pair = _at_least_float32(lambda_dpo) * dpo.losses + _at_least_float32(lambda_sft) * chosen_nll
    if pair_mask is None:
        pair_mask = jnp.ones_like(per_pair)
    valid = pair_mask.astype(bool)
    per_pair = jnp.where(valid, per_pair, 0.0)
    loss_sum = jnp.sum(per_pair)
    pair_count = jnp.sum(valid.astype(jnp.float32))
    return CoevoLossOutput(
        loss=loss_sum / jnp.maximum(pair_count, 1.0),
        loss_sum=loss_sum,
        pair_count=pair_count,
        per_pair=per_pair,
        dpo=dpo,
        sft_nll=jax.lax.stop_gradient(chosen_nll),
    )


ADVANTAGE_SCALES = ("group", "none")
GRPO_AGGREGATIONS = ("token_mean", "sequence_mean", "sum_norm")


def group_advantages(rewards_GxK: jax.Array, *, scale: str = "group", eps: float = 1e-6) -> jax.Array:
    """GRPO's group-relative advantage of each of a task's K samples, [G, K] float32.

    `scale="group"`: (r - mean) / (std + eps) over each group's K rewards, std with ddof=1 (Dr. GRPO's
    `scale="none"`: r - mean). A group of one sample has no relative signal: its advantage is 0.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale {scale!r} not in {ADVANTAGE_SCALES}")
    chex.assert_rank(rewards_GxK, 2, custom_message="group_advantages: rewards [G, K]")
    rewards = _at_least_float32(rewards_GxK)
    group_size = rewards.shape[-1]
    # equal rewards give exactly 0 (a float32 mean of 8 x 0.3 is not 0.3: a spurious +0.03 advantage)
    equal = jnp.max(rewards, axis=-1, keepdims=True) == jnp.min(rewards, axis=-1, keepdims=True)
    centred = jnp.where(equal, 0.0, rewards - jnp.mean(rewards, axis=-1, keepdims=True))
    if scale == "none":
        return centred
    if group_size < 2:
        return jnp.zeros_like(rewards)
    std = jnp.sqrt(jnp.sum(centred**2, axis=-1, keepdims=True) / (group_size - 1))
    return centred / (std + eps)


def discounted_returns(step_rewards_BxS: jax.Array, step_mask_BxS: jax.Array, gamma: float) -> jax.Array:
    """GiGPO's step value, the discounted return to the episode's end: R_t = r_t + gamma * R_t' over each
    row's valid steps (t' the next valid step), 0 where masked; [B, S]."""
    message = "discounted_returns: step rewards and mask [B, S]"
    chex.assert_rank([step_rewards_BxS, step_mask_BxS], 2, custom_message=message)
    chex.assert_equal_shape([step_rewards_BxS, step_mask_BxS], custom_message=message)
    rewards, keep = _at_least_float32(step_rewards_BxS), step_mask_BxS.astype(bool)

    def back(after_B, step):  # (return after this step, this step's) -> (carry, output)
        here = jnp.where(step[1], step[0] + gamma * after_B, 0.0)
        return jnp.where(step[1], here, after_B), here

    _, returns_SxB = jax.lax.scan(back, jnp.zeros(rewards.shape[0]), (rewards.T, keep.T), reverse=True)
    return returns_SxB.T


def step_group_advantages(
    values_N: jax.Array, group_ids_N: jax.Array, *, scale: str = "group", eps: float = 1e-6
) -> jax.Array:
    """GiGPO's step-level advantage of each value in its group (`group_ids`, ints in [0, N): steps of a task's
    episodes from one environment state), [N] float32: (v - group mean) / (group std, ddof=1, + eps), or
    `scale="none"`: v - group mean. A group of one step, or of equal values, has no signal: 0."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale {scale!r} not in {ADVANTAGE_SCALES}")
    chex.assert_rank([values_N, group_ids_N], 1, custom_message="step_group_advantages: [N]")
    chex.assert_equal_shape([values_N, group_ids_N], custom_message="step_group_advantages: [N]")
    values, n, ids = _at_least_float32(values_N), values_N.shape[0], group_ids_N
    total = lambda x: jax.ops.segment_sum(x, ids, n)[ids]  # noqa: E731
    count = total(jnp.ones_like(values))
    equal = jax.ops.segment_max(values, ids, n)[ids] == jax.ops.segment_min(values, ids, n)[ids]
    centred = jnp.where(equal, 0.0, values - total(values) / count)
    if scale == "none":
        return centred
    std = jnp.sqrt(total(centred**2) / jnp.maximum(count - 1.0, 1.0))
    return jnp.where(count > 1, centred / (std + eps), 0.0)


def grpo_loss(
    logps_BxT: jax.Array,
    old_logps_BxT: jax.Array,
    ref_logps_BxT: jax.Array | None,
    advantages: jax.Array,
    loss_mask_BxT: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    beta: float | jax.Array = 1e-3,
    aggregation: str = "token_mean",
    normaliser: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """GRPO's clipped surrogate plus a k3 KL penalty (CoEvolve eq. 1, negated to a loss): (loss, metrics).

    Per action token, with ratio = exp(logps - old_logps) and A the token's advantage (`advantages` [B]: the
    row's, GRPO; [B, T]: per token, e.g. GiGPO's episode plus step advantage of the token's reply):
    pg = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), kl = exp(ref - logps) - (ref -
    logps) - 1, loss_t = pg + beta * kl. `aggregation`: "token_mean" (sum of masked loss_t / masked tokens),
    "sequence_mean" (mean over rows with a masked token of each row's masked mean), "sum_norm" (Dr. GRPO:
    sum of masked loss_t / (B * T)). `normaliser` replaces the denominator (tokens, rows with a token, or
    B * T of the *whole* batch) so that micro-batch losses add up to the whole batch's under gradient
    accumulation; "sequence_mean" then sums its row means over the micro-batch.

    `ref_logps_BxT` may be None only with `beta == 0` (no reference pass; the `kl` metric is then 0).
    Metrics (no gradient) are masked means over action tokens: `ratio`, `abs_log_ratio` (|logps -
    old_logps|: on a batch's first update, how far the trainer's log-probs are from the sampler's), `kl`,
    `pg_loss`, `clip_fraction`
    (tokens whose clipped side was taken: ratio < 1 - clip_low with A < 0, or ratio > 1 + clip_high with
    A > 0; `clip_fraction_low` / `_high` apart), with `token_count` (this batch's action tokens).
    """
    if aggregation not in GRPO_AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r} not in {GRPO_AGGREGATIONS}")
    if ref_logps_BxT is None and not (isinstance(beta, int | float) and beta == 0):
        raise ValueError("grpo_loss without reference log-probs needs beta == 0")
    message = "grpo_loss: log-probs and loss_mask [B, T], advantages [B] or [B, T]"
    token_arrays = [logps_BxT, old_logps_BxT, loss_mask_BxT] + (
        [] if ref_logps_BxT is None else [ref_logps_BxT]
    )
    chex.assert_rank(token_arrays, 2, custom_message=message)
    chex.assert_equal_shape(token_arrays, custom_message=message)
    chex.assert_rank(advantages, {1, 2}, custom_message=message)
    chex.assert_equal_shape(
        [advantages, logps_BxT], dims=tuple(range(advantages.ndim)), custom_message=message
    )
    keep = loss_mask_BxT.astype(bool)
    logps = _at_least_float32(logps_BxT)
    # Masked positions are zeroed before exp, so garbage there never reaches a value or a gradient.
    log_ratio = jnp.where(keep, logps - _at_least_float32(old_logps_BxT), 0.0)
    ratio = jnp.exp(log_ratio)
    advantages = _at_least_float32(advantages)
    advantages = advantages[:, None] if advantages.ndim == 1 else jnp.where(keep, advantages, 0.0)
    unclipped = ratio * advantages
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    pg = -jnp.minimum(unclipped, clipped)
    if ref_logps_BxT is None:
        kl = jnp.zeros_like(pg)
    else:
        ref_minus_policy = jnp.where(keep, _at_least_float32(ref_logps_BxT) - logps, 0.0)
        kl = jnp.exp(ref_minus_policy) - ref_minus_policy - 1.0
    per_token = jnp.where(keep, pg + beta * kl, 0.0)

    tokens_B = jnp.sum(keep.astype(jnp.float32), axis=-1)
    token_count = jnp.sum(tokens_B)
    if aggregation == "token_mean":
        total, default = jnp.sum(per_token), jnp.maximum(token_count, 1.0)
    elif aggregation == "sequence_mean":
        total = jnp.sum(jnp.sum(per_token, axis=-1) / jnp.maximum(tokens_B, 1.0))
        default = jnp.maximum(jnp.sum((tokens_B > 0).astype(jnp.float32)), 1.0)
    else:
        total, default = jnp.sum(per_token), jnp.asarray(float(per_token.size), jnp.float32)
    loss = total / (default if normaliser is None else normaliser)

    def masked_mean(values):
        return jax.lax.stop_gradient(jnp.sum(jnp.where(keep, values, 0.0)) / jnp.maximum(token_count, 1.0))

    low = (ratio < 1.0 - clip_low) & (advantages < 0)
    high = (ratio > 1.0 + clip_high) & (advantages > 0)
    metrics = {
        "ratio": masked_mean(ratio),
        "abs_log_ratio": masked_mean(jnp.abs(log_ratio)),
        "kl": masked_mean(kl),
        "pg_loss": masked_mean(pg),
        "clip_fraction": masked_mean((low | high).astype(jnp.float32)),
        "clip_fraction_low": masked_mean(low.astype(jnp.float32)),
        "clip_fraction_high": masked_mean(high.astype(jnp.float32)),
        "token_count": token_count,
    }
    return loss, metrics


# --- Memory-lean forms: from final hidden states and the unembedding (`coevo_jax.chunked_logprobs`). ---
def sequence_logprobs_from_hidden(
    hidden_BxTxD: jax.Array,
    unembed_DxV: jax.Array,
    targets_BxT: jax.Array,
    loss_mask_BxT: jax.Array,
    chunk_size: int = 1024,
) -> jax.Array:
    """Memory-lean `sequence_logprobs`: log pi(e|u) per sequence from hidden states, [B]."""
    token_logps = token_logprobs_from_hidden(hidden_BxTxD, unembed_DxV, targets_BxT, chunk_size)
    return masked_sum(token_logps, loss_mask_BxT)


def sft_terms_from_hidden(
    hidden_BxTxD: jax.Array,
    unembed_DxV: jax.Array,
    targets_BxT: jax.Array,
    loss_mask_BxT: jax.Array,
    chunk_size: int = 1024,
) -> SFTTerms:
    """Memory-lean `sft_terms`: (sum of NLL, token count) from hidden states."""
    token_logps = token_logprobs_from_hidden(hidden_BxTxD, unembed_DxV, targets_BxT, chunk_size)
    return sft_terms_from_token_logprobs(token_logps, loss_mask_BxT)

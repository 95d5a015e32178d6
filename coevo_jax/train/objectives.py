"""Per-micro-batch objectives of the three train steps, built only from `coevo_jax.losses`.

* `sft_objective`: eq. 3 in its token form eq. 5, behavioural cloning (base policies, RFT);
* `dpo_objective`: eq. 7, DPO (the failure agent on D_fail; ETO and the positive agent on expert pairs);
* `coevo_objective`: eq. 9, per-pair weighted DPO plus auxiliary SFT on the chosen side (the target agent);
* `grpo_objective`: GRPO (CoEvolve eq. 1), the clipped surrogate on sampled episodes with a k3 KL penalty
  to a reference, log-probs of the temperature-scaled distribution the sampler drew from.

Each takes the decoder, one micro-batch, the whole batch's normaliser, the static settings, DPO's beta (a
traced scalar, so one compiled step serves phases of different beta; read by eq. 7/9 only) and a dropout key
(the LoRA adapters' dropout; None in passes that must be deterministic, like the reference log-probs), and
returns (this micro-batch's share of the batch loss, metric sums). The share is a *sum* over the
micro-batch divided by the whole batch's normaliser (action tokens for eq. 3/5, valid pairs for eq. 7/9,
GRPO's aggregation denominator), so adding the shares and their gradients over micro-batches gives exactly
the full-batch mean.

Batches are in device layout (`coevo_jax.sharding.device_layout`), one micro-batch at a time: sequence
entries [R, L]; DPO rows in `collate_dpo`'s layout (chosen_0, rejected_0, chosen_1, ...), per-pair entries [P].
Log-probs come from hidden states a chunk of tokens at a time (never [R, L, V] logits at once).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from coevo_jax import losses
from coevo_jax.models import Decoder


@dataclasses.dataclass(frozen=True)
class GRPOObjective:
    """Static GRPO loss settings (`losses.grpo_loss`) and the sampling temperature its log-probs are of.

    `beta` 0 drops the KL term, and with it the reference log-probs from the batch (no reference pass)."""

    clip_low: float = 0.2
    clip_high: float = 0.28
    beta: float = 1e-3
    aggregation: str = "token_mean"
    temperature: float = 0.9

    def __post_init__(self):
        if self.aggregation not in losses.GRPO_AGGREGATIONS:
            raise ValueError(f"aggregation {self.aggregation!r} not in {losses.GRPO_AGGREGATIONS}")
        if self.temperature <= 0 or self.beta < 0 or not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError(f"invalid GRPO settings: {self}")


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """Static loss settings: eq. 9 SFT normalisation, log-prob chunk length (tokens per row), whether the
    backward pass keeps the forward's logits (`losses.token_logprobs_from_hidden`: None keeps them up to
    `chunked_logprobs.KEEP_LOGITS_MAX_BYTES`), GRPO's settings. DPO's beta varies by phase and comes to the
    objectives as an argument."""

    sft_per_token: bool = False
    logprob_chunk_size: int = 1024
    keep_logits: bool | None = None
    grpo: GRPOObjective = GRPOObjective()


def token_logprobs(
    model: Decoder,
    batch: dict,
    chunk_size: int,
    dropout_key=None,
    temperature: float = 1.0,
    keep_logits: bool | None = None,
) -> jax.Array:
    """log pi(targets | prefix) per position, [R, L] float32, memory-lean per row; with `temperature`, of
    softmax(logits / temperature)."""
    hidden_RxLxD = model.hidden_states(batch["input_ids"], batch["attention_mask"], dropout_key)
    unembed_DxV = model.unembedding
    # `chunk_size` is per row: every chunk of the scan holds chunk_size positions of all rows at once.
    tokens_per_chunk = chunk_size * hidden_RxLxD.shape[0]
    return losses.token_logprobs_from_hidden(
        hidden_RxLxD,
        unembed_DxV,
        batch["targets"],
        tokens_per_chunk,
        keep_logits=keep_logits,
        temperature=temperature,
        softcap=model.config.final_logit_softcap,
    )


def pair_logprobs(
    model: Decoder, batch: dict, chunk_size: int, dropout_key=None, keep_logits: bool | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(chosen, rejected) sequence log-probs [P] (eq. 2/4) and chosen action-token counts [P].

    Rows 2p and 2p + 1 are pair p's chosen and rejected sides (`coevo_jax.data.batching.collate_dpo`).
    """
    token_logps_RxL = token_logprobs(model, batch, chunk_size, dropout_key, keep_logits=keep_logits)
    seq_logps_R = losses.masked_sum(token_logps_RxL, batch["loss_mask"])
    pairs_Px2 = seq_logps_R.reshape(-1, 2)
    token_counts_Px2 = jnp.sum(batch["loss_mask"].astype(jnp.float32), axis=-1).reshape(-1, 2)
    return pairs_Px2[:, 0], pairs_Px2[:, 1], token_counts_Px2[:, 0]


def sft_objective(
    model: Decoder,
    batch: dict,
    total_tokens: jax.Array,
    cfg: ObjectiveConfig,
    beta: jax.Array,
    dropout_key=None,
):
    """Eq. 3/5: summed action-token NLL of the micro-batch / action tokens of the whole batch (no beta)."""
    del beta
    terms = losses.sft_terms_from_token_logprobs(
        token_logprobs(model, batch, cfg.logprob_chunk_size, dropout_key, keep_logits=cfg.keep_logits),
        batch["loss_mask"],
    )
    return terms.nll_sum / total_tokens, {"nll_sum": terms.nll_sum, "token_count": terms.token_count}


def _pair_sums(dpo: losses.DPOOutput, chosen, rejected, mask) -> dict[str, jax.Array]:
    masked = lambda x: jnp.sum(jnp.where(mask > 0, x, 0.0))
    return {
        "dpo_loss_sum": masked(dpo.losses),
        "reward_accuracy_sum": masked(dpo.reward_accuracies),
        "reward_margin_sum": masked(dpo.reward_margins),
        "chosen_reward_sum": masked(dpo.chosen_rewards),
        "rejected_reward_sum": masked(dpo.rejected_rewards),
        "chosen_logps_sum": masked(jax.lax.stop_gradient(chosen)),
        "rejected_logps_sum": masked(jax.lax.stop_gradient(rejected)),
        "pair_count": jnp.sum(mask.astype(jnp.float32)),
    }


def dpo_objective(
    model: Decoder,
    batch: dict,
    total_pairs: jax.Array,
    cfg: ObjectiveConfig,
    beta: jax.Array,
    dropout_key=None,
):
    """Eq. 7: DPO against cached reference log-probs, summed over valid pairs / valid pairs of the batch."""
    chosen, rejected, _ = pair_logprobs(model, batch, cfg.logprob_chunk_size, dropout_key, cfg.keep_logits)
    dpo = losses.dpo_loss(chosen, rejected, batch["ref_chosen_logps"], batch["ref_rejected_logps"], beta)
    sums = _pair_sums(dpo, chosen, rejected, batch["pair_mask"])
    return sums["dpo_loss_sum"] / total_pairs, sums


def coevo_objective(
    model: Decoder,
    batch: dict,
    total_pairs: jax.Array,
    cfg: ObjectiveConfig,
    beta: jax.Array,
    dropout_key=None,
):
    """Eq. 9: lambda_dpo * DPO + lambda_sft * chosen NLL per pair, summed / valid pairs of the batch."""
    chosen, rejected, chosen_counts = pair_logprobs(
        model, batch, cfg.logprob_chunk_size, dropout_key, cfg.keep_logits
    )
    out = losses.coevo_loss(
        chosen,
        rejected,
        batch["ref_chosen_logps"],
        batch["ref_rejected_logps"],
        chosen_counts,
        batch["lambda_dpo"],
        batch["lambda_sft"],
        beta,
        pair_mask=batch["pair_mask"],
        sft_per_token=cfg.sft_per_token,
    )
    sums = _pair_sums(out.dpo, chosen, rejected, batch["pair_mask"])
    sums["sft_nll_sum"] = jnp.sum(jnp.where(batch["pair_mask"] > 0, out.sft_nll, 0.0))
    # The paper calls eq. 9 L_target; results.json records it as `final_target_loss`.
    sums["target_loss_sum"] = jax.lax.stop_gradient(out.loss_sum)
    return out.loss_sum / total_pairs, sums


GRPO_METRICS = (
    "ratio",
    "abs_log_ratio",
    "kl",
    "pg_loss",
    "clip_fraction",
    "clip_fraction_low",
    "clip_fraction_high",
)


def grpo_objective(
    model: Decoder,
    batch: dict,
    normaliser: jax.Array,
    cfg: ObjectiveConfig,
    beta: jax.Array,
    dropout_key=None,
):
    """GRPO: the micro-batch's summed per-token loss / the whole batch's aggregation denominator.

    Log-probs are of softmax(logits / `cfg.grpo.temperature`), the distribution the sampler drew the
    tokens from, so that before any update the ratio to the sampler's `old_logps` is 1 up to numerics.
    Metric sums are per action token (divided by the batch's `token_count` afterwards). DPO's `beta` is
    not GRPO's (`cfg.grpo.beta`, static: at 0 the batch has no reference log-probs).
    """
    del beta
    grpo = cfg.grpo
    logps = token_logprobs(
        model, batch, cfg.logprob_chunk_size, dropout_key, grpo.temperature, cfg.keep_logits
    )
    loss, metrics = losses.grpo_loss(
        logps,
        batch["old_logps"],
        batch["ref_logps"] if grpo.beta > 0 else None,
        batch["advantages"],
        batch["loss_mask"],
        clip_low=grpo.clip_low,
        clip_high=grpo.clip_high,
        beta=grpo.beta,
        aggregation=grpo.aggregation,
        normaliser=normaliser,
    )
    count = metrics["token_count"]
    sums = {f"{name}_sum": metrics[name] * count for name in GRPO_METRICS}
    sums["token_count"] = count
    sums["episode_count"] = jnp.sum(batch["example_mask"].astype(jnp.float32))
    return loss, sums

"""Reference log-probs of eq. 7/9 and of GRPO's KL term, computed once per batch and stored with it.

The reference policy is the policy as it stands when a phase starts, so instead of keeping a frozen copy
of its parameters on device, each pair's log pi_ref(chosen|u) and log pi_ref(rejected|u) are computed by
one forward pass before the first update and carried in the batch (`ref_chosen_logps`,
`ref_rejected_logps`); the DPO steps then run forward/backward of the policy only. GRPO's reference (the
SFT policy) scores each batch of sampled episodes once, per token (`ref_logps`), before its updates.
"""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import Mesh

from coevo_jax.models import bind
from coevo_jax.sharding import ShardingRules, activation_context
from coevo_jax.train.objectives import ObjectiveConfig, pair_logprobs, token_logprobs


def reference_logprobs(
    params: dict,
    batch: dict,
    *,
    graphdef: nnx.GraphDef,
    cfg: ObjectiveConfig,
    mesh: Mesh,
    rules: ShardingRules,
    compute_shardings=None,
) -> tuple[jax.Array, jax.Array]:
    """(chosen, rejected) sequence log-probs [K, P] of a device-layout DPO batch, no gradient."""
    params = jax.lax.stop_gradient(params)

    def micro_batch_logprobs(micro_batch):
        # Bound inside the mapped body, as the train steps do (its parameters come in as traced values).
        model = bind(graphdef, params, compute_shardings)
        return pair_logprobs(model, micro_batch, cfg.logprob_chunk_size)[:2]

    with activation_context(mesh, rules):
        chosen, rejected = jax.lax.map(micro_batch_logprobs, batch)
    return chosen, rejected


def reference_token_logprobs(
    params: dict,
    batch: dict,
    *,
    graphdef: nnx.GraphDef,
    cfg: ObjectiveConfig,
    mesh: Mesh,
    rules: ShardingRules,
    compute_shardings=None,
) -> jax.Array:
    """Per-token log-probs [K, R, L] of a device-layout sequence batch at GRPO's temperature, no gradient."""
    params = jax.lax.stop_gradient(params)

    def micro_batch_logprobs(micro_batch):
        model = bind(graphdef, params, compute_shardings)
        return token_logprobs(model, micro_batch, cfg.logprob_chunk_size, temperature=cfg.grpo.temperature)

    with activation_context(mesh, rules):
        return jax.lax.map(micro_batch_logprobs, batch)

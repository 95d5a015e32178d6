"""Shared helpers for the sharding / train / checkpoint tests: a tiny model, meshes and synthetic batches.

Batches are built with the real collators of `coevo_jax.data.batching` from random token sequences, so the
tests exercise the exact layout the training loop will see.
"""

from __future__ import annotations

import jax
import numpy as np

from coevo_jax import sharding
from coevo_jax.data.batching import TokenizedPair, collate_dpo, collate_sft
from coevo_jax.data.chat_format import TokenizedTrajectory
from coevo_jax.models import ModelConfig, abstract_model
from coevo_jax.train import ObjectiveConfig, OptimizerConfig, build_steps, make_optimizer, phase_scalars
from coevo_jax.train.state import init_train_state, state_shardings

TINY = ModelConfig(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    model_type="llama",
)
PAD = 0
# The four layouts every sharded step must agree on (8 fake CPU devices).
MESHES = {
    "data8": (("data", 8), ("fsdp", 1), ("tensor", 1)),
    "data2_fsdp4": (("data", 2), ("fsdp", 4), ("tensor", 1)),
    "fsdp4_tensor2": (("data", 1), ("fsdp", 4), ("tensor", 2)),
    "cube2": (("data", 2), ("fsdp", 2), ("tensor", 2)),
}
OPT = OptimizerConfig(learning_rate=1e-3, weight_decay=0.01, grad_clip_norm=1.0, warmup_steps=0)
OBJ = ObjectiveConfig(logprob_chunk_size=16)
BETA = 0.1  # DPO's, of every DPO / eq. 9 step here
SCALARS = phase_scalars(OPT, BETA)  # the per-phase arguments of the steps: OPT's schedule and BETA


def mesh_of(axes, num_devices: int | None = None):
    devices = jax.devices() if num_devices is None else jax.devices()[:num_devices]
    return sharding.make_mesh(sharding.MeshConfig(axes=axes), devices)


def single_mesh():
    return mesh_of((("data", 1), ("fsdp", 1), ("tensor", 1)), 1)


def trajectory(rng: np.random.RandomState, length: int) -> TokenizedTrajectory:
    """Random tokens; the second half is the 'action' part."""
    ids = rng.randint(1, TINY.vocab_size, size=length).astype(np.int32)
    mask = np.zeros(length, bool)
    mask[length // 2 :] = True
    return TokenizedTrajectory(ids, mask)


def sft_batch(seed: int, *, rows: int = 8, length: int = 32, real: int | None = None) -> dict:
    rng = np.random.RandomState(seed)
    real = rows if real is None else real
    examples = [trajectory(rng, int(rng.randint(length // 2, length + 1))) for _ in range(real)]
    return collate_sft(examples, length=length, batch_size=rows, pad_id=PAD)


def pairs(seed: int, count: int, length: int = 32) -> list[TokenizedPair]:
    rng = np.random.RandomState(seed)
    out = []
    for k in range(count):
        weights = (0.5, 0.5) if k % 2 == 0 else (1.0, 0.0)
        chosen = trajectory(rng, int(rng.randint(length // 2, length + 1)))
        rejected = trajectory(rng, int(rng.randint(length // 2, length + 1)))
        out.append(TokenizedPair(chosen, rejected, *weights))
    return out


def dpo_batch(seed: int, *, pairs_per_batch: int = 8, length: int = 32, real: int | None = None) -> dict:
    real = pairs_per_batch if real is None else real
    return collate_dpo(pairs(seed, real, length), length=length, pairs_per_batch=pairs_per_batch, pad_id=PAD)


_OPTIMIZERS: dict = {}


def optimizer(opt: OptimizerConfig = OPT):
    """One optax transformation per AdamW settings, so jitted initializers are compiled once per test
    session."""
    adamw = opt.adamw_settings()
    return _OPTIMIZERS.setdefault(adamw, make_optimizer(adamw))


def setup(
    mesh,
    model_cfg: ModelConfig = TINY,
    opt: OptimizerConfig = OPT,
    obj: ObjectiveConfig = OBJ,
    return_grads: bool = False,
):
    """(graphdef, shardings, steps, tx, rules) for a tiny policy on `mesh` with the default rules; `opt`'s
    AdamW settings (its schedule is the steps' `phase_scalars(opt, beta)` argument)."""
    rules = sharding.ShardingRules()
    tx = optimizer(opt)
    graphdef, _ = abstract_model(model_cfg)
    shardings = state_shardings(model_cfg, tx, mesh, rules)
    steps = build_steps(graphdef, tx, shardings, mesh, rules, obj, return_grads=return_grads)
    return graphdef, shardings, steps, tx, rules


def fresh_state(shardings, model_cfg: ModelConfig = TINY, opt: OptimizerConfig = OPT, seed: int = 0):
    return init_train_state(model_cfg, optimizer(opt), shardings, jax.random.key(seed))


def to_numpy(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


def placed(batch: dict, mesh, rules, num_microbatches: int = 1) -> dict:
    """A collated batch in device layout on `mesh`."""
    return sharding.place_batch(sharding.device_layout(batch, num_microbatches), mesh, rules)


def with_reference(steps, state, batch: dict) -> dict:
    """A placed DPO batch with the reference log-probs of `state`'s current parameters attached."""
    chosen, rejected = steps.reference(state.params, batch)
    return {**batch, "ref_chosen_logps": chosen, "ref_rejected_logps": rejected}

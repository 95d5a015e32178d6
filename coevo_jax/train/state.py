"""Train state of one policy and its creation directly into shardings (never whole on one device).

A policy is a static NNX `GraphDef` (kept outside any pytree) plus its parameters as a pure nested dict
(what `nnx.merge(graphdef, params)` takes). Its `TrainState` pytree holds the step counter, the *trainable*
parameters and their optax state: every parameter in full fine-tuning; only the LoRA adapters when
`ModelConfig.lora_rank` > 0, whose frozen base stays outside the state (no gradient, no optimizer moments;
`models.partition_trainable` splits a policy's parameters into the two). Shapes come first
(`jax.eval_shape`), shardings follow from the logical-axis rules, and the state is built by a jitted
initializer with those `out_shardings`, or loaded tensor by tensor through `load_pretrained`'s `place`
callback.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from coevo_jax.checkpoint_formats import load_pretrained
from coevo_jax.models import Decoder, ModelConfig, abstract_model, partition_trainable
from coevo_jax.sharding import ShardingRules, checked_sharding, param_shardings, replicated


@flax.struct.dataclass
class TrainState:
    """One policy's trainable state: `step` (int32 scalar), `params` (the trainable parameters, pure dict),
    `opt_state` (optax)."""

    step: jax.Array
    params: dict
    opt_state: optax.OptState


def opt_state_shardings(tx: optax.GradientTransformation, params_shardings: dict, abstract_params, mesh):
    """Optimizer-state shardings: moments like their parameters, everything else (counts) replicated."""
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
    return optax.tree_utils.tree_map_params(
        tx,
        lambda _, sharding: sharding,
        abstract_opt,
        params_shardings,
        transform_non_params=lambda _: replicated(mesh),
    )


def policy_shardings(model_cfg: ModelConfig, mesh: Mesh, rules: ShardingRules) -> dict:
    """NamedShardings of all the policy's parameters (with LoRA: base and adapters)."""
    _, abstract = abstract_model(model_cfg)
    return param_shardings(abstract, mesh, rules)


def state_shardings(
    model_cfg: ModelConfig, tx: optax.GradientTransformation, mesh: Mesh, rules: ShardingRules
) -> TrainState:
    """A `TrainState` of NamedShardings; raises ValueError naming a parameter whose dims do not divide."""
    params_sh, _ = partition_trainable(policy_shardings(model_cfg, mesh, rules), model_cfg)
    return TrainState(
        step=replicated(mesh),
        params=params_sh,
        opt_state=opt_state_shardings(tx, params_sh, abstract_params_of(model_cfg), mesh),
    )


def abstract_params_of(model_cfg: ModelConfig) -> dict:
    """Pure dict of ShapeDtypeStructs of the trainable parameters."""
    return partition_trainable(nnx.to_pure_dict(abstract_model(model_cfg)[1]), model_cfg)[0]


def abstract_state(model_cfg: ModelConfig, tx, shardings: TrainState) -> TrainState:
    """ShapeDtypeStructs (with shardings) of a whole TrainState: the restore target of a checkpoint."""
    params = abstract_params_of(model_cfg)
    shapes = TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32), params=params, opt_state=jax.eval_shape(tx.init, params)
    )
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


_JITTED_INITS: dict = {}


def _init_params(model_cfg: ModelConfig, key: jax.Array) -> dict:
    return nnx.to_pure_dict(nnx.state(Decoder(model_cfg, rngs=nnx.Rngs(params=key)), nnx.Param))


def init_params(model_cfg: ModelConfig, param_shardings: dict, key: jax.Array) -> dict:
    """Freshly initialised parameters (pure dict), each array created directly in its sharding."""
    leaves, treedef = jax.tree.flatten(param_shardings)
    cache_key = ("params", model_cfg, treedef, tuple(leaves))
    if cache_key not in _JITTED_INITS:
        _JITTED_INITS[cache_key] = jax.jit(
            lambda k: _init_params(model_cfg, k), out_shardings=param_shardings
        )
    return _JITTED_INITS[cache_key](key)


def init_adapters(model_cfg: ModelConfig, adapter_shardings: dict, key: jax.Array) -> dict:
    """The fresh LoRA adapters (A drawn, B = 0) of `init_params(model_cfg, ..., key)`, in their shardings.

    Only the adapters are returned, so XLA drops the base's initialisation: a new adapter for an existing
    (loaded, shared) base costs no base-sized allocation.
    """
    leaves, treedef = jax.tree.flatten(adapter_shardings)
    cache_key = ("adapters", model_cfg, treedef, tuple(leaves))
    if cache_key not in _JITTED_INITS:
        _JITTED_INITS[cache_key] = jax.jit(
            lambda k: partition_trainable(_init_params(model_cfg, k), model_cfg)[0],
            out_shardings=adapter_shardings,
        )
    return _JITTED_INITS[cache_key](key)


def _jitted_once(kind: str, build, model_cfg, tx, shardings: TrainState):
    """One jitted initializer per (kind, config, optimizer, shardings): both policies share its compile."""
    leaves, treedef = jax.tree.flatten(shardings)
    key = (kind, model_cfg, tx, treedef, tuple(leaves))
    if key not in _JITTED_INITS:
        donate = (0,) if kind == "wrap" else ()  # wrapping loaded params must not copy them
        _JITTED_INITS[key] = jax.jit(build(model_cfg, tx), out_shardings=shardings, donate_argnums=donate)
    return _JITTED_INITS[key]


def _fresh_init(model_cfg: ModelConfig, tx):
    def init(key):
        params = _init_params(model_cfg, key)
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    return init


def _wrap_params(model_cfg: ModelConfig, tx):
    del model_cfg

    def init(params):
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    return init


def init_train_state(
    model_cfg: ModelConfig, tx: optax.GradientTransformation, shardings: TrainState, key: jax.Array
) -> TrainState:
    """A freshly initialised full fine-tuning state, each array created directly in its sharding.

    A LoRA state starts from a base: `train_state_from_params` on the adapters of `init_params` (or of a
    loaded base with `init_adapters`)."""
    if model_cfg.lora_rank:
        raise ValueError("init_train_state: LoRA adapters start from a base; use train_state_from_params")
    return _jitted_once("fresh", _fresh_init, model_cfg, tx, shardings)(key)


def train_state_from_params(
    params: dict, tx: optax.GradientTransformation, shardings: TrainState
) -> TrainState:
    """A step-0 state around existing (already placed) trainable parameters, which it takes over (donated)."""
    return _jitted_once("wrap", _wrap_params, None, tx, shardings)(params)


def sharded_place(mesh: Mesh, rules: ShardingRules):
    """A `load_pretrained` `place` callback putting each tensor straight into its sharding.

    Uses `make_array_from_callback`, so on several hosts each process only copies its own shards.
    """

    def place(name: str, value: np.ndarray, logical_axes: tuple[str, ...]) -> jax.Array:
        sharding: NamedSharding = checked_sharding(name, value.shape, logical_axes, mesh, rules.params)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return place


def load_sharded(
    path: str, mesh: Mesh, rules: ShardingRules, *, dtype=None, param_dtype=None, remat=None, adapter=None
):
    """(model config, graphdef, params dict, tokenizer) of an HF directory or GGUF file, loaded sharded
    (with `adapter`, a PEFT adapter directory on top: see `load_pretrained`)."""
    model, tokenizer = load_pretrained(
        path, dtype=dtype, param_dtype=param_dtype, place=sharded_place(mesh, rules), adapter=adapter
    )
    cfg = model.config if remat is None else model.config.replace(remat=remat)
    graphdef, _ = abstract_model(cfg)
    return cfg, graphdef, nnx.to_pure_dict(nnx.state(model, nnx.Param)), tokenizer

"""LoRA adapters of the decoder (Hu et al., 2021): their parameters, their forward term, and their merge.

A target projection (`ModelConfig.lora_targets`: q, k, v, o, gate, up, down) with base kernel W, stored
[in..., out...] (q: [D, H, E], o: [H, E, D], gate: [D, F]), gets two adapter matrices A [in..., r] and
B [r, out...]. They are `nnx.LoRAParam`s (a subclass of `nnx.Param`, so `nnx.state(model, nnx.Param)` still
holds the whole policy and `nnx.LoRAParam` filters the adapters out of it), and their logical axes are W's
input and output axes plus 'lora_rank' (never sharded): an adapter is sharded like its base weight. The
projection becomes

    x W + (alpha / r) * dropout(x) A B,

PEFT's LoRA exactly: A is drawn like PEFT's (Kaiming-uniform, bound 1 / sqrt(fan_in)) and B starts at
zero, so a fresh adapter leaves the model unchanged. Dropout acts only when a train step passes a key.

Adapters are added after every base parameter was drawn (`add_adapters`), so a LoRA decoder built from
the same key has exactly the base decoder's weights. `merged_params` folds trained adapters into the base
weights (W + alpha / r * A B) for a decoder of `cfg.without_lora()`: sampling without the adapters' extra
matmuls, and the merged Hugging Face export.

Shape legend: L layers, M the leading axes of an input, K the (flattened) input features, N the (flattened) output
features, r the rank.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from coevo_jax.models.config import LORA_TARGETS, ModelConfig
from coevo_jax.models.dense import dense
from coevo_jax.models.kernels import kernel_set

# target -> (sub-module of a Block, its base kernel, how many leading kernel axes are input axes)
SITES = {
    "q": ("attn", "q_kernel", 1),
    "k": ("attn", "k_kernel", 1),
    "v": ("attn", "v_kernel", 1),
    "o": ("attn", "o_kernel", 2),
    "gate": ("mlp", "gate_kernel", 1),
    "up": ("mlp", "up_kernel", 1),
    "down": ("mlp", "down_kernel", 1),
}
RANK_AXIS = "lora_rank"  # logical name of the rank dimension (replicated by the sharding rules)


def adapter_name(target: str) -> str:
    """The attribute (and parameter path element) of `target`'s adapter in its Attention / MLP module."""
    return f"{target}_lora"


def _lora_param(value: jax.Array, logical_axes: tuple[str, ...]) -> nnx.LoRAParam:
    return nnx.LoRAParam(value, eager_sharding=False, out_sharding=logical_axes)


class LoRA(nnx.Module):
    """The adapter of one base kernel: `__call__(x)` is the term added to that projection's output."""

    def __init__(self, kernel: nnx.Param, input_axes: int, cfg: ModelConfig, salt: int, key: jax.Array):
        shape = kernel.get_value().shape
        axes = tuple(kernel.get_metadata()["out_sharding"])
        rank, dtype = cfg.lora_rank, cfg.param_dtype
        bound = 1.0 / math.sqrt(math.prod(shape[:input_axes]))
        a = jax.random.uniform(key, (*shape[:input_axes], rank), jnp.float32, -bound, bound).astype(dtype)
        self.a = _lora_param(a, (*axes[:input_axes], RANK_AXIS))
        self.b = _lora_param(jnp.zeros((rank, *shape[input_axes:]), dtype), (RANK_AXIS, *axes[input_axes:]))
        self.scale = cfg.lora_scale
        self.dropout = cfg.lora_dropout
        self.salt = salt  # folded into the layer's dropout key: every adapter drops its own units
        self.kernels = kernel_set(cfg)  # its products go where its base projection's go

    def matrices(self) -> tuple[jax.Array, jax.Array]:
        """(A [K, r], B [r, N]): the adapter as two plain matrices."""
        a, b = self.a[...], self.b[...]
        return a.reshape(-1, a.shape[-1]), b.reshape(b.shape[0], -1)

    def __call__(self, x_MxK: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
        """alpha / r * dropout(x) A B, [..., N] in x's dtype; dropout only with a key and a rate > 0."""
        if dropout_key is not None and self.dropout > 0:
            keep = 1.0 - self.dropout
            kept_MxK = jax.random.bernoulli(jax.random.fold_in(dropout_key, self.salt), keep, x_MxK.shape)
            x_MxK = jnp.where(kept_MxK, x_MxK / keep, 0).astype(x_MxK.dtype)
        a_KxR, b_RxN = self.matrices()
        x_MxR = dense(x_MxK, a_KxR, self.kernels)
        return dense(x_MxR, b_RxN, self.kernels) * jnp.asarray(self.scale, x_MxK.dtype)


def add_adapters(blocks, cfg: ModelConfig, rngs: nnx.Rngs) -> None:
    """Gives every target projection of each of the decoder's `blocks` a fresh adapter, layer by layer."""
    for block in blocks:
        for salt, target in enumerate(LORA_TARGETS):
            if target in cfg.lora_targets:
                part, kernel, input_axes = SITES[target]
                module = getattr(block, part)
                if getattr(module, kernel, None) is None:  # keys-as-values, KV sharing, linear layers: none
                    continue
                adapter = LoRA(getattr(module, kernel), input_axes, cfg, salt, rngs.params())
                setattr(module, adapter_name(target), nnx.data(adapter))


def merged_params(params: dict, cfg: ModelConfig) -> dict:
    """The parameters of a decoder of `cfg.without_lora()`: each target kernel W + alpha / r * A B.

    A pure function of the pure parameter dict (jit it to merge on device, in the weights' shardings); the
    sum is formed in float32 and stored in W's dtype.
    """
    if not cfg.lora_rank:
        return params
    if cfg.layer_types:  # one stack per kind of layer
        return {
            **params,
            "layers": {kind: _merged_stack(stack, cfg) for kind, stack in params["layers"].items()},
        }
    return {**params, "layers": _merged_stack(params["layers"], cfg)}


def _merged_stack(stack: dict, cfg: ModelConfig) -> dict:
    """One stack of blocks' parameters with each adapter it holds folded into its kernel."""
    layers = {part: dict(values) if isinstance(values, dict) else values for part, values in stack.items()}
    for target in cfg.lora_targets:
        part, kernel, _ = SITES[target]
        if adapter_name(target) not in layers[part]:  # the kind has no such projection
            continue
        adapter = layers[part].pop(adapter_name(target))
        w = layers[part][kernel]
        a_LxKxR = adapter["a"].reshape(w.shape[0], -1, cfg.lora_rank).astype(jnp.float32)
        b_LxRxN = adapter["b"].reshape(w.shape[0], cfg.lora_rank, -1).astype(jnp.float32)
        delta = (cfg.lora_scale * jnp.einsum("lkr,lrn->lkn", a_LxKxR, b_LxRxN)).reshape(w.shape)
        layers[part][kernel] = (w.astype(jnp.float32) + delta).astype(w.dtype)
    return layers

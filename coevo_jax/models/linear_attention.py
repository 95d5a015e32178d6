"""Qwen3.5's linear-attention layer (Gated DeltaNet): the token mixer of its `linear_attention` blocks.

One projection gives the queries, keys and values, mixed along time by a causal depthwise convolution of
width W and a SiLU; each value head then runs the gated delta rule (`gated_delta_rule`) with a decay and
a write strength of its own per token; the output is RMS-normed per head, gated by SiLU of a second
projection and projected back. Key heads serve consecutive groups of value heads (as grouped-query
attention's key/value heads serve query heads).

Instead of a KV cache a layer keeps a fixed-size state (`init_state`): its last W - 1 convolution inputs and
its delta-rule state. A chunk is appended to it exactly as if the chunk's padding tokens (mask 0) were
absent: each row's valid tokens are moved to its front first, so they convolve with the tokens before
them and the padding after them changes nothing (decay 0, write strength 0), and the outputs are moved
back. A full-sequence pass is a chunk appended to an empty state.

Shape legend: B batch, T length, D hidden_size, C = 2 Hk Ek + H Ev convolved features, W conv width,
Hk key heads, H value heads, Ek key head_dim, Ev value head_dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from coevo_jax.models.config import ModelConfig
from coevo_jax.models.dense import dense
from coevo_jax.models.gated_delta_rule import gated_delta_rule
from coevo_jax.models.kernels import kernel_set
from coevo_jax.models.layers import RMSNorm, normal, param


def init_state(cfg: ModelConfig, batch: int, dtype) -> tuple[jax.Array, jax.Array]:
    """An empty state of one linear-attention layer: (conv inputs [B, W - 1, C] in `dtype`, delta-rule state
    [B, H, Ek, Ev] in float32)."""
    conv = jnp.zeros((batch, cfg.linear_conv_width - 1, _conv_features(cfg)), dtype)
    heads = (batch, cfg.linear_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
    return conv, jnp.zeros(heads, jnp.float32)


def _conv_features(cfg: ModelConfig) -> int:
    return (
        2 * cfg.linear_key_heads * cfg.linear_key_head_dim
        + cfg.linear_value_heads * cfg.linear_value_head_dim
    )


class LinearAttention(nnx.Module):
    """Gated DeltaNet; called like `blocks.Attention`, with its state where attention takes a cache."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, pd = cfg.hidden_size, cfg.param_dtype
        heads, ev, c = cfg.linear_value_heads, cfg.linear_value_head_dim, _conv_features(cfg)
        self.qkv_kernel = param(normal(rngs, (d, c), pd), ("embed", "linear_qkv"))
        self.z_kernel = param(normal(rngs, (d, heads, ev), pd), ("embed", "q_heads", "head_dim"))
        self.beta_kernel = param(normal(rngs, (d, heads), pd), ("embed", "q_heads"))
        self.decay_kernel = param(normal(rngs, (d, heads), pd), ("embed", "q_heads"))
        self.conv_kernel = param(normal(rngs, (cfg.linear_conv_width, c), pd), ("norm", "linear_qkv"))
        self.dt_bias = param(jnp.ones((heads,), pd), ("q_heads",))
        a = jax.random.uniform(rngs.params(), (heads,), jnp.float32, 1.0, 16.0)
        self.a_log = param(jnp.log(a).astype(pd), ("q_heads",))
        self.norm = RMSNorm(ev, cfg.rms_norm_eps, dtype=cfg.dtype, param_dtype=pd)
        self.out_kernel = param(normal(rngs, (heads, ev, d), pd), ("q_heads", "head_dim", "embed"))
        self.config = cfg
        self.dtype = cfg.dtype
        self.kernels = kernel_set(cfg)

    def __call__(
        self, x_BxTxD, positions_BxT, mask_BxT, state=None, slots_BxT=None, dropout_key=None, shared_kv=None
    ):
        """(output [B, T, D], the state after the chunk or None without one, None). `mask_BxT` is the chunk's
        token mask; `state` (`init_state`) the layer's state before it (None: empty, and none returned)."""
        del positions_BxT, slots_BxT, dropout_key, shared_kv
        cfg = self.config
        batch, length, _ = x_BxTxD.shape
        mask_BxT = mask_BxT.astype(jnp.int32)
        order_BxT = jnp.argsort(1 - mask_BxT, axis=1, stable=True)  # each row's valid tokens first
        front = lambda a: jnp.take_along_axis(
            a, order_BxT.reshape(batch, length, *[1] * (a.ndim - 2)), axis=1
        )
        mask_BxT = front(mask_BxT)
        live_BxTx1 = mask_BxT[..., None].astype(self.dtype)
        x_BxTxD = front(x_BxTxD) * live_BxTx1
        conv_state, delta_state = init_state(cfg, batch, self.dtype) if state is None else state
        qkv_BxTxC, conv_state = self._convolve(
            dense(x_BxTxD, self.qkv_kernel[...], self.kernels), conv_state, mask_BxT
        )
        hk, ek, h, ev = (
            cfg.linear_key_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_heads,
            cfg.linear_value_head_dim,
        )
        q, k, v = jnp.split(qkv_BxTxC, [hk * ek, 2 * hk * ek], axis=-1)
        q_BxTxHxEk, k_BxTxHxEk = (
            jnp.repeat(a.reshape(batch, length, hk, ek), h // hk, axis=2) for a in (q, k)
        )
        v_BxTxHxEv = v.reshape(batch, length, h, ev)
        live_BxTx1 = live_BxTx1.astype(jnp.float32)
        beta_BxTxH = jax.nn.sigmoid(dense(x_BxTxD, self.beta_kernel[...], self.kernels).astype(jnp.float32))
        decay_in_BxTxH = dense(x_BxTxD, self.decay_kernel[...], self.kernels).astype(jnp.float32)
        rate_H = jnp.exp(self.a_log[...].astype(jnp.float32))
        g_BxTxH = -rate_H * jax.nn.softplus(decay_in_BxTxH + self.dt_bias[...].astype(jnp.float32))
        out_BxTxHxEv, delta_state = gated_delta_rule(
            q_BxTxHxEk, k_BxTxHxEk, v_BxTxHxEv, g_BxTxH * live_BxTx1, beta_BxTxH * live_BxTx1, delta_state
        )
        z_BxTxHxEv = dense(x_BxTxD, self.z_kernel[...].reshape(x_BxTxD.shape[-1], h * ev), self.kernels)
        gate_BxTxHxEv = jax.nn.silu(z_BxTxHxEv.reshape(batch, length, h, ev).astype(jnp.float32))
        out_BxTxHxEv = (self.norm(out_BxTxHxEv.astype(self.dtype)) * gate_BxTxHxEv).astype(self.dtype)
        back_BxT = jnp.argsort(order_BxT, axis=1)  # the tokens' original order
        out_BxTxHxEv = jnp.take_along_axis(out_BxTxHxEv, back_BxT[..., None, None], axis=1)
        out_BxTxD = dense(
            out_BxTxHxEv.reshape(batch, length, h * ev),
            self.out_kernel[...].reshape(h * ev, -1),
            self.kernels,
        )
        return out_BxTxD, None if state is None else (conv_state, delta_state), None

    def _convolve(self, qkv_BxTxC, conv_state_BxWxC, mask_BxT):
        """(SiLU of the causal depthwise convolution [B, T, C] of the chunk after the state's inputs, the
        last W - 1 inputs up to each row's last valid token)."""
        width, length = self.config.linear_conv_width, qkv_BxTxC.shape[1]
        inputs = jnp.concatenate([conv_state_BxWxC.astype(qkv_BxTxC.dtype), qkv_BxTxC], axis=1)
        kernel_WxC = self.conv_kernel[...].astype(qkv_BxTxC.dtype)
        out = sum(inputs[:, j : j + length] * kernel_WxC[j] for j in range(width))
        valid_B = jnp.sum(mask_BxT, axis=1)
        keep_BxW = valid_B[:, None] + jnp.arange(width - 1)[None, :]
        return jax.nn.silu(out), jnp.take_along_axis(inputs, keep_BxW[..., None], axis=1)

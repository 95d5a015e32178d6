"""The fused-attention dispatch (`models.fused_attention`): prefix detection, the fused branch against a float64
reference, the block-wise fallback for other masks, and the decoder's full forward through it.

cuDNN itself needs an NVIDIA GPU; here the same `jax.nn.dot_product_attention` call runs with XLA's
implementation, which applies the same length masks (bench/gpu_mfu.py --check compares cuDNN on a GPU).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_fixtures import KITCHEN_SINK, padded_batch, random_decoder
from seeds import fresh_seed
from test_causal_attention import _reference

from coevo_jax.models import blocks, fused_attention
from coevo_jax.models.causal_attention import causal_attention
from coevo_jax.models.kernels import resolve


def test_prefix_lengths_counts_keys_and_detects_right_padding_only():
    right = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    lengths, all_prefixes = fused_attention.prefix_lengths(jnp.asarray(right))
    assert lengths.tolist() == [3, 4, 0] and bool(all_prefixes)
    for not_prefix in ([[0, 1, 1, 1]], [[1, 0, 1, 0]]):  # left padding, a hole
        lengths, all_prefixes = fused_attention.prefix_lengths(jnp.asarray(not_prefix))
        assert lengths.tolist() == [3 if not_prefix[0][0] == 0 else 2] and not bool(all_prefixes)


def _inputs(seed, key_mask):
    rng = np.random.default_rng(seed)
    batch, length = key_mask.shape
    q = rng.standard_normal((batch, length, 4, 8))
    k = rng.standard_normal((batch, 2, length, 8))
    v = rng.standard_normal((batch, 2, length, 8))
    return q, k, v


def _masks():
    right = np.ones((3, 11), np.int32)
    right[1, 7:] = 0
    right[2, 2:] = 0
    left = right.copy()
    left[0, :4] = 0  # one left-padded row sends the whole batch to the block-wise path
    return {"right": right, "left": left}


@pytest.mark.parametrize("padding", ["right", "left"])
def test_fused_dispatch_matches_float64_reference_and_block_wise_gradients(padding):
    seed = fresh_seed()
    key_mask = _masks()[padding]
    q, k, v = _inputs(seed, key_mask)
    fused = lambda q, k, v: fused_attention.fused_causal_attention(
        q, k.swapaxes(1, 2), v.swapaxes(1, 2), jnp.asarray(key_mask), implementation="xla", block_size=4
    )
    blocked = lambda q, k, v: causal_attention(q, k, v, jnp.asarray(key_mask), block_size=4)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    out = np.asarray(jax.jit(fused)(f32(q), f32(k), f32(v)))
    seen = (np.tril(np.ones((11, 11), bool))[None] & (key_mask[:, None, :] > 0)).any(-1)  # [B, T]
    expected = _reference(q, k, v, key_mask)
    # Every query that sees a key (padded queries after a right-padded row's end included).
    np.testing.assert_allclose(out[seen], expected[seen], atol=2e-5, err_msg=f"seed={seed}")

    weights = f32(np.random.default_rng(seed + 1).standard_normal(q.shape) * seen[:, :, None, None])
    grads = lambda fn: jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * weights), argnums=(0, 1, 2)))
    for got, want in zip(
        grads(fused)(f32(q), f32(k), f32(v)), grads(blocked)(f32(q), f32(k), f32(v)), strict=True
    ):
        np.testing.assert_allclose(got, want, atol=2e-5, err_msg=f"seed={seed}")


def test_a_right_padded_promise_calls_the_fused_kernel_alone_with_the_same_results():
    """`right_padded=True`: no cond in the program (nor its fallback), and the dispatch's results."""
    seed = fresh_seed()
    key_mask = jnp.asarray(_masks()["right"])
    q, k, v = (jnp.asarray(x, jnp.float32) for x in _inputs(seed, np.asarray(key_mask)))
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)

    def attend(right_padded):
        return lambda q, k, v: fused_attention.fused_causal_attention(
            q, k, v, key_mask, implementation="xla", right_padded=right_padded, block_size=4
        )

    assert "cond" in str(jax.make_jaxpr(attend(False))(q, k, v))
    assert "cond" not in str(jax.make_jaxpr(attend(True))(q, k, v))
    # The same kernel either way; XLA fuses around it differently, so float32 rounding differs a little
    # (over 31 seeds: outputs 3.6e-7 apart at most, gradients 1.05e-6 on a scale of up to 9).
    outputs = [np.asarray(jax.jit(attend(right_padded))(q, k, v)) for right_padded in (True, False)]
    np.testing.assert_allclose(*outputs, rtol=1e-6, atol=1e-6, err_msg=f"seed={seed}")
    weights = jnp.asarray(np.random.default_rng(seed + 1).standard_normal(q.shape), jnp.float32)
    grads = lambda fn: jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) * weights), argnums=(0, 1, 2)))(q, k, v)
    for got, want in zip(grads(attend(True)), grads(attend(False)), strict=True):
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * scale, err_msg=f"seed={seed}")


def test_fused_dispatch_keeps_only_the_fused_branch_residuals():
    """Under autodiff the cond's residuals are the fused branch's and its operands: the block-wise
    fallback recomputes its own, so a right-padded batch writes no zeros for them in every layer."""
    seed = fresh_seed()
    batch, length = 3, 64
    key_mask = np.ones((batch, length), np.int32)
    key_mask[1, 40:] = 0
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((batch, length, 4, 8)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((batch, length, 2, 8)), jnp.float32) for _ in range(2))
    mask = jnp.asarray(key_mask)

    def residuals(attend):
        """(shape, dtype) of each residual with a leading batch axis that `jax.vjp` keeps for the backward."""
        _, backward = jax.vjp(attend, q, k, v)
        leaves = jax.tree_util.tree_leaves(backward)
        return collections.Counter(
            (x.shape, str(x.dtype)) for x in leaves if getattr(x, "ndim", 0) and x.shape[0] == batch
        )

    dispatch = residuals(
        lambda q, k, v: fused_attention.fused_causal_attention(
            q, k, v, mask, implementation="xla", block_size=16
        )
    )
    alone = residuals(
        lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, key_value_seq_lengths=jnp.sum(mask, -1), implementation="xla"
        )
    )
    # Beyond those: at most the operands (the block-wise branch's, shared with cuDNN's, which keeps q, k and v;
    # XLA's stand-in keeps q grouped instead) and the key mask.
    operands = {(x.shape, str(x.dtype)) for x in (q, k, v, mask)}
    extra = dispatch - alone
    assert set(extra) <= operands, f"residuals beyond the fused branch's and the operands: {extra}"


def test_uses_fused_by_choice_platform_and_shape():
    assert fused_attention.uses_fused("cudnn", jnp.float32, 64, "cpu")
    assert not fused_attention.uses_fused("blocked", jnp.bfloat16, 64, "gpu")
    assert fused_attention.uses_fused("auto", jnp.bfloat16, 64, "gpu")
    assert not fused_attention.uses_fused("auto", jnp.bfloat16, 64, "cpu")
    assert not fused_attention.uses_fused("auto", jnp.bfloat16, 64, "tpu")
    assert not fused_attention.uses_fused("auto", jnp.float32, 64, "gpu")  # cuDNN's kernel is bf16/fp16
    assert not fused_attention.uses_fused("auto", jnp.bfloat16, 160, "gpu")
    with pytest.raises(ValueError, match="attention='flash'"):
        fused_attention.uses_fused("flash", jnp.bfloat16, 64, "gpu")
    with pytest.raises(ValueError, match="attention='flash'"):
        KITCHEN_SINK.replace(attention="flash")


# float32, two softmax orders (XLA's whole-row one, the block-wise one): gradients of size ~50 differ in the
# 5th significant digit.
TOL = dict(rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(
    ("sides", "right_padded"),
    [
        (("right", "right", "right"), False),
        (("left", "right", "left"), False),
        (("right", "right", "right"), True),
    ],
)
def test_decoder_full_forward_through_the_fused_dispatch_equals_block_wise(monkeypatch, sides, right_padded):
    seed = fresh_seed()
    monkeypatch.setattr(blocks, "_FUSED_IMPLEMENTATION", "xla")
    traced = []  # the layer scan traces its block once per program
    dispatch = blocks.fused_causal_attention
    monkeypatch.setattr(
        blocks, "fused_causal_attention", lambda *a, **kw: traced.append(1) or dispatch(*a, **kw)
    )
    ids, mask = padded_batch(list(zip((9, 6, 11), sides, strict=True)), 11, seed=seed % 991)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)

    def run(attention):
        """Loss, logits and gradients of the same random weights, attending by `attention`."""
        cfg = KITCHEN_SINK.replace(remat=True, attention=attention, right_padded=right_padded)
        model = random_decoder(cfg, seed=seed % 1000)
        graphdef, params = nnx.graphdef(model), nnx.to_pure_dict(nnx.state(model))

        def total(p):
            logits = nnx.merge(graphdef, p)(ids, mask)
            return jnp.sum(jnp.where(mask[..., None] > 0, jnp.tanh(logits), 0.0)), logits

        return jax.jit(jax.value_and_grad(total, has_aux=True))(params)

    (_, fused_logits), fused_grads = run("cudnn")
    assert traced, "attention='cudnn' did not reach the fused dispatch"
    traced.clear()
    (_, blocked_logits), blocked_grads = run("blocked")
    assert not traced
    real = np.asarray(mask) > 0
    np.testing.assert_allclose(
        np.asarray(fused_logits)[real], np.asarray(blocked_logits)[real], **TOL, err_msg=f"seed={seed}"
    )
    for (path, got), want in zip(
        jax.tree_util.tree_leaves_with_path(fused_grads),
        jax.tree_util.tree_leaves(blocked_grads),
        strict=True,
    ):
        np.testing.assert_allclose(got, want, **TOL, err_msg=f"{jax.tree_util.keystr(path)} seed={seed}")


@pytest.mark.parametrize(
    ("backend", "kind", "capability", "expected"),
    [
        ("gpu", "NVIDIA H100 80GB HBM3", "9.0", True),
        ("gpu", "NVIDIA A100-SXM4-40GB", "8.0", True),
        ("gpu", "Tesla V100-SXM2-16GB", "7.0", False),  # before Ampere: no cuDNN flash attention
        ("gpu", "AMD Instinct MI300X", "gfx942", False),  # ROCm is a 'gpu' backend too, without cuDNN
        ("gpu", "a GPU without the attribute", None, False),
        ("cpu", "cpu", None, False),
    ],
)
def test_auto_picks_cudnn_on_nvidia_gpus_from_ampere_on(monkeypatch, backend, kind, capability, expected):
    class FakeDevice:
        platform = backend
        device_kind = kind
        compute_capability = capability

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(jax, "devices", lambda *a: [FakeDevice()])
    cfg = resolve(KITCHEN_SINK.replace(dtype="bfloat16", kernels="xla"))  # as the decoder resolves it
    assert cfg.platform == backend
    assert fused_attention.uses_fused(cfg.attention, cfg.dtype, cfg.head_dim, cfg.platform) == expected


def test_a_gpu_program_compiled_on_a_cpu_attends_block_wise_unless_told():
    # the device cannot say which GPU the program is for: 'auto' takes the block-wise path, 'cudnn' stays
    for attention, expected in [("auto", "blocked"), ("cudnn", "cudnn"), ("blocked", "blocked")]:
        cfg = resolve(KITCHEN_SINK.replace(platform="gpu", attention=attention))
        assert (cfg.platform, cfg.kernels, cfg.attention) == ("gpu", "xla", expected)

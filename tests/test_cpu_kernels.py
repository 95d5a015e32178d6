"""The hand-written CPU kernels (`models.kernels.cpu_ffi`: prefix attention, small-row matmul, logit stats)
against float64 NumPy; the CPU kernel set (`models.kernels.cpu.CpuKernels`): which operations it sends to
them, and the decode loop with them against the decode loop on XLA's path; and where the kernel set is chosen
(`models.kernels.resolve`)."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from seeds import fresh_seed

from coevo_jax.models import Decoder, ModelConfig, dense
from coevo_jax.models.kernels import CpuKernels, XlaKernels, cpu, cpu_ffi, kernel_set, resolve
from coevo_jax.models.kv_cache import place_chunk
from coevo_jax.sampling import Sampler, SamplingConfig

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler to build the CPU kernels"
)
CPU, XLA = CpuKernels(), XlaKernels("cpu")
SMALL = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=8, dtype="float32", param_dtype="float32",
)  # fmt: skip


def _reference(q_BxKxQxE, keys_BxKxExS, values_BxKxSxE, limits_BxT):
    """float64 softmax(q . k / sqrt(E)) . v over each query's slot prefix; zeros for an empty prefix."""
    batch, kv_heads, queries, dim = q_BxKxQxE.shape
    out = np.zeros(q_BxKxQxE.shape)
    for b in range(batch):
        for k in range(kv_heads):
            for j in range(queries):
                n = limits_BxT[b, j % limits_BxT.shape[1]]
                if n == 0:
                    continue
                scores = q_BxKxQxE[b, k, j].astype(np.float64) @ keys_BxKxExS[b, k, :, :n] / np.sqrt(dim)
                probs = np.exp(scores - scores.max())
                out[b, k, j] = probs / probs.sum() @ values_BxKxSxE[b, k, :n]
    return out


@pytest.mark.parametrize(
    "batch, kv_heads, groups, length, dim, slots",
    [(1, 1, 1, 1, 8, 1), (3, 2, 2, 1, 32, 100), (8, 4, 2, 1, 32, 384), (2, 3, 3, 1, 64, 517), (2, 1, 4, 3, 128, 40),
     (2, 2, 2, 19, 32, 300), (2, 2, 1, 2, 20, 150), (1, 2, 3, 1, 72, 1100)],
)  # fmt: skip
def test_prefix_attention_matches_float64(batch, kv_heads, groups, length, dim, slots):
    rng = np.random.default_rng(fresh_seed())
    layers = 3
    q = rng.standard_normal((batch, kv_heads, groups * length, dim)).astype(np.float32) * 4  # peaked softmax
    keys = rng.standard_normal((layers, batch, kv_heads, dim, slots)).astype(np.float32)
    values = rng.standard_normal((layers, batch, kv_heads, slots, dim)).astype(np.float32)
    limits = rng.integers(0, slots + 1, (batch, length)).astype(np.int32)
    limits[0, 0] = slots  # the whole window
    if batch * length > 1:
        limits[-1, -1] = 0  # an empty prefix
    assert cpu.serves_attention(jnp.float32, jnp.float32, dim)
    run = jax.jit(cpu_ffi.prefix_attention)
    for layer in range(layers):
        got = run(q, keys, values, layer, limits)
        expected = _reference(q, keys[layer].astype(np.float64), values[layer].astype(np.float64), limits)
        np.testing.assert_allclose(np.asarray(got), expected, atol=2e-5, rtol=2e-5)


def test_prefix_attention_refuses_an_out_of_range_layer():
    q, cache = np.zeros((1, 1, 1, 8), np.float32), np.zeros((2, 1, 1, 8, 4), np.float32)
    values = np.zeros((2, 1, 1, 4, 8), np.float32)
    with pytest.raises(Exception, match="layer index out of range"):
        jax.block_until_ready(cpu_ffi.prefix_attention(q, cache, values, 2, np.ones((1, 1), np.int32)))


@pytest.mark.parametrize("length", [1, 5])
def test_cached_chunk_attention_reads_the_prefix_the_placement_allows(length):
    # the CPU set's attention over the cache (on the kernel) against float64 attention under place_chunk's mask: a decode step
    # (T = 1) and a left-padded chunk
    rng = np.random.default_rng(fresh_seed())
    layers, batch, kv_heads, groups, dim, slots = 2, 4, 2, 3, 16, 50
    q = rng.standard_normal((batch, length, kv_heads * groups, dim)).astype(np.float32)
    keys = rng.standard_normal((layers, batch, kv_heads, dim, slots)).astype(np.float32)
    values = rng.standard_normal((layers, batch, kv_heads, slots, dim)).astype(np.float32)
    lengths = jnp.asarray([0, 7, slots - length, 20], jnp.int32)
    mask = np.ones((batch, length), np.int32)
    mask[3] = 0  # a row with nothing to append
    mask[1, : length // 2] = 0  # left padding
    allowed = place_chunk(lengths, jnp.asarray(mask), slots).allowed_BxTxS
    got = jax.jit(CPU.attend_cache, static_argnums=5)(q, keys, values, jnp.int32(1), allowed, 1)
    limits = np.asarray(allowed).sum(-1)
    assert limits[0].tolist() == list(range(1, length + 1)) and limits[2, -1] == slots
    q_grouped = q.reshape(batch, length, kv_heads, groups, dim).transpose(0, 2, 3, 1, 4)
    q_grouped = q_grouped.reshape(batch, kv_heads, groups * length, dim)
    expected = _reference(q_grouped, keys[1].astype(np.float64), values[1].astype(np.float64), limits)
    expected = expected.reshape(batch, kv_heads, groups, length, dim).transpose(0, 3, 1, 2, 4)
    real = mask.astype(bool)  # padding queries' outputs are garbage by contract
    np.testing.assert_allclose(
        np.asarray(got).reshape(expected.shape)[real], expected[real], atol=2e-5, rtol=2e-5
    )


@pytest.mark.parametrize(
    "rows, depth, features",
    [(1, 1, 1), (8, 256, 688), (8, 688, 256), (3, 13, 37), (16, 64, 1030), (13, 100, 2049), (11, 7, 16),
     (2, 3, 4), (40, 24, 1100), (20, 300, 48), (3, 0, 5), (16, 1544, 576), (8, 40, 1030)],
)  # fmt: skip
def test_small_matmul_matches_float64(rows, depth, features):
    # row counts off the register blocks (above 16: groups of 16; above 8: x packed), depths off the weight
    # blocks (16 rows for narrow weights and packed x, else 8) and off the threads' 8-row split, columns off
    # the 16-lane vectors; narrow weights split by rows between threads, wide ones (>= 1,024) by columns
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    w = rng.standard_normal((depth, features)).astype(np.float32)
    assert cpu.serves_matmul(jnp.float32, jnp.float32, rows) == (rows <= 16)
    got = np.asarray(jax.jit(cpu_ffi.small_matmul)(x, w))
    expected = x.astype(np.float64) @ w.astype(np.float64)
    bound = 1e-6 * np.sqrt(depth) * (np.abs(x) @ np.abs(w)).max()  # float32 sums of `depth` terms
    assert np.abs(got - expected).max() <= bound, f"seed {seed}"


@pytest.mark.parametrize(
    "rows, depth, features",
    [(1, 1, 1), (16, 576, 4099), (8, 256, 8192), (3, 13, 37), (9, 100, 2049), (17, 33, 7), (2, 0, 3)],
)
def test_small_matmul_nt_matches_float64(rows, depth, features):
    # rows off and past the 8-row x blocks, an odd count of weight rows (a last block of one), depths off
    # the 16-lane vectors (the scalar tail), an empty depth (zeros)
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    w = rng.standard_normal((features, depth)).astype(np.float32)
    got = np.asarray(jax.jit(cpu_ffi.small_matmul_nt)(x, w))
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 1e-6 * np.sqrt(max(depth, 1)) * (np.abs(x) @ np.abs(w).T).max(initial=0)
    assert got.shape == (rows, features) and np.abs(got - expected).max() <= bound, f"seed {seed}"
    leading = jax.jit(cpu_ffi.small_matmul_nt)(x.reshape(1, rows, 1, depth), w)
    np.testing.assert_array_equal(np.asarray(leading).reshape(rows, features), got)


def test_small_matmul_keeps_leading_axes_and_runs_under_vmap():
    rng = np.random.default_rng(seed := fresh_seed())
    x = rng.standard_normal((3, 2, 4, 24)).astype(np.float32)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    expected = x.astype(np.float64) @ w.astype(np.float64)
    got = jax.jit(cpu_ffi.small_matmul)(x[0], w)
    assert got.shape == (2, 4, 40)
    np.testing.assert_allclose(np.asarray(got), expected[0], atol=1e-5, err_msg=f"seed {seed}")
    batched = jax.jit(jax.vmap(cpu_ffi.small_matmul, in_axes=(0, None)))(x, w)
    np.testing.assert_allclose(np.asarray(batched), expected, atol=1e-5, err_msg=f"seed {seed}")


def test_small_matmul_reads_one_layer_of_a_stack_in_place():
    # a stack of 3 layers' weights, short rows (split by rows) and long ones (split by columns)
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for depth, features in [(24, 40), (16, 1100)]:
        x = rng.standard_normal((5, depth)).astype(np.float32)
        w = rng.standard_normal((3, depth, features)).astype(np.float32)
        product = jax.jit(cpu_ffi.small_matmul)
        for layer in range(3):
            expected = x.astype(np.float64) @ w[layer].astype(np.float64)
            got = np.asarray(product(x, w, layer))
            np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=f"seed {seed}, layer {layer}")
        with pytest.raises(Exception, match="layer index out of range"):
            jax.block_until_ready(product(x, w, 3))


def test_decode_weights_stay_in_the_stack_where_the_kernel_serves():
    cfg = SMALL
    model = Decoder(cfg, rngs=nnx.Rngs(seed := fresh_seed()))
    assert isinstance(model.kernels, CpuKernels)
    stacked_leaves = lambda weights: [
        "/".join(str(getattr(key, "key", key)) for key in path)
        for path, leaf in jax.tree_util.tree_leaves_with_path(
            weights, is_leaf=lambda leaf: isinstance(leaf, cpu.StackedLayer)
        )
        if isinstance(leaf, cpu.StackedLayer)
    ]
    kernels = ["attn/k_kernel", "attn/o_kernel", "attn/q_kernel", "attn/v_kernel"]
    kernels += ["mlp/down_kernel", "mlp/gate_kernel", "mlp/up_kernel"]
    in_place = model.layer_weights(rows=16)
    assert [sorted(stacked_leaves(weights)) for weights in in_place] == [kernels] * cfg.num_layers
    assert in_place[1]["attn"]["q_kernel"].layer == 1 and in_place[1]["attn"]["q_kernel"].shape == (32, 4, 8)
    assert stacked_leaves(model.layer_weights(rows=17)) == []  # too many rows for the kernel: slices
    assert stacked_leaves(model.layer_weights()) == []

    # a decode step through the stacked weights == through slices of them (the same kernel, other pointers)
    rng = np.random.default_rng(seed)
    for layer in range(cfg.num_layers):
        for kernel in in_place[layer]["mlp"].values():
            x = jnp.asarray(rng.standard_normal((3, 1, kernel.shape[0])), jnp.float32)
            want = dense.dense(x, kernel.sliced(), CPU)
            got = jax.jit(dense.dense, static_argnums=2)(x, kernel, CPU)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # where the kernel does not serve, a StackedLayer is sliced and multiplied by XLA
    too_many = jnp.ones((17, 32), jnp.float32)
    kernel = in_place[0]["mlp"]["gate_kernel"]
    np.testing.assert_allclose(
        np.asarray(dense.dense(too_many, kernel, CPU)),
        np.asarray(too_many) @ np.asarray(kernel.sliced()),
        atol=1e-5,
    )
    with pytest.raises(TypeError, match=r"supports \[...\] only"):
        kernel[0]
    xla_model = Decoder(cfg.replace(kernels="xla"), rngs=nnx.Rngs(seed))  # XLA's set: slices only
    assert stacked_leaves(xla_model.layer_weights(rows=16)) == []


def test_dense_and_the_unembedding_send_few_float32_rows_to_the_kernel(monkeypatch):
    calls = []

    def counted(x, w):
        calls.append(x.shape)
        return small_matmul(x, w)

    small_matmul = cpu_ffi.small_matmul
    monkeypatch.setattr(cpu_ffi, "small_matmul", counted)
    x, w = jnp.ones((2, 8, 32), jnp.float32), jnp.ones((32, 5), jnp.float32)
    product = lambda x, w: dense.dense(x, w, CPU)
    jax.eval_shape(product, x, w)  # 16 rows
    jax.eval_shape(product, jnp.ones((17, 32), jnp.float32), w)  # one row too many
    jax.eval_shape(product, x.astype(jnp.bfloat16), w)  # bf16: XLA's bf16 product
    assert calls == [(2, 8, 32)]
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((2,), ("data",))):
        jax.eval_shape(product, x, w)  # sharded operands: XLA's path, which SPMD partitions
    assert len(calls) == 1
    # the unembedding at a decode step's rows: an untied model's through `small_matmul`, a tied model's table
    # through `small_matmul_nt`
    transposed_calls = []

    def counted_nt(x, w):
        transposed_calls.append(x.shape)
        return small_matmul_nt(x, w)

    small_matmul_nt = cpu_ffi.small_matmul_nt
    monkeypatch.setattr(cpu_ffi, "small_matmul_nt", counted_nt)
    hidden = np.random.default_rng(seed := fresh_seed()).standard_normal((4, 1, 16)).astype(np.float32)
    for tied, expected_calls in [(False, 2), (True, 2)]:
        cfg = ModelConfig(
            vocab_size=40, hidden_size=16, intermediate_size=24, num_layers=1, num_heads=2, num_kv_heads=1,
            head_dim=8, dtype="float32", param_dtype="float32", tie_word_embeddings=tied,
        )  # fmt: skip
        model = Decoder(cfg, rngs=nnx.Rngs(0))
        got = model.logits_from_hidden(jnp.asarray(hidden))
        assert len(calls) == expected_calls and len(transposed_calls) == int(tied)
        want = hidden.astype(np.float64) @ np.asarray(model.unembedding, np.float64)
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, err_msg=f"seed {seed}, tied {tied}")


def _greedy(model, prompts, kernels: str, monkeypatch):
    """Greedy tokens and log-probs of a fresh sampler of `model` with the kernel set `kernels`, and how many
    attention calls its programs sent to the kernel."""
    calls = []
    prefix_attention = cpu_ffi.prefix_attention

    def counted(*args):
        calls.append(1)
        return prefix_attention(*args)

    monkeypatch.setattr(cpu_ffi, "prefix_attention", counted)
    params = nnx.to_pure_dict(nnx.state(model))
    sampler = Sampler(
        model.config.replace(kernels=kernels),
        batch_size=len(prompts),
        cache_len=96,
        sampling=SamplingConfig(max_new_tokens=40),
    )
    logits, cache = sampler.prefill(params, sampler.init_cache(), prompts, [0] * len(prompts))
    follow_up = [[3, 4, 5, 6, 7]] * len(prompts)  # a cached chunk after the fresh prompt
    logits, cache = sampler.prefill(params, cache, follow_up, [len(p) for p in prompts])
    result, _ = sampler.decode(params, cache, logits, [True] * len(prompts), jax.random.key(0))
    return np.asarray(result.tokens_BxN), np.asarray(result.logprobs_BxN), len(calls)


def test_decode_with_the_kernel_matches_xlas_path(monkeypatch):
    cfg = SMALL
    model = Decoder(cfg, rngs=nnx.Rngs(fresh_seed()))
    prompts = [[1, 2, 3, 4, 5], [7] * 30, [9, 8]]
    tokens_xla, logprobs_xla, calls_xla = _greedy(model, prompts, "xla", monkeypatch)
    tokens_kernel, logprobs_kernel, calls_kernel = _greedy(model, prompts, "cpu", monkeypatch)
    # traced once each: the fresh prompt's and the cached chunk's scanned layer (a fresh prompt attends through
    # the cache when the kernel serves it), the decode step's unrolled layers
    assert calls_xla == 0 and calls_kernel == 2 + cfg.num_layers
    np.testing.assert_array_equal(tokens_kernel, tokens_xla)
    np.testing.assert_allclose(logprobs_kernel, logprobs_xla, atol=1e-5)


@pytest.mark.parametrize("rows, vocab", [(1, 1), (3, 15), (8, 8192), (5, 1037), (2, 49152)])
def test_logit_stats_match_float64(rows, vocab):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, vocab)) * rng.uniform(0.5, 30)).astype(np.float32)
    expected_lse = _float64_logsumexp(x)
    argmax, lse = jax.jit(cpu_ffi.logit_stats)(x)
    assert argmax.dtype == jnp.int32 and lse.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(argmax), np.argmax(x, axis=-1), err_msg=f"seed {seed}")
    np.testing.assert_allclose(np.asarray(lse), expected_lse, rtol=1e-6, atol=1e-6, err_msg=f"seed {seed}")


def _float64_logsumexp(x):
    x = np.asarray(x, np.float64)
    top = x.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):  # a row of -inf: -inf - -inf
        return top[..., 0] + np.log(np.exp(x - top).sum(-1))


def test_logit_stats_ties_infinities_nans_and_leading_axes():
    inf, nan = np.inf, np.nan
    x = np.array(
        [[1, 3, 3, -inf, 0], [nan, 1, nan, 2, 9], [-inf] * 5, [1, inf, 2, inf, 0], [-inf, 0, -inf, 0, -inf],
         [2, 2, 2, 2, 2], [-100, -200, -300, -400, -500]],
        np.float32,
    )  # fmt: skip
    argmax, lse = cpu_ffi.logit_stats(x)
    np.testing.assert_array_equal(np.asarray(argmax), [1, 0, 0, 1, 1, 0, 0])  # jnp.argmax's, NaN largest
    expected = _float64_logsumexp(x)  # NaN for the NaN row; the rows of -inf and of +inf set apart:
    expected[2], expected[3] = -inf, inf  # log 0 and log inf, where x - max is NaN
    np.testing.assert_allclose(np.asarray(lse), expected, rtol=1e-6)
    stacked = np.stack([x, x[::-1]])  # leading axes beyond one, and vmap
    argmax, lse = jax.vmap(cpu_ffi.logit_stats)(stacked)
    np.testing.assert_array_equal(
        np.asarray(argmax), np.stack([[1, 0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0, 1]])
    )
    np.testing.assert_allclose(np.asarray(lse)[1], expected[::-1], rtol=1e-6)
    assert cpu_ffi.logit_stats(stacked)[0].shape == (2, 7)


def test_logit_stats_serve_float32_only():
    def lowered(kernels, dtype):
        return jax.jit(kernels.argmax_and_log_normaliser).lower(jnp.zeros((2, 300), dtype)).as_text()

    assert cpu_ffi.LOGIT_STATS_TARGET in lowered(CPU, jnp.float32)
    assert cpu_ffi.LOGIT_STATS_TARGET not in lowered(CPU, jnp.bfloat16)
    assert cpu_ffi.LOGIT_STATS_TARGET not in lowered(XLA, jnp.float32)


def test_other_dtypes_and_sharded_operands_keep_xlas_path():
    assert not cpu.serves_attention(jnp.bfloat16, jnp.float32, 32)
    assert not cpu.serves_attention(jnp.float32, jnp.bfloat16, 32)
    assert not cpu.serves_attention(jnp.float32, jnp.float32, cpu_ffi.MAX_HEAD_DIM + 1)
    two_devices = jax.sharding.AbstractMesh((2,), ("data",))
    with jax.sharding.use_abstract_mesh(two_devices):  # a sharded cache: XLA's path, which SPMD partitions
        assert not cpu.serves_attention(jnp.float32, jnp.float32, 32)
        assert not CPU.reads_cache_in_place(jnp.float32, jnp.float32, 32)
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("data",))):
        assert cpu.serves_attention(jnp.float32, jnp.float32, 32)
    assert not XLA.reads_cache_in_place(jnp.float32, jnp.float32, 32)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="resolves 'auto' on a CPU backend")
def test_the_kernel_set_is_chosen_once_where_the_decoder_is_built(monkeypatch):
    model = Decoder(SMALL, rngs=nnx.Rngs(0))
    assert (model.config.platform, model.config.kernels) == ("cpu", "cpu")
    assert model.kernels == kernel_set(model.config) == CPU
    assert resolve(model.config) is model.config  # resolved once: nothing left to resolve
    with pytest.raises(ValueError, match="unresolved"):
        kernel_set(SMALL)
    monkeypatch.setenv("COEVO_JAX_CPU_KERNELS", "0")  # read where a decoder is built, not while tracing
    assert resolve(SMALL).kernels == "xla" and resolve(SMALL.replace(kernels="cpu")).kernels == "cpu"
    assert model.kernels == CPU  # a decoder built before keeps its kernels
    # a program for another platform: XLA's set, whatever this machine has
    assert resolve(SMALL.replace(platform="gpu")).kernels == "xla"
    with pytest.raises(ValueError, match="kernels='cpu' runs on the CPU"):
        resolve(SMALL.replace(platform="gpu", kernels="cpu"))


def test_a_missing_compiler_warns_and_leaves_the_kernel_off(caplog, tmp_path, monkeypatch):
    monkeypatch.setenv("COEVO_JAX_KERNEL_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=cpu_ffi.__name__):
        assert not cpu_ffi._load_and_register(str(tmp_path / "no-such-compiler"))
    assert "CPU kernels unavailable" in caplog.text
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


def test_concurrent_builds_give_one_complete_library(tmp_path, monkeypatch):
    monkeypatch.setenv("COEVO_JAX_KERNEL_DIR", str(tmp_path))
    compiler = os.environ.get("CXX", "c++")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: cpu_ffi._build(compiler), range(2)))
    assert paths[0] == paths[1] and [p.name for p in tmp_path.iterdir()] == [paths[0].name]
    assert paths[0].stat().st_size > 0 and cpu_ffi._build(compiler) == paths[0]  # reused, not rebuilt

"""Sampler: cached greedy decoding equals full-forward argmax, incremental prefill equals re-encoding,
rows do not disturb each other, stops per row, top-k/top-p against a NumPy reference, sharding, compiles."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from model_fixtures import KITCHEN_SINK, VOCAB, random_decoder, with_config
from seeds import fresh_seed

from coevo_jax.decode_loop import categorical, sample_with_logprobs
from coevo_jax.models.kernels import CpuKernels, XlaKernels
from coevo_jax.sampling import (
    CACHE_FULL,
    INACTIVE,
    MAX_TOKENS,
    STOP_SEQUENCE,
    STOP_TOKEN,
    Sampler,
    SamplingConfig,
    StopConfig,
    left_pad,
)
from coevo_jax.sharding import MeshConfig, make_mesh


@pytest.fixture(scope="module")
def model():
    return random_decoder(KITCHEN_SINK, seed=3)


_FULL_LEN = 64


@jax.jit
def _forward_padded(graphdef_and_state, ids_1xT, mask_1xT):
    graphdef, state = graphdef_and_state
    return nnx.merge(graphdef, state)(ids_1xT, mask_1xT)[0]


def _full_logits(model, ids: list[int]) -> np.ndarray:
    """Full-forward logits [len(ids), V] without a cache (right-padded to one length: one compile)."""
    assert len(ids) <= _FULL_LEN
    padded = np.zeros((1, _FULL_LEN), np.int32)
    padded[0, : len(ids)] = ids
    mask = (np.arange(_FULL_LEN) < len(ids)).astype(np.int32)[None]
    return np.asarray(_forward_padded(nnx.split(model), padded, mask))[: len(ids)]


def _greedy_reference(model, prompt: list[int], steps: int) -> list[int]:
    """Step-by-step argmax of the full forward, no cache."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(np.argmax(_full_logits(model, ids)[-1])))
    return ids[len(prompt) :]


def _prompts(seed: int, lengths) -> list[list[int]]:
    rng = np.random.RandomState(seed)
    return [rng.randint(3, VOCAB, size=n).tolist() for n in lengths]


def test_greedy_equals_full_forward_argmax_for_rows_of_different_lengths(model):
    prompts = _prompts(0, (5, 17, 1, 30))  # 17 and 30 fall in different buckets than 5: padding differs
    sampler, params = Sampler.for_model(
        model, batch_size=4, cache_len=64, sampling=SamplingConfig(max_new_tokens=8)
    )
    generated = sampler.generate(params, prompts, jax.random.key(0))
    for prompt, tokens in zip(prompts, generated, strict=True):
        assert tokens == _greedy_reference(model, prompt, 8)
    # each row alone gives the same tokens: rows do not disturb each other
    alone = Sampler.for_model(model, batch_size=1, cache_len=64, sampling=SamplingConfig(max_new_tokens=8))
    for prompt, tokens in zip(prompts, generated, strict=True):
        assert alone[0].generate(alone[1], [prompt], jax.random.key(0))[0] == tokens


def test_a_tied_embedding_model_samples_the_full_forward_argmax():
    """Tied embeddings (SmolLM2's): the sampler's logits come from the embedding table, as the full forward's."""
    tied = random_decoder(KITCHEN_SINK.replace(tie_word_embeddings=True), seed=5)
    assert tied.lm_head is None
    prompts = _prompts(2, (9, 3))
    sampler, params = Sampler.for_model(
        tied, batch_size=2, cache_len=64, sampling=SamplingConfig(max_new_tokens=6)
    )
    for prompt, tokens in zip(prompts, sampler.generate(params, prompts, jax.random.key(0)), strict=True):
        assert tokens == _greedy_reference(tied, prompt, 6)


def test_incremental_prefill_and_rollback_match_encoding_the_history_at_once(model):
    sampler, params = Sampler.for_model(model, batch_size=3, cache_len=64)
    history = _prompts(1, (9, 4, 20))
    turn1 = _prompts(2, (6, 13, 2))
    cache = sampler.init_cache()
    _, cache = sampler.prefill(params, cache, history, [0, 0, 0])
    logits, cache = sampler.prefill(params, cache, turn1, [len(h) for h in history])
    for row in range(3):
        expected = _full_logits(model, history[row] + turn1[row])[-1]
        np.testing.assert_allclose(np.asarray(logits[row]), expected, rtol=2e-5, atol=2e-5)
    # roll back row 0 to its first 4 tokens and continue differently; row 1 gets nothing; row 2 restarts
    turn2 = [[7, 8, 9], None, [11, 12]]
    starts = [4, len(history[1]) + len(turn1[1]), 0]
    logits, cache = sampler.prefill(params, cache, turn2, starts)
    np.testing.assert_allclose(
        np.asarray(logits[0]), _full_logits(model, history[0][:4] + [7, 8, 9])[-1], rtol=2e-5, atol=2e-5
    )
    np.testing.assert_allclose(np.asarray(logits[2]), _full_logits(model, [11, 12])[-1], rtol=2e-5, atol=2e-5)
    assert np.asarray(cache.lengths_B).tolist() == [7, starts[1], 2]


def test_decode_continues_a_multi_turn_cache_like_the_full_forward(model):
    """After decode the cache holds all tokens but the last sampled one; appending it and more continues."""
    sampler, params = Sampler.for_model(
        model, batch_size=2, cache_len=96, sampling=SamplingConfig(max_new_tokens=5)
    )
    prompts = _prompts(3, (8, 3))
    cache = sampler.init_cache()
    logits, cache = sampler.prefill(params, cache, prompts, [0, 0])
    result, cache = sampler.decode(params, cache, logits, [True, True], jax.random.key(0))
    first = np.asarray(result.tokens_BxN)
    lengths = np.asarray(cache.lengths_B)
    assert lengths.tolist() == [8 + 4, 3 + 4]
    observations = _prompts(4, (5, 11))
    chunks = [[int(first[r, -1])] + observations[r] for r in range(2)]
    logits, cache = sampler.prefill(params, cache, chunks, lengths)
    result, cache = sampler.decode(params, cache, logits, [True, True], jax.random.key(1))
    for r in range(2):
        history = prompts[r] + first[r].tolist() + observations[r]
        assert np.asarray(result.tokens_BxN)[r].tolist() == _greedy_reference(model, history, 5)


def _expected_stop(tokens, stops: StopConfig, max_new: int, room: int):
    """Python reference of the per-row stop rule: (count, reason) for a row's greedy tokens."""
    for i, token in enumerate(tokens[:max_new]):
        count = i + 1
        if token in stops.stop_ids:
            return count, STOP_TOKEN
        if any(tuple(tokens[max(0, count - len(s)) : count]) == s for s in stops.stop_sequences):
            return count, STOP_SEQUENCE
        if count == max_new:
            return count, MAX_TOKENS
        if count == room:  # no cache slot left to feed this token
            return count, CACHE_FULL
    raise AssertionError("reference too short")


def test_rows_stop_on_their_own(model):
    prompts = _prompts(5, (6, 6, 6, 6))
    reference = [_greedy_reference(model, p, 7) for p in prompts]
    stops = StopConfig(
        stop_ids=(reference[0][2],),  # row 0 stops at its 3rd token at the latest
        stop_sequences=(tuple(reference[1][1:3]), (VOCAB + 5, VOCAB + 6, VOCAB + 7)),
    )
    sampler, params = Sampler.for_model(
        model, batch_size=4, cache_len=12, sampling=SamplingConfig(max_new_tokens=6), stops=stops
    )
    cache = sampler.init_cache()
    logits, cache = sampler.prefill(params, cache, prompts[:3] + [None], [0, 0, 0, 0])
    result, cache = sampler.decode(params, cache, logits, [True, True, True, False], jax.random.key(0))
    counts, reasons = np.asarray(result.counts_B), np.asarray(result.reasons_B)
    tokens = np.asarray(result.tokens_BxN)
    lengths = np.asarray(cache.lengths_B)
    for row in range(3):
        count, reason = _expected_stop(reference[row], stops, max_new=6, room=12 - 6 + 1)
        assert (counts[row], reasons[row]) == (count, reason), row
        assert tokens[row, :count].tolist() == reference[row][:count]
        assert lengths[row] == 6 + count - 1  # the last sampled token is not in the cache
    assert counts[0] <= 3 and counts[1] <= 3
    assert reasons[3] == INACTIVE and counts[3] == 0 and lengths[3] == 0


def test_decode_stops_when_the_cache_is_full(model):
    sampler, params = Sampler.for_model(
        model, batch_size=1, cache_len=8, sampling=SamplingConfig(max_new_tokens=6)
    )
    cache = sampler.init_cache()
    logits, cache = sampler.prefill(params, cache, _prompts(12, (5,)), [0])
    result, cache = sampler.decode(params, cache, logits, [True], jax.random.key(0))
    assert int(result.counts_B[0]) == 4 and int(result.reasons_B[0]) == CACHE_FULL
    assert int(cache.lengths_B[0]) == 8


def test_max_tokens_stop(model):
    sampler, params = Sampler.for_model(
        model, batch_size=1, cache_len=64, sampling=SamplingConfig(max_new_tokens=4)
    )
    cache = sampler.init_cache()
    logits, cache = sampler.prefill(params, cache, _prompts(6, (5,)), [0])
    result, _ = sampler.decode(params, cache, logits, [True], jax.random.key(0))
    assert int(result.counts_B[0]) == 4 and int(result.reasons_B[0]) == MAX_TOKENS


def _nucleus_reference(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """float64 probabilities after temperature, top-k and top-p (smallest set with mass >= top_p)."""
    z = logits.astype(np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    keep = np.zeros_like(z, dtype=bool)
    keep[order[: top_k or len(z)]] = True
    p = np.exp(z - z.max()) * keep
    p /= p.sum()
    mass, nucleus = 0.0, np.zeros_like(keep)
    for i in order:
        if not keep[i] or mass >= top_p:
            break
        nucleus[i] = True
        mass += p[i]
    q = np.where(nucleus, p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 0.8), (1.3, 5, 0.9), (1.0, 3, 1.0)]
)
def test_sampling_distribution_matches_numpy_reference(temperature, top_k, top_p):
    rng = np.random.RandomState(int(np.random.SeedSequence().entropy % 2**31))
    logits = (rng.standard_normal(12) * 2.0).astype(np.float32)
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    draws = 20000
    batch = jnp.broadcast_to(jnp.asarray(logits), (draws, 12))
    samples = np.asarray(sample_with_logprobs(batch, jax.random.key(int(rng.randint(1 << 30))), cfg)[0])
    expected = _nucleus_reference(logits, temperature, top_k, top_p)
    observed = np.bincount(samples, minlength=12) / draws
    assert np.all(observed[expected == 0] == 0), "a token outside the top-k/top-p set was sampled"
    np.testing.assert_allclose(observed, expected, atol=0.015)


def _kernel_set(name: str):
    """XLA's set, or the CPU set (its kernels need a C++ compiler to build)."""
    if name == "xla":
        return XlaKernels("cpu")
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler to build the CPU kernels")
    return CpuKernels()


@pytest.mark.parametrize(
    "kernels", ["xla", "cpu"]
)  # XLA's two passes; the CPU kernel `logit_stats` (float32)
@pytest.mark.parametrize("vocab", [5, 128, 129, 620, 1000, 8192])
def test_first_argmax_is_numpys_argmax_with_ties_infinities_and_nans(vocab, kernels):
    first_argmax = _kernel_set(kernels).argmax
    rng = np.random.default_rng(fresh_seed())
    x = rng.integers(-3, 4, size=(7, vocab)).astype(np.float64)  # a handful of values: many ties
    x[1] = -np.inf  # every value -inf: index 0
    x[2, rng.integers(vocab)] = np.inf
    x[3, rng.choice(vocab, size=min(3, vocab), replace=False)] = np.nan  # the first NaN wins
    x[4, -1] = 10.0  # the maximum in the last (padded) block
    x[5] = 2.0  # all equal: index 0
    for dtype in (jnp.float32, jnp.bfloat16):
        got = np.asarray(jax.jit(first_argmax)(jnp.asarray(x, dtype)))
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, np.argmax(x, axis=-1))
    stacked = jnp.asarray(np.stack([x, x[::-1]]), jnp.float32)  # leading axes beyond one
    np.testing.assert_array_equal(
        np.asarray(first_argmax(stacked)), np.argmax(np.stack([x, x[::-1]]), axis=-1)
    )


def test_categorical_draws_what_jax_random_categorical_draws():
    rng = np.random.default_rng(fresh_seed())
    logits = jnp.asarray(rng.standard_normal((6, 700)) * 3.0, jnp.float32)
    for _ in range(4):
        key = jax.random.key(int(rng.integers(1 << 30)))
        expected = jax.random.categorical(key, logits, axis=-1)
        np.testing.assert_array_equal(np.asarray(categorical(key, logits)), np.asarray(expected))
        keys = jax.random.split(key, 6)  # a key per row
        expected = jax.vmap(jax.random.categorical)(keys, logits)
        np.testing.assert_array_equal(np.asarray(jax.jit(categorical)(keys, logits)), np.asarray(expected))


def test_greedy_and_tiny_top_p_are_argmax():
    logits = jnp.asarray(np.random.RandomState(0).standard_normal((4, 50)), jnp.float32)
    argmax = np.argmax(np.asarray(logits), axis=-1)
    for cfg in (SamplingConfig(), SamplingConfig(temperature=1.0, top_p=1e-6)):
        tokens, _ = sample_with_logprobs(logits, jax.random.key(0), cfg)
        assert np.asarray(tokens).tolist() == argmax.tolist()


def test_one_compile_per_bucket_and_one_decode(model):
    sampler, params = Sampler.for_model(
        model, batch_size=2, cache_len=128, sampling=SamplingConfig(max_new_tokens=3)
    )
    cache = sampler.init_cache()
    key = jax.random.key(0)
    for lengths in ((3, 9), (12, 1), (5, 16), (20, 2), (17, 31)):  # buckets 16, 16, 16, 32, 32
        logits, cache = sampler.prefill(params, cache, _prompts(7, lengths), [0, 0])
        _, cache = sampler.decode(params, cache, logits, [True, True], key)
    assert sampler._prefill._cache_size() == 2
    assert sampler._decode._cache_size() == 1


def test_a_first_chunk_takes_the_causal_block_program_and_matches_the_cached_one(model):
    """A chunk whose rows all start at 0 compiles its own prefill (self-attention on the causal block
    path); its logits and cache equal those of the same tokens fed as two chunks (the cached path)."""
    sampler, params = Sampler.for_model(model, batch_size=2, cache_len=64)
    prompts = _prompts(3, (11, 6))
    fresh_logits, fresh_cache = sampler.prefill(params, sampler.init_cache(), prompts, [0, 0])
    assert sampler._prefill._cache_size() == 1
    _, cache = sampler.prefill(params, sampler.init_cache(), [p[:1] for p in prompts], [0, 0])
    logits, cache = sampler.prefill(params, cache, [p[1:] for p in prompts], [1, 1])
    assert sampler._prefill._cache_size() == 2  # the same bucket, started at 0 or not
    np.testing.assert_allclose(np.asarray(fresh_logits), np.asarray(logits), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(fresh_cache.keys), np.asarray(cache.keys), rtol=0, atol=1e-5)
    assert np.asarray(fresh_cache.lengths_B).tolist() == [11, 6]


def test_sampling_with_temperature_is_reproducible_and_row_independent(model):
    cfg = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=6)
    sampler, params = Sampler.for_model(model, batch_size=3, cache_len=32, sampling=cfg)
    prompts = _prompts(8, (4, 4, 4))
    a = sampler.generate(params, prompts, jax.random.key(5))
    b = sampler.generate(params, prompts, jax.random.key(5))
    c = sampler.generate(params, prompts, jax.random.key(6))
    assert a == b and a != c
    assert all(len(t) == 6 for t in a)


def test_a_key_per_row_makes_each_rows_sample_independent_of_its_batch(model):
    """Row b sampled with keys[b] gives the same tokens whichever row it is and whatever shares the batch."""
    cfg = SamplingConfig(temperature=1.0, max_new_tokens=6)
    sampler, params = Sampler.for_model(model, batch_size=3, cache_len=48, sampling=cfg)
    prompts, keys = _prompts(12, (4, 9, 6)), jax.random.split(jax.random.key(7), 3)

    def sample(order, active=(True, True, True)):
        chunks = [prompts[i] if on else None for i, on in zip(order, active, strict=True)]
        logits, cache = sampler.prefill(params, sampler.init_cache(), chunks, [0, 0, 0])
        result, _ = sampler.decode(params, cache, logits, list(active), keys[np.asarray(order)])
        tokens, counts = np.asarray(result.tokens_BxN), np.asarray(result.counts_B)
        return {i: tokens[r, : counts[r]].tolist() for r, i in enumerate(order) if active[r]}

    together = sample([0, 1, 2])
    assert sample([2, 0, 1]) == together  # rows permuted
    assert sample([1, 2, 0], (False, True, True)) == {i: together[i] for i in (2, 0)}  # without prompt 1
    assert len({tuple(t) for t in together.values()}) == 3


def test_sharded_sampler_equals_single_device(model):
    prompts = _prompts(9, (3, 7, 12, 5, 1, 9, 2, 15))
    cfg = SamplingConfig(max_new_tokens=5)
    single, params = Sampler.for_model(model, batch_size=8, cache_len=48, sampling=cfg)
    expected = single.generate(params, prompts, jax.random.key(0))
    mesh = make_mesh(MeshConfig(axes=(("data", 4), ("fsdp", 1), ("tensor", 2))))
    sharded, _ = Sampler.for_model(model, batch_size=8, cache_len=48, sampling=cfg, mesh=mesh)
    placed = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    assert sharded.generate(placed, prompts, jax.random.key(0)) == expected
    cache = sharded.init_cache()
    assert len(cache.keys.sharding.device_set) == 8


def test_bf16_cache_decodes_close_to_float32(model):
    prompts = _prompts(10, (6, 11))
    cfg = SamplingConfig(max_new_tokens=1)
    f32, params = Sampler.for_model(model, batch_size=2, cache_len=32, sampling=cfg)
    bf16, _ = Sampler.for_model(model, batch_size=2, cache_len=32, sampling=cfg, cache_dtype=jnp.bfloat16)
    for sampler in (f32, bf16):
        cache = sampler.init_cache()
        _, cache = sampler.prefill(params, cache, prompts, [0, 0])
        logits, _ = sampler.prefill(params, cache, [[4, 5], [6]], [6, 11])
        sampler.last_logits = np.asarray(logits)
    assert bf16.init_cache().keys.dtype == jnp.bfloat16
    np.testing.assert_allclose(bf16.last_logits, f32.last_logits, atol=0.1)
    assert not np.allclose(bf16.last_logits, f32.last_logits, atol=1e-7)  # the bf16 cache is really used


def test_bf16_compute_model_samples(model):
    bf16_model = with_config(model, KITCHEN_SINK.replace(dtype=jnp.bfloat16))
    sampler, params = Sampler.for_model(
        bf16_model, batch_size=2, cache_len=32, sampling=SamplingConfig(max_new_tokens=4)
    )
    out = sampler.generate(params, _prompts(11, (5, 9)), jax.random.key(0))
    assert all(len(t) == 4 and all(0 <= x < VOCAB for x in t) for t in out)


def test_a_remat_or_unrolled_model_samples_like_the_same_model_without(model):
    """The SmolLM2 and paper configs train with remat; their samplers must decode (remat inside the decode
    loop's trace failed with TraceContextError) and give the same tokens. Unrolled layers too."""
    outputs = []
    for changes in ({}, {"remat": True}, {"unroll_layers": True}):
        sampler, params = Sampler.for_model(
            with_config(model, KITCHEN_SINK.replace(**changes)),
            batch_size=2,
            cache_len=64,
            sampling=SamplingConfig(max_new_tokens=6),
        )
        outputs.append(sampler.generate(params, _prompts(12, (5, 9)), jax.random.key(0)))
    assert outputs[0] == outputs[1] == outputs[2]


def test_chunk_padding_and_bucket_errors():
    assert Sampler(KITCHEN_SINK, batch_size=1, cache_len=100).buckets == (16, 32, 64, 100)
    ids, mask = left_pad([[1, 2], None, [3]], (4, 8))
    assert ids.tolist() == [[0, 0, 1, 2], [0, 0, 0, 0], [0, 0, 0, 3]]
    assert mask.tolist() == [[0, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1]]
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        left_pad([[1] * 9], (4, 8))
    with pytest.raises(ValueError):
        SamplingConfig(top_p=0.0)


def test_a_cache_window_samples_and_caches_what_the_whole_cache_does(model):
    """Prefill and decode on the first W slots give the same tokens, stops and cache contents as on all of
    them, over two turns, greedy and sampled; one decode program per window bucket used."""
    stops = StopConfig(stop_ids=(7,), stop_sequences=((5, 6),))
    prompts, observations = _prompts(13, (5, 17, 30)), _prompts(14, (9, 40, 3))
    keys = [jax.random.split(jax.random.key(turn), 3) for turn in range(2)]
    outputs = {}
    for name, buckets in (("windowed", (16, 32, 64, 128)), ("whole", (256,))):
        for cfg in (SamplingConfig(max_new_tokens=8), SamplingConfig(temperature=1.0, max_new_tokens=8)):
            sampler, params = Sampler.for_model(
                model, batch_size=3, cache_len=256, sampling=cfg, stops=stops, window_buckets=buckets
            )
            cache, chunks, starts, turns = sampler.init_cache(), prompts, [0, 0, 0], []
            for turn in range(2):
                live = max(s + len(c) for s, c in zip(starts, chunks, strict=True))
                window = sampler.window_for(live)
                logits, cache = sampler.prefill(params, cache, chunks, starts, window)
                result, cache = sampler.decode(params, cache, logits, [True] * 3, keys[turn], window)
                tokens, counts = np.asarray(result.tokens_BxN), np.asarray(result.counts_B)
                turns.append(
                    (window, tokens.tolist(), counts.tolist(), np.asarray(result.reasons_B).tolist())
                )
                starts = np.asarray(cache.lengths_B).tolist()
                chunks = [[int(tokens[r, counts[r] - 1])] + observations[r] for r in range(3)]
            lengths = np.asarray(cache.lengths_B)
            filled = (
                [  # keys [B, K, E, S], values [B, K, S, E] per layer
                    np.asarray(k)[r, ..., : lengths[r]] for k in cache.keys for r in range(3)
                ]
                + [np.asarray(v)[r, :, : lengths[r]] for v in cache.values for r in range(3)]
            )
            ids = [np.asarray(cache.token_ids_BxS)[r, : lengths[r]] for r in range(3)]
            outputs[name, cfg.greedy] = turns, lengths.tolist(), filled, ids
            if name == "windowed":
                assert [t[0] for t in turns] == [64, 128]  # 30 + 8 tokens, then about 90 + 8
                assert sampler._decode._cache_size() == 2
    for greedy in (True, False):
        windowed, whole = outputs["windowed", greedy], outputs["whole", greedy]
        assert [t[1:] for t in windowed[0]] == [t[1:] for t in whole[0]] and windowed[1] == whole[1]
        # the second turn's keys and values come from hidden states attended over 64 vs 256 slots: float32
        # sums in another order (one element in 1,536 differed by 1.5e-6 on an AVX2-only CPU)
        for a, b in zip(windowed[2] + windowed[3], whole[2] + whole[3], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_window_too_small_for_the_turn_is_refused(model):
    sampler, params = Sampler.for_model(model, batch_size=1, cache_len=256, window_buckets=(16, 64))
    assert sampler.window_buckets == (16, 64, 256) and sampler.window_for(10) == 256  # 10 + 256 new tokens
    with pytest.raises(ValueError, match="window 16"):
        sampler.prefill(params, sampler.init_cache(), _prompts(15, (20,)), [0], window=16)
    with pytest.raises(ValueError, match="window 48"):
        sampler.decode(params, sampler.init_cache(), jnp.zeros((1, VOCAB)), [True], jax.random.key(0), 48)


@pytest.mark.parametrize("kernels", ["xla", "cpu"])  # XLA's product; the CPU kernel `logit_stats`
def test_log_normaliser_matches_float64_logsumexp(kernels):
    log_normaliser = _kernel_set(kernels).log_normaliser
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((5, 1000)) * 10).astype(np.float32)
    logits[1, :990] = -np.inf  # top-k truncation leaves ten finite logits
    logits[2, 7] = 80.0  # one dominant logit
    finite = np.where(np.isinf(logits), -np.inf, logits.astype(np.float64))
    peak = finite.max(-1, keepdims=True)
    expected = peak[:, 0] + np.log(np.exp(finite - peak).sum(-1))
    got = np.asarray(jax.jit(log_normaliser)(jnp.asarray(logits)))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5, err_msg=f"seed {seed}")

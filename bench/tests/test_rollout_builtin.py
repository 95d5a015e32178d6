"""`bench/rollout_builtin.py`'s `CallTimer`: device time of a sampler's calls by kind and cache window."""

import jax
import numpy as np
import rollout_builtin
from flax import nnx
from model_fixtures import KITCHEN_SINK, random_decoder

from coevo_jax.sampling import Sampler, SamplingConfig


def test_call_timer_counts_calls_windows_and_decode_steps():
    model = random_decoder(KITCHEN_SINK, seed=5)
    sampler = Sampler(
        KITCHEN_SINK,
        batch_size=2,
        cache_len=64,
        sampling=SamplingConfig(max_new_tokens=5),
        window_buckets=(32,),
    )
    params = nnx.to_pure_dict(nnx.state(model))
    timer = rollout_builtin.CallTimer(sampler)
    chunks = [[5, 6, 7, 8], [9, 10]]
    for turn in range(2):
        window = sampler.window_for(4 + turn)
        cache = sampler.init_cache()
        logits, cache = sampler.prefill(params, cache, chunks, [0, 0], window)
        result, _ = sampler.decode(params, cache, logits, [True, turn == 0], jax.random.key(turn), window)
        # no stop token: every active row runs to the cap
        assert int(np.max(np.asarray(result.counts_B))) == 5

    assert timer.live == [4, 5]  # what each turn asked `window_for`
    rows = {(row["kind"], row["window"]): row for row in timer.rows()}
    assert set(rows) == {("prefill", 32), ("decode", 32)}
    assert rows[("prefill", 32)]["calls"] == 2 and rows[("prefill", 32)]["decode_steps"] == 0
    decode = rows[("decode", 32)]
    assert decode["calls"] == 2 and decode["decode_steps"] == 10
    assert decode["seconds"] > 0 and abs(decode["ms_per_step"] - decode["seconds"] / 10 * 1e3) < 1e-9
    assert abs(sum(row["share"] for row in rows.values()) - 1.0) < 1e-9

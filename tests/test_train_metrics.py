"""Host-side metric read-back: one step late, at the logging cadence, with tokens per second."""

import jax.numpy as jnp
import pytest

from coevo_jax.train import MetricsLog


def test_metrics_are_read_one_step_late_at_the_cadence():
    clock = iter(float(t) for t in range(100))
    log = MetricsLog(every=2, clock=lambda: next(clock))  # window starts at t=0
    outputs = [log.push(step, {"loss": jnp.float32(step), "tokens": jnp.float32(10)}) for step in range(1, 6)]
    # Step 2 is due: read while step 3 is pushed; step 4 while step 5 is pushed.
    assert [o is None for o in outputs] == [True, True, False, True, False]
    assert outputs[2]["step"] == 2 and outputs[2]["loss"] == 2.0
    assert outputs[2]["tokens_per_second"] == pytest.approx(20 / 1)  # steps 1-2: 20 tokens in 1 tick
    assert outputs[4]["tokens_per_second"] == pytest.approx(20 / 1)  # steps 3-4
    last = log.flush()
    assert last["step"] == 5 and log.flush() is None


def test_cadence_must_be_positive():
    with pytest.raises(ValueError):
        MetricsLog(every=0)

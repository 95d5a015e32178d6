"""Host side of the step metrics: device scalars are read back only at the logging cadence.

A step returns a small dict of device scalars. `MetricsLog.push` keeps them without synchronising;
every `every` steps it returns the host values of the step pushed *before* the current one, so that
reading them back never stalls a device that already has the next step queued. Tokens per second are
computed over the whole window from the per-step `tokens` counts (the first window includes compilation).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np


class MetricsLog:
    """Buffers step metrics and hands out host floats every `every` steps (one step late)."""

    def __init__(self, every: int, clock: Callable[[], float] = time.perf_counter):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.every = every
        self._clock = clock
        self._pending: tuple[int, dict] | None = None
        self._window_tokens: list = []
        self._window_start = clock()

    def push(self, step: int, metrics: dict) -> dict[str, float] | None:
        """Records `metrics` of `step`; returns the previous step's host metrics when it is due."""
        due = self._pending is not None and self._pending[0] % self.every == 0
        out = self._read() if due else None
        self._pending = (step, metrics)
        self._window_tokens.append(metrics.get("tokens", 0.0))
        return out

    def flush(self) -> dict[str, float] | None:
        """The last pushed step's host metrics (e.g. at the end of a phase), or None."""
        if self._pending is None:
            return None
        out = self._read()
        self._pending = None
        return out

    def _read(self) -> dict[str, float]:
        step, metrics = self._pending
        host = {k: float(v) for k, v in jax.device_get(metrics).items() if np.ndim(v) == 0}
        # Every step since the last read, up to and including the one read now (it has finished).
        tokens = float(np.sum(jax.device_get(self._window_tokens)))
        now = self._clock()
        host["step"] = float(step)
        host["tokens_per_second"] = tokens / max(now - self._window_start, 1e-9)
        self._window_tokens = []
        self._window_start = now
        return host

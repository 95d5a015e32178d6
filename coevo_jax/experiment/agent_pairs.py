"""The target's and the failure agent's independent stages, run side by side where that is safe.

Both agents' SFT phases, their explorations of an iteration and their co-evolution phases each depend only
on inputs that exist before either starts, so they can run at once. On a single-process CPU run one small
policy's program leaves part of the cores idle (small products, elementwise work, a layer scan), and two
programs dispatched from two threads fill them. Each stage computes exactly what it computes alone: the
same programs, batches, data order and sampling keys.

Never with several processes (each would have to issue its collectives in one order) and not by default on
accelerators or several CPU devices, where one policy's program fills the devices and a second one only adds
memory and contention.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


def resolve_concurrent_agents(
    choice: bool | None, *, platform: str, process_count: int, device_count: int = 1
) -> bool:
    """`ExperimentConfig.concurrent_agents` resolved: None means on for a single-process CPU run on one
    device (on several CPU devices each program already spreads over the cores)."""
    if choice and process_count > 1:
        raise ValueError(
            f"concurrent_agents=True needs a single-process run (this one has {process_count} processes): "
            "every process must issue its programs in one order"
        )
    if choice is None:
        return platform == "cpu" and process_count == 1 and device_count == 1
    return bool(choice)


def run_pair(first: Callable[[], A], second: Callable[[], B], *, concurrent: bool) -> tuple[A, B]:
    """(first(), second()): one after the other, or with `concurrent` `second` in a thread of its own.

    Both always finish before this returns; the first exception raised (first's before second's) propagates.
    """
    if not concurrent:
        return first(), second()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent") as pool:
        other = pool.submit(second)
        try:
            a = first()
        except BaseException:
            other.exception()  # wait for it, then report first's error
            raise
        return a, other.result()

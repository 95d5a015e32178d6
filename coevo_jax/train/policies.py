"""The two co-evolving policies (target and failure agent) on one mesh, and parking the idle one on host.

Training alternates: while one policy takes DPO steps, the other only has to exist (it is sampled from
between phases). `park` moves an idle policy's optimizer state (2/3 of its training bytes with float32 Adam
moments) - optionally its parameters too - to host memory (`pinned_host`, a real memory kind on GPU and
TPU, so the copy is a DMA); `unpark` brings it back into its device shardings, bit for bit. See
docs/memory_plan.md for when this is needed.
"""

from __future__ import annotations

import flax.struct
import jax

from coevo_jax.train.state import TrainState

POLICY_NAMES = ("target", "failure")
HOST_MEMORY_KIND = "pinned_host"


@flax.struct.dataclass
class CoevoState:
    """Both policies' train states and the loop's RNG key (raw uint32 key data, checkpoint-friendly)."""

    target: TrainState
    failure: TrainState
    rng: jax.Array

    def policy(self, name: str) -> TrainState:
        """The train state of 'target' or 'failure'."""
        if name not in POLICY_NAMES:
            raise ValueError(f"unknown policy {name!r}; expected one of {POLICY_NAMES}")
        return getattr(self, name)

    def with_policy(self, name: str, state: TrainState) -> CoevoState:
        """A copy with one policy's state replaced."""
        self.policy(name)
        return self.replace(**{name: state})


def coevo_shardings(policy_shardings: TrainState, rng_sharding) -> CoevoState:
    """Shardings of a CoevoState whose two policies share one architecture and mesh."""
    return CoevoState(target=policy_shardings, failure=policy_shardings, rng=rng_sharding)


def host_memory_available(shardings) -> bool:
    """Whether every device of these shardings has a pinned host memory space."""
    leaves = jax.tree.leaves(shardings)
    devices = {d for s in leaves for d in s.device_set}
    return all(HOST_MEMORY_KIND in {m.kind for m in d.addressable_memories()} for d in devices)


def _to_memory(tree, shardings, kind: str | None):
    target = shardings if kind is None else jax.tree.map(lambda s: s.with_memory_kind(kind), shardings)
    return jax.device_put(tree, target)


def park(state: TrainState, shardings: TrainState, *, params_too: bool = False) -> TrainState:
    """The state with its optimizer state (and, with `params_too`, its parameters) in pinned host memory."""
    if not host_memory_available(shardings.opt_state):
        raise RuntimeError(f"devices of this mesh have no {HOST_MEMORY_KIND!r} memory to park state in")
    params = _to_memory(state.params, shardings.params, HOST_MEMORY_KIND) if params_too else state.params
    return state.replace(
        opt_state=_to_memory(state.opt_state, shardings.opt_state, HOST_MEMORY_KIND), params=params
    )


def unpark(state: TrainState, shardings: TrainState) -> TrainState:
    """The state back in device memory, in exactly its train-step shardings."""
    return jax.device_put(state, shardings)


def is_parked(state: TrainState) -> bool:
    """Whether any array of the state lives in host memory."""
    return any(leaf.sharding.memory_kind == HOST_MEMORY_KIND for leaf in jax.tree.leaves(state))

"""The two-policy state, and parking an idle policy in host memory and back (bit-exact)."""

import jax
import numpy as np
import pytest
from train_fixtures import MESHES, fresh_state, mesh_of, setup, to_numpy

from coevo_jax.train.policies import CoevoState, is_parked, park, unpark


@pytest.fixture(scope="module")
def policy():
    mesh = mesh_of(MESHES["data2_fsdp4"])
    _, shardings, _, _, _ = setup(mesh)
    return shardings, fresh_state(shardings)


@pytest.mark.parametrize("params_too", [False, True])
def test_park_and_unpark_round_trip_is_exact(policy, params_too):
    shardings, state = policy
    parked = park(state, shardings, params_too=params_too)
    assert is_parked(parked) and not is_parked(state)
    kinds = {leaf.sharding.memory_kind for leaf in jax.tree.leaves(parked.opt_state)}
    assert kinds == {"pinned_host"}
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(parked.params)} == (
        {"pinned_host"} if params_too else {"device"}
    )
    restored = unpark(parked, shardings)
    assert not is_parked(restored)
    jax.tree.map(
        lambda r, s: r.sharding.is_equivalent_to(s, r.ndim) or pytest.fail(str(r.sharding)),
        restored,
        shardings,
    )
    jax.tree.map(np.testing.assert_array_equal, to_numpy(restored), to_numpy(state))


def test_coevo_state_selects_and_replaces_policies(policy):
    _, state = policy
    both = CoevoState(target=state, failure=state, rng=jax.random.key_data(jax.random.key(0)))
    bumped = both.with_policy("failure", state.replace(step=state.step + 1))
    assert int(bumped.policy("failure").step) == 1 and int(bumped.policy("target").step) == 0
    with pytest.raises(ValueError, match="unknown policy"):
        both.policy("expert")

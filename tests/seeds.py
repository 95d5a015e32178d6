"""Fresh random seeds for the tests that draw new inputs on every run, each printed so it can be replayed.

pytest shows a failing test's printed output, so the seed is in every failure report; rerunning the test
with `COEVO_TEST_SEED=<seed>` in the environment draws exactly the same inputs again.
"""

import os

SEED_VARIABLE = "COEVO_TEST_SEED"


def fresh_seed() -> int:
    """A random 32-bit seed, or the one in `COEVO_TEST_SEED`; printed with the command line to replay it."""
    replay = os.environ.get(SEED_VARIABLE)
    seed = int(replay) if replay else int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed} (replay with {SEED_VARIABLE}={seed})")
    return seed

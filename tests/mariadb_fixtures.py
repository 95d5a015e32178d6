"""InterCode-SQL's backends for parametrized tests: the server backends need `bash launch/<backend>.sh start`.

`BACKENDS` are the ones CI runs: without a server a test of the mariadb backend is skipped, except where $CI
is set: CI starts the server (.ci/run), so there a missing server fails the test instead of hiding it.
`ALL_BACKENDS` adds `mysql`, whose tests run where `launch/mysql.sh start` was run and are skipped elsewhere,
CI included (the script fetches MySQL from Debian's moving unstable suite).
"""

import os

import pytest

from coevo_jax.envs.intercode_sql.env import BACKENDS as ALL_BACKENDS

BACKENDS = ("sqlite", "mariadb")
__all__ = ["ALL_BACKENDS", "BACKENDS", "require_backend", "table_checksums"]


def require_backend(backend: str) -> None:
    """Skips a server-backend test when no server answers at the default socket (mariadb: fails under $CI)."""
    if backend == "sqlite":
        return
    from coevo_jax.envs.intercode_sql.server import SERVER_BACKENDS, ServerUnavailable

    try:
        SERVER_BACKENDS[backend](timeout_s=1.0, max_rows=10, max_result_bytes=1000).close()
    except ServerUnavailable as error:
        if backend == "mariadb" and os.environ.get("CI"):
            pytest.fail(f"CI starts the MariaDB server (launch/mariadb.sh start), yet: {error}")
        pytest.skip(f"no {backend} server (bash launch/{backend}.sh start): {error}")


def table_checksums(env, databases) -> dict:
    """CHECKSUM TABLE of every table of `databases`, read through the environment's server sessions."""
    sums = {}
    for db in databases:
        tables = [name for (name,) in env.run(db, "SHOW TABLES")]
        rows = env.run(db, "CHECKSUM TABLE " + ", ".join(f"`{t}`" for t in tables))
        assert isinstance(rows, list), rows
        sums.update(dict(rows))
    return sums

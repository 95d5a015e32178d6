"""InterCode-SQL (`InterCodeSqlEnv`): Spider dev questions answered by querying the database, on SQLite or MariaDB.

* `env`: `InterCodeSqlEnv`, the environment: splits, episodes, the score; its backend answers the agent's SQL.
* `sqlite_backend`: the embedded default, MySQL answered on SQLite copies of the databases.
* `server`: the MariaDB backend (`launch/mariadb.sh` starts the server), set to MySQL 8's ways;
  `group_by`: MySQL 8's unsorted GROUP BY there.
* `statements`: the agent's SQL read and its output shown as InterCode's MySQL server did (SHOW,
  DESCRIBE, USE, MySQL's error messages, the observation text).
* `db`: InterCode's MySQL dump converted to SQLite files (cached) and their schema.
* `mysql`: MySQL's collation and functions installed into SQLite connections.
* `sandbox`: read-only, time- and size-limited execution of the agent's SQL on SQLite.
* `reward`: InterCode's reward (row IoU times Kendall tau of their order).
* `experts`: InterCode's recorded GPT-4 episodes as expert demonstrations.
* `agreement`: CLI replaying those episodes to check that our reward agrees with InterCode's.
"""

from coevo_jax.envs.intercode_sql.env import InterCodeSqlEnv

__all__ = ["InterCodeSqlEnv"]

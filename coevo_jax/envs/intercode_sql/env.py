"""InterCode-SQL: Spider dev questions answered by querying the database, scored on `submit`.

Behaviour follows InterCode's `SqlEnv` (a MySQL 8 server in Docker), on one of three backends:
- `backend="sqlite"` (the default, embedded, offline): SQLite copies of the databases answer as MySQL does
  (`sqlite_backend`: SHOW and DESCRIBE from the catalogue, MySQL's collation, functions and messages);
- `backend="mariadb"`: the project's MariaDB server answers everything (`server`; start it with
  `bash launch/mariadb.sh start`; `socket` or $COEVO_MARIADB_SOCKET say where it listens);
- `backend="mysql"`: a MySQL server answers everything as it is (`launch/mysql.sh` runs Debian's build
  privately; `socket` or $COEVO_MYSQL_SOCKET point at another, InterCode's own MySQL 8.0.31 say).
On all three:
- an action is one SQL statement, or `submit`; `USE db` switches the episode's database;
- the observation is `str()` of the result rows, `None` for a statement without rows, or
  `Error executing query: <message>`; a result past the size limit is cut and said to be (`render_output`);
- the score is InterCode's reward (`reward`) of the last statement's output against the gold
  query's, clamped to [0, 1]. `submit` ends the episode with it; every other step reports what submitting
  now would score, as InterCode's recorded multi-turn runs do, so an episode that runs out of steps is
  scored on its last output;
- the agent's SQL runs read-only and time- and size-limited. Writes, which InterCode's server allowed (and
  never reset), are refused.

Task ids are indices into `ic_spider_dev.json`. Splits are by database (documented in the README):
`test_unseen` is every task of car_1, dog_kennels and orchestra (214 tasks); of the other 17 databases,
every fifth task (by index within its database) is `test_seen` and the rest are `train`.
Expert trajectories are InterCode's GPT-4 episodes that reached reward 1 (`experts`).

`add_tasks` takes other questions on the same databases (CoEvolve's synthesized tasks): a `TaskSpec` whose
instruction is the question and whose state names the database and the gold query; they are scored like the
others. `run` executes a statement on a database outside any episode; `scan_decides_order` says whether a
query's row order is only the table scan's (checked on the SQLite copies, whatever the backend).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path

from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment, StepResult, TaskSpec, check_task_id, is_new_spec
from coevo_jax.envs.intercode_sql.db import DATA_DIR, DUMP_PATH, build_databases, load_schema
from coevo_jax.envs.intercode_sql.experts import replay_experts
from coevo_jax.envs.intercode_sql.reward import intercode_reward
from coevo_jax.envs.intercode_sql.sqlite_backend import SqliteBackend
from coevo_jax.envs.intercode_sql.statements import USE, normalize_action, render_output

TASKS_PATH = DATA_DIR / "ic_spider_dev.json"
UNSEEN_DATABASES = ("car_1", "dog_kennels", "orchestra")
TEST_SEEN_EVERY = 5
BACKENDS = ("sqlite", "mariadb", "mysql")
MAX_STEPS = 10  # InterCode's multi-turn GPT-4 runs used 10 turns

INSTRUCTION = (
    "You are a helpful assistant that answers questions about a MySQL database by querying it. "
    "Each turn, first think about what to do, then write one SQL command; you will receive its output "
    "(result rows) or its error message as the observation. Explore the schema when you need to with "
    "SHOW TABLES and DESCRIBE <table>. When the output of your last query answers the question, submit it.\n"
    "Your response must use the following format:\n\n"
    "Thought: I think ...\nAction: <one SQL command, or submit>\n\n"
    "The Action is executed exactly as written: write a single SQL command on one line, without code "
    "fences. The answer is scored on the rows returned by your last query before you submit."
)


class InterCodeSqlEnv(Environment):
    """InterCode-SQL over the Spider dev databases, on SQLite or a MariaDB server (see the module docstring)."""

    name = "intercode_sql"

    def __init__(
        self,
        *,
        tasks_path: str | Path = TASKS_PATH,
        dump_path: str | Path = DUMP_PATH,
        cache_root: str | Path | None = None,
        query_timeout_s: float = 5.0,
        max_rows: int = 100_000,
        max_result_bytes: int = 1_000_000,
        max_observation_chars: int | None = None,
        backend: str = "sqlite",
        socket: str | Path | None = None,
    ):
        """`socket` is the server backends' unix socket (default: where launch/<backend>.sh puts it)."""
        if backend not in BACKENDS:
            raise ValueError(f"{self.name}: unknown backend {backend!r}; backends: {', '.join(BACKENDS)}")
        self.tasks_path = Path(tasks_path)
        # The SQLite copies are built on either backend: their catalogue names the databases, and they
        # answer `scan_decides_order`.
        db_dir = build_databases(Path(dump_path), Path(cache_root) if cache_root else None)
        self._schema = load_schema(db_dir)
        self._records = _load_tasks(self.tasks_path, set(self._schema))
        self.query_timeout_s, self.max_rows = query_timeout_s, max_rows
        self.max_result_bytes = max_result_bytes
        self.max_observation_chars = max_observation_chars
        limits = dict(timeout_s=query_timeout_s, max_rows=max_rows, max_result_bytes=max_result_bytes)
        self._sqlite = SqliteBackend(db_dir, self._schema, **limits)
        if backend in ("mariadb", "mysql"):
            from coevo_jax.envs.intercode_sql.server import SERVER_BACKENDS  # needs PyMySQL

            self._backend = SERVER_BACKENDS[backend](socket, **limits)
        else:
            self._backend = self._sqlite
        self.backend = backend
        self._added: dict[str, TaskSpec] = {}
        self._added_records: dict[str, dict] = {}
        self._gold_rows: dict[str, list] = {}
        self._task_id: str | None = None
        self._db: str | None = None
        self._last_output: list | str | None = None
        self._done = True

    # -- tasks and splits -------------------------------------------------------------------------------
    @property
    def instruction(self) -> str:
        return INSTRUCTION

    def splits(self) -> tuple[str, ...]:
        return ("train", "test_seen", "test_unseen")

    @cached_property
    def _split_ids(self) -> dict[str, list[str]]:
        splits: dict[str, list[str]] = {name: [] for name in self.splits()}
        position: dict[str, int] = {}
        for index, record in enumerate(self._records):
            db = record["db"]
            if db in UNSEEN_DATABASES:
                splits["test_unseen"].append(str(index))
                continue
            k = position.get(db, 0)
            position[db] = k + 1
            splits["test_seen" if k % TEST_SEEN_EVERY == TEST_SEEN_EVERY - 1 else "train"].append(str(index))
        return splits

    def tasks(self, split: str) -> list[str]:
        if split not in self._split_ids:
            raise ValueError(f"unknown {self.name} split {split!r}; splits: {', '.join(self.splits())}")
        return list(self._split_ids[split])

    def max_steps(self, task_id: str) -> int:
        self.record(task_id)
        return MAX_STEPS

    def add_tasks(self, specs: Iterable[TaskSpec]) -> None:
        """Added questions: `state` is {"db": a database, "gold": its gold query}, the question `instruction`."""
        for spec in specs:
            own = spec.task_id.isdigit() and int(spec.task_id) < len(self._records)
            if not is_new_spec(self.name, self._added, spec, own):
                continue
            state = spec.state if isinstance(spec.state, dict) else {}
            db, gold = state.get("db"), state.get("gold")
            if not isinstance(db, str) or db.lower() not in self._schema:
                raise ValueError(f"{self.name}: task {spec.task_id}: unknown database {db!r}")
            if not isinstance(gold, str) or not gold.strip() or not spec.instruction.strip():
                raise ValueError(f"{self.name}: task {spec.task_id}: needs a question and a gold query")
            self._added[spec.task_id] = spec
            self._added_records[spec.task_id] = {
                "db": db,
                "query": spec.instruction,
                "gold": gold,
                "hardness": "added",
            }

    def record(self, task_id: str) -> dict:
        """The task's record of ic_spider_dev.json (an added task's alike): db, query (the question), gold,
        hardness."""
        check_task_id(self.name, task_id)
        if task_id in self._added_records:
            return self._added_records[task_id]
        if not (task_id.isdigit() and int(task_id) < len(self._records)):
            raise ValueError(f"unknown {self.name} task id {task_id!r} (ids are 0..{len(self._records) - 1})")
        return self._records[int(task_id)]

    # -- episodes -------------------------------------------------------------------------------------------
    def reset(self, task_id: str) -> str:
        record = self.record(task_id)
        self._task_id, self._db = task_id, record["db"].lower()
        self._last_output, self._done = None, False
        self._backend.end_session("episode")  # the last episode's session variables end with it
        return f"Database: {record['db']}\nQuestion: {record['query']}"

    def step(self, action: str) -> StepResult:
        if self._task_id is None or self._done:
            raise RuntimeError(f"{self.name}: step() called without an episode in progress (call reset)")
        statement = normalize_action(action)
        if statement.lower() == "submit":
            self._done = True
            score = self.score()
            return (
                render_output(self._last_output, self.max_observation_chars),
                score,
                True,
                {"reward": score},
            )
        self._last_output = self.execute(statement)
        return render_output(self._last_output, self.max_observation_chars), self.score(), False, {}

    def score(self) -> float:
        """The reward `submit` would give now: InterCode's, clamped to [0, 1]."""
        return min(1.0, max(0.0, intercode_reward(self._last_output, self.gold_rows(self._task_id))))

    def gold_rows(self, task_id: str) -> list:
        """The gold query's rows; a gold query that fails counts as no rows, as in InterCode."""
        if task_id not in self._gold_rows:
            record = self.record(task_id)
            rows = self._backend.answer(record["db"].lower(), record["gold"], session="gold")
            self._gold_rows[task_id] = rows if isinstance(rows, list) else []
        return self._gold_rows[task_id]

    def execute(self, statement: str) -> list | str | None:
        """One statement in the current database: rows, None (no result set) or the error text."""
        used = USE.match(statement)
        if used:
            db = used.group(1).lower()
            if db not in self._schema:
                return f"Error executing query: Unknown database '{db}'"
            self._db = db
            return None
        return self._backend.answer(self._db, statement)

    def run(self, db: str, sql: str, *, reverse_scan: bool = False) -> list | str | None:
        """`sql` on database `db` outside any episode, answered as in an episode (SHOW and DESCRIBE
        included; USE changes nothing): rows, None or the error text. `reverse_scan` (SQLite backend only)
        runs it with SQLite's `reverse_unordered_selects` (tables and indexes scanned backwards where no
        ORDER BY fixes the order), so a result whose row order is the scan's comes back in another order."""
        if db.lower() not in self._schema:
            return f"Error executing query: Unknown database '{db}'"
        statement = normalize_action(sql)
        if USE.match(statement):
            return None
        return self._backend.answer(db.lower(), statement, session="outside", reverse_scan=reverse_scan)

    def scan_decides_order(self, db: str, sql: str) -> bool:
        """Whether `sql`'s rows come back in another order when SQLite scans tables backwards: its row
        order is then the storage's, not the query's. Checked on the SQLite copies on either backend."""
        statement = normalize_action(sql)
        forward = self._sqlite.answer(db.lower(), statement, session="outside")
        return self._sqlite.answer(db.lower(), statement, session="outside", reverse_scan=True) != forward

    def expert_trajectories(self, split: str, limit: int | None = None) -> list[Trajectory]:
        """The first `limit` of InterCode's GPT-4 wins on `split` that score 1.0 here too (`experts`).

        `limit` counts kept trajectories: every episode of the split is replayed, those that score below 1.0
        here are left out.
        """
        kept, _ = replay_experts(self, split)
        return kept[:limit]

    def close(self) -> None:
        self._backend.close()
        self._sqlite.close()


def _load_tasks(path: Path, databases: set[str]) -> list[dict]:
    """ic_spider_dev.json's records, checked: each needs db (a known database), query and gold strings."""
    try:
        records = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read the task file: {error}") from None
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a list of task records")
    for index, record in enumerate(records):
        for field in ("db", "query", "gold"):
            value = record.get(field) if isinstance(record, dict) else None
            if not isinstance(value, str) or not value:
                raise ValueError(f"{path}: record {index}: field {field!r} must be a non-empty string")
        if record["db"].lower() not in databases:
            raise ValueError(f"{path}: record {index}: field 'db': unknown database {record['db']!r}")
    return records

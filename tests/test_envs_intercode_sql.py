"""InterCode-SQL: the environment, InterCode's recorded runs replayed in it, the experts, the rollout loop.

Tests taking a `backend` run on SQLite and on the MariaDB server (`mariadb_fixtures`: skipped without a server,
except under CI). The parts below the environment are tested in `test_envs_intercode_sql_db.py`,
`test_envs_intercode_sql_reward.py` and `test_envs_intercode_sql_server.py`.
"""

import collections
import hashlib
import itertools
import json
import random
import re
import time
from pathlib import Path

import pytest
from mariadb_fixtures import ALL_BACKENDS, BACKENDS, require_backend, table_checksums
from rollout_fixtures import smollm2_actor

from coevo_jax.envs import make
from coevo_jax.envs.base import ExpertStep
from coevo_jax.envs.intercode_sql.agreement import reward_agreement
from coevo_jax.envs.intercode_sql.db import build_databases
from coevo_jax.envs.intercode_sql.env import MAX_STEPS, UNSEEN_DATABASES, InterCodeSqlEnv
from coevo_jax.envs.intercode_sql.experts import (
    HARNESS_REJECTION,
    GptEpisode,
    expert_steps,
    load_episodes,
    replay_experts,
)
from coevo_jax.envs.intercode_sql.sandbox import TruncatedRows
from coevo_jax.envs.intercode_sql.statements import (
    SYSTEM_SCHEMAS,
    like_match,
    mysql_error_message,
    normalize_action,
    render_output,
)
from coevo_jax.react import INVALID_FORMAT_OBSERVATION, parse_action
from coevo_jax.rollout import RolloutConfig, ScriptedActor, run_rollouts


@pytest.fixture(scope="module")
def env(cache):
    environment = InterCodeSqlEnv(cache_root=cache)
    yield environment
    environment.close()


@pytest.fixture(scope="module", params=ALL_BACKENDS)
def backend_env(request, cache):
    """The environment on each backend in turn."""
    require_backend(request.param)
    environment = InterCodeSqlEnv(cache_root=cache, backend=request.param)
    yield environment
    environment.close()


@pytest.fixture(scope="module")
def episodes():
    return load_episodes()


# -- schema commands and the task file ---------------------------------------------------------------------
def test_describe_and_show_tables_match_every_recorded_mysql_observation(env, episodes):
    """Our emulated SHOW TABLES / DESCRIBE / SHOW COLUMNS print exactly what InterCode's MySQL printed.

    InterCode's server was not reset between these runs: a GPT-4 `ALTER TABLE` that MySQL executed shows up
    in later episodes' DESCRIBE of that table, so those tables are left out.
    """
    altered = {
        a.split()[2].lower()
        for e in episodes
        for a, o in zip(e.actions, e.observations, strict=True)
        if a.upper().startswith("ALTER TABLE") and o == "None"
    }
    assert altered == {"contestants", "course", "employee", "performance", "pets"}
    checked = 0
    for episode in episodes:
        env.reset(episode.task_id)
        for action, observation in zip(episode.actions, episode.observations, strict=True):
            if observation.startswith(HARNESS_REJECTION):
                continue
            ours = env.step(action)[0]  # every action runs: a USE changes what SHOW TABLES lists
            if action.split()[-1].lower() in altered:
                continue
            if action.strip().upper().startswith(("DESCRIBE", "SHOW TABLES", "SHOW COLUMNS")):
                assert ours == observation, (episode.task_id, action)
                checked += 1
    assert checked >= 1860  # of 1,928 such commands; the rest describe an altered table


def test_a_malformed_task_file_names_record_and_field(tmp_path, cache):
    path = tmp_path / "tasks.json"
    path.write_text(
        json.dumps([{"db": "singer", "query": "q", "gold": "SELECT 1"}, {"db": "singer", "query": "q"}])
    )
    with pytest.raises(ValueError, match=r"tasks.json: record 1: field 'gold'"):
        InterCodeSqlEnv(tasks_path=path, cache_root=cache)


# -- the environment -----------------------------------------------------------------------------------------
def test_splits_are_by_database_and_cover_every_task(env):
    splits = {name: env.tasks(name) for name in env.splits()}
    assert {k: len(v) for k, v in splits.items()} == {"train": 661, "test_seen": 159, "test_unseen": 214}
    every = list(itertools.chain(*splits.values()))
    assert sorted(every, key=int) == [str(i) for i in range(1034)]
    db = {split: {env.record(t)["db"].lower() for t in ids} for split, ids in splits.items()}
    assert db["test_unseen"] == set(UNSEEN_DATABASES)
    assert db["test_seen"] <= db["train"] and not db["train"] & db["test_unseen"]
    with pytest.raises(ValueError, match="unknown intercode_sql split"):
        env.tasks("dev")


def test_an_episode_is_scored_like_intercode(backend_env):
    env = backend_env
    text = env.reset("0")
    assert text.startswith("Database: poker_player\nQuestion: What are the names of poker players")
    assert env.max_steps("0") == MAX_STEPS
    observation, score, done, _ = env.step("SELECT player_name FROM poker_players")
    assert observation == "Error executing query: Table 'poker_player.poker_players' doesn't exist"
    assert (score, done) == (0.0, False)
    assert env.step("SHOW TABLES")[0] == "[('people',), ('poker_player',)]"
    answer = "SELECT T1.Name FROM people AS T1 JOIN poker_player AS T2 ON T1.People_ID = T2.People_ID"
    _, score, done, _ = env.step(f"```sql\n{answer} ORDER BY T2.Final_Table_Made;\n```")
    assert (score, done) == (1.0, False)
    _, reversed_score, _, _ = env.step(answer + " ORDER BY T2.Final_Table_Made DESC")
    assert reversed_score == 0.0  # InterCode would say -1.0: clamped
    env.step(answer + " ORDER BY T2.Final_Table_Made")
    _, score, done, _ = env.step("submit")
    assert (score, done) == (1.0, True)
    with pytest.raises(RuntimeError, match="without an episode"):
        env.step("SHOW TABLES")


def test_emulated_commands_and_errors(env):
    env.reset("0")
    assert env.step("DESCRIBE nope")[0] == "Error executing query: Table 'poker_player.nope' doesn't exist"
    assert env.step("USE nowhere")[0] == "Error executing query: Unknown database 'nowhere'"
    assert env.step("USE poker_player")[0] == "None"
    assert "('world_1',)" in env.step("SHOW DATABASES")[0]
    assert (
        env.step("SELECT Nme FROM people")[0] == "Error executing query: Unknown column 'Nme' in 'field list'"
    )
    assert (
        env.step("DELETE FROM people")[0]
        == "Error executing query: command denied: the database is read-only"
    )
    assert mysql_error_message('near "FORM": syntax error', "x").startswith(
        "You have an error in your SQL syntax"
    )
    assert normalize_action("  SELECT 1;  ") == "SELECT 1"
    with pytest.raises(
        ValueError, match=r"intercode_sql: a task id must be a string .*got int 809; use '809'"
    ):
        env.reset(809)


def test_long_observations_can_be_truncated(cache):
    short = InterCodeSqlEnv(cache_root=cache, max_observation_chars=50)
    short.reset("0")
    observation, _, _, _ = short.step("SELECT * FROM people")
    assert len(observation) == 50 + len(" ... (truncated)") and observation.endswith("(truncated)")
    short.close()


def _like_reference(pattern: str, text: str) -> bool:
    """LIKE as a regular expression (exponential on many %, so only for short patterns)."""
    regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, text, re.I | re.S) is not None


def test_like_match_agrees_with_a_regular_expression_on_random_patterns():
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice("abAB_") for _ in range(rng.randrange(0, 8)))
        pattern = "".join(rng.choice("aAb%%_") for _ in range(rng.randrange(0, 7)))
        assert like_match(pattern, text) == _like_reference(pattern, text), (pattern, text)
    assert like_match(r"poker\_%", "poker_player") and not like_match(r"poker\_%", "pokerXplayer")


def test_normalize_action_reads_code_fences():
    assert normalize_action("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert normalize_action("```MySQL SELECT 2```") == "SELECT 2"
    assert normalize_action("```SELECT 3```") == "SELECT 3"
    assert normalize_action("```sql\nSELECT 4") == "```sql\nSELECT 4"  # no closing fence: kept as is
    assert normalize_action("````") == "````"


def test_render_output_builds_only_what_it_shows():
    rows = [(i, f"name {i}") for i in range(1000)]
    assert render_output(rows) == str(rows) and render_output(None) == "None" and render_output([]) == "[]"
    assert render_output(rows, 30) == str(rows)[:30] + " ... (truncated)"
    cut = render_output(TruncatedRows(rows[:2], 64))
    assert (
        cut
        == f"{rows[:2]} ... (truncated: the result is larger than 64 bytes; only its first 2 rows were fetched)"
    )


_DEADLINE_S = 1.0
_TIMED_OUT = (
    "Error executing query: Query execution was interrupted, maximum statement execution time exceeded"
)
_CUT_AT_2_ROWS = "(truncated: the result is larger than 1000000 bytes; only its first 2 rows were fetched)"
_CUT = "(truncated: the result is larger than 1000000 bytes"
_HOSTILE_ACTIONS = {  # action -> what the observation must contain, on (sqlite, mariadb)
    "SHOW TABLES LIKE '" + "%" * 12 + "z'": ("[]", "[]"),
    "SHOW TABLES LIKE '" + "%" * 5000 + "z'": ("[]", "[]"),
    "SHOW TABLES LIKE '" + "%_" * 40 + "%r'": ("[]", "[]"),
    "SHOW TABLES LIKE '" + "%p" * 2 + "%'": ("[('people',), ('poker_player',)]",) * 2,
    "SELECT 1 WHERE '" + "a" * 5000 + "!' REGEXP '^(a+)+$'": ("[]", "[]"),
    # MariaDB's PCRE gives up on catastrophic backtracking by itself (no match)
    "SELECT 1 WHERE '" + "a" * 5000 + "!' REGEXP '^(a|aa)+$'": (_TIMED_OUT, "[]"),
    "SELECT 1 WHERE '" + "a" * 40 + "!' REGEXP '^(a|a)*$'": (_TIMED_OUT, "[]"),
    "SELECT Name FROM people WHERE '" + "x" * 3000 + "' REGEXP '(x+x+)+y'": (_TIMED_OUT, "[]"),
    "SELECT printf('%.*c', 2147483647, 'x')": (
        "Error executing query: FUNCTION printf does not exist",
        "Error executing query: FUNCTION poker_player.printf does not exist",
    ),
    "SELECT PRINTF('%.*f', 2147483647, 1.0)": (
        "Error executing query: FUNCTION printf does not exist",
        "Error executing query: FUNCTION poker_player.PRINTF does not exist",
    ),
    "SELECT format('%.*c', 2147483647, 'x')": ("[('0." + "0" * 30 + "',)]", "[('0." + "0" * 38 + "',)]"),
    "```sql" + "\n" * 8000: ("Error executing query",) * 2,
    "```" + "\n" * 8000 + "SELECT 1": ("Error executing query",) * 2,
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 250) SELECT zeroblob(999000) FROM c": (
        _CUT_AT_2_ROWS,
        "FUNCTION poker_player.zeroblob does not exist",
    ),
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 250) SELECT REPEAT('x', 999000) FROM c": (
        "no such function: REPEAT",
        _CUT_AT_2_ROWS,
    ),
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 400) SELECT randomblob(999000) FROM c": (
        _CUT,
        "FUNCTION poker_player.randomblob does not exist",
    ),
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 400) "
    "SELECT replace(hex(zeroblob(499000)), '0', 'x') FROM c": (
        _CUT,
        "FUNCTION poker_player.zeroblob does not exist",
    ),
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000) "
    "SELECT hex(randomblob(400000)) AS h FROM c ORDER BY h COLLATE MYSQL_CI": (
        "maximum statement execution time",
        "Unknown collation: 'MYSQL_CI'",
    ),
    "SELECT 1 WHERE '" + "a" * 3000 + "' LIKE '" + "%a" * 200 + "%b'": ("[]", "[]"),
    # MariaDB ends a recursive CTE after 1,000 iterations (max_recursive_iterations)
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c": (
        _TIMED_OUT,
        "[(1001,)]",
    ),
    "SELECT SLEEP(10)": ("no such function: SLEEP", _TIMED_OUT),
    "KILL CONNECTION_ID()": ("You have an error in your SQL syntax", "Lost connection to the server"),
    "SELECT REPEAT('x', 100000000)": ("no such function: REPEAT", "[(None,)]"),  # over max_allowed_packet
    "SELECT * FROM people a, people b, people c, people d, people e, people f": (_CUT, _CUT),  # 117,649 rows
    "SELECT count(*) FROM people a, people b, people c, people d, people e, people f, people g, people h, "
    "people i": ("[(40353607,)]", _TIMED_OUT),
}


def _unchanged_data(env, cache, databases=("poker_player",)):
    """What a statement must not change: the SQLite files' bytes, or the server's table checksums."""
    if env.backend == "sqlite":
        db_dir = build_databases(root=cache)
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in db_dir.glob("*.sqlite")}
    return table_checksums(env, databases)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("action", list(_HOSTILE_ACTIONS), ids=lambda a: a[:40])
def test_hostile_actions_are_answered_within_the_deadline(cache, backend, action):
    """Each once took from seconds to minutes or gigabytes (issue 24); the data stay unchanged."""
    require_backend(backend)
    environment = InterCodeSqlEnv(cache_root=cache, query_timeout_s=_DEADLINE_S, backend=backend)
    before = _unchanged_data(environment, cache)
    environment.reset("0")
    start = time.monotonic()
    observation, score, done, _ = environment.step(action)
    elapsed = time.monotonic() - start
    assert elapsed < _DEADLINE_S + 1.5, f"{elapsed:.1f} s"
    expected = _HOSTILE_ACTIONS[action][BACKENDS.index(backend)]
    assert expected in observation and len(observation) < 9_000_000, observation[:300]
    assert (score, done) == (0.0, False)
    answer = "SELECT T1.Name FROM people AS T1 JOIN poker_player AS T2 ON T1.People_ID = T2.People_ID"
    assert environment.step(answer + " ORDER BY T2.Final_Table_Made")[1] == 1.0  # still usable
    assert _unchanged_data(environment, cache) == before
    environment.close()


_WRITES = (
    "DELETE FROM people",
    "UPDATE people SET Name = 'x'",
    "INSERT INTO people (Name) VALUES ('x')",
    "REPLACE INTO people (People_ID, Name) VALUES (1, 'x')",
    "DROP TABLE people",
    "TRUNCATE TABLE people",
    "ALTER TABLE people ADD COLUMN x INT",
    "CREATE TABLE t (x INT)",
    "CREATE TEMPORARY TABLE t (x INT)",
    "CREATE VIEW v AS SELECT 1",
    "CREATE INDEX i ON people (Name(10))",
    "RENAME TABLE people TO p2",
    "CREATE DATABASE evil",
    "DROP DATABASE poker_player",
    "SELECT * FROM people INTO OUTFILE '/tmp/coevo_intercode_out.txt'",
    "LOAD DATA INFILE '/etc/passwd' INTO TABLE people",
    "GRANT ALL ON *.* TO 'coevo_reader'@'localhost'",
    "SET PASSWORD = PASSWORD('x')",
    "CREATE USER 'evil'@'localhost'",
    "CREATE PROCEDURE p() SELECT 1",
    "CREATE TRIGGER tr BEFORE INSERT ON people FOR EACH ROW SET NEW.Name = 'x'",
    "LOCK TABLES people WRITE",
    "ANALYZE TABLE people",
    "OPTIMIZE TABLE people",
    "FLUSH TABLES",
    "SET GLOBAL read_only = 0",
    "SHUTDOWN",
    "PREPARE s FROM 'DELETE FROM people'",
    "EXECUTE s",
    "SELECT 1; DELETE FROM people",
    "ATTACH '/tmp/coevo_intercode_other.db' AS other",
    "PRAGMA query_only = OFF",
    "VACUUM INTO '/tmp/coevo_intercode_copy.db'",
)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_no_write_succeeds(cache, backend):
    """InterCode's server let GPT-4 ALTER its tables; here every kind of write is refused and nothing changes."""
    require_backend(backend)
    environment = InterCodeSqlEnv(cache_root=cache, backend=backend)
    databases = [name for (name,) in environment.run("poker_player", "SHOW DATABASES")]
    databases = [name for name in databases if name not in SYSTEM_SCHEMAS]
    assert len(databases) == 20
    before = _unchanged_data(environment, cache, databases)
    environment.reset("0")
    for statement in _WRITES:
        assert environment.step(statement)[0].startswith("Error executing query"), statement
    assert environment.step("SELECT count(*) FROM people")[0] == "[(7,)]"
    assert _unchanged_data(environment, cache, databases) == before
    for leftover in ("/tmp/coevo_intercode_out.txt", "/tmp/coevo_intercode_copy.db"):
        assert not Path(leftover).exists()
    environment.close()


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_registry_builds_it(backend):
    require_backend(backend)
    kwargs = {} if backend == "sqlite" else {"backend": backend}  # the server found where it is by default
    environment = make("intercode_sql", **kwargs)
    assert environment.name == "intercode_sql" and len(environment.tasks("train")) == 661
    environment.reset("0")
    assert environment.step("SHOW TABLES")[0] == "[('people',), ('poker_player',)]"
    environment.close()
    with pytest.raises(ValueError, match="unknown backend 'postgres'; backends: sqlite, mariadb, mysql"):
        make("intercode_sql", backend="postgres")


# -- InterCode's recorded rewards and the experts ----------------------------------------------------------
# Measured on SQLite 0.985 / 0.964 / 0.969: the rest are MySQL-vs-SQLite row order, MySQL-only errors
# (scalar subqueries of several rows) and DECIMAL result types. On MariaDB 0.995 / 0.988 / 0.990: row order
# where MySQL's and MariaDB's plans differ, ties, set operations' order, GPT-4's ALTER TABLEs that InterCode's
# server kept (studies/intercode_sql_agreement/README.md).
_AGREEMENT_FLOORS = {  # turn, final reward, success
    "sqlite": (0.984, 0.963, 0.968),
    "mariadb": (0.994, 0.988, 0.989),
    "mysql": (0.994, 0.985, 0.989),  # MySQL 9.7.4 and 8.0.46 alike: their own plans' row order, not 8.0.31's
}


def test_reward_agreement_with_intercodes_recorded_gpt4_rewards(backend_env, episodes):
    """Every GPT-4 action replayed: our score after each turn vs. InterCode's recorded reward."""
    report = reward_agreement(backend_env, episodes)
    summary = report.summary()
    assert summary["episodes"] == 1034 and summary["turns"] == 5834 and summary["harness_turns_skipped"] == 33
    turn, final, success = _AGREEMENT_FLOORS[backend_env.backend]
    assert summary["turn_agreement"] >= turn
    assert summary["final_reward_agreement"] >= final
    assert summary["success_agreement"] >= success


def test_experts_are_gpt4_wins_replayed_to_reward_one(env, episodes):
    trajectories, dropped = replay_experts(env, "train", episodes)
    assert len(trajectories) == 465  # 3 of them on tasks whose gold MySQL refuses: an empty result wins there
    reasons = collections.Counter(reason.split(" scored")[0] for reason in dropped.values())
    assert reasons == {"GPT-4 never reached reward 1": 180, "replay": 16}
    for trajectory in trajectories:
        assert trajectory.reward == 1.0 and trajectory.agent == "expert"
        assert parse_action(trajectory.actions[-1]) == "submit"
        assert all(a.startswith("Thought: ") and parse_action(a) for a in trajectory.actions)
    for episode in episodes:
        steps = expert_steps(episode)
        if steps is None:
            assert 1.0 not in episode.rewards
        else:
            assert len(steps) == episode.rewards.index(1.0) + 2 and steps[-1].action == "submit"
    rejected = f"{HARNESS_REJECTION}:\n```SQL\nYour SQL code here\n```\n"
    synthetic = GptEpisode(
        "0",
        ("SHOW TABLES;", "SHOW TABLES", "SELECT x FROM t", "SELECT y FROM t", "SELECT z FROM t"),
        (rejected, "[('t',)]", "Error executing query: Unknown column", "[(1,)]", "[(2,)]"),
        (0.0, 0.0, 0.0, 1.0, 0.0),
    )
    assert expert_steps(synthetic) == [
        ExpertStep("I should find out which tables the database has.", "SHOW TABLES"),
        ExpertStep("Let me query the data to get closer to the answer.", "SELECT x FROM t"),
        ExpertStep("The last command failed, so I will correct it.", "SELECT y FROM t"),
        ExpertStep("The last result answers the question, so I will submit it.", "submit"),
    ]


# -- through the rollout loop --------------------------------------------------------------------------------
def test_scripted_experts_through_the_rollout_loop_reach_reward_one(env, episodes, tmp_path, cache):
    experts = {t.task_id: t for t in env.expert_trajectories("test_seen", limit=6)}
    assert list(experts.values()) == replay_experts(env, "test_seen", episodes)[0][:6]

    def reply(request):
        return experts[request.task_id].actions[(len(request.messages) - 3) // 2]

    actor = ScriptedActor(reply, num_slots=3)
    trajectories, stats = run_rollouts(
        lambda: InterCodeSqlEnv(cache_root=cache),
        actor,
        list(experts),
        str(tmp_path / "sql.jsonl"),
        RolloutConfig(agent="expert", show_progress=False),
    )
    assert stats.episodes == 6 and stats.successes == 6
    for trajectory in trajectories:
        assert trajectory.extra["terminate_reason"] == "done" and trajectory.reward == 1.0
        assert trajectory.messages == experts[trajectory.task_id].messages


@pytest.mark.slow
def test_smollm2_plays_sql_episodes_through_the_rollout_loop(env, smollm2_gguf_path, tmp_path, cache):
    """The real SmolLM2-135M-Instruct (GGUF) queries the SQLite databases through the KV-cache actor."""
    actor, sampler, _ = smollm2_actor(smollm2_gguf_path, cache_len=1024, max_new_tokens=48)
    tasks = env.tasks("test_unseen")[:3]
    trajectories, stats = run_rollouts(
        lambda: InterCodeSqlEnv(cache_root=cache, max_observation_chars=400),
        actor,
        tasks,
        str(tmp_path / "smollm2_sql.jsonl"),
        RolloutConfig(max_steps=3, show_progress=False),
    )
    assert (
        stats.episodes == 3 and sampler.compilations <= 8
    )  # prefill per (chunk, window) bucket, decode per window, prefix copy
    assert sorted(t.task_id for t in trajectories) == sorted(tasks)
    for trajectory in trajectories:
        assert trajectory.env == "intercode_sql" and 0.0 <= trajectory.reward <= 1.0
        assert trajectory.extra["terminate_reason"] in ("max_steps", "done")
        assert trajectory.messages[2].content.startswith("Database: ")
        observations = [m.content for m in trajectory.messages[4::2]]
        assert all(o.startswith("Observation: ") for o in observations)
    # Zero-shot SmolLM2 rarely follows the format, but its "Action: ..." lines do reach SQLite (greedy: 3).
    executed = [
        m.content for t in trajectories for m in t.messages[4::2] if m.content != INVALID_FORMAT_OBSERVATION
    ]
    env_replies = ("Observation: Error executing query", "Observation: [", "Observation: None")
    assert len(executed) >= 1 and all(o.startswith(env_replies) for o in executed)

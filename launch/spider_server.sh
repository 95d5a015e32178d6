# What launch/mariadb.sh and launch/mysql.sh share (sourced, not run): the 20 Spider databases loaded from the
# repository's dump once per dump, the read-only account, stop, status and the start|stop|status dispatch.
#
# The sourcing script sets NAME (the server's name, its directory under the cache) and REPO, and defines
# admin_sql (SQL as the administrator, statements on stdin or -e), answers (the server answers a ping),
# admin_shutdown, prepare_server (install or unpack it), initialise (the data directory, once), start_server,
# dump_sql (the dump's statements as this server takes them) and after_load (given the databases' names).
#
# Everything of a server lives under one directory, <cache>/$NAME, where <cache> is the project's cache
# directory ($COEVO_JAX_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/coevo_jax, as for the SQLite copies).

DUMP="$REPO/coevo_jax/envs/data/intercode/ic_spider_dbs.sql"
ROOT=${COEVO_JAX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/coevo_jax}/$NAME
DATA="$ROOT/data"
SOCKET="$ROOT/mysqld.sock"
PIDFILE="$ROOT/mysqld.pid"
LOG="$ROOT/mysqld.log"
MARKER="$ROOT/loaded.sha256"
READER=coevo_reader  # the environment's account (coevo_jax/envs/intercode_sql/server.py READER)

say() { echo "$NAME: $*"; }
fail() { echo "$NAME: $*" >&2; exit 1; }

spider_databases() { sed -n 's/^CREATE DATABASE  *IF NOT EXISTS `\([^`]*\)`.*/\1/p' "$DUMP"; }

load_databases() {
  local digest dbs
  digest=$(sha256sum "$DUMP" | cut -d' ' -f1)
  if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$digest" ]; then
    say "the Spider databases are loaded (dump $digest)"
    return 0
  fi
  say "loading the 20 Spider databases from $DUMP"
  dbs=$(spider_databases)
  {
    for db in $dbs; do echo "DROP DATABASE IF EXISTS \`$db\`;"; done
    dump_sql
    echo "DROP USER IF EXISTS '$READER'@'localhost';"
    echo "CREATE USER '$READER'@'localhost';"
    for db in $dbs; do echo "GRANT SELECT, SHOW VIEW ON \`$db\`.* TO '$READER'@'localhost';"; done
  } | admin_sql || fail "loading the dump failed"
  after_load "$dbs"
  echo "$digest" >"$MARKER"
  say "loaded"
}

stop_server() {
  if ! answers; then
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      say "the server (pid $pid) does not answer: sending it SIGTERM"
      kill -TERM "$pid"
    else
      say "not running"
      return 0
    fi
  else
    admin_shutdown
  fi
  for _ in $(seq 1 60); do
    [ -e "$PIDFILE" ] || { say "stopped"; return 0; }
    sleep 0.5
  done
  fail "the server did not stop within 30 s (pid $(cat "$PIDFILE" 2>/dev/null))"
}

server_main() {
  case "${1:-}" in
    start)
      mkdir -p "$ROOT" && chmod 700 "$ROOT"
      prepare_server
      initialise
      start_server
      load_databases
      ;;
    stop) stop_server ;;
    status)
      if answers; then
        say "running: socket $SOCKET, pid $(cat "$PIDFILE" 2>/dev/null), $(admin_sql -e 'SELECT VERSION()')"
        if [ -f "$MARKER" ]; then say "Spider databases loaded (dump $(cat "$MARKER"))"; else say "Spider databases not loaded"; fi
      else
        say "not running (expected socket $SOCKET)"
        exit 3
      fi
      ;;
    *)
      echo "usage: $0 start|stop|status" >&2
      exit 2
      ;;
  esac
}

#!/usr/bin/env bash
# A MariaDB server owned by this project for InterCode-SQL's server backend (`envs.make("intercode_sql",
# backend="mariadb")`): launch/mariadb.sh start|stop|status.
#
# Everything lives under one directory, <cache>/mariadb, where <cache> is the project's cache directory
# ($COEVO_JAX_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/coevo_jax, as for the SQLite copies):
# the data directory, the unix socket `mysqld.sock` (no TCP port), the pid file, the log and the server's
# temporary files. Nothing system-wide is configured or started: Debian's `mariadb-server` package is
# installed with apt-get where `mariadbd` is missing (its system service is neither started nor left enabled),
# and the server runs with --no-defaults as the calling user.
#
# `start` initialises the data directory once, starts the server, and loads the 20 Spider databases from the
# repository's dump once per dump (a marker holds the dump's SHA-256; a changed dump is reloaded). It also
# creates the account the environment uses, `coevo_reader`@`localhost` (no password, socket only), with
# SELECT and SHOW VIEW on those databases and nothing else; the server runs read-only besides. `stop` shuts it
# down; `status` says whether it answers.
set -euo pipefail

NAME=mariadb
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=launch/spider_server.sh
. "$REPO/launch/spider_server.sh"  # ROOT, DATA, SOCKET, PIDFILE, LOG, MARKER, READER, DUMP; say, fail, ...
ADMIN=$(id -un)  # the data directory's socket-authenticated administrator: whoever initialised it
# MySQL 8.0's default sql_mode (InterCode's server) less ONLY_FULL_GROUP_BY, as the environment's sessions set it
# too (coevo_jax/envs/intercode_sql/server.py says why).
SQL_MODE=STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION

admin_sql() { mariadb --no-defaults --socket="$SOCKET" --user="$ADMIN" --batch --skip-column-names "$@"; }

answers() { mariadb-admin --no-defaults --socket="$SOCKET" --user="$ADMIN" --connect-timeout=2 ping >/dev/null 2>&1; }

admin_shutdown() { mariadb-admin --no-defaults --socket="$SOCKET" --user="$ADMIN" shutdown; }

prepare_server() {
  command -v mariadbd >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || fail "mariadbd is missing and apt-get is not available; install MariaDB by hand"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "mariadbd is missing and installing it needs root (no sudo found)"
    sudo=sudo
  fi
  say "installing mariadb-server with apt-get (its system service is not started)"
  # Debian's postinst starts the service unless policy-rc.d says no: say no for the length of the install.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null && $sudo chmod 755 "$policy" && made_policy=1
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends mariadb-server || {
    [ "$made_policy" = 1 ] && $sudo rm -f "$policy"
    fail "apt-get install mariadb-server failed"
  }
  [ "$made_policy" = 1 ] && $sudo rm -f "$policy"
  if command -v deb-systemd-helper >/dev/null 2>&1; then
    $sudo deb-systemd-helper disable mariadb.service >/dev/null 2>&1 || true
  fi
}

initialise() {
  [ -d "$DATA/mysql" ] && return 0
  say "initialising $DATA"
  rm -rf "$DATA" "$MARKER"
  mkdir -p "$DATA"
  mariadb-install-db --no-defaults --datadir="$DATA" --user="$ADMIN" --lower-case-table-names=1 \
    --auth-root-authentication-method=socket --auth-root-socket-user="$ADMIN" --skip-test-db \
    >"$ROOT/install.log" 2>&1 || fail "mariadb-install-db failed; see $ROOT/install.log"
}

start_server() {
  answers && { say "already running (socket $SOCKET)"; return 0; }
  rm -f "$SOCKET" "$PIDFILE"
  mkdir -p "$ROOT/tmp" "$ROOT/files"
  local user_flag=()
  [ "$(id -u)" -eq 0 ] && user_flag=(--user=root)
  # Read-only for every account without SUPER; statements of the reader's sessions are limited by the client
  # (max_statement_time) and here by default too; no TCP, no file import or export.
  setsid mariadbd --no-defaults "${user_flag[@]}" --datadir="$DATA" --socket="$SOCKET" --pid-file="$PIDFILE" \
    --log-error="$LOG" --tmpdir="$ROOT/tmp" --secure-file-priv="$ROOT/files" --skip-networking \
    --skip-name-resolve --local-infile=0 --read-only=ON --lower-case-table-names=1 \
    --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci --sql-mode="$SQL_MODE" \
    --max-statement-time=30 --max-allowed-packet=4M --tmp-memory-table-size=0 --tmp-disk-table-size=256M \
    --innodb-buffer-pool-size=64M --performance-schema=OFF </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 120); do
    answers && { say "started (socket $SOCKET)"; return 0; }
    sleep 0.5
  done
  fail "the server did not answer within 60 s; see $LOG"
}

dump_sql() {
  echo "SET SESSION max_statement_time = 0;"
  # The dump starts by creating InterCode's all-privileges `admin` account: skip that block. MariaDB runs
  # MySQL-8-only versioned comments (/*!80016 ... */) as SQL, so the one the dump has is removed.
  sed -n '/^CREATE DATABASE/,$p' "$DUMP" | sed "s#/\*!80016 DEFAULT ENCRYPTION='N' \*/##"
}

after_load() { :; }

server_main "$@"

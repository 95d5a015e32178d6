#!/usr/bin/env bash
# A MySQL server owned by this project for InterCode-SQL's `mysql` backend (`envs.make("intercode_sql",
# backend="mysql")`): launch/mysql.sh start|stop|status.
#
# Debian's stable release has no MySQL, its unstable suite does (mysql-9.7 when this was written). `start`
# unpacks that build with the libraries it needs into <cache>/mysql/root (launch/debian_packages.py; nothing
# is installed system-wide) and runs it with its own dynamic loader. Everything lives under <cache>/mysql,
# where <cache> is $COEVO_JAX_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/coevo_jax: the unpacked server, the data
# directory, the unix socket `mysqld.sock` (no TCP port), the pid file, the log and the server's temporary files.
#
# `start` initialises the data directory once (root@localhost without a password, reachable only through
# the socket in a directory only its owner may enter), starts the server with MySQL's defaults (sql_mode,
# collation, optimizer) as InterCode's Docker image ran them, loads the 20 Spider databases from the
# repository's dump once per dump (then computes its tables' statistics, which the plans follow), and creates
# the environment's account `coevo_reader`@`localhost` with SELECT and SHOW VIEW on those databases only; the
# server runs read-only besides. `stop` shuts it down; `status` says whether it answers. Unlike
# launch/mariadb.sh this is not part of CI: it fetches from Debian's moving unstable suite.
set -euo pipefail

NAME=mysql
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=launch/spider_server.sh
. "$REPO/launch/spider_server.sh"  # ROOT, DATA, SOCKET, PIDFILE, LOG, MARKER, READER, DUMP; say, fail, ...
SYSROOT="$ROOT/root"
# Where the build comes from: launch/debian_packages.py's arguments less --dest. Another MySQL build, e.g.
# Ubuntu 24.04's 8.0: COEVO_MYSQL_SOURCE="--mirror http://archive.ubuntu.com/ubuntu --suite noble-updates
# --suite noble --component main --component universe mysql-server-core-8.0 mysql-client-core-8.0", with its
# own COEVO_JAX_CACHE (a data directory is not shared between MySQL releases).
SOURCE=${COEVO_MYSQL_SOURCE:---suite sid mysql-server-core mysql-client-core}
LIBS="$SYSROOT/usr/lib/x86_64-linux-gnu:$SYSROOT/lib/x86_64-linux-gnu"
find_loader() {  # the unpacked build's dynamic loader (under lib/ in a release before usrmerge)
  LOADER="$SYSROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
  [ -e "$LOADER" ] || LOADER="$SYSROOT/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
}
find_loader

private() { "$LOADER" --library-path "$LIBS" "$@"; }  # a program of the unpacked build, on its own libraries

admin_sql() { private "$SYSROOT/usr/bin/mysql" --no-defaults --socket="$SOCKET" --user=root --batch --skip-column-names "$@"; }

answers() { [ -x "$LOADER" ] && private "$SYSROOT/usr/bin/mysqladmin" --no-defaults --socket="$SOCKET" --user=root --connect-timeout=2 ping >/dev/null 2>&1; }

server_flags() {
  echo --no-defaults --basedir="$SYSROOT/usr" --lc-messages-dir="$SYSROOT/usr/share/mysql" \
    --plugin-dir="$SYSROOT/usr/lib/mysql/plugin" --datadir="$DATA" --lower-case-table-names=1
  [ "$(id -u)" -eq 0 ] && echo --user=root
  return 0
}

admin_shutdown() { private "$SYSROOT/usr/bin/mysqladmin" --no-defaults --socket="$SOCKET" --user=root shutdown; }

prepare_server() {
  [ -x "$SYSROOT/usr/sbin/mysqld" ] && [ -x "$LOADER" ] && return 0
  command -v dpkg-deb >/dev/null 2>&1 || fail "dpkg-deb is needed to unpack Debian's MySQL packages"
  say "unpacking a MySQL server and its libraries into $SYSROOT ($SOURCE)"
  rm -rf "$SYSROOT"
  # shellcheck disable=SC2086
  python3 "$REPO/launch/debian_packages.py" --dest "$SYSROOT" $SOURCE \
    || { rm -rf "$SYSROOT"; fail "fetching the packages failed"; }
  [ -x "$SYSROOT/usr/sbin/mysqld" ] || fail "no usr/sbin/mysqld in the unpacked packages"
  find_loader
}

initialise() {
  [ -d "$DATA/mysql" ] && return 0
  say "initialising $DATA"
  rm -rf "$DATA" "$MARKER"
  # shellcheck disable=SC2046
  private "$SYSROOT/usr/sbin/mysqld" $(server_flags) --initialize-insecure >"$ROOT/install.log" 2>&1 \
    || fail "mysqld --initialize-insecure failed; see $ROOT/install.log"
}

start_server() {
  answers && { say "already running (socket $SOCKET)"; return 0; }
  rm -f "$SOCKET" "$PIDFILE"
  mkdir -p "$ROOT/tmp" "$ROOT/files"
  # Read-only for every account without SUPER; SELECTs stop after 30 s unless a session sets less; no TCP, no
  # X protocol, no file import or export.
  # shellcheck disable=SC2046
  setsid "$LOADER" --library-path "$LIBS" "$SYSROOT/usr/sbin/mysqld" $(server_flags) --socket="$SOCKET" \
    --pid-file="$PIDFILE" --log-error="$LOG" --tmpdir="$ROOT/tmp" --secure-file-priv="$ROOT/files" \
    --skip-networking --mysqlx=OFF --skip-name-resolve --local-infile=0 --read-only=ON \
    --max-execution-time=30000 --innodb-buffer-pool-size=64M --performance-schema=OFF \
    </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 120); do
    answers && { say "started (socket $SOCKET, $(admin_sql -e 'SELECT VERSION()'))"; return 0; }
    sleep 0.5
  done
  fail "the server did not answer within 60 s; see $LOG"
}

# The dump starts by creating InterCode's all-privileges `admin` account: skip that block.
dump_sql() { sed -n '/^CREATE DATABASE/,$p' "$DUMP"; }

after_load() {
  # The optimizer's plans, and so the row order of a query without ORDER BY, follow the tables' statistics,
  # which InnoDB otherwise computes in the background some time after the load: compute them now, once.
  # shellcheck disable=SC2086  # $1: the names, one a line, become the list
  admin_sql -e "SELECT CONCAT('ANALYZE TABLE \`', TABLE_SCHEMA, '\`.\`', TABLE_NAME, '\`;') FROM
      information_schema.TABLES WHERE TABLE_SCHEMA IN ($(printf "'%s'," $1 | sed 's/,$//'))" | admin_sql >/dev/null \
    || fail "ANALYZE TABLE failed"
}

server_main "$@"

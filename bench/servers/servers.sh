#!/usr/bin/env bash
# More MariaDB servers on this machine, beside the main one on 3306: queues on several
# database servers (tests/test_multidb.py, docs/scaling.md's measurements) and a read
# replica (MYSQLQ['READ_DATABASE']).
#
#   servers.sh start          server "b" on 3407 (binary log on, GTID), idempotent
#   servers.sh start-replica  also server "r" on 3408, a GTID replica of "b", idempotent
#   servers.sh stop           stop both (their data directories stay)
#   servers.sh status         one line per server: name port up|down
#
# Each server has its own data directory, socket and port under $MYSQLQ_SERVERS_DIR
# (default /tmp/mysqlq-servers) and runs a copy of the distribution's mariadbd (another
# inode than the main server's). Root connects over TCP from 127.0.0.1 without a
# password, as on the main server.
set -euo pipefail

BASE=${MYSQLQ_SERVERS_DIR:-/tmp/mysqlq-servers}
SERVER=/usr/sbin/mariadbd
BINARY=$BASE/bin/mariadbd
declare -A PORT=([b]=3407 [r]=3408)
declare -A ID=([b]=2 [r]=3)

log() { printf '[servers] %s\n' "$*" >&2; }
dir_of() { echo "$BASE/$1"; }

client() {  # client NAME ARGS...: the mariadb client on NAME's socket, as root
  mariadb --no-defaults --socket="$(dir_of "$1")/mysqld.sock" --user=root \
    --connect-timeout=2 -N -B "${@:2}"
}

up() { client "$1" -e "SELECT 1" >/dev/null 2>&1; }

write_config() {
  local name=$1 dir
  dir=$(dir_of "$name")
  mkdir -p "$dir/data"
  cat >"$dir/my.cnf" <<CNF
[mariadbd]
user=mysql
basedir=/usr
lc-messages-dir=/usr/share/mysql
datadir=$dir/data
socket=$dir/mysqld.sock
pid-file=$dir/mysqld.pid
log-error=$dir/error.log
port=${PORT[$name]}
bind-address=127.0.0.1
skip-name-resolve
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
innodb_buffer_pool_size=128M
innodb_log_file_size=64M
performance_schema=OFF
max_connections=300
server_id=${ID[$name]}
log_bin=$dir/data/binlog
binlog_format=ROW
log_slave_updates=ON
CNF
  if [[ "$name" == r ]]; then
    echo "read_only=ON" >>"$dir/my.cnf"
  fi
}

launch() {
  local name=$1 dir deadline
  dir=$(dir_of "$name")
  if up "$name"; then
    return 0
  fi
  write_config "$name"
  if [[ ! -d "$dir/data/mysql" ]]; then
    log "$name: creating its data directory"
    mariadb-install-db --defaults-file="$dir/my.cnf" --auth-root-authentication-method=normal \
      --skip-test-db >"$dir/install.log" 2>&1
  fi
  chown -R mysql:mysql "$dir"
  if ! cmp -s "$SERVER" "$BINARY"; then
    mkdir -p "$BASE/bin"
    install -m 755 "$SERVER" "$BINARY"
  fi
  rm -f "$dir/mysqld.sock"
  log "$name: starting on port ${PORT[$name]}"
  setsid "$BINARY" --defaults-file="$dir/my.cnf" </dev/null >>"$dir/stdout.log" 2>&1 &
  deadline=$((SECONDS + 60))
  until up "$name"; do
    if ((SECONDS > deadline)); then
      log "$name did not start in 60s; the end of its log:"
      tail -n 20 "$dir/error.log" >&2 || true
      exit 1
    fi
    sleep 0.2
  done
  client "$name" -e "SET sql_log_bin = 0;
    CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
    GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
}

replicate() {  # "r" replicates "b" from the start of its binary log (GTID), once
  local status
  status=$(client r -e "SHOW SLAVE STATUS\G")
  if [[ -n "$status" ]]; then  # set up before: only make sure it runs
    client r -e "START SLAVE" 2>/dev/null || true
    return 0
  fi
  log "r: replicating b (port ${PORT[b]})"
  client r -e "SET GLOBAL gtid_slave_pos = '';
    CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=${PORT[b]}, MASTER_USER='root',
      MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1;
    SET GLOBAL read_only = ON;
    START SLAVE;"
}

stop_one() {
  local name=$1 file pid
  file="$(dir_of "$name")/mysqld.pid"
  if [[ -s "$file" ]] && pid=$(cat "$file") && kill -0 "$pid" 2>/dev/null; then
    log "$name: stopping"
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  fi
}

case "${1:-}" in
  start) launch b ;;
  start-replica) launch b; launch r; replicate ;;
  stop) stop_one r; stop_one b ;;
  status)
    for name in b r; do
      if up "$name"; then echo "$name ${PORT[$name]} up"; else echo "$name ${PORT[$name]} down"; fi
    done ;;
  *) echo "usage: $0 start|start-replica|stop|status" >&2; exit 2 ;;
esac

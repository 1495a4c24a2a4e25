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
declare -A PORT=([b]=3407 [r]=3408)
declare -A ID=([b]=2 [r]=3)

log() { printf '[servers] %s\n' "$*" >&2; }
# shellcheck source=bench/lib/mariadbd.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mariadbd.sh"

dir_of() { echo "$BASE/$1"; }

client() {  # client NAME ARGS...: the mariadb client on NAME's socket, as root
  mariadbd_client "$(dir_of "$1")" "${@:2}"
}

up() { client "$1" -e "SELECT 1" >/dev/null 2>&1; }

write_config() {
  local name=$1 dir
  dir=$(dir_of "$name")
  mariadbd_write_config "$dir" "${PORT[$name]}" <<CNF
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
  local name=$1 dir
  dir=$(dir_of "$name")
  if up "$name"; then
    return 0
  fi
  write_config "$name"
  mariadbd_install_db "$dir" "$name"
  log "$name: starting on port ${PORT[$name]}"
  mariadbd_launch "$dir" "$BASE"
  mariadbd_wait "$dir" 60 0.2 "$name did not start in 60s" up "$name"
  mariadbd_grant_tcp_root "$dir" "SET sql_log_bin = 0;"
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
  local name=$1 pid
  if pid=$(mariadbd_pid "$(dir_of "$name")"); then
    log "$name: stopping"
    mariadbd_stop "$pid"
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

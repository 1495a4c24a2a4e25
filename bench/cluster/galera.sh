#!/usr/bin/env bash
# A 3-node MariaDB Galera cluster on this machine, for the tests, the chaos run and the
# benchmark: three mariadbd of their own (ports 4306, 4307, 4308), each with its own data
# directory under $MYSQLQ_GALERA_DIR (default /tmp/mysqlq-galera). The server on 3306 is
# never touched.
#
#   bash bench/cluster/galera.sh start          # idempotent: starts what isn't running,
#                                               # waits until all three are Synced
#   bash bench/cluster/galera.sh status         # one line per node; exit 0 if all Synced
#   bash bench/cluster/galera.sh stop           # clean shutdown of the three
#   bash bench/cluster/galera.sh kill N         # kill -9 of node N (1-3), as a crash would
#   bash bench/cluster/galera.sh start-node N   # (re)start node N: it rejoins (IST or SST)
#   bash bench/cluster/galera.sh destroy        # stop and delete the data directories
#
# Needs the Debian packages galera-4 and rsync (.ci/setup installs them). Runs as root;
# the servers run as the mysql user, from a copy of mariadbd ($BASE/bin/mariadbd): tools
# that find the main server by its executable (start-stop-daemon --exec /usr/sbin/mariadbd
# in .ci/setup-runtime and the restart tests) must never take a node for it. A fresh start bootstraps node 1 (--wsrep-new-cluster)
# and lets 2 and 3 join by rsync SST; a test cluster's data is disposable, so a cluster
# whose nodes all went down is bootstrapped again from node 1 whatever its grastate says.
set -euo pipefail

BASE=${MYSQLQ_GALERA_DIR:-/tmp/mysqlq-galera}
PORTS=(4306 4307 4308)
GCOMM=(4567 4577 4587)
IST=(4568 4578 4588)
SST=(4444 4454 4464)
PROVIDER=/usr/lib/galera/libgalera_smm.so
SYNC_TIMEOUT=${MYSQLQ_GALERA_TIMEOUT:-120}

log() { printf '[galera] %s\n' "$*" >&2; }
# shellcheck source=bench/lib/mariadbd.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/mariadbd.sh"
SERVER=$MARIADBD_SERVER

node_dir() { echo "$BASE/node$1"; }
port() { echo "${PORTS[$1-1]}"; }

client() {  # client N ARGS...: the mariadb client on node N's socket, as root
  mariadbd_client "$(node_dir "$1")" "${@:2}"
}

state() {  # state N: wsrep_local_state_comment of node N, or "down"
  client "$1" -e "SHOW STATUS LIKE 'wsrep_local_state_comment'" 2>/dev/null \
    | awk '{print $2}' || true
}

pid_of() { mariadbd_pid "$(node_dir "$1")"; }

write_config() {
  local n=$1
  mariadbd_write_config "$(node_dir "$n")" "${PORTS[$n-1]}" <<EOF
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=$PROVIDER
wsrep_cluster_name=mysqlq_galera
wsrep_cluster_address=gcomm://127.0.0.1:${GCOMM[0]},127.0.0.1:${GCOMM[1]},127.0.0.1:${GCOMM[2]}
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1:${GCOMM[$n-1]}
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:${GCOMM[$n-1]};ist.recv_addr=127.0.0.1:${IST[$n-1]};gcache.size=256M"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:${SST[$n-1]}
EOF
}

launch() {  # launch N [--wsrep-new-cluster]
  local n=$1 dir
  dir=$(node_dir "$n")
  write_config "$n"
  mariadbd_install_db "$dir" "node $n"
  log "node $n: starting on port $(port "$n")${2:+ ($2)}"
  mariadbd_launch "$dir" "$BASE" ${2:+"$2"}
}

synced() { [[ "$(state "$1")" == "Synced" ]]; }

wait_synced() {  # wait_synced N... (all within SYNC_TIMEOUT)
  local deadline=$((SECONDS + SYNC_TIMEOUT)) n
  for n in "$@"; do
    mariadbd_wait "$(node_dir "$n")" $((deadline - SECONDS)) 0.5 \
      "node $n not Synced after ${SYNC_TIMEOUT}s" synced "$n"
  done
}

grant_tcp_root() {  # root over TCP from 127.0.0.1 without a password, as on the main server
  mariadbd_grant_tcp_root "$(node_dir 1)"
}

allow_bootstrap() {
  local file
  file="$(node_dir 1)/data/grastate.dat"
  [[ -f "$file" ]] && sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "$file"
  return 0
}

start() {
  [[ -x $SERVER && -f $PROVIDER ]] || {
    log "needs mariadb-server and galera-4 (apt-get install galera-4 rsync)"; exit 1; }
  mkdir -p "$BASE"
  chmod 755 "$BASE"
  local n up=() down=()
  for n in 1 2 3; do
    if [[ -n "$(pid_of "$n" || true)" ]]; then up+=("$n"); else down+=("$n"); fi
  done
  if ((${#up[@]} == 0)); then
    allow_bootstrap
    launch 1 --wsrep-new-cluster
    wait_synced 1
    grant_tcp_root
    down=(2 3)
  fi
  for n in "${down[@]}"; do
    [[ "$n" == 1 && ${#up[@]} == 0 ]] && continue
    launch "$n"
  done
  wait_synced 1 2 3
  status
}

start_node() {
  local n=$1
  if [[ -n "$(pid_of "$n" || true)" ]]; then
    wait_synced "$n"
    return
  fi
  launch "$n"
  wait_synced "$n"
}

stop() {
  local n pid
  for n in 3 2 1; do
    pid=$(pid_of "$n" || true)
    [[ -z "$pid" ]] && continue
    log "node $n: shutting down"
    mariadbd_stop "$pid" 60
  done
}

kill_node() {
  local pid
  pid=$(pid_of "$1" || true)
  if [[ -z "$pid" ]]; then
    log "node $1 is not running"
    return
  fi
  kill -KILL "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  log "node $1 (pid $pid) killed"
}

status() {
  local n all=0 st
  for n in 1 2 3; do
    st=$(state "$n")
    printf 'node%s 127.0.0.1:%s %s pid=%s\n' "$n" "$(port "$n")" "${st:-down}" \
      "$(pid_of "$n" || echo -)"
    [[ "$st" == "Synced" ]] || all=1
  done
  return $all
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  kill) kill_node "${2:?node number}" ;;
  start-node) start_node "${2:?node number}" ;;
  destroy) stop; rm -rf "$BASE" ;;
  *) echo "usage: $0 start|stop|status|kill N|start-node N|destroy" >&2; exit 2 ;;
esac

# shellcheck shell=bash
# One mariadbd of a bench script's own, beside the main server on 3306: the steps
# bench/servers/servers.sh and bench/cluster/galera.sh share. Source it; the caller
# defines log() (a message to stderr with its own tag).
#
# A server lives in a directory DIR: DIR/my.cnf, DIR/data, DIR/mysqld.sock,
# DIR/mysqld.pid, DIR/error.log. It runs as the mysql user from a copy of the
# distribution's mariadbd (another inode than the main server's): tools that find the main
# server by its executable (start-stop-daemon --exec /usr/sbin/mariadbd in
# .ci/setup-runtime and the restart tests) must never take it for the main one. Root
# connects over the socket, and over TCP from 127.0.0.1 without a password once
# mariadbd_grant_tcp_root ran, as on the main server.

MARIADBD_SERVER=${MARIADBD_SERVER:-/usr/sbin/mariadbd}

mariadbd_client() {  # mariadbd_client DIR ARGS...: the mariadb client on DIR's socket, as root
  mariadb --no-defaults --socket="$1/mysqld.sock" --user=root --connect-timeout=2 -N -B "${@:2}"
}

mariadbd_write_config() {  # mariadbd_write_config DIR PORT < more lines of [mariadbd]
  local dir=$1 port=$2
  mkdir -p "$dir/data"
  {
    cat <<CNF
[mariadbd]
user=mysql
basedir=/usr
lc-messages-dir=/usr/share/mysql
datadir=$dir/data
socket=$dir/mysqld.sock
pid-file=$dir/mysqld.pid
log-error=$dir/error.log
port=$port
bind-address=127.0.0.1
skip-name-resolve
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
innodb_buffer_pool_size=128M
innodb_log_file_size=64M
performance_schema=OFF
max_connections=300
CNF
    cat
  } >"$dir/my.cnf"
}

mariadbd_install_db() {  # mariadbd_install_db DIR LABEL: create the data directory once
  local dir=$1
  if [[ ! -d "$dir/data/mysql" ]]; then
    log "$2: creating its data directory"
    mariadb-install-db --defaults-file="$dir/my.cnf" --auth-root-authentication-method=normal \
      --skip-test-db >"$dir/install.log" 2>&1
  fi
  chown -R mysql:mysql "$dir"
}

mariadbd_binary() {  # mariadbd_binary BASE: the copy of mariadbd under BASE/bin, made if stale
  local binary=$1/bin/mariadbd
  if ! cmp -s "$MARIADBD_SERVER" "$binary"; then
    mkdir -p "$1/bin"
    install -m 755 "$MARIADBD_SERVER" "$binary"
  fi
  echo "$binary"
}

mariadbd_launch() {  # mariadbd_launch DIR BASE [ARGS...]: start it in the background
  local dir=$1 binary
  binary=$(mariadbd_binary "$2")
  rm -f "$dir/mysqld.sock"
  setsid "$binary" --defaults-file="$dir/my.cnf" "${@:3}" </dev/null >>"$dir/stdout.log" 2>&1 &
}

mariadbd_wait() {  # mariadbd_wait DIR SECONDS PAUSE WHAT COMMAND...: until COMMAND succeeds
  local dir=$1 deadline=$((SECONDS + $2)) pause=$3 what=$4
  until "${@:5}"; do
    if ((SECONDS > deadline)); then
      log "$what; the end of its log:"
      tail -n 20 "$dir/error.log" >&2 || true
      exit 1
    fi
    sleep "$pause"
  done
}

mariadbd_pid() {  # mariadbd_pid DIR: its pid if it runs (else fails, printing nothing)
  local file=$1/mysqld.pid
  [[ -s "$file" ]] && kill -0 "$(cat "$file")" 2>/dev/null && cat "$file"
}

mariadbd_stop() {  # mariadbd_stop PID [SECONDS]: SIGTERM, then wait (at most SECONDS)
  local pid=$1 deadline=$((SECONDS + ${2:-86400}))
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null && ((SECONDS <= deadline)); do sleep 0.2; done
}

mariadbd_grant_tcp_root() {  # mariadbd_grant_tcp_root DIR [SQL run first in the session]
  mariadbd_client "$1" -e "${2:-}
    CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
    GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
}

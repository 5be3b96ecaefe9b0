#!/usr/bin/env bash
# A real local Vitess for development, tests and the demo.
#
#   dev/local_vitess.sh start    install MariaDB if missing, build Vitess if missing, start the
#                                cluster unless it already runs; prints its ports (idempotent)
#   dev/local_vitess.sh stop     stop it (data is thrown away: every start is a fresh cluster)
#   dev/local_vitess.sh status   exit 0 and print the ports when it answers, else exit 1
#   dev/local_vitess.sh env      print the ports as shell assignments (for `eval`)
#
# The cluster is one vttestserver process (vtcombo: vtgate + vttablets in-process) over one
# MariaDB mysqld from Debian: keyspace `commerce` (unsharded) and keyspace `customer` sharded
# in two (-80, 80-) by hash(customer_id). Schemas live in dev/vitess/schema.
#
# Environment knobs:
#   VITESS_BASE_PORT  first of five ports (default 15300): +1 vtgate gRPC, +2 mysqld, +3 vtgate MySQL
#   VITESS_CACHE_DIR  where built binaries live (default ~/.cache/airflow-provider-vitess, or
#                     /var/cache/airflow-provider-vitess as root)
#   VITESS_STATE_DIR  data, logs and pid of the running cluster
#                     (default ${TMPDIR:-/tmp}/airflow-provider-vitess-cluster)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"

# The Vitess release is pinned in one place: dev/vitess/go.mod.
vitess_version="$(awk '$1 == "vitess.io/vitess" && $2 ~ /^v/ {print $2; exit}' "$here/vitess/go.mod")"
go_toolchain="$(awk '$1 == "toolchain" {print $2; exit}' "$here/vitess/go.mod")"

base_port="${VITESS_BASE_PORT:-15300}"
grpc_port=$((base_port + 1))
mysql_port=$((base_port + 3))
# mysqlctl refuses to run as root, so as root the cluster runs as a system user of its own, and
# everything that user reads (binaries, config, schema, data) lives outside root's home.
run_as_user="vitess-local"
if [ "$(id -u)" = 0 ]; then
    default_cache=/var/cache/airflow-provider-vitess
else
    default_cache="${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-vitess"
fi
cache_dir="${VITESS_CACHE_DIR:-$default_cache}"
vtroot="$cache_dir/vitess-$vitess_version"
state_dir="${VITESS_STATE_DIR:-${TMPDIR:-/tmp}/airflow-provider-vitess-cluster}"
pid_file="$state_dir/vttestserver.pid"
log_file="$state_dir/vttestserver.log"

log() { printf '[local_vitess] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

ensure_mariadb() {
    if command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; then
        return
    fi
    log "installing MariaDB server from Debian"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
        mariadb-server mariadb-client >/dev/null
    # Debian may start its own server on 3306; ours runs on its own ports and socket.
    as_root service mariadb stop >/dev/null 2>&1 || true
}

ensure_vitess_built() {
    local bins=(vttestserver vtcombo mysqlctl) missing=0 b
    for b in "${bins[@]}"; do [ -x "$vtroot/bin/$b" ] || missing=1; done
    if [ "$missing" = 0 ]; then return; fi
    command -v go >/dev/null 2>&1 || { log "Go is required to build Vitess"; exit 1; }
    log "building Vitess $vitess_version with Go $go_toolchain (cold: minutes; warm: seconds)"
    mkdir -p "$vtroot/bin"
    (cd "$here/vitess" && GOTOOLCHAIN="$go_toolchain" GOFLAGS=-mod=mod GOBIN="$vtroot/bin" go install tool)
}

# vttestserver expects VTROOT to hold bin/ and config/ (init file, extra my.cnf). Our config
# replaces Vitess's MySQL-8-only init file with a MariaDB-safe one.
prepare_vtroot() {
    mkdir -p "$vtroot/config/mycnf"
    cp "$here/vitess/config/init_db.sql" "$vtroot/config/init_db.sql"
    cp "$here/vitess/config/mycnf/test-suite.cnf" "$vtroot/config/mycnf/test-suite.cnf"
}

# Prints the command prefix that runs a program as the cluster's user.
as_cluster_user() {
    if [ "$(id -u)" != 0 ]; then return; fi
    if ! id "$run_as_user" >/dev/null 2>&1; then
        useradd --system --no-create-home --home-dir "$state_dir" --shell /usr/sbin/nologin "$run_as_user"
    fi
    chown -R "$run_as_user:" "$state_dir"
    # setpriv execs in place (no wrapper process), so the pid we record is vttestserver's.
    echo setpriv --reuid="$run_as_user" --regid="$run_as_user" --init-groups
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

running() {
    [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null
}

ready() {
    running && port_open "$grpc_port" && port_open "$mysql_port" \
        && [ -f "$state_dir/ready" ]
}

print_ports() {
    printf 'VITESS_HOST=127.0.0.1\nVITESS_GRPC_PORT=%s\nVITESS_MYSQL_PORT=%s\n' "$grpc_port" "$mysql_port"
}

# vttestserver prints its config as one JSON line once every keyspace is serving.
wait_ready() {
    local deadline=$((SECONDS + ${VITESS_START_TIMEOUT:-300}))
    while [ $SECONDS -lt $deadline ]; do
        if ! running; then
            log "vttestserver exited while starting; last lines of $log_file:"
            tail -n 40 "$log_file" >&2
            return 1
        fi
        if grep -q '"port"' "$log_file" 2>/dev/null && port_open "$grpc_port" && port_open "$mysql_port"; then
            touch "$state_dir/ready"
            return 0
        fi
        sleep 1
    done
    log "vttestserver did not become ready in time; last lines of $log_file:"
    tail -n 40 "$log_file" >&2
    return 1
}

start() {
    if ready; then
        log "already running"
        print_ports
        return
    fi
    if running; then stop; fi
    ensure_mariadb
    ensure_vitess_built
    prepare_vtroot
    rm -rf "$state_dir"
    mkdir -p "$state_dir/data"
    cp -R "$here/vitess/schema" "$state_dir/schema"
    local prefix
    prefix="$(as_cluster_user)"
    log "starting vttestserver (Vitess $vitess_version) on ports $base_port-$((base_port + 3))"
    # setsid: the cluster outlives the shell that started it (pytest reuses it).
    # shellcheck disable=SC2086  # $prefix is a command prefix, split on purpose
    HOME="$state_dir" VTROOT="$vtroot" VTDATAROOT="$state_dir" VT_MYSQL_ROOT=/usr \
        setsid $prefix "$vtroot/bin/vttestserver" \
        --port "$base_port" \
        --data-dir "$state_dir/data" \
        --mysql-bind-host 127.0.0.1 \
        --vtcombo-bind-host 127.0.0.1 \
        --keyspaces commerce,customer \
        --num-shards 1,2 \
        --replica-count 1 \
        --rdonly-count 0 \
        --schema-dir "$state_dir/schema" \
        --charset utf8mb4 \
        --vschema-ddl-authorized-users '%' \
        --tablet-refresh-interval 1s \
        >"$log_file" 2>&1 </dev/null &
    echo $! >"$pid_file"
    wait_ready
    log "ready"
    print_ports
}

stop() {
    if running; then
        local pid
        pid="$(cat "$pid_file")"
        log "stopping vttestserver (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    # vttestserver normally stops its mysqld; make sure a crash left none behind.
    pkill -f "mariadbd.*$state_dir" 2>/dev/null || true
    pkill -f "mysqld.*$state_dir" 2>/dev/null || true
    rm -f "$pid_file" "$state_dir/ready"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if ready; then print_ports; else log "not running"; exit 1; fi ;;
    env) print_ports ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac

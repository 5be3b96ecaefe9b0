# Sourced by dev/local_vitess.sh and dev/vitess_topology.sh (which set $here to dev/): the
# pinned Vitess release, where its binaries are built, and who the clusters run as.

# The Vitess release is pinned in one place: dev/vitess/go.mod.
vitess_version="$(grep -oE 'vitess\.io/vitess v[0-9][^ ]*' "$here/vitess/go.mod" | head -n1 | cut -d' ' -f2)"
go_toolchain="$(awk '$1 == "toolchain" {print $2; exit}' "$here/vitess/go.mod")"

# vtgate reports an 8.x MySQL version by default, and clients (SQLAlchemy among them) then ask
# for MySQL-8-only variables such as @@transaction_isolation, which the MariaDB behind it does
# not have. Reporting a 5.7 version makes them use names both servers know.
# shellcheck disable=SC2034  # used by the sourcing script
vtgate_reported_version="5.7.9-Vitess"

# mysqlctl refuses to run as root, so as root a cluster runs as a system user of its own, and
# everything that user reads (binaries, config, schema, data) lives outside root's home.
run_as_user="vitess-local"
# shellcheck disable=SC2034
cluster_user="airflow"
if [ "$(id -u)" = 0 ]; then
    default_cache=/var/cache/airflow-provider-vitess
else
    default_cache="${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-vitess"
fi
cache_dir="${VITESS_CACHE_DIR:-$default_cache}"
vtroot="$cache_dir/vitess-$vitess_version"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Whether the server whose pid the caller's $pid_file holds is alive (a script whose server has
# no single pid file defines its own `running` after sourcing this file).
running() {
    [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null
}

# Stops the server of the caller's $pid_file: TERM, then up to ROUNDS half-seconds for it to
# exit, then KILL. The caller removes its files. Usage: stop_server WHAT ROUNDS
stop_server() {
    if running; then
        local pid
        pid="$(cat "$pid_file")"
        log "stopping $1 (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq "$2"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
}

# Waits until the command given after the first four arguments succeeds, while the caller's
# `running` says the server is alive; if it dies or the time runs out, shows its log's tail.
# Usage: wait_until_ready WHAT TIMEOUT_SECONDS INTERVAL LOG_FILE COMMAND...
wait_until_ready() {
    local what=$1 deadline=$((SECONDS + $2)) interval=$3 log_file=$4
    shift 4
    while [ $SECONDS -lt $deadline ]; do
        if ! running; then
            log "$what exited while starting; last lines of $log_file:"
            tail -n 40 "$log_file" >&2
            return 1
        fi
        if "$@"; then return 0; fi
        sleep "$interval"
    done
    log "$what did not become ready in time; last lines of $log_file:"
    tail -n 40 "$log_file" >&2
    return 1
}

# Builds every tool pinned in dev/vitess/go.mod into $vtroot/libexec.
build_vitess() {
    command -v go >/dev/null 2>&1 || { log "Go is required to build Vitess"; exit 1; }
    log "building Vitess $vitess_version with Go $go_toolchain (cold: minutes; warm: seconds)"
    mkdir -p "$vtroot/libexec"
    local began=$SECONDS
    (cd "$here/vitess" && GOTOOLCHAIN="$go_toolchain" GOFLAGS=-mod=mod GOBIN="$vtroot/libexec" go install tool)
    log "built Vitess in $((SECONDS - began)) s"
}

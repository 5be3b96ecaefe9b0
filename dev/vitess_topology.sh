#!/usr/bin/env bash
# A real Vitess cluster assembled from its parts, for topology changes (MoveTables, Reshard),
# which vttestserver (dev/local_vitess.sh) cannot run.
#
#   dev/vitess_topology.sh start     install MariaDB + etcd if missing, build Vitess if missing, start
#                                    the cluster unless it already runs; prints its ports (idempotent)
#   dev/vitess_topology.sh stop      stop it (data is thrown away: every start is a fresh cluster)
#   dev/vitess_topology.sh status    exit 0 and print the ports when vtgate answers, else exit 1
#   dev/vitess_topology.sh env       print the ports as shell assignments (for `eval`)
#   dev/vitess_topology.sh tablet KEYSPACE SHARD UID
#                                    start one more MariaDB + vttablet and make it its shard's primary
#   dev/vitess_topology.sh replica KEYSPACE SHARD UID
#                                    start one more MariaDB + vttablet of type replica, replicating
#                                    from the shard's primary (a test delays it: MASTER_DELAY)
#   dev/vitess_topology.sh copy-phase DURATION
#                                    (shards4) restart the vttablets with another
#                                    --vreplication-copy-phase-duration, keeping their data
#   dev/vitess_topology.sh mysql UID ARGS...
#                                    the mysql client on tablet UID's MariaDB (not through vtgate)
#   dev/vitess_topology.sh tablet-down UID
#                                    stop one tablet and its MariaDB (a torn-down old shard)
#   dev/vitess_topology.sh vtctldclient ARGS...
#                                    run vtctldclient against the cluster (workflows, topology)
#
# `start` brings up: etcd (Debian's etcd-server) as the topo server, vtctld, the layout's keyspace
# and vtgate. Layouts (VITESS_TOPO_LAYOUT):
#   commerce  (default) keyspace `commerce`, unsharded: one primary tablet, uid 100, holding the
#             tables of dev/vitess/schema. The workflows (MoveTables, Reshard) are run by the caller
#             through `tablet` and `vtctldclient`, as in Vitess's own examples/local
#             (tests/support/topology.py).
#   shards4   keyspace `sharded` of four shards -40,40-80,80-c0,c0- (one primary each, uids
#             100..400, started side by side), empty, its vschema dev/vitess/topology/
#             vschema_sharded.json (a `hash` vindex, no tables: tests add theirs by DDL through
#             vtgate). Its own ports and state dir (below), so it runs beside a commerce cluster.
# Tablets are primaries (durability policy `none`: MoveTables and Reshard need no replicas), but
# those `replica` adds (tests/support/topology.py, replica_cluster_running).
#
# Environment knobs:
#   VITESS_TOPO_LAYOUT     commerce (default) or shards4, as above; give the same one to every
#                          subcommand of that cluster
#   VITESS_TOPO_BASE_PORT  first of 200 ports (default 17000; shards4 uses the 200 after them):
#                          +0 etcd, +2/+3 vtctld web/gRPC, +4/+5/+6 vtgate web/gRPC/MySQL,
#                          +100+n/+130+n/+160+n tablet n web/gRPC/mysqld
#   VITESS_CACHE_DIR       where built binaries live (as dev/local_vitess.sh)
#   VITESS_TOPO_STATE_DIR  data, logs and pids (default ${TMPDIR:-/tmp}/airflow-provider-vitess-topology,
#                          -shards4 for that layout)
#   VITESS_TOPO_VTTABLET_FLAGS  extra vttablet flags for every tablet this start brings up
#                          (split on spaces), e.g. "--vstream-packet-size 16384"
#   VITESS_TOPO_COPY_PHASE_DURATION  vttablet's --vreplication-copy-phase-duration (Go duration:
#                          500ms, 3s, 1m, 1h) for every tablet this start brings up. On MySQL the
#                          flag bounds each copy query with a MAX_EXECUTION_TIME hint; MariaDB
#                          (before 12.0) ignores that hint, so the same bound is also set as MariaDB's
#                          own per-user MAX_STATEMENT_TIME of vt_filtered, the user vttablet's row
#                          streamer reads as: a copy query is killed when the duration runs out, as
#                          MySQL would kill it (docs/design.md, "Large tables").
# A running cluster started with other knob values is restarted by `start` (a fresh cluster).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=dev/vitess/common.sh
. "$here/vitess/common.sh"

layout="${VITESS_TOPO_LAYOUT:-commerce}"
case "$layout" in
    commerce) base="${VITESS_TOPO_BASE_PORT:-17000}" ;;
    shards4) base=$((${VITESS_TOPO_BASE_PORT:-17000} + 200)) ;;
    *) echo "VITESS_TOPO_LAYOUT must be commerce or shards4, not '$layout'" >&2; exit 2 ;;
esac
# The keyspace and shards of the shards4 layout.
sharded_keyspace=sharded
sharded_shards=(-40 40-80 80-c0 c0-)
etcd_port=$base
etcd_peer_port=$((base + 1))
vtctld_web_port=$((base + 2))
vtctld_grpc_port=$((base + 3))
vtgate_web_port=$((base + 4))
vtgate_grpc_port=$((base + 5))
vtgate_mysql_port=$((base + 6))
cell=zone1
bin="$vtroot/libexec"
default_state_dir="${TMPDIR:-/tmp}/airflow-provider-vitess-topology"
[ "$layout" = commerce ] || default_state_dir="$default_state_dir-$layout"
state_dir="${VITESS_TOPO_STATE_DIR:-$default_state_dir}"
copy_phase_duration="${VITESS_TOPO_COPY_PHASE_DURATION:-}"
# shellcheck disable=SC2206  # split on purpose: a list of flags
extra_tablet_flags=(${VITESS_TOPO_VTTABLET_FLAGS:-})
topo_flags=(--topo-implementation etcd2 --topo-global-server-address "127.0.0.1:$etcd_port"
    --topo-global-root /vitess/global)

log() { printf '[vitess_topology] %s\n' "$*" >&2; }

ensure_packages() {
    # One install at a time on the machine, whichever layout asks: two layouts started at once
    # on a bare machine (the suite's workers do) both found etcd missing, and the second one's
    # stop of Debian's etcd came after the first had started its cluster's.
    local lock="${TMPDIR:-/tmp}/airflow-provider-vitess-packages.lock" lock_fd
    exec {lock_fd}>>"$lock"
    flock "$lock_fd"
    local missing=()
    command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server mariadb-client)
    command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
    if [ ${#missing[@]} != 0 ]; then
        log "installing ${missing[*]} from Debian"
        as_root apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends "${missing[@]}" >/dev/null
        # Debian starts its own servers on the default ports; ours run on their own ports and
        # as the cluster's user. Only Debian's etcd is stopped (it runs as user etcd): `service
        # etcd stop` stops every /usr/bin/etcd on the machine, another cluster's included, which
        # left the four-shard cluster without its topology server and a query hanging.
        as_root service mariadb stop >/dev/null 2>&1 || true
        as_root pkill -u etcd -x etcd >/dev/null 2>&1 || true
    fi
    exec {lock_fd}>&-
}

ensure_vitess_built() {
    local b missing=0
    for b in mysqlctl vtctld vtctldclient vtgate vttablet; do [ -x "$bin/$b" ] || missing=1; done
    if [ "$missing" = 0 ]; then return; fi
    build_vitess
}

# Prints the command prefix that runs a program as the cluster's user (mysqlctl refuses root).
as_cluster_user() {
    if [ "$(id -u)" != 0 ]; then return; fi
    if ! id "$run_as_user" >/dev/null 2>&1; then
        useradd --system --no-create-home --home-dir "$state_dir" --shell /usr/sbin/nologin "$run_as_user"
    fi
    echo setpriv --reuid="$run_as_user" --regid="$run_as_user" --init-groups
}

# Runs a long-lived server in its own session, its pid in $state_dir/pids/NAME.
spawn() {
    local name="$1" prefix
    shift
    prefix="$(as_cluster_user)"
    [ "$(id -u)" != 0 ] || chown -R "$run_as_user:" "$state_dir"
    # shellcheck disable=SC2086  # $prefix is a command prefix, split on purpose
    HOME="$state_dir" VTDATAROOT="$state_dir" VTROOT="$vtroot" VT_MYSQL_ROOT=/usr \
        setsid $prefix "$@" >"$state_dir/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$state_dir/pids/$name"
}

# Runs a short command as the cluster's user.
run() {
    local prefix
    prefix="$(as_cluster_user)"
    # shellcheck disable=SC2086
    HOME="$state_dir" VTDATAROOT="$state_dir" VTROOT="$vtroot" VT_MYSQL_ROOT=/usr $prefix "$@"
}

wait_port() {
    local name="$1" port="$2" deadline=$((SECONDS + ${3:-120}))
    until port_open "$port"; do
        if [ $SECONDS -ge $deadline ] || ! kill -0 "$(cat "$state_dir/pids/$name")" 2>/dev/null; then
            log "$name did not start; last lines of $state_dir/logs/$name.log:"
            tail -n 30 "$state_dir/logs/$name.log" >&2
            return 1
        fi
        sleep 0.2
    done
}

vtctldclient() {
    "$bin/vtctldclient" --server "127.0.0.1:$vtctld_grpc_port" "$@"
}

# A Go duration (500ms, 3s, 1.5m, 1h) in seconds, as MariaDB's MAX_STATEMENT_TIME takes it.
duration_seconds() {
    local d="$1"
    [[ "$d" =~ ^([0-9]+(\.[0-9]+)?)(ms|s|m|h)$ ]] || {
        log "VITESS_TOPO_COPY_PHASE_DURATION must be a number with ms, s, m or h (e.g. 3s), not '$d'"
        exit 2
    }
    awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
        'BEGIN { f = (u == "ms") ? 0.001 : (u == "s") ? 1 : (u == "m") ? 60 : 3600; printf "%g", n * f }'
}

# What a start was asked for: a running cluster started otherwise is not the one wanted.
settings() {
    printf 'layout=%s\ncopy_phase_duration=%s\nvttablet_flags=%s\n' \
        "$layout" "$copy_phase_duration" "${extra_tablet_flags[*]}"
}

tablet_flags() {
    if [ -n "$copy_phase_duration" ]; then
        printf '%s\n' --vreplication-copy-phase-duration "$copy_phase_duration"
    fi
    if [ ${#extra_tablet_flags[@]} -gt 0 ]; then printf '%s\n' "${extra_tablet_flags[@]}"; fi
}

make_credentials() {
    local auth="$state_dir/auth" password
    mkdir -p "$auth"
    password="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
    printf '%s' "$password" >"$auth/password"
    printf '[{"Username": "%s", "Password": "%s"}]\n' "$cluster_user" "$password" >"$auth/grpc_users.json"
    printf '{"%s": [{"Password": "%s", "UserData": "%s"}]}\n' "$cluster_user" "$password" "$cluster_user" \
        >"$auth/mysql_users.json"
    chmod 600 "$auth"/*
}

start_etcd() {
    spawn etcd etcd --name "apv-$base" --data-dir "$state_dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-cluster "apv-$base=http://127.0.0.1:$etcd_peer_port"
    wait_port etcd "$etcd_port"
    "$bin/vtctldclient" --server internal "${topo_flags[@]}" AddCellInfo \
        --root "/vitess/$cell" --server-address "127.0.0.1:$etcd_port" "$cell"
}

start_vtctld() {
    spawn vtctld "$bin/vtctld" "${topo_flags[@]}" --cell "$cell" --service-map 'grpc-vtctl,grpc-vtctld' \
        --port "$vtctld_web_port" --grpc-port "$vtctld_grpc_port" --bind-address 127.0.0.1 \
        --log_dir "$state_dir/logs" --config-file-not-found-handling=ignore
    wait_port vtctld "$vtctld_grpc_port"
}

# tablet KEYSPACE SHARD UID [primary|replica]: one mysqlctl-managed MariaDB and its vttablet, made
# primary of SHARD, or (replica) a tablet of type replica whose MariaDB replicates from the shard's
# primary (see start_replication). Idempotent: a tablet already running is left alone.
start_tablet() {
    local keyspace="$1" shard="$2" uid="$3" role="${4:-primary}" n alias name
    n=$((uid / 100 - 1))
    [ "$n" -ge 0 ] && [ "$n" -lt 30 ] || { log "tablet uid must be 100..3000 in steps of 100"; exit 2; }
    local web=$((base + 100 + n)) grpc=$((base + 130 + n)) mysql=$((base + 160 + n))
    printf -v alias '%s-%010d' "$cell" "$uid"
    name="vttablet-$uid"
    if [ -f "$state_dir/pids/$name" ] && kill -0 "$(cat "$state_dir/pids/$name")" 2>/dev/null; then
        return
    fi
    vtctldclient GetKeyspace "$keyspace" >/dev/null 2>&1 \
        || vtctldclient CreateKeyspace --durability-policy=none "$keyspace" >/dev/null
    [ "$(id -u)" != 0 ] || chown -R "$run_as_user:" "$state_dir"
    EXTRA_MY_CNF="$state_dir/config/extra.cnf" run "$bin/mysqlctl" --log_dir "$state_dir/logs" \
        --tablet-uid "$uid" --mysql-port "$mysql" --config-file-not-found-handling=ignore \
        init --init-db-sql-file "$state_dir/config/init_db.sql" >"$state_dir/logs/mysqlctl-$uid.log" 2>&1 \
        || { log "mysqlctl init of tablet $uid failed:"; tail -n 30 "$state_dir/logs/mysqlctl-$uid.log" >&2; exit 1; }
    local extra=()
    if [ "$role" = replica ]; then
        # A replica's replication is ours to set up (start_replication): an unmanaged tablet
        # (v0.23's only way to --disable-active-reparents) leaves it alone. It reaches its MariaDB
        # by socket and needs an app password, set here on this server only (not logged). SLAVE
        # MONITOR: vtgate's SHOW VITESS_REPLICATION_STATUS asks the replica's mysqld for its lag
        # as the app user, and MariaDB (10.5+) answers SHOW SLAVE STATUS only with it.
        local socket
        printf -v socket '%s/vt_%010d/mysql.sock' "$state_dir" "$uid"
        mysql_of "$uid" -e "SET sql_log_bin = 0; ALTER USER 'vt_app'@'localhost' IDENTIFIED BY 'replica';
            GRANT SLAVE MONITOR ON *.* TO 'vt_app'@'localhost'"
        extra+=(--unmanaged --db-socket "$socket" --db-app-user vt_app --db-app-password replica)
        # A replica's schema engine learns DDL from its own binlog (a primary's reloads after the
        # DDL it runs): else a VStream of a table created since finds "table ... not present".
        extra+=(--watch-replication-stream)
    fi
    spawn_vttablet "$keyspace" "$shard" "$uid" ${extra[@]+"${extra[@]}"}
    if [ "$role" = replica ]; then
        start_replication "$uid" "$keyspace/$shard"
        return
    fi
    # A shard's first primary: PlannedReparentShard elects it (durability `none`: no replicas needed).
    local deadline=$((SECONDS + 60))
    until vtctldclient PlannedReparentShard --new-primary "$alias" "$keyspace/$shard" \
        >>"$state_dir/logs/reparent-$uid.log" 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            log "tablet $alias did not become primary of $keyspace/$shard:"
            tail -n 20 "$state_dir/logs/reparent-$uid.log" >&2
            exit 1
        fi
        sleep 1
    done
}

# spawn_vttablet KEYSPACE SHARD UID [FLAGS...]: tablet UID's vttablet (its MariaDB runs), with the
# cluster's tablet flags and FLAGS; waits for its gRPC port.
spawn_vttablet() {
    local keyspace="$1" shard="$2" uid="$3" n alias flags=()
    shift 3
    n=$((uid / 100 - 1))
    printf -v alias '%s-%010d' "$cell" "$uid"
    mapfile -t flags < <(tablet_flags)
    spawn "vttablet-$uid" "$bin/vttablet" "${topo_flags[@]}" --log_dir "$state_dir/logs" \
        --tablet-path "$alias" --tablet-hostname 127.0.0.1 --bind-address 127.0.0.1 \
        --init-keyspace "$keyspace" --init-shard "$shard" --init-tablet-type replica \
        --health-check-interval 1s --heartbeat-on-demand-duration 5s \
        --port "$((base + 100 + n))" --grpc-port "$((base + 130 + n))" \
        --service-map 'grpc-queryservice,grpc-tabletmanager,grpc-updatestream' \
        --db-charset utf8mb4 --queryserver-config-pool-size 4 --queryserver-config-stream-pool-size 4 \
        --queryserver-config-transaction-cap 20 --config-file-not-found-handling=ignore \
        ${flags[@]+"${flags[@]}"} "$@"
    wait_port "vttablet-$uid" "$((base + 130 + n))"
}

# copy_phase DURATION: the running shards4 cluster's vttablets restarted with
# --vreplication-copy-phase-duration DURATION, their MariaDB and data kept (an operator raising
# the flag, as CopyStalledError's remedy says), and the row streamer's MariaDB bound with it
# (the knob's note above). The cluster's settings then name the new duration: a `start` asking
# for another one starts a fresh cluster, so a caller puts the old duration back when done.
copy_phase() {
    [ "$layout" = shards4 ] || { log "copy-phase: the shards4 layout only"; exit 2; }
    ready || { log "copy-phase: the cluster is not running"; exit 1; }
    copy_phase_duration="$1"
    local seconds i uid pid alias pids=() failed=0 deadline
    seconds="$(duration_seconds "$copy_phase_duration")"
    for i in "${!sharded_shards[@]}"; do
        uid=$(((i + 1) * 100))
        mysql_of "$uid" -e "SET sql_log_bin = 0; ALTER USER 'vt_filtered'@'localhost' WITH MAX_STATEMENT_TIME $seconds"
        # Killed, not stopped: a graceful stop takes a vttablet ~10 s, and its state is in the
        # topology and its MariaDB, which stays up.
        pid="$(cat "$state_dir/pids/vttablet-$uid")"
        kill -KILL -- "-$pid" 2>/dev/null || true
        pids+=("$pid")
    done
    for pid in "${pids[@]}"; do
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    done
    pids=()
    for i in "${!sharded_shards[@]}"; do
        spawn_vttablet "$sharded_keyspace" "${sharded_shards[$i]}" $(((i + 1) * 100)) &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    [ "$failed" = 0 ] || { log "a vttablet of keyspace $sharded_keyspace did not start again"; exit 1; }
    # The shards' records still name these tablets their primaries: each takes the type back.
    deadline=$((SECONDS + 60))
    for i in "${!sharded_shards[@]}"; do
        printf -v alias '%s-%010d' "$cell" $(((i + 1) * 100))
        until vtctldclient GetTablet "$alias" 2>/dev/null | tr -d ' \n' | grep -q '"type":"PRIMARY"'; do
            [ $SECONDS -lt $deadline ] || { log "tablet $alias did not come back as primary"; exit 1; }
            sleep 0.5
        done
    done
    settings >"$state_dir/settings"
    log "vttablets of $sharded_keyspace restarted with --vreplication-copy-phase-duration $copy_phase_duration"
}

# start_replication UID KEYSPACE/SHARD: tablet UID's MariaDB replicates from the shard's primary,
# from the start of the primary's binary log (it holds the shard's whole history: the init SQL is
# not logged), by GTID. Set up here, not by vttablet: Vitess v0.23's own replica start fails on
# MariaDB ("invalid MySQL 5.6 SID": it parses the primary's server_uuid, which MariaDB has not), so
# the replica's vttablet runs unmanaged, which also keeps its replication manager from touching
# what a test sets (e.g. MASTER_DELAY).
start_replication() {
    local uid="$1" what="$2" primary
    primary="$(vtctldclient GetShard "$what" | tr -d ' \n' | grep -oE '"primary_alias":\{"cell":"[^"]*","uid":[0-9]+' \
        | grep -oE '[0-9]+$')" || { log "shard $what has no primary for tablet $uid to replicate from"; exit 1; }
    mysql_of "$uid" -e "SET GLOBAL gtid_slave_pos = ''; CHANGE MASTER TO MASTER_HOST = '127.0.0.1',
        MASTER_PORT = $((base + 160 + primary / 100 - 1)), MASTER_USER = 'vt_repl', MASTER_USE_GTID = slave_pos,
        MASTER_CONNECT_RETRY = 1; START SLAVE"
    wait_replicating "$uid" "$what"
}

# Waits until tablet UID's MariaDB replicates with both threads running (vttablet sets it up at
# its start; a replica whose replication broke is named with the error its MariaDB gives).
wait_replicating() {
    local uid="$1" what="$2" deadline=$((SECONDS + 60)) status=""
    while [ $SECONDS -lt $deadline ]; do
        status="$(mysql_of "$uid" -e 'SHOW SLAVE STATUS\G' 2>&1 || true)"
        if grep -q 'Slave_IO_Running: Yes' <<<"$status" && grep -q 'Slave_SQL_Running: Yes' <<<"$status"; then
            return
        fi
        sleep 1
    done
    log "tablet $uid does not replicate from the primary of $what:"
    printf '%s\n' "$status" >&2
    tail -n 20 "$state_dir/logs/vttablet-$uid.log" >&2
    exit 1
}

# mysql_of UID ARGS...: the mysql client on tablet UID's MariaDB (its socket, as vt_dba).
mysql_of() {
    local uid="$1" dir
    shift
    printf -v dir '%s/vt_%010d' "$state_dir" "$uid"
    run mysql --no-defaults -S "$dir/mysql.sock" -u vt_dba "$@"
}

stop_tablet() {
    local uid="$1" pid
    if [ -f "$state_dir/pids/vttablet-$uid" ]; then
        pid="$(cat "$state_dir/pids/vttablet-$uid")"
        kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        rm -f "$state_dir/pids/vttablet-$uid"
    fi
    run "$bin/mysqlctl" --log_dir "$state_dir/logs" --tablet-uid "$uid" --config-file-not-found-handling=ignore \
        shutdown >>"$state_dir/logs/mysqlctl-$uid.log" 2>&1 || true
}

start_vtgate() {
    spawn vtgate "$bin/vtgate" "${topo_flags[@]}" --log_dir "$state_dir/logs" --cell "$cell" \
        --cells-to-watch "$cell" --tablet-types-to-wait PRIMARY --service-map 'grpc-vtgateservice' \
        --bind-address 127.0.0.1 --port "$vtgate_web_port" --grpc-port "$vtgate_grpc_port" \
        --mysql-server-port "$vtgate_mysql_port" --mysql-server-bind-address 127.0.0.1 \
        --mysql-server-version "$vtgate_reported_version" \
        --mysql-auth-server-impl static --mysql-auth-server-static-file "$state_dir/auth/mysql_users.json" \
        --grpc-auth-mode static --grpc-auth-static-password-file "$state_dir/auth/grpc_users.json" \
        --enable-buffer --buffer-min-time-between-failovers 1s --buffer-window 10s \
        --tablet-refresh-interval 1s --vschema-ddl-authorized-users "$cluster_user" \
        --config-file-not-found-handling=ignore
    wait_port vtgate "$vtgate_mysql_port"
    wait_port vtgate "$vtgate_grpc_port"
}

running() { [ -f "$state_dir/ready" ] && [ -f "$state_dir/pids/vtgate" ] && kill -0 "$(cat "$state_dir/pids/vtgate")" 2>/dev/null; }

ready() { running && port_open "$vtgate_grpc_port" && port_open "$vtgate_mysql_port"; }

print_ports() {
    printf 'VITESS_HOST=127.0.0.1\nVITESS_GRPC_PORT=%s\nVITESS_MYSQL_PORT=%s\n' "$vtgate_grpc_port" "$vtgate_mysql_port"
    printf 'VITESS_USER=%s\nVITESS_PASSWORD_FILE=%s\nVITESS_TLS_CA=\n' "$cluster_user" "$state_dir/auth/password"
    printf 'VITESS_VTCTLD=127.0.0.1:%s\n' "$vtctld_grpc_port"
}

start() {
    if ready && [ "$(cat "$state_dir/settings" 2>/dev/null)" = "$(settings)" ]; then
        log "already running"
        print_ports
        return
    fi
    local t0=$SECONDS statement_seconds=""
    if [ -n "$copy_phase_duration" ]; then statement_seconds="$(duration_seconds "$copy_phase_duration")"; fi
    stop
    ensure_packages
    ensure_vitess_built
    rm -rf "$state_dir"
    mkdir -p "$state_dir/logs" "$state_dir/pids" "$state_dir/config"
    cp "$here/vitess/config/init_db.sql" "$state_dir/config/init_db.sql"
    if [ -n "$copy_phase_duration" ]; then
        # MariaDB ignores the MAX_EXECUTION_TIME hint that carries the flag on MySQL: the same
        # bound on the row streamer's user (see the knob's note above).
        printf "ALTER USER 'vt_filtered'@'localhost' WITH MAX_STATEMENT_TIME %s;\n" "$statement_seconds" \
            >>"$state_dir/config/init_db.sql"
    fi
    # One mysqld per tablet: each its own primary, so read_only stays Vitess's business.
    grep -v '^read_only' "$here/vitess/config/mycnf/test-suite.cnf" >"$state_dir/config/extra.cnf"
    make_credentials
    log "starting etcd, vtctld, the $layout layout and vtgate (Vitess $vitess_version) on ports $base-$((base + 199))"
    start_etcd
    start_vtctld
    if [ "$layout" = shards4 ]; then
        start_shards4
    else
        start_tablet commerce 0 100
        # Every table starts in `commerce`: the local cluster's commerce and customer tables.
        cat "$here/vitess/schema/commerce/001_tables.sql" "$here/vitess/schema/customer/001_tables.sql" \
            >"$state_dir/config/commerce.sql"
        vtctldclient ApplySchema --sql-file "$state_dir/config/commerce.sql" commerce >/dev/null
        vtctldclient ApplyVSchema --vschema-file "$here/vitess/topology/vschema_commerce.json" commerce >/dev/null
    fi
    start_vtgate
    settings >"$state_dir/settings"
    touch "$state_dir/ready"
    log "ready in $((SECONDS - t0))s"
    print_ports
}

# The shards4 layout's keyspace: its four tablets started side by side (each a mysqlctl init,
# a vttablet and a reparent: most of the start's time is waiting, which they share).
start_shards4() {
    vtctldclient CreateKeyspace --durability-policy=none "$sharded_keyspace" >/dev/null
    local i pids=() failed=0
    for i in "${!sharded_shards[@]}"; do
        start_tablet "$sharded_keyspace" "${sharded_shards[$i]}" $(((i + 1) * 100)) &
        pids+=($!)
    done
    for i in "${pids[@]}"; do wait "$i" || failed=1; done
    [ "$failed" = 0 ] || { log "a tablet of keyspace $sharded_keyspace did not start"; exit 1; }
    vtctldclient ApplyVSchema --vschema-file "$here/vitess/topology/vschema_sharded.json" \
        "$sharded_keyspace" >/dev/null
}

stop() {
    local f pid
    if [ -d "$state_dir/pids" ]; then
        # vtgate first, mysqld last (vttablets want their database while they stop).
        for f in vtgate $(cd "$state_dir/pids" && ls | grep '^vttablet-' || true) vtctld etcd; do
            [ -f "$state_dir/pids/$f" ] || continue
            pid="$(cat "$state_dir/pids/$f")"
            kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
            kill -KILL -- "-$pid" 2>/dev/null || true
        done
    fi
    # Then by command line: a process whose pid file was lost (a start killed midway, two starts
    # at once) still holds its fixed port and would make the next start's tablet fail to bind.
    local pattern
    # (Each pattern ends in a "/" after the state dir: another cluster's state dir may begin
    # with this one's name, e.g. the shards4 layout's.)
    for pattern in "vitess-v[^ ]*/libexec/vt[a-z]* .*--log_dir $state_dir/logs " "etcd .*--data-dir $state_dir/etcd" \
        "mysqld_safe.*$state_dir/" "mariadbd.*$state_dir/" "mysqld .*$state_dir/"; do
        pkill -KILL -f "$pattern" 2>/dev/null || true
    done
    rm -rf "$state_dir/pids" "$state_dir/ready" "$state_dir/settings"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if ready; then print_ports; else log "not running"; exit 1; fi ;;
    env) print_ports ;;
    tablet-down) shift; [ $# = 1 ] || { echo "usage: $0 tablet-down UID" >&2; exit 2; }; stop_tablet "$1" ;;
    tablet) shift; [ $# = 3 ] || { echo "usage: $0 tablet KEYSPACE SHARD UID" >&2; exit 2; }; start_tablet "$@" ;;
    replica) shift; [ $# = 3 ] || { echo "usage: $0 replica KEYSPACE SHARD UID" >&2; exit 2; }
        start_tablet "$@" replica ;;
    copy-phase) shift; [ $# = 1 ] || { echo "usage: $0 copy-phase DURATION" >&2; exit 2; }; copy_phase "$1" ;;
    mysql) shift; [ $# -ge 1 ] || { echo "usage: $0 mysql UID ARGS..." >&2; exit 2; }; mysql_of "$@" ;;
    vtctldclient) shift; vtctldclient "$@" ;;
    *) echo "usage: $0 start|stop|status|env|tablet KEYSPACE SHARD UID|replica KEYSPACE SHARD UID|mysql UID ARGS...|tablet-down UID|vtctldclient ARGS..." >&2
       exit 2 ;;
esac

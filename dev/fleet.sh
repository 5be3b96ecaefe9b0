#!/usr/bin/env bash
# An Airflow 3 fleet on one machine, made of real parts: the CeleryExecutor, a Redis broker, a
# PostgreSQL metadata database (which also holds the syncs' checkpoint store), the scheduler,
# dag-processor, triggerer and api-server, and two Celery workers that share no directory.
# Staging and Delta live on the local S3 server (dev/local_s3.sh); merges run on a Spark standalone
# cluster (a master and a worker), through a Spark Connect server with S3A whose executors are the
# cluster's (dev/spark_connect.sh), or through spark-submit from the Celery worker to the cluster.
# docs/deployment.md follows what this script does.
#
#   dev/fleet.sh start          start every part unless all already run; prints the fleet's
#                               settings (idempotent; a partly running fleet is stopped and
#                               started afresh: every start is an empty fleet)
#   dev/fleet.sh stop           stop every part (the state directory is kept until the next start)
#   dev/fleet.sh status         exit 0 and print the settings when every part answers, else exit 1
#   dev/fleet.sh env            print the settings as shell assignments (for `eval` or tests)
#   dev/fleet.sh worker N       start worker N again unless it runs (after a test killed it)
#   dev/fleet.sh triggerer N    start triggerer N (1 or 2) again unless it runs
#   dev/fleet.sh restart-broker stop Redis and start it again, empty (it keeps nothing on disk), as
#                               a broker host that restarts loses what it held
#   dev/fleet.sh deploy FILE..  copy DAG files into each host's own dags folder (the control
#                               host's and each worker's), as a deployment ships DAGs to each host
#
# How the workers are kept apart: each runs with an empty environment plus its own HOME, TMPDIR,
# AIRFLOW_HOME (its dags folder, its task logs), [vitess] spill_dir, Celery hostname and log
# server port; the host name Airflow records for its tasks (ti.hostname) comes from
# [core] hostname_callable = tests.fleet.hostname.worker_hostname, which returns the worker's
# FLEET_WORKER_NAME. Nothing but S3, PostgreSQL, vtgate, Spark Connect and the broker connects them.
#
# Two triggerers (on the control host and on `control-2`), as a deployment runs two for a
# triggerer's death: a trigger of a dead one is taken over by the other.
#
# Ports (127.0.0.1 only; 18600-18699): Redis 18601, PostgreSQL 18602, S3 18603, api-server 18610,
# the workers' log servers 18611 and 18612, the triggerers' 18613 and 18615, the control hosts'
# 18614 and 18616 (their [logging] worker_log_server_port; nothing serves there under Celery),
# Spark Connect 18690, the Spark master 18691 (its UI 18692), the Spark worker's UI 18693.
#
# Environment knobs:
#   FLEET_STATE_DIR   everything the fleet writes (default ${TMPDIR:-/tmp}/apv-fleet)
#   FLEET_PYTHON      the Python with Airflow and the provider (default: the checkout's .venv)
#   FLEET_WORKERS     how many Celery workers (default 2)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
state="${FLEET_STATE_DIR:-${TMPDIR:-/tmp}/apv-fleet}"
python="${FLEET_PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
bindir="$(dirname "$python")"
workers="${FLEET_WORKERS:-2}"
redis_port=18601
pg_port=18602
s3_port=18603
api_port=18610
trigger_log_port=18613
trigger_log_port_2=18615
connect_port=18690
spark_master_port=18691
spark_master_ui=18692
spark_worker_ui=18693
bucket=fleet
user=fleet

log() { printf '[fleet] %s\n' "$*" >&2; }
# as_root and port_open: one definition for every dev script.
# shellcheck source=vitess/common.sh
. "$here/vitess/common.sh"

# `running` of common.sh reads $pid_file: one per part here.
alive() {
    local pid_file="$state/pids/$1"
    running
}

# The parts, in start order; each has a pid file under $state/pids.
parts() {
    echo redis postgres spark-master spark-worker api-server scheduler dag-processor triggerer triggerer-2
    for n in $(seq "$workers"); do echo "worker-$n"; done
}

s3_env() { LOCAL_S3_PORT=$s3_port LOCAL_S3_BUCKETS=$bucket LOCAL_S3_STATE_DIR="$state/s3" "$here/local_s3.sh" "$@"; }
connect_env() {
    SPARK_CONNECT_PORT=$connect_port SPARK_CONNECT_STATE_DIR="$state/spark-connect" \
        SPARK_CONNECT_PYTHON="$python" "$here/spark_connect.sh" "$@"
}

ready() {
    local p
    for p in $(parts); do alive "$p" || return 1; done
    [ -f "$state/ready" ] && port_open $api_port && s3_env status >/dev/null 2>&1 \
        && connect_env status >/dev/null 2>&1
}

# --- what the fleet needs installed ----------------------------------------------------------

ensure_redis() {
    command -v redis-server >/dev/null 2>&1 && return
    log "installing redis-server from Debian (the Celery broker)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends redis-server >/dev/null
}

pg_bin() {
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n | tail -n1)"
    if [ -z "$found" ]; then
        log "installing PostgreSQL from Debian (the metadata database and checkpoint store)"
        as_root apt-get update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends postgresql >/dev/null
        found="$(ls -d /usr/lib/postgresql/*/bin | sort -t/ -k4 -n | tail -n1)"
    fi
    echo "$found"
}

# The Celery provider (and Celery, with its Redis client) from PyPI, at the pin of pyproject's
# `test` extra, without moving the installed Airflow.
ensure_celery_provider() {
    "$python" -c 'import airflow.providers.celery, redis' 2>/dev/null && return
    local pin airflow_version
    pin="$(grep -oE 'apache-airflow-providers-celery[^"]*' "$repo/pyproject.toml" | head -n1)"
    airflow_version="$("$python" -c 'from importlib.metadata import version; print(version("apache-airflow"))')"
    log "installing $pin from PyPI (Airflow $airflow_version stays)"
    "$python" -m pip install -q -c "$repo/dev/constraints.txt" "$pin" "apache-airflow==$airflow_version"
}

# --- the servers ------------------------------------------------------------------------------

# PostgreSQL refuses to run as root: as root the cluster belongs to the package's postgres user.
# setpriv execs (runuser would stay as the parent): the pid file holds postgres itself.
as_pg=()
[ "$(id -u)" = 0 ] && as_pg=(setpriv --reuid=postgres --regid=postgres --init-groups)

start_postgres() {
    local bin dir="$state/postgres"
    bin="$(pg_bin)"
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$dir"
    "${as_pg[@]}" "$bin/initdb" -D "$dir/data" --auth=trust -U postgres -E UTF8 --no-locale --no-sync >"$state/logs/initdb.log" 2>&1
    log "starting PostgreSQL on 127.0.0.1:$pg_port"
    # Small and fast: a test fleet needs correctness, not durability.
    "${as_pg[@]}" setsid "$bin/postgres" -D "$dir/data" -p $pg_port -c listen_addresses=127.0.0.1 \
        -c "unix_socket_directories=$dir" -c fsync=off -c full_page_writes=off -c synchronous_commit=off \
        -c shared_buffers=32MB -c max_connections=100 >"$state/logs/postgres.log" 2>&1 </dev/null &
    echo $! >"$state/pids/postgres"
    local pid_file="$state/pids/postgres"
    wait_until_ready PostgreSQL 60 0.2 "$state/logs/postgres.log" "$bin/pg_isready" -q -h 127.0.0.1 -p $pg_port
    local db
    for db in airflow vitess_sync; do
        "$bin/psql" -q -h 127.0.0.1 -p $pg_port -U postgres -c "CREATE DATABASE $db" >/dev/null
    done
}

# The Spark standalone cluster: a master and a worker (2 cores: the Connect server's application
# and a spark-submit's each take one, spark.cores.max=1). The worker starts its executors with
# the S3 keys in their environment, where S3A's default chain finds them for the Connect server's
# executors (a spark-submit's job sets its own on its session, which reach the executors with
# each task).
start_spark_cluster() {
    local spark_home
    spark_home="$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
    mkdir -p "$state/spark/work"
    log "starting a Spark master on 127.0.0.1:$spark_master_port and a worker"
    SPARK_LOG_DIR="$state/spark" PYSPARK_PYTHON="$python" setsid "$spark_home/bin/spark-class" \
        org.apache.spark.deploy.master.Master --host 127.0.0.1 --port $spark_master_port \
        --webui-port $spark_master_ui >"$state/logs/spark-master.log" 2>&1 </dev/null &
    echo $! >"$state/pids/spark-master"
    local pid_file="$state/pids/spark-master"
    wait_until_ready "the Spark master" 120 0.5 "$state/logs/spark-master.log" port_open $spark_master_port
    AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY_ID" AWS_SECRET_ACCESS_KEY="$(cat "$S3_SECRET_KEY_FILE")" \
        SPARK_LOG_DIR="$state/spark" SPARK_WORKER_DIR="$state/spark/work" PYSPARK_PYTHON="$python" \
        setsid "$spark_home/bin/spark-class" org.apache.spark.deploy.worker.Worker \
        "spark://127.0.0.1:$spark_master_port" --host 127.0.0.1 --webui-port $spark_worker_ui \
        --cores 2 --memory 3g >"$state/logs/spark-worker.log" 2>&1 </dev/null &
    echo $! >"$state/pids/spark-worker"
    pid_file="$state/pids/spark-worker"
    wait_until_ready "the Spark worker" 120 0.5 "$state/logs/spark-worker.log" spark_worker_registered
}

spark_worker_registered() {
    curl -s "http://127.0.0.1:$spark_master_ui/json/" 2>/dev/null | grep -q '"aliveworkers" *: *[1-9]'
}

start_redis() {
    mkdir -p "$state/redis"
    log "starting Redis on 127.0.0.1:$redis_port (the Celery broker)"
    setsid redis-server --port $redis_port --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$state/redis" --daemonize no >"$state/logs/redis.log" 2>&1 </dev/null &
    echo $! >"$state/pids/redis"
    local pid_file="$state/pids/redis"
    wait_until_ready Redis 30 0.2 "$state/logs/redis.log" port_open $redis_port
}

# --- Airflow's configuration: one for every host, and each host's own -------------------------

# Shell assignments (KEY='value'), one a line, for `set -a; . file`.
assignment() { printf "%s=%q\n" "$1" "$2"; }

write_common_env() {
    local s3_key s3_secret vitess_env
    eval "$(s3_env env)"
    s3_key="$S3_ACCESS_KEY_ID"
    s3_secret="$(cat "$S3_SECRET_KEY_FILE")"
    vitess_env="$("$here/local_vitess.sh" env)"
    local db="postgresql+psycopg://postgres@127.0.0.1:$pg_port/airflow"
    {
        assignment PATH "$bindir:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        assignment PYTHONPATH "$repo"
        assignment AIRFLOW__CORE__EXECUTOR CeleryExecutor
        assignment AIRFLOW__CORE__LOAD_EXAMPLES False
        assignment AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION True
        assignment AIRFLOW__CORE__PARALLELISM 8
        assignment AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG 4
        # ti.hostname: the worker's own name (FLEET_WORKER_NAME), not the machine's they share.
        assignment AIRFLOW__CORE__HOSTNAME_CALLABLE tests.fleet.hostname.worker_hostname
        assignment AIRFLOW__CORE__EXECUTION_API_SERVER_URL "http://127.0.0.1:$api_port/execution/"
        assignment AIRFLOW__DATABASE__SQL_ALCHEMY_CONN "$db"
        assignment AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC "${db/+psycopg/+psycopg_async}"
        assignment AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_SIZE 2
        assignment AIRFLOW__DATABASE__SQL_ALCHEMY_MAX_OVERFLOW 4
        assignment AIRFLOW__CELERY__BROKER_URL "redis://127.0.0.1:$redis_port/0"
        assignment AIRFLOW__CELERY__RESULT_BACKEND "db+postgresql+psycopg://postgres@127.0.0.1:$pg_port/airflow"
        # One task at a time per worker: two tasks that run at once run on two workers.
        assignment AIRFLOW__CELERY__WORKER_CONCURRENCY 1
        assignment AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER 1
        assignment AIRFLOW__API__HOST 127.0.0.1
        assignment AIRFLOW__API__PORT $api_port
        assignment AIRFLOW__API__BASE_URL "http://127.0.0.1:$api_port"
        assignment AIRFLOW__API__WORKERS 1
        # One secret for every host: the scheduler signs task tokens the api-server checks.
        assignment AIRFLOW__API_AUTH__JWT_SECRET "$(cat "$state/secrets/jwt")"
        assignment AIRFLOW__API__SECRET_KEY "$(cat "$state/secrets/api")"
        assignment AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS "$user:admin"
        assignment AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS False
        assignment AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT $trigger_log_port
        # Quick enough for tests on 2 cores (as tests/support/airflow_services.py).
        assignment AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL 3
        assignment AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL 30
        assignment AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL 2
        assignment AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC 2
        assignment AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC 2
        assignment AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME 0.5
        assignment AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL 2
        assignment AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC 2
        # A dead triggerer's triggers go to the other after this long without its heartbeat
        # (default 30 s).
        assignment AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD 10
        # A task queued to the broker but never started (its message lost with a restarted
        # broker) is queued again after this long (default 600 s).
        assignment AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT 60
        # A killed worker's task is failed (and retried on another worker) once it has not
        # heartbeat for this long (default 300 s).
        assignment AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT 20
        assignment AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL 2
        # A task's supervisor notices its process's exit only at its next wake-up, up to this
        # long (default 5 s) after the task ended: meanwhile the worker's one slot stays taken, and
        # the other worker's next task (a window's second group) went to the first one instead.
        assignment AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL 1
        # The connections every host needs (a deployment would keep them in a secrets backend).
        "$python" - "$s3_key" "$s3_secret" "$S3_ENDPOINT_URL" "$pg_port" "$connect_port" "$vitess_env" \
            "$spark_master_port" <<'EOF'
import json, shlex, sys
from pathlib import Path
s3_key, s3_secret, s3_url, pg_port, connect_port, vitess_env, master_port = sys.argv[1:]
v = dict(line.split("=", 1) for line in vitess_env.splitlines() if "=" in line)
conns = {
    "VITESS_DEFAULT": {"conn_type": "vitess", "host": v["VITESS_HOST"], "port": int(v["VITESS_GRPC_PORT"]),
        "login": v["VITESS_USER"], "password": Path(v["VITESS_PASSWORD_FILE"]).read_text().strip(),
        "extra": {"mysql_port": int(v["VITESS_MYSQL_PORT"]), "timeout_seconds": 10}},
    "FLEET_S3": {"conn_type": "aws", "login": s3_key, "password": s3_secret,
        "extra": {"endpoint_url": s3_url, "region_name": "us-east-1"}},
    "FLEET_STORE": {"conn_type": "postgres", "host": "127.0.0.1", "port": int(pg_port),
        "login": "postgres", "schema": "vitess_sync"},
    "SPARK_CONNECT_DEFAULT": {"conn_type": "spark_connect", "host": f"sc://127.0.0.1:{connect_port}"},
    # spark-submit from a Celery worker to the standalone cluster (client mode: the driver on
    # the worker, the executors on the cluster).
    "SPARK_FLEET": {"conn_type": "spark", "host": "spark://127.0.0.1", "port": int(master_port),
        "extra": {"deploy-mode": "client"}},
}
for name, value in conns.items():
    print(f"AIRFLOW_CONN_{name}={shlex.quote(json.dumps(value))}")
EOF
    } >"$state/common.env"
    chmod 600 "$state/common.env"
}

# A host's own directories and settings. Usage: write_host_env NAME LOG_SERVER_PORT
write_host_env() {
    local name=$1 dir="$state/$1"
    mkdir -p "$dir/home" "$dir/tmp" "$dir/airflow/dags" "$dir/airflow/logs" "$dir/spill"
    {
        assignment HOME "$dir/home"
        assignment TMPDIR "$dir/tmp"
        assignment AIRFLOW_HOME "$dir/airflow"
        assignment AIRFLOW__CORE__DAGS_FOLDER "$dir/airflow/dags"
        assignment AIRFLOW__LOGGING__BASE_LOG_FOLDER "$dir/airflow/logs"
        assignment AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT "$2"
        assignment AIRFLOW__VITESS__SPILL_DIR "$dir/spill"
        assignment FLEET_WORKER_NAME "$name"
    } >"$dir/host.env"
}

# Runs a command as HOST, with nothing of the caller's environment; every step execs, so a
# background one's $! is the command's own pid. Usage: "${as_host[@]}" HOST CMD...
as_host=(env -i bash -c 'set -a; . "$1"/common.env; . "$1/$2"/host.env; set +a; shift 2; exec "$@"' fleet "$state")

# Starts a long-running part as HOST. Usage: start_part NAME HOST CMD...
start_part() {
    local name=$1 host=$2
    shift 2
    log "starting $name"
    "${as_host[@]}" "$host" setsid "$@" >"$state/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$state/pids/$name"
}

wait_healthy() {
    local deadline=$((SECONDS + ${FLEET_START_TIMEOUT:-180})) health
    while [ $SECONDS -lt $deadline ]; do
        local p
        for p in $(parts); do
            [ "$p" = postgres ] || [ "$p" = redis ] || alive "$p" || {
                log "$p exited while starting; last lines of $state/logs/$p.log:"
                tail -n 40 "$state/logs/$p.log" >&2
                return 1
            }
        done
        health="$(curl -s "http://127.0.0.1:$api_port/api/v2/monitor/health" 2>/dev/null || true)"
        if [ "$(grep -o '"status":"healthy"' <<<"$health" | wc -l)" -ge 4 ] && workers_ready; then
            return 0
        fi
        sleep 1
    done
    log "the fleet did not become healthy in time (health: ${health:-no answer})"
    return 1
}

# Each worker has connected to the broker and says so in its log.
workers_ready() {
    local n
    for n in $(seq "$workers"); do
        grep -q "worker-$n@fleet ready" "$state/logs/worker-$n.log" 2>/dev/null || return 1
    done
}

print_env() {
    printf 'FLEET_STATE_DIR=%s\nFLEET_API_URL=http://127.0.0.1:%s\nFLEET_USER=%s\nFLEET_PASSWORD_FILE=%s\n' \
        "$state" $api_port $user "$state/secrets/passwords.json"
    printf 'FLEET_HOSTS=%s\nFLEET_WORKERS=%s\nFLEET_BUCKET=%s\nFLEET_CONNECT_URL=sc://127.0.0.1:%s\n' \
        "control $(seq -f 'worker-%g' -s ' ' "$workers")" "$(seq -f 'worker-%g' -s ' ' "$workers")" \
        $bucket $connect_port
    printf 'FLEET_STORE_URL=postgresql+psycopg://postgres@127.0.0.1:%s/vitess_sync\n' $pg_port
    printf 'FLEET_SPARK_MASTER=spark://127.0.0.1:%s\nFLEET_SPARK_MASTER_UI=http://127.0.0.1:%s\n' \
        $spark_master_port $spark_master_ui
    s3_env env
}

start() {
    if ready; then
        log "already running"
        print_env
        return
    fi
    stop
    ensure_redis
    ensure_celery_provider
    command -v curl >/dev/null 2>&1 || { as_root apt-get update -qq; as_root apt-get install -y -qq curl >/dev/null; }
    "$here/local_vitess.sh" start >/dev/null
    rm -rf "$state"
    mkdir -p "$state/pids" "$state/logs" "$state/secrets"
    chmod 700 "$state/secrets"
    head -c 48 /dev/urandom | base64 | tr -d '\n' >"$state/secrets/jwt"
    head -c 24 /dev/urandom | base64 | tr -d '\n' >"$state/secrets/api"
    printf '{"%s": "%s"}' $user "$(head -c 18 /dev/urandom | base64 | tr -d '/+=\n')" >"$state/secrets/passwords.json"
    chmod 600 "$state/secrets"/*
    start_postgres
    start_redis
    s3_env start >/dev/null
    eval "$(s3_env env)"
    start_spark_cluster
    # S3A on the Spark Connect server: the endpoint as settings, the keys from its environment
    # (S3A's default credential chain reads them there; never on a command line).
    AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY_ID" AWS_SECRET_ACCESS_KEY="$(cat "$S3_SECRET_KEY_FILE")" \
        SPARK_CONNECT_MASTER="spark://127.0.0.1:$spark_master_port" \
        SPARK_CONNECT_S3=1 SPARK_CONNECT_CONF="--conf spark.cores.max=1 --conf spark.executor.memory=1g \
--conf spark.hadoop.fs.s3a.endpoint=$S3_ENDPOINT_URL \
--conf spark.hadoop.fs.s3a.path.style.access=true --conf spark.hadoop.fs.s3a.endpoint.region=$S3_REGION \
--conf spark.hadoop.fs.s3a.connection.ssl.enabled=false" connect_env start >/dev/null
    write_common_env
    write_host_env control 18614
    write_host_env control-2 18616
    echo "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=$trigger_log_port_2" >>"$state/control-2/host.env"
    echo "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=$state/secrets/passwords.json" >>"$state/control/host.env"
    for n in $(seq "$workers"); do write_host_env "worker-$n" $((18610 + n)); done
    log "migrating the metadata database"
    "${as_host[@]}" control airflow db migrate >"$state/logs/db-migrate.log" 2>&1 || {
        tail -n 40 "$state/logs/db-migrate.log" >&2
        exit 1
    }
    start_part api-server control airflow api-server --host 127.0.0.1 --port $api_port --workers 1
    start_part scheduler control airflow scheduler
    start_part dag-processor control airflow dag-processor
    start_part triggerer control airflow triggerer
    start_part triggerer-2 control-2 airflow triggerer
    for n in $(seq "$workers"); do
        start_part "worker-$n" "worker-$n" airflow celery worker --celery-hostname "worker-$n@fleet" \
            --concurrency 1 --without-gossip --without-mingle
    done
    wait_healthy
    touch "$state/ready"
    log "ready: http://127.0.0.1:$api_port (user $user, password in $state/secrets/passwords.json)"
    print_env
}

stop_part() {
    local pid_file="$state/pids/$1"
    running || { rm -f "$pid_file"; return 0; }
    local pid
    pid="$(cat "$pid_file")"
    log "stopping $1 (pid $pid)"
    # Each part leads its own process group (setsid): its children (task processes, the log
    # server, uvicorn's workers) stop with it.
    # PostgreSQL's fast shutdown is SIGINT (SIGTERM waits for its clients).
    local sig=TERM
    [ "$1" = postgres ] && sig=INT
    kill -"$sig" -- "-$pid" 2>/dev/null || kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pid_file"
}

stop() {
    rm -f "$state/ready"
    if [ -d "$state/pids" ]; then
        local p
        for p in $(parts | tr ' ' '\n' | tac); do stop_part "$p"; done
    fi
    connect_env stop >/dev/null 2>&1 || true
    s3_env stop >/dev/null 2>&1 || true
}

start_worker() {
    [ -f "$state/ready" ] || { log "the fleet is not running: dev/fleet.sh start"; exit 1; }
    local pid_file="$state/pids/worker-$1"
    running && { log "worker-$1 already running"; return; }
    start_part "worker-$1" "worker-$1" airflow celery worker --celery-hostname "worker-$1@fleet" \
        --concurrency 1 --without-gossip --without-mingle
    wait_until_ready "worker-$1" 120 0.5 "$state/logs/worker-$1.log" \
        grep -q "worker-$1@fleet ready" "$state/logs/worker-$1.log"
}

start_triggerer() {
    [ -f "$state/ready" ] || { log "the fleet is not running: dev/fleet.sh start"; exit 1; }
    local name=triggerer host=control
    [ "$1" = 2 ] && name=triggerer-2 host=control-2
    local pid_file="$state/pids/$name"
    running && { log "$name already running"; return; }
    start_part "$name" "$host" airflow triggerer
}

restart_broker() {
    [ -f "$state/ready" ] || { log "the fleet is not running: dev/fleet.sh start"; exit 1; }
    stop_part redis
    start_redis
}

deploy() {
    [ -f "$state/ready" ] || { log "the fleet is not running: dev/fleet.sh start"; exit 1; }
    local host file
    for host in control control-2 $(seq -f 'worker-%g' "$workers"); do
        for file in "$@"; do cp "$file" "$state/$host/airflow/dags/"; done
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if ready; then print_env; else log "not running"; exit 1; fi ;;
    env) print_env ;;
    deploy) shift; deploy "$@" ;;
    worker) start_worker "${2:?usage: $0 worker N}" ;;
    triggerer) start_triggerer "${2:?usage: $0 triggerer N}" ;;
    restart-broker) restart_broker ;;
    *) echo "usage: $0 start|stop|status|env|deploy FILE...|worker N|triggerer N|restart-broker" >&2; exit 2 ;;
esac

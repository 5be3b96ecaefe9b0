#!/usr/bin/env bash
# A long-running Spark Connect server with Delta Lake, for the merge's Spark Connect mode.
#
#   dev/spark_connect.sh start    start it unless it already answers; prints its sc:// URL (idempotent)
#   dev/spark_connect.sh stop     stop it
#   dev/spark_connect.sh status   exit 0 and print the URL when it answers, else exit 1
#
# The server is PySpark's own (pyspark/jars holds spark-connect) run by spark-submit from the
# project's Python, with the merge job's Delta jar (from Maven Central, resolved once into the
# Ivy cache; the job speaks SQL to Delta, so Delta's Connect plugin is not needed) and the
# Delta session settings of
# airflow_provider_vitess/merge/spark_conf.py: `python -m airflow_provider_vitess.merge.job.connect
# server-args` prints them, so the server and the spark-submit mode never drift apart. Its
# Python workers (the job's one UDF) run the same Python, which must have the provider installed.
#
# Environment knobs:
#   SPARK_CONNECT_PORT       gRPC port on 127.0.0.1 (default 15002, Spark's)
#   SPARK_CONNECT_STATE_DIR  log, pid and the server's local dirs (default ${TMPDIR:-/tmp}/apv-spark-connect)
#   SPARK_CONNECT_PYTHON     the Python with pyspark, delta-spark and the provider (default: the
#                            checkout's .venv/bin/python, else python3)
#   SPARK_CONNECT_MASTER     the server's master (default local[2])
#   SPARK_CONNECT_S3         1: add Hadoop's S3A (s3a:// tables; give its settings in SPARK_CONNECT_CONF)
#   SPARK_CONNECT_ICEBERG    1: add Iceberg's runtime, SQL extensions and JDBC driver (Iceberg syncs)
#   SPARK_CONNECT_CONF       extra "--conf k=v ..." arguments
#   SPARK_CONNECT_AUTHENTICATE_TOKEN  a token the server requires of every client (read by the
#                            server from its environment, never on its command line; clients
#                            give it as the spark_connect connection's password). The server
#                            listens on 127.0.0.1 only; one for a cluster
#                            (`python -m airflow_provider_vitess.merge.job.connect server-args
#                            --cluster`) listens on 0.0.0.0 and is refused without a token.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
port="${SPARK_CONNECT_PORT:-15002}"
state_dir="${SPARK_CONNECT_STATE_DIR:-${TMPDIR:-/tmp}/apv-spark-connect}"
python="${SPARK_CONNECT_PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$here/../.venv/bin/python" ]; then python="$here/../.venv/bin/python"; else python=python3; fi
fi
pid_file="$state_dir/server.pid"
log_file="$state_dir/server.log"

log() { printf '[spark_connect] %s\n' "$*" >&2; }
# port_open: one definition for every dev script.
# shellcheck source=vitess/common.sh
. "$here/vitess/common.sh"

# Never prints the token. With one, the host is "localhost": pyspark sends a token only over
# TLS, except to "localhost" (gRPC local credentials), and this server speaks no TLS.
url() {
    if [ -n "${SPARK_CONNECT_AUTHENTICATE_TOKEN:-}" ]; then
        printf 'sc://localhost:%s\n' "$port"
    else
        printf 'sc://127.0.0.1:%s\n' "$port"
    fi
}

wait_ready() {
    # Cold: Ivy resolves Delta's jars first (a minute); warm: the JVM and session in ~15 s.
    local deadline=$((SECONDS + ${SPARK_CONNECT_START_TIMEOUT:-300}))
    while [ $SECONDS -lt $deadline ]; do
        if ! running; then
            log "the server exited while starting; last lines of $log_file:"
            tail -n 40 "$log_file" >&2
            return 1
        fi
        if port_open "$port"; then return 0; fi
        sleep 0.5
    done
    log "the server did not listen on 127.0.0.1:$port in time; last lines of $log_file:"
    tail -n 40 "$log_file" >&2
    return 1
}

start() {
    if running && port_open "$port"; then
        log "already running"
        url
        return
    fi
    stop
    local bin args
    bin="$("$python" -c 'import sys, pathlib; print(pathlib.Path(sys.executable).parent)')/spark-submit"
    [ -x "$bin" ] || { log "no spark-submit beside $python: install the provider's [spark] extra there"; exit 1; }
    mkdir -p "$state_dir/local"
    mapfile -t args < <("$python" -m airflow_provider_vitess.merge.job.connect server-args \
        --port "$port" --local-dir "$state_dir/local" ${SPARK_CONNECT_S3:+--s3} \
        ${SPARK_CONNECT_ICEBERG:+--iceberg})
    log "starting the Spark Connect server on 127.0.0.1:$port (log: $log_file)"
    # setsid: the server outlives the shell that started it (tests and benches reuse it).
    # shellcheck disable=SC2086  # SPARK_CONNECT_CONF is a list of arguments
    PYSPARK_PYTHON="$python" PYSPARK_DRIVER_PYTHON="$python" \
        setsid "$bin" --master "${SPARK_CONNECT_MASTER:-local[2]}" "${args[@]}" ${SPARK_CONNECT_CONF:-} \
        --class org.apache.spark.sql.connect.service.SparkConnectServer --name "Spark Connect server" \
        spark-internal >"$log_file" 2>&1 </dev/null &
    echo $! >"$pid_file"
    wait_ready
    log "ready"
    url
}

stop() {
    stop_server "the Spark Connect server" 60
    rm -f "$pid_file"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if running && port_open "$port"; then url; else log "not running"; exit 1; fi ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A real S3-compatible object store for development, tests and the demo.
#
#   dev/local_s3.sh start    build the server if missing, start it unless it already runs, create
#                            the buckets; prints endpoint and keys (idempotent)
#   dev/local_s3.sh stop     stop it (objects are thrown away: every start is a fresh store)
#   dev/local_s3.sh status   exit 0 and print the endpoint when it answers, else exit 1
#   dev/local_s3.sh env      print the endpoint and keys as shell assignments (for `eval`)
#
# The server is Versity's S3 gateway (versitygw, Apache-2.0) built from its Go module at the
# release pinned in dev/s3/go.mod, with its posix backend: a bucket is a directory under
# $LOCAL_S3_STATE_DIR/data and an object is a file in it. It speaks the S3 REST API with
# SigV4 authentication (and the newer checksum headers current AWS SDKs send), so s3fs/botocore
# and Hadoop's S3A talk to it exactly as they talk to AWS. Chosen over MinIO (its Go module has
# no tagged release on the Go proxy, only pseudo-versions, and a far larger build) and over
# Debian's radosgw (it needs a Ceph cluster behind it).
#
# Environment knobs:
#   LOCAL_S3_PORT       listen port on 127.0.0.1 (default 15380)
#   LOCAL_S3_BUCKETS    space-separated buckets to create at start (default: lake)
#   LOCAL_S3_STATE_DIR  objects, keys, log and pid (default ${TMPDIR:-/tmp}/airflow-provider-vitess-s3)
#   VITESS_CACHE_DIR    where built binaries live, shared with dev/local_vitess.sh (default
#                       ~/.cache/airflow-provider-vitess, or /var/cache/airflow-provider-vitess as root)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# The server's release is pinned in one place: dev/s3/go.mod.
server_module="github.com/versity/versitygw"
server_version="$(grep -oE "$server_module v[0-9][^ ]*" "$here/s3/go.mod" | head -n1 | cut -d' ' -f2)"

port="${LOCAL_S3_PORT:-15380}"
buckets="${LOCAL_S3_BUCKETS:-lake}"
region="us-east-1"
# The shared cache dir ($cache_dir), as_root and port_open: one definition for every dev script.
# shellcheck source=vitess/common.sh
. "$here/vitess/common.sh"
bin="$cache_dir/versitygw-$server_version/bin/versitygw"
state_dir="${LOCAL_S3_STATE_DIR:-${TMPDIR:-/tmp}/airflow-provider-vitess-s3}"
pid_file="$state_dir/versitygw.pid"
log_file="$state_dir/versitygw.log"
keys="$state_dir/keys"

log() { printf '[local_s3] %s\n' "$*" >&2; }

ensure_curl() {
    command -v curl >/dev/null 2>&1 && return
    log "installing curl from Debian (it signs the bucket-creation requests)"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends curl >/dev/null
}

ensure_built() {
    [ -x "$bin" ] && return
    command -v go >/dev/null 2>&1 || { log "Go is required to build the S3 server"; exit 1; }
    log "building versitygw $server_version (cold: a few minutes; warm: seconds)"
    mkdir -p "$(dirname "$bin")"
    local began=$SECONDS
    (cd "$here/s3" && GOFLAGS=-mod=mod GOBIN="$(dirname "$bin")" go install tool)
    log "built versitygw in $((SECONDS - began)) s"
}

ready() {
    running && port_open "$port" && [ -f "$state_dir/ready" ]
}

# Never prints the secret itself: only the file that holds it.
print_env() {
    printf 'S3_ENDPOINT_URL=http://127.0.0.1:%s\nS3_REGION=%s\n' "$port" "$region"
    printf 'S3_ACCESS_KEY_ID=%s\nS3_SECRET_KEY_FILE=%s\nS3_BUCKETS=%s\nS3_DATA_DIR=%s\n' \
        "$(cat "$keys/access_key")" "$keys/secret_key" "$buckets" "$state_dir/data"
}

# A fresh key pair for every start, readable only by its owner.
make_keys() {
    mkdir -p "$keys"
    chmod 700 "$keys"
    printf 'lake%s' "$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$keys/access_key"
    head -c 30 /dev/urandom | base64 | tr -d '/+=\n' >"$keys/secret_key"
    # curl reads the signing key from this file, so it never shows in a process list.
    printf 'user = "%s:%s"\n' "$(cat "$keys/access_key")" "$(cat "$keys/secret_key")" >"$keys/curl.conf"
    chmod 600 "$keys"/*
}

# CreateBucket, signed with SigV4 (S3 wants the body's SHA-256 too: that of no body); an
# existing bucket of ours is fine.
empty_sha256=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
create_bucket() {
    local status
    status="$(curl -sS -o "$state_dir/create_bucket.out" -w '%{http_code}' -X PUT -K "$keys/curl.conf" \
        --aws-sigv4 "aws:amz:$region:s3" -H "x-amz-content-sha256: $empty_sha256" \
        "http://127.0.0.1:$port/$1")"
    case "$status" in
        200 | 409) ;;
        *) log "creating bucket $1 failed (HTTP $status):"; cat "$state_dir/create_bucket.out" >&2; exit 1 ;;
    esac
}

wait_ready() {
    wait_until_ready versitygw "${LOCAL_S3_START_TIMEOUT:-60}" 0.2 "$log_file" port_open "$port"
}

start() {
    if ready; then
        log "already running"
        print_env
        return
    fi
    stop
    ensure_curl
    ensure_built
    rm -rf "$state_dir"
    mkdir -p "$state_dir/data"
    make_keys
    log "starting versitygw $server_version on 127.0.0.1:$port (posix backend in $state_dir/data)"
    # Keys through the environment, never as arguments (a process list shows those).
    # setsid: the server outlives the shell that started it (pytest reuses it).
    ROOT_ACCESS_KEY_ID="$(cat "$keys/access_key")" ROOT_SECRET_ACCESS_KEY="$(cat "$keys/secret_key")" \
        VGW_REGION="$region" \
        setsid "$bin" --port "127.0.0.1:$port" posix "$state_dir/data" \
        >"$log_file" 2>&1 </dev/null &
    echo $! >"$pid_file"
    wait_ready
    local b
    for b in $buckets; do create_bucket "$b"; done
    touch "$state_dir/ready"
    log "ready"
    print_env
}

stop() {
    stop_server versitygw 30
    rm -f "$pid_file" "$state_dir/ready"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if ready; then print_env; else log "not running"; exit 1; fi ;;
    env) print_env ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Debian's Chromium and its WebDriver for the status page's browser test (idempotent).
# Prints the two paths, one per line: the browser, then the driver.
set -euo pipefail

log() { printf '[chromium] %s\n' "$*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

find_bins() {
    browser="$(command -v chromium || true)"
    driver="$(command -v chromedriver || true)"
    [ -z "$driver" ] && [ -x /usr/lib/chromium/chromedriver ] && driver=/usr/lib/chromium/chromedriver
    [ -n "$browser" ] && [ -n "$driver" ]
}

if ! find_bins; then
    log "installing chromium and chromium-driver from Debian"
    # Another apt user (a MariaDB or PostgreSQL install) may hold the lock for a while.
    as_root apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
    find_bins || { log "chromium or chromedriver still missing after apt-get install"; exit 1; }
fi
printf '%s\n%s\n' "$browser" "$driver"

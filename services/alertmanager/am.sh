#!/usr/bin/env bash
# Local Prometheus Alertmanager for rmqtrace tests: install | start | stop | status | render
#
# Debian's prometheus-alertmanager, run on loopback with the shipped config
# (dashboards/prometheus/alertmanager.yml), its webhook URL replaced by $AM_WEBHOOK_URL when set.
#
# Env:
#   AM_PORT            listen port on 127.0.0.1 (default 19093); the cluster port is disabled
#   AM_WEBHOOK_URL     where the rmqtrace receiver posts (default http://127.0.0.1:9095/rmqtrace-alerts;
#                      the shipped config names the Docker host's, for docker-compose.yml)
#   AM_START_TIMEOUT   seconds to wait for /-/ready (default 30)
#   AM_STATE_DIR       state dir (default <repo>/.cache/alertmanager): config, data, log, pid
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STATE="${AM_STATE_DIR:-$REPO/.cache/alertmanager}"
SHIPPED="$REPO/dashboards/prometheus/alertmanager.yml"
SHIPPED_URL="http://host.docker.internal:9095/rmqtrace-alerts"  # the receiver URL written in $SHIPPED
CONFIG="$STATE/alertmanager.yml"
DATA="$STATE/data"
LOG="$STATE/alertmanager.log"
PIDFILE="$STATE/alertmanager.pid"
PORT="${AM_PORT:-19093}"
URL="http://127.0.0.1:$PORT"
BIN=""

log() { echo "[alertmanager] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

DAEMON_NAME=alertmanager
# shellcheck source=../daemon.sh
source "$HERE/../daemon.sh"  # pid_alive, daemon_await_ready, daemon_stop

find_bin() {
    # Debian installs the daemon as prometheus-alertmanager; upstream tarballs call it alertmanager.
    BIN="$(command -v prometheus-alertmanager || command -v alertmanager || true)"
}


port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }
is_ready() { curl -fsS -m 2 "$URL/-/ready" >/dev/null 2>&1; }

cmd_install() {
    find_bin
    if [[ -n "$BIN" ]] && command -v amtool >/dev/null; then
        log "already installed: $("$BIN" --version 2>&1 | head -1)"
        return 0
    fi
    local SUDO=""
    [[ "$(id -u)" == 0 ]] || SUDO="sudo"
    # Never let the Debian package start its own (0.0.0.0:9093) service.
    local made_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-cache policy prometheus-alertmanager 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        $SUDO apt-get update -q || rc=$?
    fi
    if ! $SUDO apt-get install -y -q --no-install-recommends prometheus-alertmanager; then
        $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends prometheus-alertmanager || rc=$?
    fi
    [[ $made_policy == 1 ]] && $SUDO rm -f /usr/sbin/policy-rc.d
    [[ $rc == 0 ]] || die "apt-get failed (rc=$rc)"
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus-alertmanager 2>/dev/null; then
        $SUDO systemctl stop prometheus-alertmanager || true
    fi
    find_bin
    [[ -n "$BIN" ]] || die "alertmanager not found after install"
    log "installed: $("$BIN" --version 2>&1 | head -1)"
}

render() {
    mkdir -p "$STATE"
    local tmp="$CONFIG.tmp.$$" want="${AM_WEBHOOK_URL:-http://127.0.0.1:9095/rmqtrace-alerts}"
    grep -qF "$SHIPPED_URL" "$SHIPPED" || die "$SHIPPED no longer names $SHIPPED_URL"
    awk -v from="$SHIPPED_URL" -v to="$want" '
        { l = $0; i = index(l, from); if (i > 0) l = substr(l, 1, i - 1) to substr(l, i + length(from)); print l }' \
        "$SHIPPED" >"$tmp"
    if command -v amtool >/dev/null && ! amtool check-config "$tmp" >"$STATE/check.log" 2>&1; then
        cat "$STATE/check.log" >&2
        rm -f "$tmp"
        die "rendered config invalid"
    fi
    mv -f "$tmp" "$CONFIG"
}

cmd_start() {
    find_bin
    [[ -n "$BIN" ]] || { cmd_install; find_bin; }
    if pid_alive; then
        [[ "$(cat "$STATE/port" 2>/dev/null)" == "$PORT" ]] \
            || die "our alertmanager (pid $(cat "$PIDFILE")) runs on port $(cat "$STATE/port" 2>/dev/null), not $PORT; stop it first"
        local old=""
        [[ -f "$CONFIG" ]] && old="$(cat "$CONFIG")"
        render
        if [[ "$old" != "$(cat "$CONFIG")" ]]; then
            curl -fsS -m 10 -X POST "$URL/-/reload" >/dev/null || die "reload failed"
            log "reloaded ($URL)"
        fi
        log "already running pid=$(cat "$PIDFILE") $URL"
        return 0
    fi
    rm -f "$PIDFILE" "$STATE/port"
    port_busy && die "127.0.0.1:$PORT is already in use by another process (set AM_PORT)"
    render
    rm -rf "$DATA"
    mkdir -p "$DATA"
    : >"$LOG"
    echo "$PORT" >"$STATE/port"
    # --cluster.listen-address= : no gossip port (a single local instance).
    nohup setsid sh -c 'echo $$ >"$0"; exec "$@"' "$PIDFILE" \
        "$BIN" \
        --config.file="$CONFIG" \
        --storage.path="$DATA" \
        --web.listen-address="127.0.0.1:$PORT" \
        --cluster.listen-address= \
        >>"$LOG" 2>&1 </dev/null &
    daemon_await_ready "${AM_START_TIMEOUT:-30}" 30
    log "ready pid=$(cat "$PIDFILE") $URL (config $CONFIG)"
}

cmd_stop() { daemon_stop "$STATE/port"; }

cmd_status() {
    if pid_alive; then
        PORT="$(cat "$STATE/port" 2>/dev/null || echo "$PORT")"
        URL="http://127.0.0.1:$PORT"
        if is_ready; then echo "running pid=$(cat "$PIDFILE") url=$URL ready"; else echo "running pid=$(cat "$PIDFILE") url=$URL NOT ready"; fi
        return 0
    fi
    echo "stopped"
    return 3
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    render) render && cat "$CONFIG" ;;
    *) echo "usage: $0 install|start|stop|status|render" >&2; exit 2 ;;
esac

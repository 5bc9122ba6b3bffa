#!/usr/bin/env bash
# Local Prometheus for rmqtrace tests: install | start | stop | status | reload | render
#
# Env:
#   PROM_PORT            listen port on 127.0.0.1 (default 19090)
#   PROM_TARGETS         comma-separated scrape targets host:port (default 127.0.0.1:9464)
#   PROM_BROKER_TARGETS  comma-separated RocketMQ broker exporters host:port, scraped as job
#                        rocketmq-broker (default none; the local broker's is 127.0.0.1:5557)
#   PROM_ALERTMANAGERS   comma-separated Alertmanagers host:port to send alerts to (default none)
#   PROM_RULE_FILES      comma-separated rule files (relative paths are resolved against $PWD)
#   PROM_JOB             scrape job name (default rmqtrace)
#   PROM_SCRAPE_INTERVAL scrape interval (default 1s); PROM_EVAL_INTERVAL (default 1s)
#   PROM_START_TIMEOUT   seconds to wait for /-/ready (default 30)
#   PROM_WAIT_SCRAPE     1 (default): start/reload also wait until every configured target
#                        has been scraped once (up or down; takes ~5-6s, Prometheus' target
#                        discovery is throttled to 5s). 0 = return as soon as /-/ready.
#   PROM_KEEP_DATA=1     keep the TSDB between starts (default: fresh data dir per start)
#   PROM_EXTRA_ARGS      extra prometheus flags (word-split)
#   PROM_STATE_DIR       state dir (default <repo>/.cache/prometheus)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STATE="${PROM_STATE_DIR:-$REPO/.cache/prometheus}"
TEMPLATE="$HERE/prometheus.yml.tmpl"
CONFIG="$STATE/prometheus.yml"
DATA="$STATE/data"
LOG="$STATE/prometheus.log"
PIDFILE="$STATE/prometheus.pid"
PORT="${PROM_PORT:-19090}"
URL="http://127.0.0.1:$PORT"
# exemplar-storage: keep OpenMetrics exemplars (trace_id) -> /api/v1/query_exemplars
FEATURES="exemplar-storage"

log() { echo "[prom] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

DAEMON_NAME=prometheus
# shellcheck source=../daemon.sh
source "$HERE/../daemon.sh"  # pid_alive, daemon_await_ready, daemon_stop


port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

is_ready() { curl -fsS -m 2 "$URL/-/ready" >/dev/null 2>&1; }

# The running instance must be the one on $PORT (PROM_PORT may differ between calls).
check_port_matches() {
    local running
    running="$(cat "$STATE/port" 2>/dev/null || echo "?")"
    [[ "$running" == "$PORT" ]] \
        || die "our prometheus (pid $(cat "$PIDFILE")) runs on port $running, not $PORT; stop it first"
}

cmd_install() {
    if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
        log "already installed: $(prometheus --version 2>&1 | head -1)"
        return 0
    fi
    local SUDO=""
    [[ "$(id -u)" == 0 ]] || SUDO="sudo"
    # Never let the Debian package start its own (0.0.0.0:9090) service.
    local made_policy=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod 755 /usr/sbin/policy-rc.d
        made_policy=1
    fi
    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    # apt-get update only when the package index does not know the package (or install fails).
    if ! apt-cache policy prometheus 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        $SUDO apt-get update -q || rc=$?
    fi
    # --no-install-recommends: skips prometheus-node-exporter (another daemon on :9100).
    if ! $SUDO apt-get install -y -q --no-install-recommends prometheus; then
        $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends prometheus || rc=$?
    fi
    [[ $made_policy == 1 ]] && $SUDO rm -f /usr/sbin/policy-rc.d
    [[ $rc == 0 ]] || die "apt-get failed (rc=$rc)"
    # If a system service got started anyway, stop it (we run our own instance).
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
        $SUDO systemctl stop prometheus || true
    fi
    command -v prometheus >/dev/null && command -v promtool >/dev/null || die "prometheus/promtool not found after install"
    log "installed: $(prometheus --version 2>&1 | head -1)"
}

# "a,b , c" -> ["a", "b", "c"]   (optionally resolving paths to absolute)
yaml_list() {
    local csv="$1" resolve="${2:-0}" out="" item
    local IFS=','
    for item in $csv; do
        item="$(echo "$item" | sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//')"
        [[ -n "$item" ]] || continue
        if [[ "$resolve" == 1 ]]; then
            item="$(realpath -m -- "$item")"
        fi
        out+="${out:+, }\"${item//\"/\\\"}\""
    done
    echo "[$out]"
}

render() {
    mkdir -p "$STATE"
    local targets rules tmp brokers ams
    targets="$(yaml_list "${PROM_TARGETS:-127.0.0.1:9464}")"
    brokers="$(yaml_list "${PROM_BROKER_TARGETS:-}")"
    ams="$(yaml_list "${PROM_ALERTMANAGERS:-}")"
    rules="$(yaml_list "${PROM_RULE_FILES:-}" 1)"
    tmp="$CONFIG.tmp.$$"
    # awk instead of sed: values may contain '/', '&' ...
    awk -v si="${PROM_SCRAPE_INTERVAL:-1s}" -v ei="${PROM_EVAL_INTERVAL:-1s}" \
        -v job="${PROM_JOB:-rmqtrace}" -v tg="$targets" -v rf="$rules" -v bt="$brokers" -v am="$ams" '
        function rep(s, k, v,   i) {
            while ((i = index(s, k)) > 0) s = substr(s, 1, i - 1) v substr(s, i + length(k))
            return s
        }
        { l = $0
          l = rep(l, "@@SCRAPE_INTERVAL@@", si); l = rep(l, "@@EVAL_INTERVAL@@", ei)
          l = rep(l, "@@JOB@@", job); l = rep(l, "@@TARGETS@@", tg); l = rep(l, "@@RULE_FILES@@", rf)
          l = rep(l, "@@BROKER_TARGETS@@", bt); l = rep(l, "@@ALERTMANAGERS@@", am)
          print l }' "$TEMPLATE" >"$tmp"
    if ! promtool check config "$tmp" >"$STATE/check.log" 2>&1; then
        cat "$STATE/check.log" >&2
        rm -f "$tmp"
        die "rendered config invalid (targets=$targets rule_files=$rules)"
    fi
    mv -f "$tmp" "$CONFIG"
}

# Wait until /api/v1/targets lists exactly the configured targets, each scraped at least once.
wait_scraped() {
    [[ "${PROM_WAIT_SCRAPE:-1}" == 1 ]] || return 0
    local want deadline=$((SECONDS + ${PROM_START_TIMEOUT:-30}))
    want="$(yaml_list "${PROM_TARGETS:-127.0.0.1:9464}${PROM_BROKER_TARGETS:+,$PROM_BROKER_TARGETS}")"
    while ((SECONDS < deadline)); do
        if curl -fsS -m 2 "$URL/api/v1/targets?state=active" 2>/dev/null | python3 -c '
import json, sys
want = set(json.loads(sys.argv[1]))
ts = json.load(sys.stdin)["data"]["activeTargets"]
have = {t["discoveredLabels"].get("__address__") for t in ts}
ok = have == want and all(not t["lastScrape"].startswith("0001-") for t in ts)
sys.exit(0 if ok else 1)' "$want"; then
            log "targets scraped: $(curl -fsS -m 2 "$URL/api/v1/targets?state=active" | python3 -c '
import json, sys
print(" ".join("%s=%s" % (t["discoveredLabels"]["__address__"], t["health"]) for t in json.load(sys.stdin)["data"]["activeTargets"]))')"
            return 0
        fi
        sleep 0.5
    done
    log "WARNING: targets not all scraped within ${PROM_START_TIMEOUT:-30}s (see $URL/api/v1/targets)"
}

cmd_reload() {
    pid_alive || die "not running"
    check_port_matches
    render
    local code
    code="$(curl -sS -m 10 -o "$STATE/reload.out" -w '%{http_code}' -X POST "$URL/-/reload" || true)"
    [[ "$code" == 200 ]] || { cat "$STATE/reload.out" >&2 || true; die "reload failed (HTTP $code)"; }
    log "reloaded ($URL) targets=${PROM_TARGETS:-127.0.0.1:9464} rule_files=${PROM_RULE_FILES:-}"
    wait_scraped
}

check_port() {
    port_busy && die "127.0.0.1:$PORT is already in use by another process (\`ss -ltnp 'sport = :$PORT'\` names it):" \
        "stop it, or start this one elsewhere (PROM_PORT=<free port>)"
    return 0
}

cmd_start() {
    command -v prometheus >/dev/null || cmd_install
    if pid_alive; then
        check_port_matches
        # Already running: make it use the current env (targets/rules) and return.
        local old=""
        [[ -f "$CONFIG" ]] && old="$(cat "$CONFIG")"
        render
        if [[ "$old" != "$(cat "$CONFIG")" ]]; then
            cmd_reload
        fi
        log "already running pid=$(cat "$PIDFILE") $URL"
        return 0
    fi
    rm -f "$PIDFILE" "$STATE/port"
    check_port
    render
    if [[ "${PROM_KEEP_DATA:-0}" != 1 ]]; then rm -rf "$DATA"; fi
    mkdir -p "$DATA"
    : >"$LOG"
    echo "$PORT" >"$STATE/port"
    # shellcheck disable=SC2086
    nohup setsid sh -c 'echo $$ >"$0"; exec "$@"' "$PIDFILE" \
        prometheus \
        --config.file="$CONFIG" \
        --storage.tsdb.path="$DATA" \
        --web.listen-address="127.0.0.1:$PORT" \
        --web.enable-lifecycle \
        --enable-feature="$FEATURES" \
        ${PROM_EXTRA_ARGS:-} \
        >>"$LOG" 2>&1 </dev/null &
    daemon_await_ready "${PROM_START_TIMEOUT:-30}" 30
    log "ready pid=$(cat "$PIDFILE") $URL (config $CONFIG)"
    wait_scraped
}

cmd_stop() { daemon_stop "$STATE/port"; }

cmd_status() {
    if pid_alive; then
        PORT="$(cat "$STATE/port" 2>/dev/null || echo "$PORT")"
        URL="http://127.0.0.1:$PORT"
        if is_ready; then
            echo "running pid=$(cat "$PIDFILE") url=$URL ready"
        else
            echo "running pid=$(cat "$PIDFILE") url=$URL NOT ready"
        fi
        return 0
    fi
    echo "stopped"
    return 3
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    check-ports) if ! pid_alive; then check_port; fi ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    reload) cmd_reload ;;
    render) render && cat "$CONFIG" ;;
    *) echo "usage: $0 install|start|check-ports|stop|status|reload|render" >&2; exit 2 ;;
esac

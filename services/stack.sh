#!/usr/bin/env bash
# The rmqtrace stack on loopback, without Docker, for your own application: up | down | status
#
#   services/stack.sh up       RocketMQ (rmq.sh), Jaeger (jaeger.sh), Prometheus (prom.sh) scraping
#                              127.0.0.1:$RMQTRACE_METRICS_PORT and the broker's exporter 127.0.0.1:5557
#                              with every rule file dashboards/README.md documents (alerts, broker,
#                              fleet, probe); with STACK_ALERTMANAGER=1 also Alertmanager (am.sh),
#                              which Prometheus then sends its alerts to. Prints the URLs to open.
#   services/stack.sh status   one line per service; exit 0 all up, 3 all down, 1 partly up
#   services/stack.sh down     stop them (each even if another fails)
#   services/stack.sh urls     print again the URLs `up` printed (starts nothing)
#
# Env: RMQTRACE_METRICS_PORT (9464) — where your application serves /metrics;
#      PROM_RULE_FILES — comma-separated rule files instead of the four shipped ones (add your own
#      with PROM_RULE_FILES="$(services/stack.sh rules),my-rules.yml");
#      STACK_ALERTMANAGER=1 — Alertmanager on 127.0.0.1:$AM_PORT (19093), posting to $AM_WEBHOOK_URL;
#      STACK_SERVICES — the services to manage (default "rocketmq jaeger prometheus", plus
#      alertmanager with STACK_ALERTMANAGER=1);
#      PROM_PORT (19090), PROM_SCRAPE_INTERVAL / PROM_EVAL_INTERVAL (5s),
#      PROM_STATE_DIR (<repo>/.cache/stack/prometheus: apart from the instances tests start),
#      AM_STATE_DIR (<repo>/.cache/stack/alertmanager);
#      the other RMQ_* / JAEGER_* / PROM_* / AM_* variables of the scripts pass through.
# `make stack` / `make stack-down` call this. The same stack in containers: dashboards/docker-compose.yml.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
RULES=""
for f in rmqtrace-alerts rmqtrace-broker rmqtrace-fleet rmqtrace-probe; do
    RULES+="${RULES:+,}$REPO/dashboards/prometheus/$f.yml"
done
BROKER_METRICS="127.0.0.1:5557"  # metricsPromExporterPort in services/rocketmq/conf/broker.conf
METRICS_PORT="${RMQTRACE_METRICS_PORT:-9464}"
DEFAULT_SERVICES="rocketmq jaeger prometheus"
[[ "${STACK_ALERTMANAGER:-0}" == 1 ]] && DEFAULT_SERVICES+=" alertmanager"
SERVICES="${STACK_SERVICES:-$DEFAULT_SERVICES}"

export PROM_PORT="${PROM_PORT:-19090}"
export PROM_STATE_DIR="${PROM_STATE_DIR:-$REPO/.cache/stack/prometheus}"
export PROM_TARGETS="127.0.0.1:$METRICS_PORT"
export PROM_BROKER_TARGETS="${PROM_BROKER_TARGETS-$BROKER_METRICS}"
export PROM_RULE_FILES="${PROM_RULE_FILES:-$RULES}"
export PROM_SCRAPE_INTERVAL="${PROM_SCRAPE_INTERVAL:-5s}"
export PROM_EVAL_INTERVAL="${PROM_EVAL_INTERVAL:-5s}"
export PROM_WAIT_SCRAPE=0  # the application may not be running yet
export AM_PORT="${AM_PORT:-19093}"
# jaeger.sh's defaults, here too: the URLs printed below are the ones it listens on
export JAEGER_QUERY_PORT="${JAEGER_QUERY_PORT:-16686}"
export JAEGER_OTLP_HTTP_PORT="${JAEGER_OTLP_HTTP_PORT:-4318}"
export JAEGER_OTLP_GRPC_PORT="${JAEGER_OTLP_GRPC_PORT:-4317}"
export AM_STATE_DIR="${AM_STATE_DIR:-$REPO/.cache/stack/alertmanager}"
if [[ " $SERVICES " == *" alertmanager "* ]]; then
    export PROM_ALERTMANAGERS="${PROM_ALERTMANAGERS:-127.0.0.1:$AM_PORT}"
fi

RMQ="$HERE/rocketmq/rmq.sh"
JAEGER="$HERE/jaeger/jaeger.sh"
PROM="$HERE/prometheus/prom.sh"
AM="$HERE/alertmanager/am.sh"

log() { echo "[stack] $*" >&2; }
has() { [[ " $SERVICES " == *" $1 "* ]]; }

# The page that answers on this Prometheus: Debian's 2.42 ships only the classic UI (/alerts is a 404).
prom_page() {
    local page="$1" base="http://127.0.0.1:$PROM_PORT"
    if [[ "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$base/$page")" == 200 ]]; then
        echo "$base/$page"
    else
        echo "$base/classic/$page"
    fi
}

cmd_up() {
    # every port first: a taken Jaeger port found after RocketMQ started (or after a 12-minute
    # build) wastes the wait; each script's line names the port and what to do
    if has rocketmq; then bash "$RMQ" check-ports; fi
    if has jaeger; then bash "$JAEGER" check-ports; fi
    if has prometheus; then bash "$PROM" check-ports; fi
    if has rocketmq; then
        log "starting RocketMQ (name server + proxy/broker; first run resolves jars from Maven Central)"
        bash "$RMQ" start
    fi
    if has jaeger; then
        log "starting Jaeger (first run builds it with Go: minutes)"
        bash "$JAEGER" start
    fi
    if has alertmanager; then
        log "starting Alertmanager on 127.0.0.1:$AM_PORT"
        bash "$AM" start
    fi
    if has prometheus; then
        log "starting Prometheus on 127.0.0.1:$PROM_PORT, scraping $PROM_TARGETS${PROM_BROKER_TARGETS:+ and the broker exporter $PROM_BROKER_TARGETS}"
        bash "$PROM" start
    fi
    echo
    echo "rmqtrace stack is up:"
    cmd_urls
}

# What to open and how to point an application at the stack (also `stack.sh urls`, after `up`).
cmd_urls() {
    if has rocketmq; then
        echo "  RocketMQ     gRPC proxy 127.0.0.1:8081, name server 127.0.0.1:9876 (topic rmqtrace-test exists)"
        echo "               broker metrics http://$BROKER_METRICS/metrics (scraped as job rocketmq-broker)"
    fi
    if has jaeger; then
        echo "  Jaeger       query API http://127.0.0.1:$JAEGER_QUERY_PORT/api/services"
        echo "               OTLP 127.0.0.1:$JAEGER_OTLP_HTTP_PORT (HTTP), 127.0.0.1:$JAEGER_OTLP_GRPC_PORT (gRPC)"
    fi
    if has prometheus; then
        echo "  Prometheus   alerts $(prom_page alerts)"
        echo "               rules  $(prom_page rules)"
        echo "               rule files: ${PROM_RULE_FILES//,/ }"
    fi
    if has alertmanager; then
        echo "  Alertmanager http://127.0.0.1:$AM_PORT/ (receives Prometheus' alerts; webhook ${AM_WEBHOOK_URL:-http://127.0.0.1:9095/rmqtrace-alerts})"
    fi
    cat <<TXT

Run your application with:
  export RMQTRACE_METRICS_PORT=$METRICS_PORT OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$JAEGER_OTLP_HTTP_PORT RMQ_ENDPOINT=127.0.0.1:8081
Import dashboards/grafana/rmqtrace-dashboard.json into your Grafana (see dashboards/README.md).
Stop with: services/stack.sh down   (or make stack-down)
TXT
}

cmd_down() {
    local rc=0
    has prometheus && { bash "$PROM" stop || rc=1; }
    has alertmanager && { bash "$AM" stop || rc=1; }
    has jaeger && { bash "$JAEGER" stop || rc=1; }
    has rocketmq && { bash "$RMQ" stop || rc=1; }
    return $rc
}

cmd_status() {
    local up=0 total=0 line svc
    local -a all=()
    has rocketmq && all+=("RocketMQ:$RMQ")
    has jaeger && all+=("Jaeger:$JAEGER")
    has prometheus && all+=("Prometheus:$PROM")
    has alertmanager && all+=("Alertmanager:$AM")
    total=${#all[@]}
    for svc in "${all[@]}"; do
        if line="$(bash "${svc#*:}" status 2>&1)"; then
            up=$((up + 1))
        fi
        echo "${svc%%:*}:"
        echo "$line" | sed 's/^/  /'
    done
    if has prometheus && bash "$PROM" status >/dev/null 2>&1; then
        curl -fsS -m 2 "http://127.0.0.1:$PROM_PORT/api/v1/targets?state=active" 2>/dev/null | python3 -c '
import json, sys
for t in json.load(sys.stdin)["data"]["activeTargets"]:
    print("  scrape %s: %s %s" % (t["scrapeUrl"], t["health"], t["lastError"]))' || true
    fi
    [[ $up == "$total" ]] && return 0
    [[ $up == 0 ]] && return 3
    return 1
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    rules) echo "$RULES" ;;
    urls) cmd_urls ;;
    *) echo "usage: $0 up|down|status|urls|rules" >&2; exit 2 ;;
esac

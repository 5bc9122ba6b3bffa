#!/usr/bin/env bash
# The rmqtrace stack on loopback, without Docker, for your own application: up | down | status
#
#   services/stack.sh up       RocketMQ (rmq.sh), Jaeger (jaeger.sh), Prometheus (prom.sh) scraping
#                              127.0.0.1:$RMQTRACE_METRICS_PORT and the broker's exporter 127.0.0.1:5557
#                              with dashboards/prometheus/rmqtrace-alerts.yml and rmqtrace-broker.yml
#   services/stack.sh status   one line per service; exit 0 all up, 3 all down, 1 partly up
#   services/stack.sh down     stop all three (each even if another fails)
#
# Env: RMQTRACE_METRICS_PORT (9464) — where your application serves /metrics;
#      PROM_PORT (19090), PROM_SCRAPE_INTERVAL / PROM_EVAL_INTERVAL (5s),
#      PROM_STATE_DIR (<repo>/.cache/stack/prometheus: apart from the instances tests start);
#      the other RMQ_* / JAEGER_* / PROM_* variables of the three scripts pass through.
# `make stack` / `make stack-down` call this. The same stack in containers: dashboards/docker-compose.yml.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
RULES="$REPO/dashboards/prometheus/rmqtrace-alerts.yml,$REPO/dashboards/prometheus/rmqtrace-broker.yml"
BROKER_METRICS="127.0.0.1:5557"  # metricsPromExporterPort in services/rocketmq/conf/broker.conf
METRICS_PORT="${RMQTRACE_METRICS_PORT:-9464}"

export PROM_PORT="${PROM_PORT:-19090}"
export PROM_STATE_DIR="${PROM_STATE_DIR:-$REPO/.cache/stack/prometheus}"
export PROM_TARGETS="127.0.0.1:$METRICS_PORT"
export PROM_BROKER_TARGETS="$BROKER_METRICS"
export PROM_RULE_FILES="$RULES"
export PROM_SCRAPE_INTERVAL="${PROM_SCRAPE_INTERVAL:-5s}"
export PROM_EVAL_INTERVAL="${PROM_EVAL_INTERVAL:-5s}"
export PROM_WAIT_SCRAPE=0  # the application may not be running yet

RMQ="$HERE/rocketmq/rmq.sh"
JAEGER="$HERE/jaeger/jaeger.sh"
PROM="$HERE/prometheus/prom.sh"

log() { echo "[stack] $*" >&2; }

cmd_up() {
    # every port first: a taken Jaeger port found after RocketMQ started (or after a 12-minute
    # build) wastes the wait; each script's line names the port and what to do
    local script
    for script in "$RMQ" "$JAEGER" "$PROM"; do
        bash "$script" check-ports
    done
    log "starting RocketMQ (name server + proxy/broker; first run resolves jars from Maven Central)"
    bash "$RMQ" start
    log "starting Jaeger (first run builds it with Go: minutes)"
    bash "$JAEGER" start
    log "starting Prometheus on 127.0.0.1:$PROM_PORT, scraping $PROM_TARGETS and the broker's $BROKER_METRICS"
    bash "$PROM" start
    cat <<TXT

rmqtrace stack is up:
  RocketMQ   gRPC proxy 127.0.0.1:8081, name server 127.0.0.1:9876 (topic rmqtrace-test exists),
             broker metrics http://$BROKER_METRICS/metrics (scraped as job rocketmq-broker)
  Jaeger     OTLP http://127.0.0.1:4318 (gRPC :4317), query API http://127.0.0.1:16686/api/services
  Prometheus http://127.0.0.1:$PROM_PORT  (alerts: /alerts, rules: ${RULES//,/ })

Run your application with:
  export RMQTRACE_METRICS_PORT=$METRICS_PORT OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 RMQ_ENDPOINT=127.0.0.1:8081
Import dashboards/grafana/rmqtrace-dashboard.json into your Grafana (see dashboards/README.md).
Stop with: services/stack.sh down   (or make stack-down)
TXT
}

cmd_down() {
    local rc=0
    bash "$PROM" stop || rc=1
    bash "$JAEGER" stop || rc=1
    bash "$RMQ" stop || rc=1
    return $rc
}

cmd_status() {
    local up=0 total=3 line
    for svc in "RocketMQ:$RMQ" "Jaeger:$JAEGER" "Prometheus:$PROM"; do
        if line="$(bash "${svc#*:}" status 2>&1)"; then
            up=$((up + 1))
        fi
        echo "${svc%%:*}:"
        echo "$line" | sed 's/^/  /'
    done
    if [[ $up -gt 0 ]] && bash "$PROM" status >/dev/null 2>&1; then
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
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac

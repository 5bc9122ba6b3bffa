#!/usr/bin/env bash
# Local Jaeger v2 (v1.76.0, built from the Go module pinned in go.mod/go.sum):
#   build | start | check-ports | stop | status | logs
#
# Env (all optional):
#   JAEGER_OTLP_GRPC_PORT (4317)  JAEGER_OTLP_HTTP_PORT (4318)
#   JAEGER_QUERY_PORT (16686)     JAEGER_QUERY_GRPC_PORT (16685)
#   JAEGER_PROM_EXPORTER_PORT (8889: OTLP metrics re-exposed for Prometheus)
#   JAEGER_MAX_TRACES (100000)    JAEGER_LOG_LEVEL (info)
#   JAEGER_START_TIMEOUT (60 s; a needed build is not counted)
#   JAEGER_CONFIG (default services/jaeger/jaeger-config.yaml)
#   JAEGER_BIN (default <repo>/.cache/bin/jaeger)  JAEGER_STATE_DIR (default <repo>/.cache/jaeger)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STATE="${JAEGER_STATE_DIR:-$REPO/.cache/jaeger}"
BIN="${JAEGER_BIN:-$REPO/.cache/bin/jaeger}"
CONFIG="${JAEGER_CONFIG:-$HERE/jaeger-config.yaml}"
LOG="$STATE/jaeger.log"
PIDFILE="$STATE/jaeger.pid"
STAMP="$BIN.stamp"   # next to the binary: shared by all state dirs
PKG="github.com/jaegertracing/jaeger/cmd/jaeger"

export JAEGER_OTLP_GRPC_PORT="${JAEGER_OTLP_GRPC_PORT:-4317}"
export JAEGER_OTLP_HTTP_PORT="${JAEGER_OTLP_HTTP_PORT:-4318}"
export JAEGER_QUERY_PORT="${JAEGER_QUERY_PORT:-16686}"
export JAEGER_QUERY_GRPC_PORT="${JAEGER_QUERY_GRPC_PORT:-16685}"
export JAEGER_PROM_EXPORTER_PORT="${JAEGER_PROM_EXPORTER_PORT:-8889}"
QUERY_URL="http://127.0.0.1:$JAEGER_QUERY_PORT"

log() { echo "[jaeger] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

DAEMON_NAME=jaeger
# shellcheck source=../daemon.sh
source "$HERE/../daemon.sh"  # pid_alive, daemon_await_ready, daemon_stop

# Build identity: go.mod + go.sum (the pinned module graph) + Go toolchain version.
build_hash() {
    { cat "$HERE/go.mod" "$HERE/go.sum"; go version; } | sha256sum | cut -d' ' -f1
}

cmd_build() {
    command -v go >/dev/null || die "go not found in PATH"
    mkdir -p "$STATE" "$(dirname "$BIN")"
    local want
    want="$(build_hash)"
    if [[ -x "$BIN" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
        log "up to date: $BIN"
        return 0
    fi
    log "building $PKG -> $BIN (cold build takes minutes; GOCACHE/GOMODCACHE make rebuilds cheap)"
    local t0=$SECONDS tmp="$BIN.tmp.$$"
    # Module version pinned in go.mod, stamped into `jaeger version` / the startup log.
    local ver
    ver="$(cd "$HERE" && go list -m -f '{{.Version}}' github.com/jaegertracing/jaeger)"
    # -buildvcs=false: the module dir is inside the project's git work tree
    if ! (cd "$HERE" && go build -buildvcs=false \
        -ldflags "-X github.com/jaegertracing/jaeger/internal/version.latestVersion=$ver" \
        -o "$tmp" "$PKG") >"$STATE/build.log" 2>&1; then
        rm -f "$tmp"
        tail -n 40 "$STATE/build.log" >&2
        die "go build failed (full log: $STATE/build.log)"
    fi
    mv -f "$tmp" "$BIN"
    echo "$want" >"$STAMP"
    log "built in $((SECONDS - t0))s: $BIN"
}


port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

is_ready() {
    local p
    curl -fsS -m 2 -o /dev/null "$QUERY_URL/api/services" 2>/dev/null || return 1
    for p in "$JAEGER_OTLP_GRPC_PORT" "$JAEGER_OTLP_HTTP_PORT"; do
        port_open "$p" || return 1
    done
}

# Each port with the variable that moves it, so the error can say what to do.
PORT_VARS=(JAEGER_QUERY_PORT JAEGER_QUERY_GRPC_PORT JAEGER_OTLP_GRPC_PORT JAEGER_OTLP_HTTP_PORT JAEGER_PROM_EXPORTER_PORT)
check_ports() {
    local var p
    for var in "${PORT_VARS[@]}"; do
        p="${!var}"
        if port_open "$p"; then
            die "127.0.0.1:$p ($var) is already in use by another process (\`ss -ltnp 'sport = :$p'\` names it):" \
                "stop it, or start this one elsewhere ($var=<free port>), or, if it is a Jaeger or OTLP collector" \
                "you run, skip this one and point the app at it (OTEL_EXPORTER_OTLP_ENDPOINT)"
        fi
    done
}

cmd_start() {
    if pid_alive; then
        if is_ready; then
            log "already running pid=$(cat "$PIDFILE") query=$QUERY_URL"
            return 0
        fi
        die "pid $(cat "$PIDFILE") is running but not ready on $QUERY_URL (other ports? try: $0 stop)"
    fi
    rm -f "$PIDFILE"
    check_ports  # before the build: a cold one takes minutes, and would end in this error anyway
    cmd_build
    : >"$LOG"
    echo "$JAEGER_QUERY_PORT" >"$STATE/query_port"
    nohup setsid sh -c 'echo $$ >"$0"; exec "$@"' "$PIDFILE" \
        "$BIN" --config="$CONFIG" >>"$LOG" 2>&1 </dev/null &
    daemon_await_ready "${JAEGER_START_TIMEOUT:-60}" 40
    log "ready pid=$(cat "$PIDFILE") query=$QUERY_URL otlp-grpc=127.0.0.1:$JAEGER_OTLP_GRPC_PORT otlp-http=127.0.0.1:$JAEGER_OTLP_HTTP_PORT"
}

cmd_stop() { daemon_stop; }

cmd_status() {
    if pid_alive; then
        QUERY_URL="http://127.0.0.1:$(cat "$STATE/query_port" 2>/dev/null || echo "$JAEGER_QUERY_PORT")"
        if is_ready; then
            echo "running pid=$(cat "$PIDFILE") query=$QUERY_URL ready"
        else
            echo "running pid=$(cat "$PIDFILE") query=$QUERY_URL NOT ready"
        fi
        return 0
    fi
    echo "stopped"
    return 3
}

case "${1:-}" in
    build) cmd_build ;;
    start) cmd_start ;;
    check-ports) if ! pid_alive; then check_ports; fi ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    logs) tail -n "${2:-50}" "$LOG" ;;
    *) echo "usage: $0 build|start|check-ports|stop|status|logs [N]" >&2; exit 2 ;;
esac

# Shared by the service scripts (prom.sh, am.sh, jaeger.sh): a daemon started in the background
# with its pid in $PIDFILE. Source it after defining log() and is_ready(), and setting PIDFILE,
# LOG and DAEMON_NAME (a word of the daemon's command line: a stale pid file whose pid now
# belongs to another program must not be taken for ours).

pid_alive() {
    local pid
    [[ -f "$PIDFILE" ]] || return 1
    pid="$(cat "$PIDFILE" 2>/dev/null)" || return 1
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null \
        && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$DAEMON_NAME"
}

# daemon_await_ready SECONDS [TAIL_LINES]: return once is_ready holds; if the daemon exits or the
# time runs out, show the end of its log, stop it and exit 1.
daemon_await_ready() {
    local deadline=$((SECONDS + $1)) lines="${2:-30}"
    while ((SECONDS < deadline)); do
        if pid_alive && is_ready; then return 0; fi
        if [[ -f "$PIDFILE" ]] && ! pid_alive; then
            log "process exited"
            break
        fi
        sleep 0.3  # real-time: polling a daemon's readiness
    done
    log "failed to become ready; last log lines ($LOG):"
    tail -n "$lines" "$LOG" >&2 || true
    daemon_stop || true
    exit 1
}

# daemon_stop [FILE...]: SIGTERM, SIGKILL after 10 s; removes the pid file and the FILEs.
daemon_stop() {
    if ! pid_alive; then
        rm -f "$PIDFILE"
        log "not running"
        return 0
    fi
    local pid i
    pid="$(cat "$PIDFILE")"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1  # real-time: waiting for the daemon to exit
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "pid $pid did not exit after SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$PIDFILE" "$@"
    log "stopped pid=$pid"
}

#!/usr/bin/env bash
# Local Apache RocketMQ 5.x on loopback for rmqtrace's tests: name server + proxy in local mode
# (broker inside the proxy JVM). No Docker, no distribution tarball: jars come from Maven Central.
#
#   rmq.sh start                 start name server + proxy/broker (idempotent), create default topics
#   rmq.sh stop [kill]           stop everything started from this run dir (TERM, KILL after
#                                RMQ_STOP_TIMEOUT; ~13 s); `kill`: SIGKILL at once
#   rmq.sh status                show pids/ports; exit 0 if all up, 3 if all down, 1 if partly up
#   rmq.sh check-ports           exit 1 with the next step if a port start needs is taken (make stack)
#   rmq.sh topic NAME... [fifo|priority] [--queues N]
#                                create/update topics (default 4 queues); `fifo` makes every named
#                                topic FIFO, NAME:fifo marks a single one; `priority` makes them
#                                PRIORITY topics (RocketMQ 5.5: one queue per level). Uses rmq_admin.py (python3,
#                                ~25 ms per topic); RMQ_ADMIN=java uses the JVM helper (~2.5 s/call)
#   rmq.sh group NAME... [fifo]  create/update consumer groups (RocketMQ 5.5's proxy rejects consumers
#                                of unknown groups: "group not found"); `fifo` = consumeMessageOrderly
#                                =true, required for FIFO (ordered) delivery to gRPC consumers
#   rmq.sh restart-proxy         stop + start only the proxy/broker JVM, keeping the store
#   rmq.sh stop-proxy [kill]     stop only the proxy/broker (graceful TERM, or SIGKILL with `kill`)
#   rmq.sh start-proxy           start the proxy/broker again (name server must be up)
#   rmq.sh logs [N]              tail the logs
#   rmq.sh clean                 stop, then delete the run dir (store, logs)
#   rmq.sh lib                   only resolve the jars (cache)
#
# Environment: RMQ_RUN_DIR (default <repo>/.cache/rocketmq/run), RMQ_LIB_DIR (default
# <repo>/.cache/rocketmq/lib), RMQ_JAVA (java binary, default: a JDK 17), RMQ_VERSION (force a
# RocketMQ version), RMQ_START_TIMEOUT (seconds, default 180), RMQ_STOP_TIMEOUT (default 30),
# RMQ_PROXY_JVM_OPTS / RMQ_NAMESRV_JVM_OPTS (extra JVM flags), RMQ_ADMIN=java (see topic/group).
# Ports (fixed, see conf/), all on 127.0.0.1: name server 9876, broker 10911 (+10909 vip, 10912 HA),
# broker metrics 5557 (Prometheus /metrics), proxy gRPC 8081, proxy remoting 8080. The JVMs run with
# loopback_bind.c preloaded (built here with cc): RocketMQ has no bind-address setting for the proxy's
# two servers or the HA port (README.md); RMQ_ALLOW_WILDCARD_BIND=1 starts without it when no C
# compiler exists (those three then listen on all interfaces).
# One instance per machine; the pid files decide what `stop` may kill.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# resolved: a worktree whose .cache is a symlink controls the same instance (live_pid compares paths)
CACHE="$(realpath -m "$REPO/.cache")/rocketmq"
LIB="${RMQ_LIB_DIR:-$CACHE/lib}"
RUN="${RMQ_RUN_DIR:-$CACHE/run}"
CLASSES="$CACHE/classes"
CONF="$HERE/conf"
START_TIMEOUT="${RMQ_START_TIMEOUT:-180}"
STOP_TIMEOUT="${RMQ_STOP_TIMEOUT:-30}"
# Versions tried in order when resolving the jars (5.5.1 and 5.3.4 are not on Maven Central for
# rocketmq-proxy/-tools; 5.5.0 is).
VERSIONS="${RMQ_VERSION:-5.5.0 5.4.0 5.3.3}"

NAMESRV_ADDR=127.0.0.1:9876
CLUSTER=DefaultCluster
NAMESRV_PORT=9876
BROKER_PORT=10911
GRPC_PORT=8081
REMOTING_PORT=8080
METRICS_PORT=5557  # metricsPromExporterPort in conf/broker.conf
SHIM_SRC="$HERE/loopback_bind.c"
SHIM="$CACHE/loopback_bind.so"
DEFAULT_TOPIC=rmqtrace-test
DEFAULT_FIFO_TOPIC=rmqtrace-fifo
DEFAULT_FIFO_GROUP=rmqtrace-fifo-group

log() { echo "rmq.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- java / jars
java_major() { "$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\)[."].*/\1/p' | head -1; }

find_java() {
    if [[ -n "${RMQ_JAVA:-}" ]]; then echo "$RMQ_JAVA"; return; fi
    local c m
    for c in /usr/lib/jvm/java-17-openjdk-*/bin/java /usr/lib/jvm/*17*/bin/java \
             "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)"; do
        [[ -n "$c" && -x "$c" ]] || continue
        m="$(java_major "$c")"
        # RocketMQ 5.x runs on 8..21; 17 is what is tested here (25 is not supported).
        if [[ -n "$m" && "$m" -ge 11 && "$m" -le 21 ]]; then echo "$c"; return; fi
    done
    die "no JDK 11..21 found (install openjdk-17-jdk-headless or set RMQ_JAVA)"
}

# hash of the pom without its comments (editing a comment must not trigger a re-download)
pom_sum() { sed '/<!--/,/-->/d' "$HERE/pom.xml" | sha256sum | cut -c1-16; }

lib_ok() {
    [[ -f "$LIB/.complete" ]] || return 1
    grep -q "pom=$(pom_sum)" "$LIB/.complete" || return 1
    compgen -G "$LIB/rocketmq-proxy-*.jar" >/dev/null && compgen -G "$LIB/rocketmq-namesrv-*.jar" >/dev/null \
        && compgen -G "$LIB/rocketmq-tools-*.jar" >/dev/null
}

ensure_lib() {
    lib_ok && return 0
    if compgen -G "$LIB/rocketmq-proxy-*.jar" >/dev/null && { live_pid proxy >/dev/null || live_pid namesrv >/dev/null; }; then
        log "WARNING: $LIB is stale (pom.xml changed) but in use by running JVMs; keeping it until 'rmq.sh stop'"
        return 0
    fi
    command -v mvn >/dev/null || die "maven (mvn) not found: apt-get install -y maven"
    local v tmp="$LIB.tmp.$$" t0=$SECONDS
    mkdir -p "$(dirname "$LIB")"
    for v in $VERSIONS; do
        log "resolving RocketMQ $v jars with maven into $LIB (first time only, ~1-2 min) ..."
        rm -rf "$tmp"
        if mvn -B -q -f "$HERE/pom.xml" -Drmq.version="$v" dependency:copy-dependencies \
               -DoutputDirectory="$tmp" -DincludeScope=runtime >"$CACHE/mvn.log" 2>&1; then
            rm -rf "$LIB"
            mv "$tmp" "$LIB"
            echo "version=$v pom=$(pom_sum)" >"$LIB/.complete"
            rm -rf "$CLASSES"
            log "jars ready: RocketMQ $v, $(ls "$LIB" | wc -l) files, $((SECONDS - t0)) s"
            return 0
        fi
        log "RocketMQ $v did not resolve (see $CACHE/mvn.log)"
    done
    rm -rf "$tmp"
    tail -20 "$CACHE/mvn.log" >&2 || true
    die "could not resolve the RocketMQ jars"
}

# compile the admin helper (one JVM for many topic/group operations) if javac is there
ensure_admin() {
    local src="$HERE/RmqAdmin.java"
    if [[ -f "$CLASSES/RmqAdmin.class" && "$CLASSES/RmqAdmin.class" -nt "$src" ]]; then return 0; fi
    local javac
    javac="$(dirname "$(readlink -f "$JAVA")")/javac"
    [[ -x "$javac" ]] || return 1
    mkdir -p "$CLASSES.tmp.$$"
    if "$javac" -nowarn -d "$CLASSES.tmp.$$" -cp "$LIB/*" "$src" >"$CACHE/javac.log" 2>&1; then
        rm -rf "$CLASSES"
        mv "$CLASSES.tmp.$$" "$CLASSES"
        return 0
    fi
    rm -rf "$CLASSES.tmp.$$"
    log "WARNING: could not compile RmqAdmin.java (see $CACHE/javac.log); using MQAdminStartup"
    return 1
}

jvm_common() {
    # TLS disabled: otherwise every server generates a self-signed certificate at boot
    # (RSA + BouncyCastle, ~6 s per JVM here). Clients connect in plain text.
    echo "-Drocketmq.home.dir=$RUN -Duser.home=$RUN/home" \
        "-Drmq.logback.configurationFile=$RUN/conf/logback.xml" \
        "-Dtls.server.mode=disabled -Djava.net.preferIPv4Stack=true" \
        "-XX:-OmitStackTraceInFastThrow" \
        "--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED" \
        "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED"
}

# Build the bind() shim (see loopback_bind.c) once; it is rebuilt when the source is newer.
ensure_shim() {
    if [[ -s "$SHIM" && "$SHIM" -nt "$SHIM_SRC" ]]; then return 0; fi
    local cc
    cc="$(command -v cc || command -v gcc || command -v clang || true)"
    if [[ -z "$cc" ]]; then
        if [[ "${RMQ_ALLOW_WILDCARD_BIND:-0}" == 1 ]]; then
            log "WARNING: no C compiler: the proxy's gRPC/remoting ports and the HA port will listen on all interfaces"
            SHIM=""
            return 0
        fi
        die "no C compiler (cc) to build loopback_bind.so, which keeps the proxy's and HA ports on loopback: apt-get install -y gcc (or RMQ_ALLOW_WILDCARD_BIND=1)"
    fi
    mkdir -p "$CACHE"
    "$cc" -shared -fPIC -O2 -o "$SHIM.tmp.$$" "$SHIM_SRC" -ldl >"$CACHE/cc.log" 2>&1 \
        || { cat "$CACHE/cc.log" >&2; die "could not build $SHIM"; }
    mv -f "$SHIM.tmp.$$" "$SHIM"
}

# ---------------------------------------------------------------- processes
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pid of component $1 if it is alive AND is our JVM (guards against recycled pids)
live_pid() {
    local f="$RUN/$1.pid" pid
    [[ -f "$f" ]] || return 1
    pid="$(cat "$f")"
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-Drocketmq.home.dir=$RUN " || return 1
    echo "$pid"
}

# During start-up the pid file names the launcher shell until it execs java, so live_pid (which
# looks for the JVM's command line) can miss a JVM that is still starting: only a gone pid fails.
started_pid() {
    local f="$RUN/$1.pid" pid
    [[ -s "$f" ]] || return 1
    pid="$(cat "$f")"
    [[ -n "$pid" && -d "/proc/$pid" ]]
}

launch() { # name main-class jvm-opts... -- args...
    local name="$1" main="$2"; shift 2
    local opts=() args=()
    while [[ $# -gt 0 && "$1" != "--" ]]; do opts+=("$1"); shift; done
    [[ $# -gt 0 ]] && shift
    args=("$@")
    mkdir -p "$RUN/logs"
    echo "===== $(date '+%F %T.%3N') starting $name" >>"$RUN/logs/$name.log"
    # A pid file left by a JVM that died (a killed session) must not pass for the new one: the wait
    # below and started_pid would read the dead pid before the new shell writes its own.
    rm -f "$RUN/$name.pid"
    # setsid: own session/process group, detached from the caller's terminal and job control.
    # The inner shell records its own pid and then execs java, so the pid file is the JVM's pid.
    # The JVM (only) gets the loopback bind() shim preloaded.
    local preload=()
    [[ -n "$SHIM" ]] && preload=(env "LD_PRELOAD=$SHIM${LD_PRELOAD:+:$LD_PRELOAD}")
    # shellcheck disable=SC2046
    setsid bash -c 'echo $$ >"$0"; exec "$@"' "$RUN/$name.pid" \
        "${preload[@]}" "$JAVA" "${opts[@]}" $(jvm_common) -cp "$LIB/*" "$main" "${args[@]}" \
        >>"$RUN/logs/$name.log" 2>&1 </dev/null 9>&- &
    disown 2>/dev/null || true
    local i
    for i in $(seq 500); do [[ -s "$RUN/$name.pid" ]] && break; sleep 0.02; done
}

fail_start() { # name message
    log "ERROR: $2"
    log "---- last lines of $RUN/logs/$1.log"
    tail -n 40 "$RUN/logs/$1.log" >&2 || true
    exit 1
}

wait_ports() { # name deadline(SECONDS) ports...
    local name="$1" deadline="$2"; shift 2
    local p
    for p in "$@"; do
        until port_open "$p"; do
            started_pid "$name" || fail_start "$name" "$name exited before port $p opened"
            ((SECONDS < deadline)) || fail_start "$name" "$name: port $p not open after ${START_TIMEOUT}s"
            sleep 0.1
        done
    done
}

prepare_run_dir() {
    mkdir -p "$RUN/home" "$RUN/logs" "$RUN/store" "$RUN/conf/tls"
    sed "s#STORE_DIR#$RUN/store#g" "$CONF/broker.conf" >"$RUN/conf/broker.conf"
    cp "$CONF/namesrv.conf" "$CONF/logback.xml" "$RUN/conf/"
    # The proxy's gRPC server always builds a TLS context (TLS_PERMISSIVE accepts plain text too).
    # In its "test mode" it generates a self-signed certificate with BouncyCastle at every start
    # (~5 s here); a certificate made once with openssl is loaded in a few ms instead.
    local tls="$RUN/conf/tls"
    if [[ ! -s "$tls/rocketmq.key" || ! -s "$tls/rocketmq.crt" ]] && command -v openssl >/dev/null; then
        openssl req -x509 -newkey rsa:2048 -nodes -keyout "$tls/rocketmq.key" -out "$tls/rocketmq.crt" \
            -days 36500 -subj /CN=localhost >/dev/null 2>&1 || rm -f "$tls/rocketmq.key" "$tls/rocketmq.crt"
    fi
    if [[ -s "$tls/rocketmq.key" && -s "$tls/rocketmq.crt" ]]; then
        sed "s#TLS_DIR#$tls#g" "$CONF/rmq-proxy.json" >"$RUN/conf/rmq-proxy.json"
    else
        sed -e "s#TLS_DIR#$tls#g" -e 's#"tlsTestModeEnable": false#"tlsTestModeEnable": true#' \
            "$CONF/rmq-proxy.json" >"$RUN/conf/rmq-proxy.json"
    fi
}

start_namesrv() {
    local deadline=$((SECONDS + START_TIMEOUT))
    if live_pid namesrv >/dev/null; then return 0; fi
    port_open $NAMESRV_PORT && die "$(port_taken $NAMESRV_PORT)"
    launch namesrv org.apache.rocketmq.namesrv.NamesrvStartup \
        -Xms64m -Xmx256m -XX:MaxDirectMemorySize=128m -XX:+UseSerialGC ${RMQ_NAMESRV_JVM_OPTS:-} \
        -- -c "$RUN/conf/namesrv.conf"
    wait_ports namesrv $deadline $NAMESRV_PORT
}

start_proxy() { # [extra admin ops run in the same JVM as the registration wait]
    local deadline=$((SECONDS + START_TIMEOUT))
    if ! live_pid proxy >/dev/null; then
        local p
        for p in $GRPC_PORT $REMOTING_PORT $BROKER_PORT $METRICS_PORT; do
            port_open $p && die "$(port_taken $p)"
        done
        launch proxy org.apache.rocketmq.proxy.ProxyStartup \
            -Xms512m -Xmx512m -XX:MaxDirectMemorySize=512m -XX:+UseG1GC ${RMQ_PROXY_JVM_OPTS:-} \
            -- -pm local -bc "$RUN/conf/broker.conf" -pc "$RUN/conf/rmq-proxy.json" -n $NAMESRV_ADDR
    fi
    wait_ports proxy $deadline $BROKER_PORT $GRPC_PORT $REMOTING_PORT $METRICS_PORT
    # broker registered in the name server (topic routes resolvable), then the extra ops
    admin "wait:$((deadline - SECONDS > 5 ? deadline - SECONDS : 5))@127.0.0.1:$BROKER_PORT" "$@" >&2 \
        || fail_start proxy "broker not registered in the name server, or admin operation failed: $*"
}

signal_one() { # name TERM|KILL ; prints the pid signalled
    local pid
    pid="$(live_pid "$1")" || { rm -f "$RUN/$1.pid"; return 0; }
    kill -"$2" "$pid" 2>/dev/null || true
    echo "$pid"
}

wait_gone() { # name pid : wait for exit, SIGKILL after STOP_TIMEOUT
    local name="$1" pid="$2" t0=$SECONDS
    [[ -n "$pid" ]] || return 0
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            log "$name (pid $pid) did not exit after ${STOP_TIMEOUT}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 10))
        fi
        sleep 0.1
    done
    rm -f "$RUN/$name.pid"
    log "$name stopped (pid $pid, $((SECONDS - t0)) s)"
}

stop_one() { # name [KILL]
    local pid
    pid="$(signal_one "$1" "${2:-TERM}")"
    wait_gone "$1" "$pid"
}

# ---------------------------------------------------------------- admin operations
admin() { # ops as RmqAdmin tokens: wait:S topic:N fifo-topic:N group:N fifo-group:N queues:N
    if ensure_admin; then
        "$JAVA" -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto $(jvm_common) \
            -cp "$CLASSES:$LIB/*" RmqAdmin $NAMESRV_ADDR $CLUSTER "$@"
        return
    fi
    # fallback: one MQAdminStartup JVM per operation (~5 s each)
    local op kind arg queues=4 mq=("$JAVA" -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC)
    for op in "$@"; do
        kind="${op%%:*}"; arg="${op#*:}"
        case "$kind" in
            wait)
                local secs="${arg%%@*}" until
                until=$((SECONDS + ${secs%.*}))
                until "${mq[@]}" $(jvm_common) -cp "$LIB/*" org.apache.rocketmq.tools.command.MQAdminStartup \
                        clusterList -n $NAMESRV_ADDR 2>/dev/null | grep -q "127.0.0.1:$BROKER_PORT"; do
                    ((SECONDS < until)) || return 1
                    sleep 1
                done ;;
            queues) queues="$arg" ;;
            topic | fifo-topic | priority-topic)
                local type=NORMAL
                [[ $kind == fifo-topic ]] && type=FIFO
                [[ $kind == priority-topic ]] && type=PRIORITY
                "${mq[@]}" $(jvm_common) -cp "$LIB/*" org.apache.rocketmq.tools.command.MQAdminStartup \
                    updateTopic -n $NAMESRV_ADDR -c $CLUSTER -t "$arg" -r "$queues" -w "$queues" \
                    -a "+message.type=$type" ;;
            group | fifo-group)
                "${mq[@]}" $(jvm_common) -cp "$LIB/*" org.apache.rocketmq.tools.command.MQAdminStartup \
                    updateSubGroup -n $NAMESRV_ADDR -c $CLUSTER -g "$arg" \
                    -o "$([[ $kind == fifo-group ]] && echo true || echo false)" ;;
        esac
    done
}

names_to_ops() { # kind names... ; `fifo` anywhere -> all fifo ; NAME:fifo -> that one fifo ; `priority` -> all PRIORITY
    local kind="$1"; shift
    local all_fifo=0 all_priority=0 n ops=() prev=""
    for n in "$@"; do
        [[ "$n" == fifo || "$n" == --fifo ]] && all_fifo=1
        [[ "$n" == priority || "$n" == --priority ]] && all_priority=1
        [[ "$prev" == --queues ]] && ops+=("queues:$n")
        prev="$n"
    done
    while [[ $# -gt 0 ]]; do
        n="$1"; shift
        case "$n" in
            fifo | --fifo | priority | --priority) continue ;;
            --queues) shift; continue ;;
        esac
        if [[ "$n" == *:fifo || $all_fifo == 1 ]]; then ops+=("fifo-$kind:${n%:fifo}")
        elif [[ $all_priority == 1 && $kind == topic ]]; then ops+=("priority-topic:$n")
        else ops+=("$kind:$n"); fi
    done
    local named=0
    for n in "${ops[@]}"; do [[ "$n" == queues:* ]] || named=1; done
    ((named)) || die "usage: rmq.sh $kind NAME... [fifo|priority] [--queues N]"
    printf '%s\n' "${ops[@]}"
}

require_up() {
    live_pid proxy >/dev/null && port_open $GRPC_PORT && live_pid namesrv >/dev/null \
        || die "RocketMQ is not running (rmq.sh start)"
}

# ---------------------------------------------------------------- commands
with_lock() {
    mkdir -p "$RUN"
    exec 9>"$RUN/.lock"
    flock -w 600 9 || die "could not lock $RUN/.lock"
}

all_up() {
    live_pid namesrv >/dev/null && live_pid proxy >/dev/null && port_open $NAMESRV_PORT \
        && port_open $BROKER_PORT && port_open $GRPC_PORT && port_open $REMOTING_PORT && port_open $METRICS_PORT
}

# The ports a start needs, checked before the jars are resolved (minutes on a cold cache).
check_ports() {
    local p need=()
    live_pid namesrv >/dev/null || need+=($NAMESRV_PORT)
    live_pid proxy >/dev/null || need+=($GRPC_PORT $REMOTING_PORT $BROKER_PORT $METRICS_PORT)
    for p in "${need[@]}"; do
        port_open $p && die "$(port_taken $p)"
    done
    return 0
}

port_taken() { # PORT: the cause and the next step, one line
    echo "port $1 is in use by a process not started from $RUN (\`ss -ltnp 'sport = :$1'\` names it): stop it," \
        "or, if it is a RocketMQ you run, skip this one and point the app at its proxy (RMQ_ENDPOINT=HOST:PORT)"
}

cmd_start() {
    with_lock
    if all_up; then log "already running"; return 0; fi
    check_ports
    local t0=$SECONDS
    ensure_lib
    JAVA="$(find_java)"
    prepare_run_dir
    ensure_shim
    ensure_admin || true
    start_namesrv
    log "name server up on 127.0.0.1:$NAMESRV_PORT ($((SECONDS - t0)) s)"
    start_proxy "topic:$DEFAULT_TOPIC" "fifo-topic:$DEFAULT_FIFO_TOPIC" "fifo-group:$DEFAULT_FIFO_GROUP"
    log "ready in $((SECONDS - t0)) s: gRPC proxy 127.0.0.1:$GRPC_PORT, remoting proxy 127.0.0.1:$REMOTING_PORT," \
        "name server 127.0.0.1:$NAMESRV_PORT, broker 127.0.0.1:$BROKER_PORT," \
        "broker metrics http://127.0.0.1:$METRICS_PORT/metrics (run dir $RUN)"
}

cmd_stop() { # [kill]
    with_lock
    # Graceful: the proxy/broker unregisters from the name server within ~50 ms of SIGTERM, then
    # needs ~12 s (grpc shutdown, a fixed 3 s sleep in DefaultMessageStore.shutdown, service
    # thread joins); the name server is stopped meanwhile. `stop kill`: SIGKILL both at once
    # (the store survives: mmapped writes are in the page cache; consumer offsets committed in
    # the last ~5 s may be lost, i.e. redelivered after the next start).
    local ppid npid
    if [[ "${1:-}" == kill ]]; then
        ppid="$(signal_one proxy KILL)"
        npid="$(signal_one namesrv KILL)"
        wait_gone proxy "$ppid"
        wait_gone namesrv "$npid"
        return 0
    fi
    ppid="$(signal_one proxy TERM)"
    [[ -n "$ppid" ]] && sleep 1
    npid="$(signal_one namesrv TERM)"
    wait_gone proxy "$ppid"
    wait_gone namesrv "$npid"
}

cmd_status() {
    local up=0 total=0 n pid
    for n in namesrv proxy; do
        total=$((total + 1))
        if pid="$(live_pid $n)"; then
            up=$((up + 1))
            printf '%-8s running  pid %s\n' $n "$pid"
        else
            printf '%-8s stopped\n' $n
        fi
    done
    local p
    for p in "namesrv:$NAMESRV_PORT" "broker:$BROKER_PORT" "grpc:$GRPC_PORT" "remoting:$REMOTING_PORT" \
             "metrics:$METRICS_PORT"; do
        if port_open "${p#*:}"; then printf '%-8s port %-5s open\n' "${p%%:*}" "${p#*:}"
        else printf '%-8s port %-5s closed\n' "${p%%:*}" "${p#*:}"; fi
    done
    echo "run dir: $RUN"
    if ((up == total)) && all_up; then return 0; elif ((up == 0)); then return 3; else return 1; fi
}

cmd_restart_proxy() {
    with_lock
    live_pid namesrv >/dev/null || die "name server is not running (rmq.sh start)"
    local t0=$SECONDS
    stop_one proxy
    JAVA="$(find_java)"
    prepare_run_dir
    ensure_shim
    start_proxy
    log "proxy restarted in $((SECONDS - t0)) s"
}

cmd_stop_proxy() {
    with_lock
    if [[ "${1:-}" == kill ]]; then stop_one proxy KILL; else stop_one proxy; fi
}

cmd_start_proxy() {
    with_lock
    live_pid namesrv >/dev/null || die "name server is not running (rmq.sh start)"
    local t0=$SECONDS
    JAVA="$(find_java)"
    prepare_run_dir
    ensure_shim
    start_proxy
    log "proxy started in $((SECONDS - t0)) s"
}

cmd_admin_kind() { # topic|group names...
    local kind="$1"; shift
    local ops
    mapfile -t ops < <(names_to_ops "$kind" "$@")
    [[ ${#ops[@]} -gt 0 ]] || exit 1
    require_up
    # fast path: remoting protocol from python (stdlib only), a few ms per topic/group
    if [[ "${RMQ_ADMIN:-python}" != java ]] && command -v python3 >/dev/null; then
        python3 "$HERE/rmq_admin.py" "$kind" "$@"
        return
    fi
    ensure_lib
    JAVA="$(find_java)"
    admin "${ops[@]}"
}

main() {
    local cmd="${1:-}"
    [[ $# -gt 0 ]] && shift
    case "$cmd" in
        start) cmd_start ;;
        check-ports) if ! all_up; then check_ports; fi ;;
        stop) cmd_stop "$@" ;;
        status) cmd_status ;;
        topic) cmd_admin_kind topic "$@" ;;
        group) cmd_admin_kind group "$@" ;;
        restart-proxy) cmd_restart_proxy ;;
        stop-proxy) cmd_stop_proxy "$@" ;;
        start-proxy) cmd_start_proxy ;;
        logs) tail -n "${1:-40}" "$RUN"/logs/*.log ;;
        clean) cmd_stop; rm -rf "$RUN"; log "removed $RUN" ;;
        lib) ensure_lib; JAVA="$(find_java)"; ensure_admin; ensure_shim; log "lib: $LIB" ;;
        *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
           [[ -z "$cmd" || "$cmd" == -h || "$cmd" == help ]] ;;
    esac
}

main "$@"

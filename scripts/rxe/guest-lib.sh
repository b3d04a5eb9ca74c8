# shellcheck shell=bash
# Helpers for checks that run inside the rxe-test guest (in the chroot into the
# host root, so host binaries and the host's rdma-core are on PATH).
#
# A check is a bash function run by `rxe_check NAME FUNCTION [ARGS...]`:
#   - it runs in a subshell killed after RXE_CHECK_TIMEOUT seconds, with
#     stdout/stderr in $RXE_LOGDIR/NAME.log;
#   - return 0 -> "PASS NAME", return $RXE_SKIP (77) -> "SKIPPED NAME (reason)",
#     anything else -> "FAIL NAME (reason)";
#   - the reason is what it last gave to `rxe_reason "..."` (or the log's last line);
#   - `rxe_info "..."` prints an "INFO NAME: ..." line after the result.
# Only PASS and FAIL lines are counted by the host; SKIPPED lines are listed
# again at the end of the run so nobody mistakes a skip for a pass.

set -a
RXE_IP=${RXE_IP:-10.0.2.15}
RXE_DEV=${RXE_DEV:-rxe0}
RXE_GID=${RXE_GID:-1}
RXE_SKIP=77
RXE_SERVER_CPU=${RXE_SERVER_CPU:-0}
RXE_CLIENT_CPU=${RXE_CLIENT_CPU:-1}
RXE_LOGDIR="$RXE_OUT/logs"
RXE_METRICS="$RXE_OUT/metrics.tsv"
RXE_RESULTS="$RXE_OUT/results.txt"
RXE_FASTWAKE="$RXE_BIN_DIR/fastwake"
RXE_PRELOAD="$RXE_BIN_DIR/libfastwake_preload.so"
set +a
mkdir -p "$RXE_LOGDIR"

# ---- used inside a check -----------------------------------------------------
# (Hot paths use bash builtins only: every exec costs ~0.2 s under TCG.)

# rxe_last_match FILE REGEX: print the last line of FILE matching REGEX
# (bash ERE); status 1 if none.
rxe_last_match() {
    local line found="" ok=1
    while IFS= read -r line || [ -n "$line" ]; do
        [[ $line =~ $2 ]] && { found=$line; ok=0; }
    done <"$1"
    [ $ok = 0 ] && printf '%s\n' "$found"
    return $ok
}
rxe_reason() { printf '%s\n' "$*" >"$RXE_CUR_REASON"; }
rxe_info() { printf '%s\n' "$*" >>"$RXE_CUR_INFO"; }
# rxe_metric KEY VALUE: one row "check<TAB>key<TAB>value" in metrics.tsv
rxe_metric() { printf '%s\t%s\t%s\n' "$RXE_CUR_NAME" "$1" "$2" >>"$RXE_METRICS"; }
rxe_fail() { rxe_reason "$*"; return 1; }

# RXE_HANDOFF_TRIES: runs a dispatch check may take to show a hand-off.
RXE_HANDOFF_TRIES=${RXE_HANDOFF_TRIES:-3}

# rxe_until_handed_off FN ARGS...: run the check FN; a run that failed only
# because no wait was handed off (its reason says "no ... was handed off")
# is run again, up to $RXE_HANDOFF_TRIES runs in all, and each such run is
# named in the check's INFO lines. Why: a waiter does not count on a
# dispatcher that is stale (SCHED_IDLE, and it got no CPU for a while, as
# on an emulated vCPU kept busy) and falls back to interrupt mode; a short
# run under TCG can have all its hand-offs fall back that way (CI once
# had handoffs=0 with 65 fallbacks in 558 waits; handoffs=1 was seen too).
# That is the fallback doing its job; a broken hand-off shows in every run.
rxe_until_handed_off() {
    local try=1 why line
    while :; do
        "$@" && return 0
        why=""
        while IFS= read -r line; do why=$line; done <"$RXE_CUR_REASON"
        [[ $why =~ no\ [a-z_]+\ was\ handed\ off ]] && [ "$try" -lt "$RXE_HANDOFF_TRIES" ] || return 1
        rxe_info "run $try of at most $RXE_HANDOFF_TRIES: $why; once more"
        try=$((try + 1))
        : >"$RXE_CUR_REASON"
    done
}

# rxe_build_c NAME: build the C program $RXE_SELF_DIR/NAME.c into
# $RXE_LOGDIR/NAME (again only when it or rc-common.h changed) with the
# host root's compiler and rdma-core headers, and print its path; SKIPPED
# without them.
rxe_build_c() {
    local exe="$RXE_LOGDIR/$1" src="$RXE_SELF_DIR/$1.c"
    [ -x "$exe" ] && [ "$exe" -nt "$src" ] && [ "$exe" -nt "$RXE_SELF_DIR/rc-common.h" ] && { echo "$exe"; return 0; }
    command -v cc >/dev/null || { rxe_reason "no C compiler (cc) in the host root"; return $RXE_SKIP; }
    [ -f /usr/include/infiniband/verbs.h ] || { rxe_reason "no rdma-core headers (libibverbs-dev) in the host root"; return $RXE_SKIP; }
    cc -O2 -pthread -o "$exe" "$src" -libverbs >"$RXE_LOGDIR/$1.build.log" 2>&1 \
        || { rxe_fail "$1.c did not build: $(tail -n 1 "$RXE_LOGDIR/$1.build.log")"; return 1; }
    echo "$exe"
}

# Skip unless the project's binaries are built (skips are loud, never passes).
rxe_need_fastwake() {
    [ -x "$RXE_FASTWAKE" ] && return 0
    rxe_reason "fastwake binary not built: run cargo build --release first"
    return $RXE_SKIP
}
rxe_need_preload() {
    [ -f "$RXE_PRELOAD" ] && return 0
    rxe_reason "libfastwake_preload.so not built: run cargo build --release first"
    return $RXE_SKIP
}

# rxe_sleep SECONDS: sleep without an exec (process creation is slow under TCG).
rxe_sleep() {
    [ -n "${RXE_SLEEP_FD:-}" ] || exec {RXE_SLEEP_FD}<> <(:) || RXE_SLEEP_FD=none
    if [ "$RXE_SLEEP_FD" = none ]; then sleep "$1"; else read -r -t "$1" -u "$RXE_SLEEP_FD" _ || true; fi
}

# rxe_wait_listen PORT [SECONDS]: wait until a TCP listener is on PORT
# (reads /proc/net/tcp{,6} with builtins: no exec per poll).
rxe_wait_listen() {
    local port n=$(( ${2:-20} * 20 )) f _sl local_addr _rem st
    port=$(printf ':%04X' "$1")
    while [ $n -gt 0 ]; do
        for f in /proc/net/tcp /proc/net/tcp6; do
            while read -r _sl local_addr _rem st _; do
                [ "$st" = 0A ] && [[ $local_addr == *"$port" ]] && return 0
            done <"$f"
        done
        rxe_sleep 0.05; n=$((n - 1))
    done
    return 1
}

# Each pair of processes gets its own TCP port (no TIME_WAIT surprises).
rxe_next_port() {
    local f="$RXE_LOGDIR/.port" p
    p=18515; [ -f "$f" ] && read -r p <"$f"
    echo $((p + 1)) >"$f"
    echo "$p"
}

# rxe_pair TAG [--server-env VAR=VAL]... -- COMMAND [ARGS...]
# Runs COMMAND as a server pinned to CPU $RXE_SERVER_CPU (with "-p PORT"
# appended) and, once it listens, as a client pinned to $RXE_CLIENT_CPU (with
# "-p PORT $RXE_IP" appended). Prefix COMMAND with a wrapper to run it under
# one (env LD_PRELOAD=..., "$RXE_FASTWAKE" run --mode hybrid --, ...).
# Logs: $RXE_LOGDIR/$RXE_CUR_NAME.TAG.server.log and .client.log; the paths
# are left in RXE_SERVER_LOG and RXE_CLIENT_LOG. Returns non-zero (with a
# reason) if either side fails.
rxe_pair() {
    local tag=$1; shift
    [ "${1:-}" = -- ] && shift
    local port; port=$(rxe_next_port)
    local t=$(( RXE_CHECK_TIMEOUT > 10 ? RXE_CHECK_TIMEOUT - 5 : RXE_CHECK_TIMEOUT ))
    RXE_SERVER_LOG="$RXE_LOGDIR/$RXE_CUR_NAME.$tag.server.log"
    RXE_CLIENT_LOG="$RXE_LOGDIR/$RXE_CUR_NAME.$tag.client.log"
    echo "+ server: taskset -c $RXE_SERVER_CPU $* -p $port"
    echo "+ client: taskset -c $RXE_CLIENT_CPU $* -p $port $RXE_IP"
    timeout -k 2 "$t" taskset -c "$RXE_SERVER_CPU" "$@" -p "$port" >"$RXE_SERVER_LOG" 2>&1 &
    local spid=$! t0=$EPOCHREALTIME
    if ! rxe_wait_listen "$port" 20; then
        kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
        rxe_fail "$tag: server did not listen on port $port: $(tail -n 1 "$RXE_SERVER_LOG")"; return 1
    fi
    local crc=0 src=0 t1=$EPOCHREALTIME
    timeout -k 2 "$t" taskset -c "$RXE_CLIENT_CPU" "$@" -p "$port" "$RXE_IP" >"$RXE_CLIENT_LOG" 2>&1 || crc=$?
    local t2=$EPOCHREALTIME
    wait "$spid" || src=$?
    echo "+ times: server listening after $(( (${t1/./} - ${t0/./}) / 1000 )) ms, client ran $(( (${t2/./} - ${t1/./}) / 1000 )) ms, server done $(( (${EPOCHREALTIME/./} - ${t2/./}) / 1000 )) ms later"
    if [ $crc != 0 ] || [ $src != 0 ]; then
        local why="exit"; { [ $crc = 124 ] || [ $src = 124 ]; } && why="timeout/exit"
        rxe_fail "$tag: client $why $crc, server $why $src: $(grep -v '^$' "$RXE_CLIENT_LOG" "$RXE_SERVER_LOG" | tail -n 1)"
        return 1
    fi
    return 0
}

# rxe_pingpong_verify TAG ITERS: both logs of the last rxe_pair must say
# "ITERS iters in S seconds = U usec/iter"; records usec/iter of the client.
rxe_pingpong_verify() {
    local tag=$1 iters=$2 side line
    for side in "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG"; do
        line=$(rxe_last_match "$side" '^[0-9]+ iters in [0-9.]+ seconds = [0-9.]+ usec/iter')
        [ -n "$line" ] || { rxe_fail "$tag: no 'N iters in' line in $(basename "$side")"; return 1; }
        [ "${line%% *}" = "$iters" ] || { rxe_fail "$tag: expected $iters iters, got: $line"; return 1; }
    done
    local usec=""; [[ $line =~ \ =\ ([0-9.]+)\ usec/iter ]] && usec=${BASH_REMATCH[1]}
    rxe_metric "$tag.usec_per_iter" "$usec"
    rxe_metric "$tag.iters" "$iters"
    rxe_info "$tag: $line"
}

# rxe_shim_loaded_verify TAG: with FASTWAKE_VERBOSE=1 the shim announces
# itself on stderr ("fastwake-preload: ..."); both logs of the last rxe_pair
# must show it, so a shim check cannot pass without the shim.
rxe_shim_loaded_verify() {
    local tag=$1 side
    for side in "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG"; do
        rxe_last_match "$side" '^fastwake-preload: ' >/dev/null ||
            { rxe_fail "$tag: the shim did not announce itself in $(basename "$side") (FASTWAKE_VERBOSE=1)"; return 1; }
    done
    # The first line is the configuration, the last the counters at exit.
    local first="" last="" line
    while IFS= read -r line; do
        [[ $line == "fastwake-preload: "* ]] || continue
        line=${line#fastwake-preload: }; [ -n "$first" ] || first=$line; last=$line
    done <"$RXE_CLIENT_LOG"
    rxe_info "$tag client: $first${last:+ | $last}"
}

# rxe_perftest_verify TAG ITERS [BYTES]: the client log of the last rxe_pair
# must hold the perftest result row "BYTES ITERS t_min t_max t_typical ...".
rxe_perftest_verify() {
    local tag=$1 iters=$2 bytes=${3:-2} row
    # perftest's cycle calibration can fail under TCG on a loaded host: the
    # row then reads "inf"/"-nan". The iterations still completed.
    row=$(rxe_last_match "$RXE_CLIENT_LOG" "^ *$bytes +$iters +([0-9]|inf|-?nan)")
    [ -n "$row" ] || { rxe_fail "$tag: no result row '$bytes $iters ...' in the client output"; return 1; }
    # columns: #bytes #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9
    local -a col; read -r -a col <<<"$row"; local typical=${col[4]}
    rxe_metric "$tag.t_typical_usec" "$typical"
    if [[ $typical =~ ^[0-9] ]]; then
        rxe_info "$tag: t_typical ${typical} usec (TCG: not a performance figure)"
    else
        rxe_info "$tag: $iters iterations done; t_typical '$typical' (perftest calibration failed under TCG)"
    fi
}

# ---- used by guest-checks.sh ---------------------------------------------------
RXE_N_PASS=0 RXE_N_FAIL=0 RXE_N_SKIP=0

rxe_emit() {   # rxe_emit PASS|FAIL|SKIPPED NAME [REASON]
    local line="$1 $2"
    [ -n "${3:-}" ] && line="$line ($3)"
    echo "$line"
    echo "$line" >>"$RXE_RESULTS"
    case $1 in PASS) RXE_N_PASS=$((RXE_N_PASS + 1)) ;; FAIL) RXE_N_FAIL=$((RXE_N_FAIL + 1)) ;; *) RXE_N_SKIP=$((RXE_N_SKIP + 1)) ;; esac
}

# rxe_check NAME FUNCTION [ARGS...]
# The function runs in a forked subshell (no exec: process creation is slow
# under TCG) in its own process group, killed by a watchdog after
# $RXE_CHECK_TIMEOUT seconds.
rxe_check() {
    local name=$1 fn=$2; shift 2
    if [ -n "${RXE_ONLY:-}" ] && ! [[ $name =~ $RXE_ONLY ]]; then return 0; fi
    local log="$RXE_LOGDIR/$name.log"
    RXE_CUR_NAME=$name RXE_CUR_REASON="$RXE_LOGDIR/.$name.reason" RXE_CUR_INFO="$RXE_LOGDIR/.$name.info"
    local expired="$RXE_LOGDIR/.$name.expired"
    : >"$RXE_CUR_REASON"; : >"$RXE_CUR_INFO"; [ -e "$expired" ] && rm -f "$expired"
    local rc=0 t0=$EPOCHREALTIME pid wd
    set -m   # background jobs get their own process group
    ( "$fn" "$@" ) >"$log" 2>&1 </dev/null &
    pid=$!
    # The watchdog sleeps in the background so that its TERM trap runs at once.
    ( s=""; trap 'kill $s; exit 0' TERM
      sleep "$RXE_CHECK_TIMEOUT" & s=$!; wait $s
      : >"$expired"; kill -TERM -- "-$pid"
      sleep 5 & s=$!; wait $s
      kill -KILL -- "-$pid" ) >/dev/null 2>&1 &
    wd=$!
    set +m
    wait "$pid" || rc=$?
    kill -TERM "$wd" 2>/dev/null; wait "$wd" 2>/dev/null
    [ -e "$expired" ] && rc=124
    local reason="" line
    while IFS= read -r line; do reason=$line; done <"$RXE_CUR_REASON"
    case $rc in
        0) rxe_emit PASS "$name" ;;
        "$RXE_SKIP") rxe_emit SKIPPED "$name" "${reason:-skipped}" ;;
        124) rxe_emit FAIL "$name" "timed out after ${RXE_CHECK_TIMEOUT}s${reason:+; $reason}" ;;
        *) [ -n "$reason" ] || reason="exit $rc: $(grep -v '^$' "$log" | tail -n 1)"
           rxe_emit FAIL "$name" "$reason" ;;
    esac
    while IFS= read -r line; do echo "INFO $name: $line"; done <"$RXE_CUR_INFO"
    local t1=$EPOCHREALTIME
    printf '%s\t%s\n' "$name" "$(( (${t1/./} - ${t0/./}) / 1000 ))ms" >>"$RXE_LOGDIR/.durations"
    return 0
}

# Make every function (helpers and checks) visible to child bash processes
# (the FASTWAKE_RXE_EXTRA script).
rxe_export_functions() {
    local f
    for f in $(compgen -A function); do export -f "${f?}"; done
}

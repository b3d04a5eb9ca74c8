# shellcheck shell=bash
# rxe-test checks: busy-polling programs under the preload
# shim's FASTWAKE_POLLERS=sleep (docs/design/shim.md; crates/fastwake-preload/
# src/pollers/). Sourced by guest-checks.sh (helpers from guest-lib.sh).
# Each check runs its program without the shim (the reference) and under
# the shim with FASTWAKE_MODE=hybrid FASTWAKE_POLLERS=sleep, and judges
# results, counters and CPU seconds only: TCG timings are no figures.
#
# The perftest checks run over the hub wire (rxe_a <-> rxe_b, set up by
# stall_wire in stall-checks.sh): on rxe0 alone Soft-RoCE completes a
# one-sided READ or WRITE inside the poster's own ibv_post_send (the
# loopback path runs the responder inline), so ib_read_lat's and
# ib_write_bw's first poll always finds its completion and the shim sees
# no empty poll at all. Over the wire every completion comes later, from
# the other NIC's interrupt, as on real hardware.

RXE_POLLERS_ITERS=${RXE_POLLERS_ITERS:-200}
RXE_POLLERS_BURSTS=${RXE_POLLERS_BURSTS:-150}
RXE_POLLERS_ROUNDS=${RXE_POLLERS_ROUNDS:-3}
RXE_POLLERS_GAP_MAX_MS=${RXE_POLLERS_GAP_MAX_MS:-30}
RXE_POLLERS_ENV=(FASTWAKE_MODE=hybrid FASTWAKE_POLLERS=sleep FASTWAKE_VERBOSE=1)

# pollers_wire: rxe_a/rxe_b over the hub, no netem left from the loss checks.
pollers_wire() {
    declare -F stall_wire >/dev/null || . "$RXE_SELF_DIR/stall-checks.sh"
    stall_wire || return
    tc qdisc del dev "$STALL_A_NIC" root 2>/dev/null
    return 0
}

# pollers_pair TAG MODE CMD [ARGS...]: CMD's server on rxe_a (vCPU 0, "-d
# rxe_a -x 1 -p PORT"), then its client on rxe_b (vCPU 1, "-d rxe_b -x 1
# -p PORT 127.0.0.1": perftest's TCP exchange over loopback, the RDMA over
# the wire); MODE "none" without the shim, "sleep" under it. Logs in
# RXE_SERVER_LOG / RXE_CLIENT_LOG; non-zero (with a reason) if either side
# fails or hangs.
pollers_pair() {
    local tag=$1 mode=$2; shift 2
    local port; port=$(rxe_next_port)
    local t=$(( (RXE_CHECK_TIMEOUT - 10) / 2 ))
    RXE_SERVER_LOG="$RXE_LOGDIR/$RXE_CUR_NAME.$tag.server.log"
    RXE_CLIENT_LOG="$RXE_LOGDIR/$RXE_CUR_NAME.$tag.client.log"
    local -a pre=()
    [ "$mode" = none ] || pre=(env LD_PRELOAD="$RXE_PRELOAD" "${RXE_POLLERS_ENV[@]}")
    echo "+ ${pre[*]} $* -d rxe_a|rxe_b -x 1 -p $port [127.0.0.1] (bound ${t}s)"
    timeout -k 2 "$t" taskset -c "$RXE_SERVER_CPU" "${pre[@]}" "$@" -d rxe_a -x 1 -p "$port" >"$RXE_SERVER_LOG" 2>&1 &
    local spid=$!
    if ! rxe_wait_listen "$port" 20; then
        kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
        rxe_fail "$tag: server did not listen on port $port: $(tail -n 1 "$RXE_SERVER_LOG")"; return 1
    fi
    local crc=0 src=0
    timeout -k 2 "$t" taskset -c "$RXE_CLIENT_CPU" "${pre[@]}" "$@" -d rxe_b -x 1 -p "$port" 127.0.0.1 >"$RXE_CLIENT_LOG" 2>&1 || crc=$?
    wait "$spid" || src=$?
    echo "--- server log"; cat "$RXE_SERVER_LOG"
    echo "--- client log"; cat "$RXE_CLIENT_LOG"
    if [ $crc != 0 ] || [ $src != 0 ]; then
        local why=exit; { [ $crc = 124 ] || [ $src = 124 ]; } && why="exit (124: hung, killed after ${t}s)"
        rxe_fail "$tag: client $why $crc, server $why $src: $(grep -v '^$' "$RXE_CLIENT_LOG" "$RXE_SERVER_LOG" | grep -v '^fastwake-preload' | tail -n 1)"
        return 1
    fi
}

# pollers_rows LOG: "#bytes #iterations" of each perftest result row in LOG
# (the other columns are timings). A row may have the shim's exit report
# glued to its end (perftest ends it later): only its head is read.
pollers_rows() {
    local line out=""
    while IFS= read -r line; do
        [[ $line =~ ^\ *([0-9]+)\ +([0-9]+)\ +([0-9]|inf|-?nan) ]] && out+="${BASH_REMATCH[1]} ${BASH_REMATCH[2]};"
    done <"$1"
    echo "$out"
}

# pollers_field LINE KEY: the number after KEY= in LINE (empty if none).
pollers_field() { [[ $1 =~ (^|[ ])$2=([0-9]+) ]] && echo "${BASH_REMATCH[2]}"; }

# pollers_line LOG: the shim's exit line for busy pollers, without the
# prefix; empty when the process made no empty poll (the line is printed
# only then). Fails (with a reason) when the shim did not announce itself
# with pollers=sleep.
pollers_line() {
    local log=$1
    rxe_last_match "$log" '^fastwake-preload: fastwake .* pollers=sleep ' >/dev/null ||
        { rxe_fail "the shim did not announce pollers=sleep in $(basename "$log")"; return 1; }
    local line; line=$(rxe_last_match "$log" 'fastwake-preload: pollers pid=') || line=""
    echo "${line#*fastwake-preload: }"
}

# pollers_perftest_runs BENCH ARGS...: BENCH over the wire without the
# shim, then with both sides under pollers=sleep; both must complete and
# give the same result rows (#bytes #iterations) on each side. Then sums
# the sides' pollers counters: P_EMPTY, P_SLEEPS, P_BOUND, P_HAZ, and
# P_SUM (each side's line, for an INFO).
pollers_perftest_runs() {
    local bench=$1; shift
    pollers_pair none none "$bench" "$@" || return 1
    local ref_c ref_s got_c got_s
    ref_c=$(pollers_rows "$RXE_CLIENT_LOG"); ref_s=$(pollers_rows "$RXE_SERVER_LOG")
    [[ $ref_c == *" $RXE_POLLERS_ITERS;"* ]] || { rxe_fail "$bench without the shim: client rows '$ref_c' lack $RXE_POLLERS_ITERS iterations"; return 1; }
    pollers_pair sleep sleep "$bench" "$@" || return 1
    got_c=$(pollers_rows "$RXE_CLIENT_LOG"); got_s=$(pollers_rows "$RXE_SERVER_LOG")
    [ "$got_c" = "$ref_c" ] && [ "$got_s" = "$ref_s" ] ||
        { rxe_fail "$bench under pollers=sleep: rows (#bytes #iterations) client '$got_c' server '$got_s', without the shim client '$ref_c' server '$ref_s'"; return 1; }
    rxe_info "$bench $* over rxe_a<->rxe_b: rows (#bytes #iterations) = no-shim: client '${ref_c%;}'${ref_s:+, server '${ref_s%;}'}"
    local side log pl
    P_EMPTY=0 P_SLEEPS=0 P_BOUND=0 P_HAZ=0 P_SUM=""
    for side in server client; do
        log=$RXE_SERVER_LOG; [ $side = client ] && log=$RXE_CLIENT_LOG
        pl=$(pollers_line "$log") || return 1
        if [ -z "$pl" ]; then P_SUM+=" $side: no empty poll (no pollers line);"; continue; fi
        P_EMPTY=$((P_EMPTY + $(pollers_field "$pl" empty_polls)))
        P_SLEEPS=$((P_SLEEPS + $(pollers_field "$pl" sleeps)))
        P_BOUND=$((P_BOUND + $(pollers_field "$pl" woke_by_bound)))
        P_HAZ=$((P_HAZ + $(pollers_field "$pl" threads_off_hazard)))
        P_SUM+=" $side: ${pl#pollers };"
    done
    rxe_info "pollers=sleep:$P_SUM"
}

# check_pollers_perftest BENCH [ARGS...]: perftest's polling BENCH (no -e)
# over the wire, without the shim and then with both sides under
# FASTWAKE_POLLERS=sleep: both complete (each run bounded), the result
# rows (#bytes, #iterations, on each side that prints them) equal the
# reference's, at least one side's polls were seen empty (empty_polls > 0)
# and no thread was switched off by the hazard rule (these programs poll
# nothing but their CQs: a switch-off would be a false alarm). Sleeps may
# be 0 for a back-to-back benchmark; they are shown.
check_pollers_perftest() {
    local bench=$1; shift
    rxe_need_preload || return
    command -v "$bench" >/dev/null || { rxe_reason "$bench not installed (perftest)"; return $RXE_SKIP; }
    pollers_wire || return
    pollers_perftest_runs "$bench" -n "$RXE_POLLERS_ITERS" "$@" || return 1
    rxe_metric "$bench.empty_polls" "$P_EMPTY"
    rxe_metric "$bench.sleeps" "$P_SLEEPS"
    [ "$P_EMPTY" -gt 0 ] || { rxe_fail "$bench: the shim saw no empty poll on either side:$P_SUM"; return 1; }
    [ "$P_HAZ" = 0 ] || { rxe_fail "$bench: $P_HAZ thread(s) switched off by the hazard rule, but it polls only its CQs:$P_SUM"; return 1; }
}

# pollers_cq_idle_run MODE OUT: one cq-idle run (none: without the shim;
# sleep: under pollers=sleep) of $RXE_POLLERS_BURSTS bursts into OUT;
# sets CQ_LINE to its 'cq-idle ok' line without the prefix.
pollers_cq_idle_run() {
    local mode=$1 out=$2 rc=0 t=$(( (RXE_CHECK_TIMEOUT - 10) / (2 * RXE_POLLERS_ROUNDS) ))
    local -a pre=()
    [ "$mode" = none ] || pre=(env LD_PRELOAD="$RXE_PRELOAD" "${RXE_POLLERS_ENV[@]}")
    timeout -k 2 "$t" "${pre[@]}" taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" \
        "$CQ_EXE" "$RXE_DEV" "$RXE_GID" "$RXE_POLLERS_BURSTS" 1 "$RXE_POLLERS_GAP_MAX_MS" >"$out" 2>&1 || rc=$?
    cat "$out"
    local why=""; [ $rc = 124 ] && why=" (hung, killed after ${t}s)"
    [ $rc = 0 ] || { rxe_fail "cq-idle ($mode): exit $rc$why: $(grep -v '^$' "$out" | grep -v '^fastwake-preload' | tail -n 1)"; return 1; }
    CQ_LINE=$(rxe_last_match "$out" '^cq-idle ok ') || { rxe_fail "cq-idle ($mode): no 'cq-idle ok' line"; return 1; }
    CQ_LINE=${CQ_LINE#cq-idle ok }
}

# check_pollers_cq_idle: cq-idle (both threads busy-poll their channel-less
# send and receive CQs; bursts of 1-4 messages with idle gaps of 1 ms to
# $RXE_POLLERS_GAP_MAX_MS (30), the client's gaps timed by a timerfd it
# polls with zero-timeout poll())
# on rxe0: $RXE_POLLERS_ROUNDS rounds, each a run without the shim then
# one under pollers=sleep. The CPU seconds are the whole process's (both
# threads: getrusage RUSAGE_SELF over the traffic). The least of the
# pollers=sleep runs' CPU seconds must be at most 0.2x the least of the
# reference runs'. Why the least: the program's work is the same in every
# run, and under TCG the host's load only ever adds to it, most to a
# sleeping run's (nearly all kernel work, charged to whatever the vCPU
# ran while the host held it off): one round measured 0.85 s and 1.15 s
# under load and 0.25 s without, for the same run. Each round's ratio is
# shown too.
# Why gaps of up to 30 ms (they were up to 10, 0.8 s of gaps a run): a
# sleeping run's CPU is its ~1,400 sleeps (about 760 ended by completions
# around the bursts, the rest by the 2 ms bound in the gaps), and a sleep
# costs the emulated kernel 135-310 µs of CPU depending on the host's load
# (eight CI runs), against ~10 µs on a real CPU. With 10 ms gaps the
# bursts' sleeps alone put a loaded run at 0.20-0.26x the reference, the
# bound's margin. With gaps of up to 30 ms (2.3 s a run) the idle time the
# check is about outweighs them: about 2,850 sleeps a run, most of them
# ended by the bound, at 0.074-0.112x the reference in two runs of the
# check (120-185 µs a sleep); the least per-sleep cost of either failed CI
# run (about 250 µs) would give 0.16x. The bound stays 0.2.
# Every run must give the same checksum, and in each run under the shim
# it must have slept (sleeps > 0), been woken by completions
# (woke_by_completion > 0) and switched no thread off (it polls only its
# CQs and its timer).
check_pollers_cq_idle() {
    rxe_need_preload || return
    CQ_EXE=$(rxe_build_c cq-idle) || return
    local round mode out sum="" a b ratios=() cpu_none=() cpu_sleep=() pl sl wc haz
    for ((round = 1; round <= RXE_POLLERS_ROUNDS; round++)); do
        for mode in none sleep; do
            out="$RXE_LOGDIR/$RXE_CUR_NAME.$mode$round.out"
            pollers_cq_idle_run "$mode" "$out" || return 1
            local s; s=$(channel_field_any "$CQ_LINE" sum)
            [ -n "$s" ] && { [ -z "$sum" ] || [ "$s" = "$sum" ]; } ||
                { rxe_fail "cq-idle ($mode, round $round): checksum $s, the first run's $sum"; return 1; }
            sum=$s
            if [ "$mode" = none ]; then
                a=$(channel_field_any "$CQ_LINE" cpu_s); cpu_none+=("$a")
                rxe_info "round $round without the shim: $CQ_LINE"
                continue
            fi
            b=$(channel_field_any "$CQ_LINE" cpu_s); cpu_sleep+=("$b")
            pl=$(pollers_line "$out") || return 1
            [ -n "$pl" ] || { rxe_fail "round $round: no pollers line under pollers=sleep (no empty poll seen)"; return 1; }
            ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "inf" }')")
            rxe_info "round $round pollers=sleep:    $CQ_LINE"
            rxe_info "round $round CPU seconds $b vs $a: ratio ${ratios[-1]}; $pl"
            sl=$(pollers_field "$pl" sleeps); wc=$(pollers_field "$pl" woke_by_completion); haz=$(pollers_field "$pl" threads_off_hazard)
            [ "${sl:-0}" -gt 0 ] && [ "${wc:-0}" -gt 0 ] || { rxe_fail "round $round: sleeps=${sl:-?} woke_by_completion=${wc:-?}, want both > 0: $pl"; return 1; }
            [ "${haz:-x}" = 0 ] || { rxe_fail "round $round: $haz thread(s) switched off by the hazard rule, but cq-idle polls only its CQs and its timerfd: $pl"; return 1; }
        done
    done
    local least; least=$(awk -v a="${cpu_none[*]}" -v b="${cpu_sleep[*]}" 'BEGIN {
        n = split(a, x, " "); split(b, y, " "); ma = x[1]; mb = y[1]
        for (i = 2; i <= n; i++) { if (x[i] < ma) ma = x[i]; if (y[i] < mb) mb = y[i] }
        if (ma > 0) printf "%.3f %.3f %.3f", mb, ma, mb / ma; else printf "%.3f %.3f inf", mb, ma }')
    local cb ca ratio; read -r cb ca ratio <<<"$least"
    rxe_info "process CPU seconds (both threads): pollers=sleep ${cpu_sleep[*]}, without the shim ${cpu_none[*]}; least $cb vs $ca: ratio $ratio (want <= 0.2); per round ${ratios[*]}; checksum $sum in all $((2 * RXE_POLLERS_ROUNDS)) runs"
    rxe_metric cq_idle.cpu_s.sleep "$cb"
    rxe_metric cq_idle.cpu_s.none "$ca"
    rxe_metric cq_idle.cpu_ratio "$ratio"
    awk -v r="$ratio" 'BEGIN { exit !(r != "inf" && r + 0 <= 0.2) }' ||
        { rxe_fail "CPU seconds under pollers=sleep ${cpu_sleep[*]}, without the shim ${cpu_none[*]}: least $cb over least $ca = $ratio > 0.2"; return 1; }
}

# channel_field_any LINE KEY: the value of KEY=... in LINE (any characters).
channel_field_any() { [[ $1 =~ (^|[ ])$2=([^ ]+) ]] && echo "${BASH_REMATCH[2]}"; }

# check_pollers_write_lat: ib_write_lat spins on its buffer's last byte,
# which an RDMA WRITE from the peer fills: memory the shim cannot see.
# Without the shim and under pollers=sleep over the wire: both complete
# with the same rows; the check says which of these it saw:
# - a thread switched off by the hazard rule (threads_off_hazard >= 1);
# - no sleep at all (sleeps == 0 on both sides);
# - sleeps with no switch-off: ib_write_lat also polls its send CQ for
#   each WRITE's completion (between the memory spins, never during one),
#   and a sleep there ends with that completion or, if the bound ends it,
#   the completion still comes before the thread's next post, which clears
#   the hazard rule's suspicion. The memory spin itself never sleeps: the
#   shim is not called in it.
check_pollers_write_lat() {
    rxe_need_preload || return
    command -v ib_write_lat >/dev/null || { rxe_reason "ib_write_lat not installed (perftest)"; return $RXE_SKIP; }
    pollers_wire || return
    pollers_perftest_runs ib_write_lat -n "$RXE_POLLERS_ITERS" || return 1
    rxe_metric write_lat.threads_off_hazard "$P_HAZ"
    rxe_metric write_lat.sleeps "$P_SLEEPS"
    if [ "$P_HAZ" -ge 1 ]; then
        rxe_info "outcome: switched off by the hazard rule (threads_off_hazard=$P_HAZ)"
    elif [ "$P_SLEEPS" = 0 ]; then
        rxe_info "outcome: never slept (sleeps=0)"
    else
        rxe_info "outcome: slept $P_SLEEPS time(s) in its send-CQ polls ($P_BOUND ended by the bound), never switched off (threads_off_hazard=0): each WRITE's completion came before its next post; the memory spin never sleeps"
    fi
}

rxe_pollers_checks() {
    rxe_check pollers-send-lat  check_pollers_perftest ib_send_lat
    # The bandwidth tests with 1 KB messages (one packet each at MTU
    # 1024): with the default 64 KB, 128 outstanding messages put 8192
    # packets on the hub wire at once, it drops some, and RC's retries
    # ran out (both ends of ib_send_bw exited 17 without the shim).
    rxe_check pollers-send-bw   check_pollers_perftest ib_send_bw -s 1024
    rxe_check pollers-read-lat  check_pollers_perftest ib_read_lat
    rxe_check pollers-write-bw  check_pollers_perftest ib_write_bw -s 1024
    rxe_check pollers-cq-idle   check_pollers_cq_idle
    rxe_check pollers-write-lat check_pollers_write_lat
}

# shellcheck shell=bash
# RDMA-as-really-written checks for the rxe-test guest (sourced by guest-checks.sh): RDMA
# programs that wait for NON-BLOCKING completion channels in poll/epoll/select
# sets, as UCX, rsockets' rpoll, libfabric and Ceph do. Each runs without
# the shim and under several modes; results must be identical, and the
# shim's counters must show the waits were served (not passed through).
# TCG timings are not performance figures: none are compared here.

RXE_CHANNEL_MODES=${RXE_CHANNEL_MODES:-hybrid adaptive dispatch}
RXE_CHANNEL_ITERS=${RXE_CHANNEL_ITERS:-300}

# The C program (scripts/rxe/channel-wait.c), built once per guest run with
# the host root's compiler and rdma-core headers.
channel_wait_exe() { rxe_build_c channel-wait; }

# channel_field LINE KEY: the value of KEY=... in LINE.
channel_field() { [[ $1 =~ (^|[ ])$2=([^ ]+) ]] && echo "${BASH_REMATCH[2]}"; }

# channel_wait_run TAG MODE OUT REF REFNAME CMD...: run a channel-wait
# command line, print its output, and hold its payload checksum against
# the run without the shim: mode none writes it to REF, any other mode
# must match it (REFNAME names the check that writes it). Sets CW_LINE to
# the 'channel-wait ok' line. Returns 0 when checked, 3 for the reference
# run itself (nothing more to check), 1 on a failure (already said).
channel_wait_run() {
    local tag=$1 mode=$2 out=$3 ref=$4 refname=$5 sum
    shift 5
    "$@" >"$out" 2>&1 || { rxe_fail "$tag: $(grep -v '^$' "$out" | tail -n 1)"; return 1; }
    cat "$out"
    CW_LINE=$(rxe_last_match "$out" '^channel-wait ok ') || { rxe_fail "$tag: no 'channel-wait ok' line"; return 1; }
    sum=$(channel_field "$CW_LINE" sum)
    if [ "$mode" = none ]; then
        echo "$sum" >"$ref"
        rxe_info "$tag without the shim: $CW_LINE"
        return 3
    fi
    [ -s "$ref" ] || { rxe_fail "$tag: no reference run ($refname must run first)"; return 1; }
    [ "$sum" = "$(cat "$ref")" ] || { rxe_fail "$tag: payload checksum $sum differs from the run without the shim ($(cat "$ref"))"; return 1; }
}

# check_channel_wait HOW MODE: channel-wait in its HOW (epoll|poll|select) form,
# MODE "none" (no shim: the reference) or a shim mode. Same n and payload
# checksum as the reference; under a looking mode the shim must have
# reported channel fds ready from CQEs (fdset_ready > 0; under dispatch,
# or handed waits off, the dispatcher having found their CQEs) and served
# every poll/epoll_wait; under dispatch some waits must have been handed
# off (the dispatch checks run it through rxe_until_handed_off).
check_channel_wait() {
    local how=$1 mode=$2 seed=${3:-} exe out ref line
    local tag="$how/$mode${seed:+ (stress seed $seed)}"
    exe=$(channel_wait_exe) || return
    out="$RXE_LOGDIR/$RXE_CUR_NAME.out"
    ref="$RXE_LOGDIR/.channel-wait-$how${seed:+-stress}.ref"
    local -a pre=()
    [ "$mode" = none ] || { rxe_need_preload || return; pre=(env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE="$mode" FASTWAKE_VERBOSE=1); }
    local rc=0
    channel_wait_run "$tag" "$mode" "$out" "$ref" "channel-wait-$how-none" \
        "${pre[@]}" taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" "$exe" "$RXE_DEV" "$RXE_GID" "$RXE_CHANNEL_ITERS" "$how" $seed || rc=$?
    [ "$rc" = 3 ] && return 0
    [ "$rc" = 0 ] || return 1
    line=$CW_LINE
    local verbs calls
    verbs=$(rxe_last_match "$out" 'verbs pid=') || { rxe_fail "$tag: no verbs counters (shim not loaded?)"; return 1; }
    [[ $verbs == *"contexts wrapped=1"* ]] || { rxe_fail "$tag: the shim did not wrap the context: $verbs"; return 1; }
    local call=epoll_wait; [ "$how" = epoll ] || call=$how
    calls=$(rxe_last_match "$out" "mode=$mode calls:") || { rxe_fail "$tag: no call counters"; return 1; }
    [[ $calls =~ $call\ seen=([0-9]+)\ served=([0-9]+)\ passed=([0-9]+) ]] || { rxe_fail "$tag: no $call counters: $calls"; return 1; }
    local seen=${BASH_REMATCH[1]} served=${BASH_REMATCH[2]} passed=${BASH_REMATCH[3]}
    local ready absorbed synth
    ready=$(channel_field "$verbs" fdset_ready); absorbed=$(channel_field "$verbs" fdset_absorbed)
    [[ $verbs =~ events\ synthetic=([0-9]+) ]] && synth=${BASH_REMATCH[1]}
    [ "$passed" = 0 ] && [ "$served" -gt 0 ] || { rxe_fail "$tag: $call seen=$seen served=$served passed=$passed"; return 1; }
    # Under dispatch the CQs are looked at by the waiter or by the
    # core's dispatcher: a wait it handed off was found from a CQE too.
    # (A stress seed once had all 151 waits handed off or fall back:
    # fdset_ready=0 with 151 CQEs found, stashed and delivered.)
    local d="" h=0
    if [ "$mode" = dispatch ]; then
        d=$(rxe_last_match "$out" 'dispatch_waits=') || { rxe_fail "dispatch: no dispatch counters"; return 1; }
        h=$(channel_field "$d" handoffs)
    fi
    [ $(( ${ready:-0} + ${h:-0} )) -gt 0 ] && [ "${synth:-0}" -gt 0 ] \
        || { rxe_fail "$tag: no channel fd was reported ready from a CQE (fdset_ready=${ready:-?} synthetic=${synth:-?}${d:+ handoffs=${h:-?}}): the channel was only waited on through its fd"; return 1; }
    local extra=""
    if [ "$mode" = dispatch ]; then
        [ "${h:-0}" -gt 0 ] || { rxe_fail "dispatch: no $call was handed off: $d"; return 1; }
        extra="; dispatch_waits=$(channel_field "$d" dispatch_waits) handoffs=$h fallbacks=$(channel_field "$d" fallbacks)"
        rxe_metric "channel-wait.$how.dispatch.handoffs" "$h"
    fi
    rxe_metric "channel-wait.$how.$mode.fdset_ready" "$ready"
    rxe_info "$tag under the shim: n=$RXE_CHANNEL_ITERS round trips, checksum = no-shim; $call seen=$seen served=$served passed=$passed; channel fds ready from CQEs=$ready, owed events absorbed=$absorbed, synthetic events=$synth, empty wakes=$(channel_field "$line" empty_wakes)/$(channel_field "$line" waits)$extra"
}

# check_rstream MODE: rsockets' rstream in its rpoll mode (-T a, waiting
# with -T b, verify data: -T v) between two processes; MODE "none" without the shim. The result
# rows (bytes, transfers, iterations) must match the run without the shim;
# under the shim the waiting polls must be served on both sides (channel fds
# reported ready from CQEs are shown: rpoll's own spin usually sees the CQE
# first). (rstream treats POLLHUP as an error
# even with data still to read: when the server's disconnect arrives with
# the last data, the client exits 16. Seen once under dispatch in TCG.)
check_rstream() {
    local mode=$1 port; port=$(rxe_next_port)
    command -v rstream >/dev/null || { rxe_reason "rstream not installed (rdmacm-utils)"; return $RXE_SKIP; }
    local s="$RXE_LOGDIR/$RXE_CUR_NAME.server.log" c="$RXE_LOGDIR/$RXE_CUR_NAME.client.log"
    local ref="$RXE_LOGDIR/.rstream.ref"
    local -a pre=()
    [ "$mode" = none ] || { rxe_need_preload || return; pre=(env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE="$mode" FASTWAKE_VERBOSE=1); }
    # -T b: blocking sockets, so rstream's rpoll waits with timeout -1
    # (its default, non-blocking, polls with timeout 0: it never sleeps).
    local attempt crc src races=0
    for attempt in 1 2 3 4 5 6; do
        local args=(-T a -T b -T v -S 256 -C 200 -p "$port")
        timeout -k 2 60 "${pre[@]}" taskset -c "$RXE_SERVER_CPU" rstream "${args[@]}" >"$s" 2>&1 &
        local spid=$!
        rxe_sleep 3
        crc=0 src=0
        timeout -k 2 60 "${pre[@]}" taskset -c "$RXE_CLIENT_CPU" rstream -s "$RXE_IP" "${args[@]}" >"$c" 2>&1 || crc=$?
        # A client that quit on POLLHUP can leave its server waiting for
        # the rest of the transfer: give the server a few seconds to end,
        # then end it, rather than wait out its 60 s timeout.
        local hung=0 t
        if [ $crc = 16 ]; then
            for t in 1 2 3 4 5 6 7 8 9 10; do
                kill -0 "$spid" 2>/dev/null || break
                rxe_sleep 1
            done
            if kill -0 "$spid" 2>/dev/null; then
                hung=1; kill "$spid" 2>/dev/null
            fi
        fi
        wait "$spid" || src=$?
        cat "$s" "$c"
        # rstream's own race, seen without the shim too: its do_poll treats
        # POLLHUP as an error even with data left to read, so a client that
        # sees the server's disconnect together with the last data exits 16
        # (POLLHUP) after the server finished. Run again (a new port); up
        # to 6 tries: under TCG it hit 3 tries in a row once in CI (and
        # once in one try of the run without the shim in the same run).
        # The same POLLHUP once came before any data, without the shim:
        # the client printed its header and exited 16, and the server
        # waited until its timeout; that pair runs again too.
        if [ $crc = 16 ] && { [ $src = 0 ] || [ $hung = 1 ]; } && [ $attempt -lt 6 ]; then
            races=$((races + 1)); port=$(rxe_next_port); continue
        fi
        break
    done
    # The result row: name bytes xfers iters total time Gb/sec usec/xfer
    local row_re='^[0-9a-z_]+ +[0-9.]+[kmg]? +[0-9]+ +[0-9]+ +' from=$c
    # Without the shim, a client that lost every try to rstream's own race
    # is rstream's fault, not fastwake's: the reference row is then the
    # server's, which finished and printed the same columns (CI once had
    # the race in all 6 tries of the run without the shim, and every
    # check under the shim failed for want of a reference).
    if [ "$mode" = none ] && [ $crc = 16 ] && [ $src = 0 ] && rxe_last_match "$s" "$row_re" >/dev/null; then
        from=$s crc=0
        rxe_info "rstream's POLLHUP race hit all $((races + 1)) tries of the client without the shim (rstream's own bug); the reference row is the server's"
    fi
    [ $crc = 0 ] && [ $src = 0 ] || { rxe_fail "$mode: rstream client exit $crc, server exit $src (after $races POLLHUP races): $(grep -v '^$' "$c" "$s" | tail -n 1)"; return 1; }
    [ $races = 0 ] || rxe_info "rstream's POLLHUP race (client exit 16 after the server finished) hit $races time(s); ran again"
    local row; row=$(rxe_last_match "$from" "$row_re") || { rxe_fail "$mode: no result row"; return 1; }
    local -a col; read -r -a col <<<"$row"
    local key="${col[0]} ${col[1]} ${col[2]} ${col[3]} ${col[4]}"
    if [ "$mode" = none ]; then
        echo "$key" >"$ref"
        rxe_info "rstream -T a -T b -T v without the shim: $row"
        return 0
    fi
    [ "$key" = "$(cat "$ref" 2>/dev/null)" ] || { rxe_fail "$mode: result '$key' differs from the run without the shim '$(cat "$ref" 2>/dev/null)'"; return 1; }
    local side verbs calls sum=""
    for side in "$s" "$c"; do
        verbs=$(rxe_last_match "$side" 'verbs pid=') || { rxe_fail "$mode: no verbs counters in $(basename "$side")"; return 1; }
        calls=$(rxe_last_match "$side" "mode=$mode calls:") || { rxe_fail "$mode: no call counters in $(basename "$side")"; return 1; }
        local p=""; [[ $calls =~ (poll\ seen=[0-9]+\ served=[0-9]+\ passed=[0-9]+) ]] && p=${BASH_REMATCH[1]}
        sum="$sum $(basename "$side" .log | sed 's/.*\.//'): ${p:-poll not called}, channels=$(channel_field "$verbs" channels) fdset_ready=$(channel_field "$verbs" fdset_ready) fdset_absorbed=$(channel_field "$verbs" fdset_absorbed) synthetic=$(channel_field "$verbs" synthetic) real=$(channel_field "$verbs" real) swallowed=$(channel_field "$verbs" swallowed);"
        if [ "$mode" = dispatch ]; then
            local d; d=$(rxe_last_match "$side" 'dispatch_waits=') && sum="$sum $d;"
        fi
    done
    rxe_info "rstream -T a -T b -T v under shim $mode: result = no-shim ($key);$sum"
    # Served: the waiting polls served on both sides (zero-timeout polls,
    # rpoll's own busy looks, pass through as they should). fdset_ready is
    # shown, not required: rpoll spins on the CQ itself (polling_time)
    # before it arms and polls, so the shim's look rarely comes first (0-7
    # per run seen; channel-wait, which does not spin, requires it).
    [[ $sum =~ server:\ poll\ seen=[0-9]+\ served=[1-9] ]] && [[ $sum =~ client:\ poll\ seen=[0-9]+\ served=[1-9] ]] \
        || { rxe_fail "$mode: poll not served on both sides:$sum"; return 1; }
}

# check_ucx MODE: ucx_perftest's tag-matching latency test with -E sleep
# (UCX waits on its worker's event fd in epoll: ucp_worker_get_efd +
# ucp_worker_arm) over RC verbs only (UCX_TLS=rc_verbs,self: never TCP;
# UD times out on rxe under TCG), server and client as two processes; MODE "none" without
# the shim. Same iteration count as without the shim; under the shim the
# epoll waits served and channel fds reported ready from CQEs.
check_ucx() {
    local mode=$1 port; port=$(rxe_next_port)
    command -v ucx_perftest >/dev/null || { rxe_reason "ucx_perftest not installed (apt-get install ucx-utils on the host)"; return $RXE_SKIP; }
    local s="$RXE_LOGDIR/$RXE_CUR_NAME.server.log" c="$RXE_LOGDIR/$RXE_CUR_NAME.client.log"
    local ref_err="$RXE_LOGDIR/.ucx.error"
    local -a pre=(env UCX_TLS=rc_verbs,self UCX_NET_DEVICES="$RXE_DEV:1")
    [ "$mode" = none ] || { rxe_need_preload || return; pre+=(LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE="$mode" FASTWAKE_VERBOSE=1); }
    local args=(-t tag_lat -E sleep -n 200 -p "$port")
    timeout -k 2 60 "${pre[@]}" taskset -c "$RXE_SERVER_CPU" ucx_perftest "${args[@]}" >"$s" 2>&1 &
    local spid=$!
    rxe_wait_listen "$port" 20 || { kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; rxe_fail "$mode: ucx_perftest server did not listen: $(tail -n 2 "$s" | tr '\n' ' ')"; return 1; }
    local crc=0 src=0
    timeout -k 2 60 "${pre[@]}" taskset -c "$RXE_CLIENT_CPU" ucx_perftest "$RXE_IP" "${args[@]}" >"$c" 2>&1 || crc=$?
    wait "$spid" || src=$?
    cat "$s" "$c"
    if [ $crc != 0 ] || [ $src != 0 ]; then
        # UCX's first error or fatal line, without timestamps and addresses.
        local err; err=$(grep -m1 -oE '(UCX +(ERROR|WARN) .*|Fatal: .*)' "$c" | sed -E 's/0x[0-9a-f]+/ADDR/g; s/ +/ /g')
        if [ "$mode" = none ]; then
            echo "$err" >"$ref_err"
            rxe_reason "UCX cannot run over rxe here (client exit $crc, server exit $src): $err"
            return $RXE_SKIP
        fi
        if [ -s "$ref_err" ] && [ "$err" = "$(cat "$ref_err")" ]; then
            rxe_reason "UCX fails over rxe here exactly as without the shim ($err): nothing to serve"
            return $RXE_SKIP
        fi
        rxe_fail "$mode: ucx_perftest failed differently from the run without the shim ($(cat "$ref_err" 2>/dev/null || echo 'which passed')): client exit $crc, server exit $src: $err"
        return 1
    fi
    [ "$mode" = none ] && rm -f "$ref_err"
    local row; row=$(rxe_last_match "$c" '^Final: +[0-9]+') || { rxe_fail "$mode: no 'Final:' row"; return 1; }
    local -a col; read -r -a col <<<"$row"
    [ "${col[1]}" = 200 ] || { rxe_fail "$mode: $row: not 200 iterations"; return 1; }
    if [ "$mode" = none ]; then
        rxe_info "ucx_perftest -t tag_lat -E sleep without the shim: $row"
        return 0
    fi
    local side verbs calls sum=""
    for side in "$s" "$c"; do
        verbs=$(rxe_last_match "$side" 'verbs pid=') || { rxe_fail "$mode: no verbs counters in $(basename "$side")"; return 1; }
        calls=$(rxe_last_match "$side" "mode=$mode calls:") || { rxe_fail "$mode: no call counters in $(basename "$side")"; return 1; }
        local p=""; [[ $calls =~ (epoll_wait\ seen=[0-9]+\ served=[0-9]+\ passed=[0-9]+) ]] && p=${BASH_REMATCH[1]}
        sum="$sum $(basename "$side" .log | sed 's/.*\.//'): ${p:-epoll_wait not called}, channels=$(channel_field "$verbs" channels) fdset_ready=$(channel_field "$verbs" fdset_ready) synthetic=$(channel_field "$verbs" synthetic) real=$(channel_field "$verbs" real);"
        if [ "$mode" = dispatch ]; then
            local d; d=$(rxe_last_match "$side" 'dispatch_waits=') && sum="$sum $d;"
        fi
    done
    rxe_info "ucx_perftest -E sleep under shim $mode: 200 iterations as without the shim;$sum"
    [[ $sum =~ fdset_ready=[1-9] ]] || { rxe_fail "$mode: no channel fd reported ready from a CQE:$sum"; return 1; }
}

# check_cq_ex HOW MODE [SEED]: channel-wait with extended receive CQs
# (IBV_WC_STANDARD_FLAGS; read in start_poll/end_poll batches, every
# field checked, the sequence number as immediate data) in its HOW
# form (epoll: the channel fd in an epoll set; block: blocking
# ibv_get_cq_event), with SEED the randomized stress; MODE "none" without
# the shim. Same checksum as without the shim; under the shim both
# extended CQs served (cqs_ex_served=2, none passed through), events
# synthesized from CQEs the shim looked at, and those CQEs delivered to the
# program's batches (stashed_cqes_delivered > 0: the receive CQs are read
# only through start_poll); under dispatch in the epoll form, waits handed
# off (a run in which every wait fell back is run again: rxe_until_handed_off).
check_cq_ex() {
    rxe_until_handed_off check_cq_ex_once "$@"
}

check_cq_ex_once() {
    local how=$1 mode=$2 seed=${3:-} exe out
    local tag="cq_ex/$how/$mode${seed:+ (stress seed $seed)}"
    local ref="$RXE_LOGDIR/.channel-wait-cqex-$how${seed:+-stress}.ref"
    exe=$(channel_wait_exe) || return
    out="$RXE_LOGDIR/$RXE_CUR_NAME.out"
    local -a pre=(env CHANNEL_WAIT_CQ_EX=1)
    [ "$mode" = none ] || { rxe_need_preload || return; pre+=(LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE="$mode" FASTWAKE_VERBOSE=1); }
    local rc=0
    channel_wait_run "$tag" "$mode" "$out" "$ref" "cq-ex-$how${seed:+-stress}-none" "${pre[@]}" \
        taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" "$exe" "$RXE_DEV" "$RXE_GID" 100 "$how" $seed || rc=$?
    [ "$rc" = 3 ] && return 0
    [ "$rc" = 0 ] || return 1
    local line=$CW_LINE verbs
    verbs=$(rxe_last_match "$out" 'verbs pid=') || { rxe_fail "$tag: no verbs counters"; return 1; }
    local served passed delivered synth
    served=$(channel_field "$verbs" cqs_ex_served); passed=$(channel_field "$verbs" cqs_ex_passed)
    delivered=$(channel_field "$verbs" stashed_cqes_delivered)
    [[ $verbs =~ events\ synthetic=([0-9]+) ]] && synth=${BASH_REMATCH[1]}
    [ "$served" = 2 ] && [ "$passed" = 0 ] || { rxe_fail "$tag: extended CQs not served (cqs_ex_served=$served cqs_ex_passed=$passed): $verbs"; return 1; }
    ! grep -q 'passes through' "$out" || { rxe_fail "$tag: a pass-through note: $(grep -m1 'passes through' "$out")"; return 1; }
    [ "${synth:-0}" -gt 0 ] && [ "${delivered:-0}" -gt 0 ] \
        || { rxe_fail "$tag: no event from a CQE the shim looked at reached a start_poll batch (synthetic=${synth:-?} stashed_cqes_delivered=${delivered:-?}): $verbs"; return 1; }
    local extra=""
    if [ "$mode" = dispatch ]; then
        local d h; d=$(rxe_last_match "$out" 'dispatch_waits=') || { rxe_fail "$tag: no dispatch counters"; return 1; }
        h=$(channel_field "$d" handoffs)
        [ "$how" = block ] || [ "${h:-0}" -gt 0 ] || { rxe_fail "$tag: no wait was handed off: $d"; return 1; }
        extra="; dispatch_waits=$(channel_field "$d" dispatch_waits) handoffs=$h"
    fi
    rxe_info "$tag under the shim: checksum = no-shim, both served; synthetic events=$synth, stashed CQEs shown to start_poll=$delivered, start_poll batches=$(channel_field "$line" cq_ex_batches)$extra"
}

# Round trips of the pre-wake check (the client waits once per trip).
RXE_PREWAKE_ITERS=${RXE_PREWAKE_ITERS:-500}

# check_channel_prewake MODE: channel-wait in its block form (a blocking
# channel, waited for in ibv_get_cq_event) against a server that is busy
# 2 ms before each reply; MODE "none" is the reference. Same checksum as
# the reference. Under adaptive the client's steady waits must be planned
# as pre-wakes (sleep on the channel's fd, then poll the armed CQs) and
# most of them caught; under hybrid there must be none.
#
# Why this setup (measured in this guest, TCG): its timers fire late,
# 120-290 us at p90 (a bare 1-2 ms ppoll, and the pre-wakes' own timers),
# so
# - the service is busy, not a sleep: behind a 2 ms nanosleep the
#   client's waits fell in two modes, 2.2-2.7 and 3.4-4.2 ms, and a
#   pre-wake's spin would have to cover the gap: adaptive rightly chose
#   interrupt mode (the learner's explain line, printed in a debug run:
#   "prewake ... not now" after 12 probes in 500 round trips, none in
#   200), which is what the first form of this check ran into;
# - FASTWAKE_BUDGET_US=2000 under adaptive: the ceiling bounds a
#   pre-wake's spin too (docs/design/adaptive.md), and the learned margin (the
#   timers' lateness p90, ~150-240 us here) is past the default 50 us, so
#   with it the spin ended before the reply in most pre-wakes (384
#   planned, 67 caught);
# - 500 round trips: 32 waits are learned first, then the timers are
#   probed, then the plan settles (308-461 of the 500 waits pre-woken in
#   4 of 4 runs, 97-99 % of them caught).
# Under TCG the learner's inputs (the wake-up's cost, the timers'
# lateness) are emulated, and some runs plan far fewer pre-wakes, or none
# (which input moved, I did not find). Of 14 runs of this check alone, 11
# pre-woke for 218-443 of the 500 waits at the first attempt and 3 for
# 182-186 (one of those then 30 at its second); in CI, attempts in a row
# gave 45 then 0, and 184, 41, 0; with the client and the server pinned
# to one CPU each, 2 of 4 runs fell short as well (133, 100, 66 and 54,
# 18, 140). So the check runs up to three attempts
# (it stops at one with pre-wakes for 2 in 5 of the waits) and judges the
# best: pre-wakes for 1 in 20 of the client's waits at least, 3 in 4 of
# them caught. The shim's pre-wake path is what this guest checks: that
# it fails when the shim does not pre-wake (adaptive:prewake=off: 0) or
# pre-wakes without catching (the default ceiling: 53 of 310 caught). How
# many waits a steady service gets pre-woken on a real timer is for the
# library's tests (adaptive_prewake), the shim's socket test
# (adaptive_prewakes_a_steady_socket_reply) and its liburing check
# (scripts/uring-test, steady: 1,167 of 1,200 in CI).
check_channel_prewake() {
    local mode=$1 exe out ref line n=$RXE_PREWAKE_ITERS tag="block/$1 (2 ms busy service)"
    exe=$(channel_wait_exe) || return
    out="$RXE_LOGDIR/$RXE_CUR_NAME.out"
    ref="$RXE_LOGDIR/.channel-wait-block.ref"
    local -a pre=()
    if [ "$mode" != none ]; then
        rxe_need_preload || return
        pre=(env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE="$mode" FASTWAKE_VERBOSE=1)
        [ "$mode" = adaptive ] && pre+=(FASTWAKE_BUDGET_US=2000)
    fi
    local rc eng verbs pw caught attempt best=-1 b_eng="" b_verbs="" b_caught=0 b_line=""
    for attempt in 1 2 3; do
        rc=0
        channel_wait_run "$tag" "$mode" "$out" "$ref" channel-prewake-none \
            "${pre[@]}" env CHANNEL_WAIT_SERVICE_US=2000 taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" "$exe" "$RXE_DEV" "$RXE_GID" "$n" block || rc=$?
        [ "$rc" = 3 ] && return 0
        [ "$rc" = 0 ] || return 1
        verbs=$(rxe_last_match "$out" 'verbs pid=') || { rxe_fail "$tag: no verbs counters (shim not loaded?)"; return 1; }
        # The engine line is printed only when its counters moved: none
        # means no pre-wake.
        eng=$(rxe_last_match "$out" ' prewakes=') || eng=""
        pw=$(channel_field "$eng" prewakes) || pw=0
        caught=$(channel_field "$eng" prewake_caught) || caught=0
        if [ "$pw" -gt "$best" ]; then
            best=$pw b_eng=$eng b_verbs=$verbs b_caught=$caught b_line=$CW_LINE
        fi
        [ "$mode" = adaptive ] && [ "$attempt" -lt 3 ] && [ $((5 * pw)) -lt $((2 * n)) ] || break
        rxe_info "$tag: attempt $attempt pre-woke for $pw of $n waits (2 in 5 ends the attempts): running once more (TCG timing)"
    done
    pw=$best eng=$b_eng verbs=$b_verbs caught=$b_caught line=$b_line
    if [ "$mode" = adaptive ]; then
        [ $((20 * pw)) -ge "$n" ] \
            || { rxe_fail "$tag: at best $pw pre-wakes for the client's $n waits in $attempt attempts (want 1 in 20): ${eng:-no engine counters}"; return 1; }
        [ $((4 * caught)) -ge $((3 * pw)) ] \
            || { rxe_fail "$tag: $caught of $pw pre-wakes caught (want 3 in 4): $eng"; return 1; }
        rxe_metric "channel-prewake.adaptive.prewakes" "$pw"
        rxe_metric "channel-prewake.adaptive.caught" "$caught"
    elif [ "$pw" != 0 ]; then
        rxe_fail "$tag: $pw pre-wakes outside adaptive mode: $eng"; return 1
    fi
    rxe_info "$tag under the shim: checksum = no-shim; prewakes=$pw caught=$caught of $n client waits ($(channel_field "$line" waits) in both threads); $(echo "$verbs" | grep -o 'events synthetic=[0-9]* real=[0-9]* swallowed=[0-9]*')"
}

rxe_channel_checks() {
    local how m
    # The library's verbs tests under the shim (random bursts, random wait
    # modes, destroy after odd events): the shim's blocking-channel path in
    # more modes (its VerbsCq sleeps in a raw ppoll, not through the hooks).
    for m in adaptive dispatch; do
        rxe_check "verbs-tests-under-shim-$m" check_verbs_tests "$m"
    done
    for how in epoll poll select; do
        rxe_check "channel-wait-$how-none" check_channel_wait "$how" none
        for m in $RXE_CHANNEL_MODES; do
            rxe_check "shim-channel-wait-$how-$m" rxe_until_handed_off check_channel_wait "$how" "$m"
        done
        # Randomized stress (bursts, random pauses), a new seed per guest
        # run, printed: zero lost/duplicated/reordered completions, same
        # checksum, every destroy returns.
        local seed=$((RANDOM + 1))
        rxe_check "channel-stress-$how-none" check_channel_wait "$how" none "$seed"
        for m in $RXE_CHANNEL_MODES; do
            rxe_check "shim-channel-stress-$how-$m" rxe_until_handed_off check_channel_wait "$how" "$m" "$seed"
        done
    done
    # Sleep, then poll for blocking ibv_get_cq_event.
    rxe_check channel-prewake-none check_channel_prewake none
    for m in hybrid adaptive; do
        rxe_check "shim-channel-prewake-$m" check_channel_prewake "$m"
    done
    # Extended CQs, served (the stress seed is drawn once, printed).
    local cqex_seed=$((RANDOM + 1))
    for how in epoll block stress; do
        local form=$how seed=""
        [ "$how" = stress ] && { form=epoll; seed=$cqex_seed; }
        rxe_check "cq-ex-$how-none" check_cq_ex "$form" none $seed
        for m in $RXE_CHANNEL_MODES; do
            rxe_check "shim-cq-ex-$how-$m" check_cq_ex "$form" "$m" $seed
        done
    done
    rxe_check ucx-perftest-sleep-none check_ucx none
    for m in $RXE_CHANNEL_MODES; do
        rxe_check "shim-ucx-perftest-sleep-$m" check_ucx "$m"
    done
    rxe_check rstream-rpoll-none check_rstream none
    for m in $RXE_CHANNEL_MODES; do
        rxe_check "shim-rstream-rpoll-$m" check_rstream "$m"
    done
}

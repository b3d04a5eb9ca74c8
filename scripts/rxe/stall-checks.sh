# shellcheck shell=bash
# rxe-test checks: the shim's stall monitor and ODP guard.
# Sourced by guest-checks.sh (helpers from guest-lib.sh).
#
# Loss needs a real wire: rxe hands traffic between two GIDs of one netdev
# (or any two local addresses with the same MAC) straight to itself, past
# every qdisc. scripts/rxe-test gives the guest two more NICs joined by a qemu
# hub (MACs 52:54:00:00:18:01 / :02); rxe_a on one and rxe_b on the other, with
# policy routes and static neighbours so 10.0.18.1 <-> 10.0.18.2 leaves
# through the NICs instead of the local route. tc netem drops on rxe_a's NIC.

# stall_wire: set up rxe_a/rxe_b over the hub (idempotent); sets STALL_A_NIC.
# (Its constants are set here, not at file level, so the function also works
# from a FASTWAKE_RXE_EXTRA script, which gets the functions only.)
stall_wire() {
    STALL_A_MAC=52:54:00:00:18:01 STALL_B_MAC=52:54:00:00:18:02
    STALL_A_IP=10.0.18.1 STALL_B_IP=10.0.18.2
    local d a="" b="" mac
    for d in /sys/class/net/*; do
        read -r mac <"$d/address"
        case $mac in "$STALL_A_MAC") a=${d##*/} ;; "$STALL_B_MAC") b=${d##*/} ;; esac
    done
    [ -n "$a" ] && [ -n "$b" ] || { rxe_reason "no NICs with MACs $STALL_A_MAC/$STALL_B_MAC (scripts/rxe-test too old?)"; return $RXE_SKIP; }
    STALL_A_NIC=$a
    [ -e /sys/class/infiniband/rxe_b ] && return 0
    ip addr add "$STALL_A_IP/32" dev "$a" && ip addr add "$STALL_B_IP/32" dev "$b" || { rxe_fail "ip addr add failed"; return 1; }
    ip link set "$a" up && ip link set "$b" up || { rxe_fail "ip link set up failed"; return 1; }
    local s
    for s in all "$a" "$b"; do
        sysctl -qw "net.ipv4.conf.$s.accept_local=1" "net.ipv4.conf.$s.rp_filter=0" || { rxe_fail "sysctl $s failed"; return 1; }
    done
    # Locally generated traffic between the two addresses takes the wire:
    # source-routed lookups come before the local table.
    ip rule add pref 100 lookup local && ip rule del pref 0 &&
        ip route add "$STALL_B_IP" dev "$a" src "$STALL_A_IP" table 181 &&
        ip route add "$STALL_A_IP" dev "$b" src "$STALL_B_IP" table 182 &&
        ip rule add pref 10 from "$STALL_A_IP" iif lo lookup 181 &&
        ip rule add pref 11 from "$STALL_B_IP" iif lo lookup 182 &&
        ip neigh replace "$STALL_B_IP" lladdr "$STALL_B_MAC" dev "$a" nud permanent &&
        ip neigh replace "$STALL_A_IP" lladdr "$STALL_A_MAC" dev "$b" nud permanent ||
        { rxe_fail "policy routes for the wire failed"; return 1; }
    rdma link add rxe_a type rxe netdev "$a" && rdma link add rxe_b type rxe netdev "$b" ||
        { rxe_fail "rdma link add rxe_a/rxe_b failed"; return 1; }
    local n=0 gid=""
    while [ $n -lt 100 ]; do
        read -r gid </sys/class/infiniband/rxe_b/ports/1/gids/1 2>/dev/null
        [ "$gid" = "0000:0000:0000:0000:0000:ffff:0a00:1202" ] && return 0
        rxe_sleep 0.1; n=$((n + 1))
    done
    rxe_fail "rxe_b GID 1 is '$gid', not ::ffff:$STALL_B_IP"
}

# stall_pair TAG ITERS [ENV...]: ibv_rc_pingpong server on rxe_a (vCPU 0),
# client on rxe_b (vCPU 1), both under the shim with the given extra env.
stall_pair() {
    local tag=$1 iters=$2; shift 2
    local port; port=$(rxe_next_port)
    local t=$(( RXE_CHECK_TIMEOUT > 10 ? RXE_CHECK_TIMEOUT - 5 : RXE_CHECK_TIMEOUT ))
    RXE_SERVER_LOG="$RXE_LOGDIR/$RXE_CUR_NAME.$tag.server.log"
    RXE_CLIENT_LOG="$RXE_LOGDIR/$RXE_CUR_NAME.$tag.client.log"
    local -a envs=(env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE=interrupt FASTWAKE_VERBOSE=1 "$@")
    echo "+ ${envs[*]} ibv_rc_pingpong -d rxe_a|rxe_b -g 1 -n $iters -s 64 -p $port"
    timeout -k 2 "$t" taskset -c "$RXE_SERVER_CPU" "${envs[@]}" ibv_rc_pingpong -d rxe_a -g 1 -n "$iters" -s 64 -p "$port" >"$RXE_SERVER_LOG" 2>&1 &
    local spid=$!
    rxe_wait_listen "$port" 20 || { kill "$spid"; wait "$spid"; rxe_fail "$tag: server did not listen"; return 1; }
    local crc=0 src=0
    timeout -k 2 "$t" taskset -c "$RXE_CLIENT_CPU" "${envs[@]}" ibv_rc_pingpong -d rxe_b -g 1 -n "$iters" -s 64 -p "$port" 127.0.0.1 >"$RXE_CLIENT_LOG" 2>&1 || crc=$?
    wait "$spid" || src=$?
    [ $crc = 0 ] && [ $src = 0 ] || { rxe_fail "$tag: client exit $crc, server exit $src: $(grep -v '^$' "$RXE_CLIENT_LOG" "$RXE_SERVER_LOG" | tail -n 1)"; return 1; }
}

# stall_summary LOG: the monitor's exit line ("stall monitor pid=... completions=N stalls=S ...").
stall_summary() { rxe_last_match "$1" '^fastwake-preload: stall monitor pid=' | sed 's/^fastwake-preload: //'; }
stall_field() { [[ $1 =~ (^| )$2=([0-9]+) ]] && echo "${BASH_REMATCH[2]}"; }

# No loss, 10^4 round trips (2 x 10^4 monitored SENDs): not one stall.
check_stall_none_without_loss() {
    rxe_need_preload || return
    stall_wire || return
    tc qdisc del dev "$STALL_A_NIC" root 2>/dev/null
    local iters=${RXE_STALL_ITERS:-10000} side sum c s total=0
    stall_pair noloss "$iters" || return 1
    rxe_pingpong_verify noloss "$iters" || return 1
    for side in "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG"; do
        sum=$(stall_summary "$side")
        [ -n "$sum" ] || { rxe_fail "no stall monitor exit line in $(basename "$side") (monitor not running?)"; return 1; }
        c=$(stall_field "$sum" completions) s=$(stall_field "$sum" stalls)
        [ "${c:-0}" -ge "$iters" ] || { rxe_fail "only ${c:-0} completions monitored in $(basename "$side"), want >= $iters"; return 1; }
        [ "${s:-x}" = 0 ] || { rxe_fail "$s stall(s) reported without loss: $(rxe_last_match "$side" 'stall: ')"; return 1; }
        total=$((total + c))
        rxe_info "${side##*.noloss.}: $sum"
    done
    rxe_info "no stall in $total monitored completions without loss"
}

# 5 % loss on rxe_a's NIC for the first seconds of the run: RC completions
# wait out the retransmission timeout (QP timeout 14 in ibv_rc_pingpong:
# 67 ms > the 50 ms threshold); the monitor must name those stalls. The
# loss stops before the end: a lost last ACK would leave one side
# retransmitting to a peer that has already exited.
check_stall_with_loss() {
    rxe_need_preload || return
    stall_wire || return
    local secs=${RXE_STALL_LOSS_SECS:-2} stat="$RXE_LOGDIR/$RXE_CUR_NAME.netem"
    tc qdisc replace dev "$STALL_A_NIC" root netem loss "${RXE_STALL_LOSS:-5%}" ||
        { rxe_fail "tc qdisc add netem failed (sch_netem loaded?)"; return 1; }
    ( rxe_sleep "$secs"; tc -s qdisc show dev "$STALL_A_NIC" >"$stat"; tc qdisc del dev "$STALL_A_NIC" root ) &
    local lossy=$! iters=${RXE_STALL_LOSS_ITERS:-1500} rc=0
    stall_pair loss "$iters" || rc=1
    wait "$lossy"
    tc qdisc del dev "$STALL_A_NIC" root 2>/dev/null
    rxe_info "netem for the first ${secs}s: $(tr '\n' ' ' <"$stat" | sed 's/  */ /g')"
    [ $rc = 0 ] || return 1
    rxe_pingpong_verify loss "$iters" || return 1
    local side n=0 line shown=0
    for side in "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG"; do
        while IFS= read -r line; do
            [[ $line == "fastwake-preload: stall: "* ]] || continue
            n=$((n + 1))
            [[ $line =~ qp\ 0x[0-9a-f]+\ (SEND|RDMA_WRITE|RDMA_READ|ATOMIC|OTHER)\ wr_id\ 0x[0-9a-f]+\ waited\ [0-9.]+\ ms ]] ||
                { rxe_fail "a stall line without QP, opcode or wait: $line"; return 1; }
            [ $shown -lt 3 ] && { rxe_info "${line#fastwake-preload: }"; shown=$((shown + 1)); }
        done <"$side"
        rxe_info "${side##*.loss.}: $(stall_summary "$side")"
    done
    [ $n -gt 0 ] || { rxe_fail "no stall reported with ${RXE_STALL_LOSS:-5%} loss"; return 1; }
    grep -h '^fastwake-preload: stall: ' "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG" | grep -q 'retransmission timeout' ||
        { rxe_fail "no stall named a retransmission timeout"; return 1; }
    rxe_info "$n stall episode line(s) with loss"
}

# A polling program's extended CQ (no channel: the shim passes it through)
# is still judged: channel-wait with extended send CQs
# (CHANNEL_WAIT_SCQ_EX=1, read in start_poll batches) under the shim, the
# monitor at its default threshold. Every send completion is one the
# monitor judged (completions >= 2N: both ends send N), none a stall; the
# verbose note says the CQ passes through and is judged. The build before
# this judged none of them (completions=0).
check_stall_cq_ex_passed_through() {
    rxe_need_preload || return
    declare -F channel_wait_exe >/dev/null || . "$RXE_SELF_DIR/channel-checks.sh"
    local exe out iters=200 sum c s
    exe=$(channel_wait_exe) || return
    out="$RXE_LOGDIR/$RXE_CUR_NAME.out"
    env CHANNEL_WAIT_SCQ_EX=1 LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE=interrupt FASTWAKE_VERBOSE=1 \
        taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" "$exe" "$RXE_DEV" "$RXE_GID" "$iters" epoll >"$out" 2>&1 ||
        { rxe_fail "channel-wait with extended send CQs: $(grep -v '^$' "$out" | tail -n 1)"; return 1; }
    rxe_last_match "$out" '^channel-wait ok ' >/dev/null || { rxe_fail "no 'channel-wait ok' line"; return 1; }
    grep -q 'passes through: it has no completion channel;.*the stall monitor still judges' "$out" ||
        { rxe_fail "no note that the channel-less extended CQ passes through and is judged: $(grep -m1 'extended CQ' "$out")"; return 1; }
    sum=$(stall_summary "$out")
    [ -n "$sum" ] || { rxe_fail "no stall monitor exit line (monitor not running?)"; return 1; }
    c=$(stall_field "$sum" completions) s=$(stall_field "$sum" stalls)
    [ "${c:-0}" -ge $((2 * iters)) ] ||
        { rxe_fail "only ${c:-0} send completions judged of $((2 * iters)) read from extended CQs: $sum"; return 1; }
    [ "${s:-x}" = 0 ] || { rxe_fail "$s stall(s) without loss: $(rxe_last_match "$out" 'stall: ')"; return 1; }
    rxe_info "extended send CQs without a channel, read in start_poll batches: $sum"
}

# A program asking for ODP fails on rxe (6.1: no ODP); under FASTWAKE_ODP=pin it runs.
check_odp_pin() {
    rxe_need_preload || return
    local iters=200
    if rxe_pair odp-plain -- ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" -o -c; then
        rxe_reason "ibv_rc_pingpong -o runs on $RXE_DEV without the shim: the device has ODP, nothing to prove"
        return $RXE_SKIP
    fi
    rxe_info "without the shim: $(grep -hv '^ *local\|^ *remote\|^$' "$RXE_CLIENT_LOG" "$RXE_SERVER_LOG" | head -n 1)"
    rxe_pair odp-pin -- env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE=interrupt FASTWAKE_ODP=pin \
        ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" -o -c || return 1
    rxe_pingpong_verify odp-pin "$iters" || return 1
    grep -q 'FASTWAKE_ODP=pin: ODP registrations are pinned' "$RXE_CLIENT_LOG" ||
        { rxe_fail "the shim did not say it pinned"; return 1; }
    rxe_info "with FASTWAKE_ODP=pin: $(grep -h 'FASTWAKE_ODP=pin' "$RXE_CLIENT_LOG" | head -n 1)"
}

# Bad values: one line each, defaults kept, the program unchanged.
check_stall_odp_bad_env() {
    rxe_need_preload || return
    local iters=200
    rxe_pair bad -- env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE=interrupt FASTWAKE_VERBOSE=1 \
        FASTWAKE_ODP=bogus FASTWAKE_STALL_MS=soon ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" -c || return 1
    rxe_pingpong_verify bad "$iters" || return 1
    [ "$(grep -c "FASTWAKE_ODP='bogus'" "$RXE_CLIENT_LOG")" = 1 ] || { rxe_fail "no single line for FASTWAKE_ODP=bogus"; return 1; }
    [ "$(grep -c "FASTWAKE_STALL_MS='soon'" "$RXE_CLIENT_LOG")" = 1 ] || { rxe_fail "no single line for FASTWAKE_STALL_MS=soon"; return 1; }
    [[ $(stall_summary "$RXE_CLIENT_LOG") == *threshold=50ms* ]] || { rxe_fail "the monitor did not keep its 50 ms default"; return 1; }
}

# Monitor on vs off, one run, alternating (ratios only: TCG timings are not
# performance figures).
check_stall_monitor_overhead() {
    rxe_need_preload || return
    local iters=2000 r on=() off=() line
    for r in 1 2 3 4; do
        local ms=off; [ $((r % 2)) = 1 ] && ms=50
        rxe_pair "ovh$r" -- env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE=interrupt FASTWAKE_STALL_MS=$ms \
            ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" || return 1
        line=$(rxe_last_match "$RXE_CLIENT_LOG" ' usec/iter') || { rxe_fail "no usec/iter line"; return 1; }
        [[ $line =~ =\ ([0-9.]+)\ usec/iter ]] || return 1
        if [ $ms = off ]; then off+=("${BASH_REMATCH[1]}"); else on+=("${BASH_REMATCH[1]}"); fi
    done
    rxe_info "ibv_rc_pingpong usec/iter (TCG, ratios only): monitor on ${on[*]}, off ${off[*]}; on/off ratio $(awk -v a="${on[*]}" -v b="${off[*]}" 'BEGIN{split(a,x," ");split(b,y," ");printf "%.2f", (x[1]+x[2])/(y[1]+y[2])}')"
}


# fastwake bench odp on rxe0 (no ODP on 6.1): one line saying so, then the
# pinned baseline rows only (small counts: TCG).
check_bench_odp() {
    rxe_need_fastwake || return
    local out="$RXE_LOGDIR/bench-odp.out" rc=0
    timeout -k 2 $((RXE_CHECK_TIMEOUT - 5)) "$RXE_FASTWAKE" bench odp --dev "$RXE_DEV" \
        --reps 3 --interval-us 0,500,2000 --qps 1,4 --ops 512 --timeout-s 20 >"$out" 2>&1 || rc=$?
    cat "$out"
    [ $rc = 0 ] || { rxe_fail "fastwake bench odp exit $rc: $(tail -n 1 "$out")"; return 1; }
    local line
    line=$(rxe_last_match "$out" 'running the pinned baseline only') ||
        { rxe_fail "no line saying the ODP rows cannot run on $RXE_DEV"; return 1; }
    rxe_info "$line"
    [ "$(grep -c '^damming  pinned' "$out")" = 3 ] && [ "$(grep -c '^flood    pinned' "$out")" = 2 ] ||
        { rxe_fail "expected 3 damming and 2 flood pinned rows"; return 1; }
    grep -q '^damming  odp\|^flood    odp' "$out" && { rxe_fail "ODP rows ran on a device without ODP"; return 1; }
    while IFS= read -r line; do rxe_info "$line (TCG: not a performance figure)"; done < <(grep -E '^(damming|flood) ' "$out")
}

# fastwake doctor's stall lines on rxe0 (and rxe_a/rxe_b when the loss checks ran).
check_doctor_rdma_stalls() {
    rxe_need_fastwake || return
    local out="$RXE_LOGDIR/doctor.out"
    "$RXE_FASTWAKE" doctor --gap-watch 10ms >"$out" 2>&1 || { rxe_fail "fastwake doctor failed: $(tail -n 1 "$out")"; return 1; }
    cat "$out"
    local odp ctr
    odp=$(rxe_last_match "$out" 'on-demand paging') || { rxe_fail "no on-demand paging line"; return 1; }
    [[ $odp == *"$RXE_DEV: no ODP"* ]] || { rxe_fail "the ODP line does not say $RXE_DEV has no ODP: $odp"; return 1; }
    ctr=$(rxe_last_match "$out" 'port error counters') || { rxe_fail "no port error counters line"; return 1; }
    rxe_last_match "$out" 'rc qp timeout' >/dev/null || { rxe_fail "no rc qp timeout line"; return 1; }
    rxe_info "${odp#  }"
    rxe_info "${ctr#  }"
}

rxe_stall_checks() {
    rxe_check stall-none-without-loss check_stall_none_without_loss
    rxe_check stall-with-loss check_stall_with_loss
    rxe_check stall-cq-ex-passed-through check_stall_cq_ex_passed_through
    rxe_check odp-pin-rc-pingpong check_odp_pin
    rxe_check stall-odp-bad-env check_stall_odp_bad_env
    rxe_check stall-monitor-overhead check_stall_monitor_overhead
    rxe_check bench-odp check_bench_odp
    rxe_check doctor-rdma-stalls check_doctor_rdma_stalls
}

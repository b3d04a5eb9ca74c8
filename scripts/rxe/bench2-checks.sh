# shellcheck shell=bash
# The two-process `fastwake bench pingpong --source verbs`
# (server without HOST, client with HOST), against itself and with perftest's
# ib_send_lat as the peer. Sourced by guest-checks.sh (helpers from
# guest-lib.sh). TCG timings are not performance figures: these checks look
# at completed iterations, data checks, refusals and the shim's counters.

RXE_B2_ITERS=${RXE_B2_ITERS:-300}
RXE_B2_LAT_ITERS=${RXE_B2_LAT_ITERS:-200}
RXE_B2_MODES=${RXE_B2_MODES:-poll,interrupt,hybrid,adaptive,dispatch}
RXE_B2_SHIM_MODES=${RXE_B2_SHIM_MODES:-none hybrid adaptive dispatch}

# b2_pair TAG: run the server command B2_SRV (array) with "-p PORT", then
# once it listens the client command B2_CLI with "-p PORT
# ${B2_HOST:-$RXE_IP}". fastwake pins itself (--cpus CLIENT,SERVER: the
# client end on the first CPU, the server end on the second); ib_send_lat
# gets taskset (b2_perftest). Logs in RXE_SERVER_LOG / RXE_CLIENT_LOG; exit
# codes in B2_SRC / B2_CRC. Returns 0 whatever they are.
b2_pair() {
    local tag=$1 port; port=$(rxe_next_port)
    local t=$(( RXE_CHECK_TIMEOUT > 10 ? RXE_CHECK_TIMEOUT - 5 : RXE_CHECK_TIMEOUT ))
    RXE_SERVER_LOG="$RXE_LOGDIR/$RXE_CUR_NAME.$tag.server.log"
    RXE_CLIENT_LOG="$RXE_LOGDIR/$RXE_CUR_NAME.$tag.client.log"
    echo "+ server: ${B2_SRV[*]} -p $port"
    echo "+ client: ${B2_CLI[*]} -p $port ${B2_HOST:-$RXE_IP}"
    timeout -k 2 "$t" "${B2_SRV[@]}" -p "$port" >"$RXE_SERVER_LOG" 2>&1 &
    local spid=$!
    B2_SRC=0 B2_CRC=0
    if ! rxe_wait_listen "$port" 20; then
        kill "$spid" 2>/dev/null; wait "$spid" 2>/dev/null
        B2_SRC=listen
        return 0
    fi
    timeout -k 2 "$t" "${B2_CLI[@]}" -p "$port" "${B2_HOST:-$RXE_IP}" >"$RXE_CLIENT_LOG" 2>&1 || B2_CRC=$?
    wait "$spid" || B2_SRC=$?
    echo "+ exit: server $B2_SRC, client $B2_CRC"
    echo "--- server log"; cat "$RXE_SERVER_LOG"
    echo "--- client log"; cat "$RXE_CLIENT_LOG"
}

b2_both_ok() {
    [ "$B2_SRC" = 0 ] && [ "$B2_CRC" = 0 ] && return 0
    rxe_fail "$1: server exit $B2_SRC, client exit $B2_CRC: $(grep -v '^$' "$RXE_CLIENT_LOG" "$RXE_SERVER_LOG" 2>/dev/null | grep -i 'error' | head -n 1)"
}

# b2_rows LOG: the table rows ("verbs MODE remote BYTES ITERS ...") of LOG.
b2_rows() { grep -E '^ verbs +[^ ]+ +remote +[0-9]+ +[0-9]+ ' "$1"; }

# b2_rows_verify LOG MODES(csv) ITERS: one row per mode, each with ITERS.
b2_rows_verify() {
    local log=$1 modes=$2 iters=$3 m row
    for m in ${modes//,/ }; do
        row=$(b2_rows "$log" | awk -v m="$m" '$2 == m') || true
        [ -n "$row" ] || { rxe_fail "no row for mode $m in $(basename "$log")"; return 1; }
        [ "$(awk '{print $5}' <<<"$row")" = "$iters" ] \
            || { rxe_fail "mode $m: expected $iters iterations in $(basename "$log"): $row"; return 1; }
    done
}

# fastwake <-> fastwake, every library mode interleaved, --out-json on both.
check_b2_fastwake() {
    rxe_need_fastwake || return
    local dev=${1:-$RXE_DEV} host=${2:-} cdev=${3:-$RXE_DEV}
    local js="$RXE_LOGDIR/$RXE_CUR_NAME.server.json" jc="$RXE_LOGDIR/$RXE_CUR_NAME.client.json"
    local common=(bench pingpong --source verbs -x "$RXE_GID" --mode "$RXE_B2_MODES"
        -n "$RXE_B2_ITERS" --warmup 20 --rounds 3 --cpus "$RXE_CLIENT_CPU,$RXE_SERVER_CPU")
    B2_SRV=("$RXE_FASTWAKE" "${common[@]}" -d "$dev" --out-json "$js")
    B2_CLI=("$RXE_FASTWAKE" "${common[@]}" -d "$cdev" --out_json "$jc")
    B2_HOST=$host b2_pair ff
    b2_both_ok ff || return 1
    b2_rows_verify "$RXE_CLIENT_LOG" "$RXE_B2_MODES" "$RXE_B2_ITERS" || return 1
    b2_rows_verify "$RXE_SERVER_LOG" "$RXE_B2_MODES" "$RXE_B2_ITERS" || return 1
    # The same rows on both sides (the client's, sent to the server).
    [ "$(b2_rows "$RXE_CLIENT_LOG")" = "$(b2_rows "$RXE_SERVER_LOG")" ] \
        || { rxe_fail "the server printed other rows than the client"; return 1; }
    local f role n
    for f in "$jc" "$js"; do
        role=client; [ "$f" = "$js" ] && role=server
        echo "--- $f"; cat "$f"
        # Every field of the run metadata, and one row per mode with the
        # iterations, both CPU shares and the peer.
        n=$(jq -e --arg role "$role" --arg dev "$( [ $role = client ] && echo "$cdev" || echo "$dev")" \
            --argjson iters "$RXE_B2_ITERS" '
            select(.run.version and .run.host and .run.date and .run.command
                   and .run.device == $dev and .run.role == $role and .run.ib_port == 1
                   and (.run.gid_index | type == "number") and .run.peer.program == "fastwake"
                   and .run.peer.version and .run.peer.device)
            | [.rows[] | select(.source == "verbs" and .iters == $iters and .size == 8
                   and (.cpu_us_per_op_ping | type == "number") and (.cpu_us_per_op_pong | type == "number")
                   and .peer == "fastwake" and .measured_by == "client")] | length' "$f") \
            || { rxe_fail "$role --out-json file $(basename "$f") is not valid or lacks run metadata"; return 1; }
        [ "$n" = "$(tr ',' '\n' <<<"$RXE_B2_MODES" | grep -c .)" ] \
            || { rxe_fail "$role --out-json: $n complete rows, expected one per mode"; return 1; }
    done
    rxe_info "client table: $(grep -c . < <(b2_rows "$RXE_CLIENT_LOG")) rows x $RXE_B2_ITERS round trips, every message's sequence number checked; server printed the same rows; --out-json valid on both sides (jq)"
    local r
    while IFS= read -r r; do
        # mode, then cpu/op ping+pong (TCG: not performance figures)
        rxe_info "  $(awk '{printf "%-10s iters %s cpu/op(ping+pong) %s", $2, $5, $14}' <<<"$r")"
    done < <(b2_rows "$RXE_CLIENT_LOG")
}

# Two devices: server on rxe_a, client on rxe_b, RDMA over the hub wire
# (the stall checks' NICs), TCP over loopback.
check_b2_two_devices() {
    rxe_need_fastwake || return
    declare -F stall_wire >/dev/null || . "$RXE_SELF_DIR/stall-checks.sh"
    stall_wire || return
    RXE_B2_MODES=poll,interrupt,hybrid check_b2_fastwake rxe_a 127.0.0.1 rxe_b || return 1
    # The library's stall monitor watched every SEND: without loss, no
    # stall is named.
    ! grep -h 'end: stall: ' "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG" \
        || { rxe_fail "a stall was named without loss"; return 1; }
}

# Both ends refuse other parameters, with one line each.
check_b2_mismatch() {
    rxe_need_fastwake || return
    local common=(bench pingpong --source verbs -d "$RXE_DEV" -x "$RXE_GID" --mode poll -n 50
        --cpus "$RXE_CLIENT_CPU,$RXE_SERVER_CPU")
    B2_SRV=("$RXE_FASTWAKE" "${common[@]}" -s 8)
    B2_CLI=("$RXE_FASTWAKE" "${common[@]}" -s 64)
    b2_pair mm
    [ "$B2_SRC" != 0 ] && [ "$B2_CRC" != 0 ] || { rxe_fail "exit codes server $B2_SRC client $B2_CRC, expected both non-zero"; return 1; }
    local side l
    for side in "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG"; do
        l=$(grep -c '^fastwake: error: .*runs with other parameters (size: -s' "$side")
        [ "$l" = 1 ] || { rxe_fail "$(basename "$side"): no single refusal line"; return 1; }
        grep -q 'panicked' "$side" && { rxe_fail "panic in $(basename "$side")"; return 1; }
    done
    rxe_info "server: $(grep '^fastwake: error' "$RXE_SERVER_LOG")"
    rxe_info "client: $(grep '^fastwake: error' "$RXE_CLIENT_LOG")"
}

# b2_one_line WHAT WANT CMD...: CMD exits non-zero within 20 s with exactly
# one line on stderr, "fastwake: error: ...WANT...".
b2_one_line() {
    local what=$1 want=$2; shift 2
    local err="$RXE_LOGDIR/$RXE_CUR_NAME.err" rc=0
    timeout -k 2 20 "$@" >/dev/null 2>"$err" || rc=$?
    echo "+ $what: exit $rc: $(cat "$err")"
    [ $rc != 0 ] && [ $rc != 124 ] || { rxe_fail "$what: exit $rc"; return 1; }
    [ "$(grep -c . "$err")" = 1 ] && grep -q "^fastwake: error: .*$want" "$err" \
        || { rxe_fail "$what: not one line with '$want': $(head -c 300 "$err")"; return 1; }
    rxe_info "$what: $(cat "$err")"
}

check_b2_bad_input() {
    rxe_need_fastwake || return
    local fw=("$RXE_FASTWAKE" bench pingpong --source verbs -n 10)
    local port; port=$(rxe_next_port)
    b2_one_line "unknown device" "RDMA device 'nosuch' not found" "${fw[@]}" -d nosuch "$RXE_IP" || return 1
    b2_one_line "bad GID index" "GID index 200 of $RXE_DEV port 1" "${fw[@]}" -d "$RXE_DEV" -x 200 "$RXE_IP" || return 1
    b2_one_line "empty GID entry" "GID index 7 of $RXE_DEV port 1" "${fw[@]}" -d "$RXE_DEV" -x 7 "$RXE_IP" || return 1
    b2_one_line "port out of range" "$RXE_DEV has no port 2" "${fw[@]}" -d "$RXE_DEV" -i 2 "$RXE_IP" || return 1
    b2_one_line "port 0" "" "${fw[@]}" -d "$RXE_DEV" -i 0 "$RXE_IP" || return 1
    b2_one_line "unreachable peer" "cannot connect to $RXE_IP:$port" "${fw[@]}" -d "$RXE_DEV" -p "$port" "$RXE_IP" || return 1
    # A peer of another protocol: ibv_rc_pingpong's client sends its own
    # keys ("0000:000011:..."), which are no version message.
    port=$(rxe_next_port)
    local err="$RXE_LOGDIR/$RXE_CUR_NAME.proto.err" rc=0
    timeout -k 2 20 "${fw[@]}" -d "$RXE_DEV" -p "$port" >/dev/null 2>"$err" &
    local spid=$!
    rxe_wait_listen "$port" 20 || { rxe_fail "the server did not listen"; return 1; }
    timeout -k 2 20 ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -p "$port" "$RXE_IP" >/dev/null 2>&1 || true
    wait "$spid" || rc=$?
    grep -v '^verbs: server on' "$err" >"$err.1" || true
    echo "+ other protocol: exit $rc: $(cat "$err")"
    [ $rc != 0 ] && [ $rc != 124 ] && [ "$(grep -c . "$err.1")" = 1 ] &&
        grep -q "^fastwake: error: .*speaks neither perftest's nor fastwake's protocol" "$err.1" \
        || { rxe_fail "other protocol: exit $rc: $(head -c 300 "$err")"; return 1; }
    rxe_info "other protocol (ibv_rc_pingpong client): $(cat "$err.1")"
}

# b2_shim_counters LOG: the shim's verbs exit counters of LOG, one line.
b2_shim_counters() {
    local c
    c=$(rxe_last_match "$1" '^fastwake-preload: verbs pid=') || { echo "no shim verbs line"; return 1; }
    echo "${c#fastwake-preload: }"
}

# check_b2_send_lat SIDE MODE: ib_send_lat -e as the SIDE (server|client)
# under the shim in MODE (none: without it), a fastwake end with -e as the
# other side.
check_b2_send_lat() {
    rxe_need_fastwake || return
    local side=$1 mode=$2 iters=$RXE_B2_LAT_ITERS
    [ "$mode" = none ] || { rxe_need_preload || return; }
    local pt=(ib_send_lat -d "$RXE_DEV" -x "$RXE_GID" -n "$iters" -e)
    [ "$mode" = none ] || pt=("$RXE_FASTWAKE" run --mode "$mode" --verbose -- "${pt[@]}")
    local fw=("$RXE_FASTWAKE" bench pingpong --source verbs -d "$RXE_DEV" -x "$RXE_GID" -n "$iters" -e -s 2
        --cpus "$RXE_CLIENT_CPU,$RXE_SERVER_CPU" --out-json "$RXE_LOGDIR/$RXE_CUR_NAME.json")
    if [ "$side" = server ]; then
        B2_SRV=(taskset -c "$RXE_SERVER_CPU" "${pt[@]}") B2_CLI=("${fw[@]}")
    else
        B2_SRV=("${fw[@]}") B2_CLI=(taskset -c "$RXE_CLIENT_CPU" "${pt[@]}")
    fi
    b2_pair pt
    b2_both_ok "ib_send_lat $side ($mode)" || return 1
    local ptlog=$RXE_SERVER_LOG fwlog=$RXE_CLIENT_LOG want=$iters
    [ "$side" = client ] && { ptlog=$RXE_CLIENT_LOG fwlog=$RXE_SERVER_LOG want=$((iters - 1)); }
    local row
    row=$(rxe_last_match "$ptlog" "^ *2 +$iters +([0-9]|inf|-?nan)") \
        || { rxe_fail "no ib_send_lat result row '2 $iters ...' in $(basename "$ptlog")"; return 1; }
    b2_rows_verify "$fwlog" interrupt "$want" || return 1
    grep -q 'the peer is perftest' "$fwlog" || { rxe_fail "the fastwake end did not see perftest"; return 1; }
    jq -e --argjson n "$want" '.run.peer.program | startswith("perftest")' "$RXE_LOGDIR/$RXE_CUR_NAME.json" >/dev/null \
        || { rxe_fail "--out-json does not name perftest as the peer"; return 1; }
    local info="ib_send_lat -e $side: $iters iterations ('$(echo $row | cut -d' ' -f1-5) ...'); fastwake $( [ "$side" = server ] && echo client || echo server) -e: $want timed round trips"
    if [ "$mode" != none ]; then
        local c; c=$(b2_shim_counters "$ptlog") || { rxe_fail "$mode: the shim's verbs counters are missing in $(basename "$ptlog")"; return 1; }
        grep -q 'contexts wrapped=1' <<<"$c" || { rxe_fail "$mode: the shim did not wrap ib_send_lat's context: $c"; return 1; }
        local w; w=$(grep -o ' waits=[0-9]*' <<<"$c" | head -n 1)
        [ "${w# waits=}" -gt 0 ] 2>/dev/null || { rxe_fail "$mode: no ibv_get_cq_event served by the shim: $c"; return 1; }
        # Shown, not required: a wait whose CQE is there at the first look
        # is served without the dispatcher (one run: 3 hand-offs as the
        # server, 0 as the client, all 400 waits served synthetically).
        [ "$mode" = dispatch ] && info="$info; $(grep -o 'dispatch_waits=[0-9]* handoffs=[0-9]*' "$ptlog" | tail -n 1)"
        info="$info; shim: $(grep -o 'waits=[0-9]* events synthetic=[0-9]* real=[0-9]*' <<<"$c" | head -n 1)"
    fi
    rxe_info "$info"
}

rxe_bench2_checks() {
    rxe_check bench2-fastwake-fastwake check_b2_fastwake
    rxe_check bench2-two-devices check_b2_two_devices
    rxe_check bench2-mismatch check_b2_mismatch
    rxe_check bench2-bad-input check_b2_bad_input
    local m
    for m in $RXE_B2_SHIM_MODES; do
        rxe_check "bench2-send-lat-server-$m" check_b2_send_lat server "$m"
        rxe_check "bench2-send-lat-client-$m" check_b2_send_lat client "$m"
    done
}

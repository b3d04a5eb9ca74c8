# shellcheck shell=bash
# The C ABI for verbs, in the rxe-test guest (sourced by
# guest-checks.sh). crates/fastwake-capi/tests/abi.c's verbs part (`abi
# verbs N`): a C program creates its own CQs and completion channels, has
# fastwake wait on them (fw_verbs_cq_wait) in every mode, and ping-pongs
# data-checked messages between two RC QPs on rxe0; the vector helper, the
# channel rules, bad input and the program's own teardown (no unacked
# event left) are checked too. TCG timings are not figures: none are read.

RXE_CAPI_ITERS=${RXE_CAPI_ITERS:-300}
RXE_CAPI_MODES="poll interrupt hybrid:20us adaptive dispatch"

# abi.c built against the static libfastwake.a (no SONAME or library path
# to arrange) with the host root's compiler and rdma-core headers, once per
# guest run.
capi_verbs_exe() {
    local exe="$RXE_LOGDIR/c-abi-verbs" src="$RXE_REPO/crates/fastwake-capi/tests/abi.c"
    local lib="$RXE_BIN_DIR/libfastwake.a" inc="$RXE_REPO/crates/fastwake-capi/include"
    [ -f "$lib" ] || { rxe_reason "libfastwake.a not built: run cargo build --release first"; return $RXE_SKIP; }
    [ -x "$exe" ] && [ "$exe" -nt "$src" ] && [ "$exe" -nt "$lib" ] && { echo "$exe"; return 0; }
    command -v cc >/dev/null || { rxe_reason "no C compiler (cc) in the host root"; return $RXE_SKIP; }
    [ -f /usr/include/infiniband/verbs.h ] || { rxe_reason "no rdma-core headers (libibverbs-dev) in the host root"; return $RXE_SKIP; }
    cc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -DFW_TEST_VERBS -I"$inc" "$src" "$lib" \
        -lpthread -ldl -lm -libverbs -o "$exe" >"$RXE_LOGDIR/c-abi-verbs.build.log" 2>&1 \
        || { rxe_fail "abi.c did not build: $(grep -v '^$' "$RXE_LOGDIR/c-abi-verbs.build.log" | tail -n 1)"; return 1; }
    echo "$exe"
}

# Run abi.c's part $1 (verbs, shared-cq) with $2 iterations into the
# check's .out and print it; fail on a crash, a SKIPPED part (the guest has
# the device), a FAIL line or a non-zero exit. On success CAPI_SUMMARY
# holds its "c-abi: N passed, M failed" line.
capi_run_part() {
    local part=$1 iters=$2 exe out line rc=0
    exe=$(capi_verbs_exe) || return
    out="$RXE_LOGDIR/$RXE_CUR_NAME.out"
    FASTWAKE_TEST_VERBS_DEV="$RXE_DEV" FASTWAKE_TEST_VERBS_GID="$RXE_GID" \
        taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" "$exe" "$part" "$iters" >"$out" 2>&1 || rc=$?
    cat "$out"
    if [ $rc -gt 128 ] && [ $rc != 137 ] && command -v gdb >/dev/null; then
        # A crash: where, from a second run under gdb (the log keeps it).
        echo "+ exit $rc: again under gdb for a backtrace"
        FASTWAKE_TEST_VERBS_DEV="$RXE_DEV" FASTWAKE_TEST_VERBS_GID="$RXE_GID" \
            taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" gdb -q -batch -ex run -ex 'thread apply all bt 12' \
            --args "$exe" "$part" "$iters" 2>&1 | tail -n 60
    fi
    CAPI_SUMMARY=$(rxe_last_match "$out" '^c-abi: [0-9]+ passed, [0-9]+ failed') \
        || { rxe_fail "no 'c-abi: N passed' line (exit $rc): $(grep -v '^$' "$out" | tail -n 1)"; return 1; }
    if line=$(rxe_last_match "$out" '^SKIPPED '); then
        rxe_fail "the $part part did not run in the guest: $line"; return 1
    fi
    if line=$(rxe_last_match "$out" '^FAIL '); then
        rxe_fail "$line ($CAPI_SUMMARY)"; return 1
    fi
    [ $rc = 0 ] || { rxe_fail "exit $rc: $CAPI_SUMMARY"; return 1; }
}

check_capi_verbs() {
    local out="$RXE_LOGDIR/$RXE_CUR_NAME.out" line mode
    capi_run_part verbs "$RXE_CAPI_ITERS" || return
    for mode in $RXE_CAPI_MODES; do
        rxe_last_match "$out" "^PASS verbs: $RXE_CAPI_ITERS round trips over RC, $mode\$" >/dev/null \
            || { rxe_fail "no passed round trips in mode $mode"; return 1; }
        line=$(rxe_last_match "$out" "^INFO verbs $mode: ") && rxe_info "${line#INFO verbs }"
    done
    line=$(rxe_last_match "$out" '^INFO verbs: device ') && rxe_info "${line#INFO verbs: }"
    rxe_info "$CAPI_SUMMARY (abi.c's verbs part: $RXE_CAPI_ITERS data-checked round trips per mode, vector helper, channel rules, bad input, teardown)"
}

# The per-core shared CQ from C (abi.c's `shared-cq` part): four RC
# QPs on one CQ that fastwake made on the program's context, an owner
# thread per QP on one CPU waiting on its inbox in each mode (the
# dispatcher's hand-offs counted), every completion routed and none lost,
# a completion without an inbox kept and given back.
RXE_CAPI_SHARED_ROUNDS=${RXE_CAPI_SHARED_ROUNDS:-100}
RXE_CAPI_SHARED_MODES="interrupt hybrid:20us adaptive dispatch"

check_capi_shared_cq() {
    local out="$RXE_LOGDIR/$RXE_CUR_NAME.out" line mode
    capi_run_part shared-cq "$RXE_CAPI_SHARED_ROUNDS" || return
    for mode in $RXE_CAPI_SHARED_MODES; do
        rxe_last_match "$out" "^PASS shared CQ: $RXE_CAPI_SHARED_ROUNDS rounds over [0-9]+ RC QPs, $mode\$" >/dev/null \
            || { rxe_fail "no passed rounds in mode $mode"; return 1; }
        line=$(rxe_last_match "$out" "^INFO shared-cq $mode: ") && rxe_info "${line#INFO shared-cq }"
    done
    rxe_last_match "$out" '^PASS shared CQ: a completion without an inbox is kept and taken back$' >/dev/null \
        || { rxe_fail "the unrouted completion check did not pass"; return 1; }
    rxe_last_match "$out" '^PASS shared CQ: FW_ROUTE_WR_ID_HIGH routes by wr_id' >/dev/null \
        || { rxe_fail "the wr_id route check did not pass"; return 1; }
    rxe_info "$CAPI_SUMMARY (abi.c's shared CQ part: $RXE_CAPI_SHARED_ROUNDS data-checked rounds over 4 QPs per mode, unrouted completions, the wr_id route, bad input, teardown)"
}

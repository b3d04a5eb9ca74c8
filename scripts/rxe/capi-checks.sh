# shellcheck shell=bash
# Issue 15, item 3: the C ABI for verbs, in the rxe-test guest (sourced by
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

check_capi_verbs() {
    local exe out line summary mode
    exe=$(capi_verbs_exe) || return
    out="$RXE_LOGDIR/$RXE_CUR_NAME.out"
    local rc=0
    FASTWAKE_TEST_VERBS_DEV="$RXE_DEV" FASTWAKE_TEST_VERBS_GID="$RXE_GID" \
        taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" "$exe" verbs "$RXE_CAPI_ITERS" >"$out" 2>&1 || rc=$?
    cat "$out"
    if [ $rc -gt 128 ] && [ $rc != 137 ] && command -v gdb >/dev/null; then
        # A crash: where, from a second run under gdb (the log keeps it).
        echo "+ exit $rc: again under gdb for a backtrace"
        FASTWAKE_TEST_VERBS_DEV="$RXE_DEV" FASTWAKE_TEST_VERBS_GID="$RXE_GID" \
            taskset -c "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" gdb -q -batch -ex run -ex 'thread apply all bt 12' \
            --args "$exe" verbs "$RXE_CAPI_ITERS" 2>&1 | tail -n 60
    fi
    summary=$(rxe_last_match "$out" '^c-abi: [0-9]+ passed, [0-9]+ failed') \
        || { rxe_fail "no 'c-abi: N passed' line (exit $rc): $(grep -v '^$' "$out" | tail -n 1)"; return 1; }
    if line=$(rxe_last_match "$out" '^SKIPPED '); then
        rxe_fail "the verbs part did not run in the guest: $line"; return 1
    fi
    if line=$(rxe_last_match "$out" '^FAIL '); then
        rxe_fail "$line ($summary)"; return 1
    fi
    [ $rc = 0 ] || { rxe_fail "exit $rc: $summary"; return 1; }
    for mode in $RXE_CAPI_MODES; do
        rxe_last_match "$out" "^PASS verbs: $RXE_CAPI_ITERS round trips over RC, $mode\$" >/dev/null \
            || { rxe_fail "no passed round trips in mode $mode"; return 1; }
        line=$(rxe_last_match "$out" "^INFO verbs $mode: ") && rxe_info "${line#INFO verbs }"
    done
    line=$(rxe_last_match "$out" '^INFO verbs: device ') && rxe_info "${line#INFO verbs: }"
    rxe_info "$summary (abi.c's verbs part: $RXE_CAPI_ITERS data-checked round trips per mode, vector helper, channel rules, bad input, teardown)"
}

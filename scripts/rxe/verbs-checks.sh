# shellcheck shell=bash
# Verbs checks for the rxe-test guest (sourced by guest-checks.sh; owner: the
# verbs source / libibverbs shim). Every check here needs the project's
# binaries and SKIPs loudly without them. TCG timings are not performance:
# latencies are only compared as ratios within one run.

RXE_VERBS_MODES=${RXE_VERBS_MODES:-interrupt hybrid poll adaptive dispatch}
RXE_VERBS_RC_ITERS=${RXE_VERBS_RC_ITERS:-300}
RXE_VERBS_LAT_ITERS=${RXE_VERBS_LAT_ITERS:-200}

# awk helper: ratio a/b with 2 decimals.
rxe_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# The project's verbs integration tests (built by the host before booting:
# target/release/deps/verbs_source-*).
# check_verbs_tests [SHIM_MODE [FILTER]]: with a mode, the same tests run under the
# preload shim (fastwake binds libibverbs through the global scope, like a C
# program), so its random-burst test is also a stress test of the shim's
# synthetic events and ack accounting, and its destroy test checks that acks
# still balance. With a FILTER, only the tests whose names contain it (at
# least one must run), and their counter lines (`shared CQ, ...`) are shown.
check_verbs_tests() {
    local shim_mode=${1:-} filter=${2:-} t
    t=$(ls -t "$RXE_BIN_DIR"/deps/verbs_source-* 2>/dev/null | grep -v '\.d$' | head -n 1)
    [ -n "$t" ] && [ -x "$t" ] || { rxe_reason "verbs_source test binary not built (cargo test --release -p fastwake --test verbs_source --no-run)"; return $RXE_SKIP; }
    local out="$RXE_LOGDIR/$RXE_CUR_NAME.out" rc=0
    local pre=()
    if [ -n "$shim_mode" ]; then
        rxe_need_preload || return
        pre=(env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE="$shim_mode" FASTWAKE_VERBOSE=1)
    fi
    "${pre[@]}" env FASTWAKE_TEST_VERBS_DEV="$RXE_DEV" "$t" ${filter:+"$filter"} --test-threads=1 --nocapture >"$out" 2>&1 || rc=$?
    cat "$out"
    [ $rc = 0 ] && grep -q '^test result: ok' "$out" || { rxe_fail "verbs_source tests failed: $(grep -E '^test .* FAILED|panicked' "$out" | head -n 1)"; return 1; }
    ! grep -q '^SKIPPED' "$out" || { rxe_fail "a verbs test SKIPPED although $RXE_DEV exists: $(grep -m1 '^SKIPPED' "$out")"; return 1; }
    if [ -n "$shim_mode" ]; then
        grep -q 'verbs pid=.* contexts wrapped=[1-9]' "$out" || { rxe_fail "the shim did not wrap the tests' contexts"; return 1; }
        rxe_info "under shim $shim_mode: $(grep -o 'contexts wrapped=.*' "$out" | tail -n 1)"
    fi
    if [ -n "$filter" ]; then
        grep -qE '^test result: ok\. [1-9]' "$out" || { rxe_fail "no test matched '$filter'"; return 1; }
        local line
        while read -r line; do rxe_info "$line"; done < <(grep -oE 'shared CQ, .*' "$out")
    fi
    rxe_info "$(grep -E '^test result' "$out")"
}

# fastwake bench pingpong --source verbs in every library wait mode (dispatch:
# see verbs-tests; the bench starts no dispatchers), one run;
# per-mode latency as a ratio to poll.
check_verbs_bench() {
    rxe_need_fastwake || return
    local out="$RXE_LOGDIR/verbs-bench.json"
    "$RXE_FASTWAKE" bench pingpong --source verbs --local --dev "$RXE_DEV" --cpus "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" \
        --mode poll,interrupt,hybrid,adaptive --iters 1000 --warmup 100 --rounds 5 --json >"$out" \
        || { rxe_fail "fastwake bench pingpong --source verbs failed: $(tail -n 1 "$out")"; return 1; }
    cat "$out"
    local ratios
    ratios=$(python3 - "$out" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
rows = [r for r in rows if r["source"] == "verbs"]
assert len(rows) == 4, f"expected 4 verbs rows, got {len(rows)}"
poll = next(r for r in rows if r["mode"] == "poll")["t_typical"]
for r in rows:
    assert r["iters"] == 1000, r
    print(r["mode"], "%.2f" % (r["t_typical"] / poll), "%.2f" % (r["cpu_us_per_op"] / max(1e-9, next(x for x in rows if x["mode"] == "poll")["cpu_us_per_op"])))
PY
) || { rxe_fail "bad bench output: $(tail -n 1 "$out")"; return 1; }
    local mode lat cpu
    while read -r mode lat cpu; do
        rxe_metric "verbs.$mode.t_typical_ratio_to_poll" "$lat"
        rxe_info "bench verbs $mode: t_typical = $lat x poll, cpu/op = $cpu x poll (TCG: ratios only)"
    done <<<"$ratios"
}

# verbs_perftest_row ITERS LOG: the perftest result row "2 ITERS ..." of LOG;
# prints t_typical (may be "inf": perftest's clock calibration fails under
# TCG; the iteration count is what is checked).
verbs_perftest_row() {
    local row; row=$(grep -E "^ *2 +$1 +[0-9a-z.-]+" "$2" | tail -n 1)
    [ -n "$row" ] || return 1
    awk '{print $5}' <<<"$row"
}

# check_shim_rc MODE: unmodified ibv_rc_pingpong -e -c (validates the data)
# with both sides under `fastwake run --mode MODE`; same iteration count as
# the no-shim run (made once per guest run, by the first mode's check); the
# shim must have wrapped the context (verbose line).
check_shim_rc() {
    rxe_need_fastwake || return
    rxe_need_preload || return
    local mode=$1 iters=$RXE_VERBS_RC_ITERS base
    # The no-shim run, once per guest run (the first mode's check makes it).
    local bf="$RXE_LOGDIR/.verbs-rc-base"
    if [ ! -s "$bf" ]; then
        rxe_pair base -- ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" -e -c || return 1
        rxe_pingpong_verify base "$iters" || return 1
        sed -E -n 's/.* = ([0-9.]+) usec\/iter.*/\1/p' "$RXE_CLIENT_LOG" | tail -n 1 >"$bf"
    fi
    base=$(cat "$bf")
    rxe_pair "$mode" -- "$RXE_FASTWAKE" run --mode "$mode" --verbose -- \
        ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" -e -c || return 1
    rxe_pingpong_verify "$mode" "$iters" || return 1
    local shim; shim=$(sed -E -n 's/.* = ([0-9.]+) usec\/iter.*/\1/p' "$RXE_CLIENT_LOG" | tail -n 1)
    local side
    for side in "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG"; do
        grep -q 'verbs pid=.* contexts wrapped=1' "$side" \
            || { rxe_fail "$mode: the shim did not wrap the context in $(basename "$side")"; return 1; }
        grep 'verbs pid=' "$side"
    done
    if [ "$mode" = dispatch ]; then
        # The completion-channel waits went through the dispatcher: some
        # were handed off (not only caught by the owner's own look).
        local h
        h=$(grep -o 'dispatch_waits=[0-9]* handoffs=[0-9]*' "$RXE_CLIENT_LOG" | tail -n 1)
        [ -n "$h" ] && [ "${h##*handoffs=}" -gt 0 ] \
            || { rxe_fail "dispatch: no ibv_get_cq_event was handed off (${h:-no dispatch counters})"; return 1; }
        rxe_info "dispatch: $h"
    fi
    rxe_info "rc_pingpong -e under shim $mode: $iters iters, data checked (-c); usec/iter = $(rxe_ratio "$shim" "$base") x no-shim (TCG: ratio only); $(grep -o 'events synthetic=[0-9]* real=[0-9]* swallowed=[0-9]*' "$RXE_CLIENT_LOG")"
}

# check_shim_send_lat MODE: unmodified ib_send_lat -e under the shim.
check_shim_send_lat() {
    rxe_need_fastwake || return
    rxe_need_preload || return
    local mode=$1 iters=$RXE_VERBS_LAT_ITERS
    local side base shim
    local bf="$RXE_LOGDIR/.verbs-lat-base"
    if [ ! -s "$bf" ]; then
        rxe_pair base -- ib_send_lat -d "$RXE_DEV" -x "$RXE_GID" -n "$iters" -e || return 1
        for side in "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG"; do
            verbs_perftest_row "$iters" "$side" >/dev/null || { rxe_fail "base: no '2 $iters ...' row in $(basename "$side")"; return 1; }
        done
        verbs_perftest_row "$iters" "$RXE_CLIENT_LOG" >"$bf"
    fi
    base=$(cat "$bf")
    rxe_pair "$mode" -- "$RXE_FASTWAKE" run --mode "$mode" --verbose -- \
        ib_send_lat -d "$RXE_DEV" -x "$RXE_GID" -n "$iters" -e || return 1
    for side in "$RXE_SERVER_LOG" "$RXE_CLIENT_LOG"; do
        verbs_perftest_row "$iters" "$side" >/dev/null || { rxe_fail "$mode: no '2 $iters ...' row in $(basename "$side")"; return 1; }
        grep -q 'verbs pid=.* contexts wrapped=1' "$side" \
            || { rxe_fail "$mode: the shim did not wrap the context in $(basename "$side")"; return 1; }
    done
    shim=$(verbs_perftest_row "$iters" "$RXE_CLIENT_LOG")
    rxe_metric "shim-send-lat.$mode.t_typical_ratio_to_noshim" "$(rxe_ratio "$shim" "$base")"
    rxe_info "ib_send_lat -e under shim $mode: $iters iters on both sides; t_typical = $(rxe_ratio "$shim" "$base") x no-shim (TCG: ratio only; n/a or inf when perftest's clock calibration fails under TCG)"
}

# Pass-through: a bad FASTWAKE_VERBS_VECTOR gives one line and the program
# runs untouched.
check_shim_bad_env() {
    rxe_need_preload || return
    local iters=200
    rxe_pair bad -- env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE=hybrid FASTWAKE_VERBOSE=1 FASTWAKE_VERBS_VECTOR=bogus \
        ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" -e -c || return 1
    rxe_pingpong_verify bad "$iters" || return 1
    [ "$(grep -c "FASTWAKE_VERBS_VECTOR='bogus'" "$RXE_CLIENT_LOG")" = 1 ] \
        || { rxe_fail "no single diagnostic line for FASTWAKE_VERBS_VECTOR=bogus"; return 1; }
    grep -q 'contexts wrapped=' "$RXE_CLIENT_LOG" && { rxe_fail "verbs were not passed through"; return 1; }
    return 0
}

rxe_verbs_checks() {
    rxe_check verbs-tests check_verbs_tests
    rxe_check verbs-tests-under-shim-hybrid check_verbs_tests hybrid
    # Eight QPs on one per-core shared CQ, dispatch and
    # interrupt mode (also part of verbs-tests; here alone, with counters).
    rxe_check verbs-shared-cq check_verbs_tests "" shared_cq
    rxe_check verbs-bench-pingpong check_verbs_bench
    local m
    for m in $RXE_VERBS_MODES; do
        rxe_check "shim-rc-pingpong-events-$m" rxe_until_handed_off check_shim_rc "$m"
        rxe_check "shim-send-lat-events-$m" check_shim_send_lat "$m"
    done
    rxe_check shim-verbs-bad-env check_shim_bad_env
}

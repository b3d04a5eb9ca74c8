# shellcheck shell=bash
# The fetch path over RDMA in the rxe-test guest (sourced by
# guest-checks.sh; owner: fastwake::fetch). fetch-rdma runs the integration
# tests (target/release/deps/fetch_rdma-*, built by the host before
# booting): every fetched object checked against the server's copy on all
# four paths while the server rewrites them, missing keys, a silent and a
# vanished server, and the hog on the RPC core, whose per-size lines
# (medians, the share adaptive gave RPC) are shown as INFO lines.
# fetch-bench runs `fastwake bench fetch` (the RPC thread at nice 19, so
# that the hog scenario's hog wins its CPU in every run; an RPC then takes
# tens of ms under TCG, hence 100 fetches a cell and four sizes, to stay
# well inside the check's bound) and shows its table as INFO lines; its
# JSON lands in the results dir (fetch-bench.json).
# c-abi-fetch runs abi.c's fetch part (capi-checks.sh builds it): a round
# trip on every path through fw_fetch_*.

check_fetch_rdma() {
    local t
    t=$(ls -t "$RXE_BIN_DIR"/deps/fetch_rdma-* 2>/dev/null | grep -v '\.d$' | head -n 1)
    [ -n "$t" ] && [ -x "$t" ] || { rxe_reason "fetch_rdma test binary not built (cargo test --release -p fastwake --test fetch_rdma --no-run)"; return $RXE_SKIP; }
    local out="$RXE_LOGDIR/$RXE_CUR_NAME.out" rc=0
    env FASTWAKE_TEST_VERBS_DEV="$RXE_DEV" "$t" --test-threads=1 --nocapture >"$out" 2>&1 || rc=$?
    cat "$out"
    # The per-phase lines first, so that a failure's log shows what the
    # chooser saw (its estimates, in the explain lines) before it failed.
    local line
    while read -r line; do rxe_info "$line"; done < <(grep -oE 'fetch_rdma_[a-z]+: .*' "$out")
    [ $rc = 0 ] && grep -q '^test result: ok\. [1-9]' "$out" || { rxe_fail "fetch_rdma tests failed: $(grep -E '^test .* FAILED|panicked' "$out" | head -n 1)"; return 1; }
    ! grep -q '^SKIPPED' "$out" || { rxe_fail "a fetch test SKIPPED although $RXE_DEV exists: $(grep -m1 '^SKIPPED' "$out")"; return 1; }
}

check_fetch_bench() {
    local bin="$RXE_BIN_DIR/fastwake"
    [ -x "$bin" ] || { rxe_reason "fastwake not built (cargo build --release)"; return $RXE_SKIP; }
    local out="$RXE_LOGDIR/$RXE_CUR_NAME.out" json="$RXE_OUT/fetch-bench.json" rc=0
    rm -f "$json"
    "$bin" bench fetch --dev "$RXE_DEV" --cpus 0,1 --rpc-nice 19 --sizes 8,512,4096,65536 -n "${RXE_FETCH_N:-100}" --json-file "$json" --explain >"$out" 2>&1 || rc=$?
    cat "$out"
    [ $rc = 0 ] || { rxe_fail "bench fetch failed: $(tail -n 1 "$out")"; return 1; }
    grep -q '"scenario"' "$json" || { rxe_fail "bench fetch wrote no rows"; return 1; }
    local line
    while IFS= read -r line; do rxe_info "$line"; done < <(grep -E '^\|' "$out")
}

check_capi_fetch() {
    capi_run_part fetch 1 || return
    rxe_info "$CAPI_SUMMARY"
}

# shellcheck shell=bash
# Lanes over RDMA in the rxe-test guest (sourced by guest-checks.sh; owner:
# fastwake::lanes::rdma). The integration tests (target/release/deps/
# lanes_rdma-*, built by the host before booting) send random messages on
# a latency and a bulk lane (and synchronous readers beside a streaming
# writer), check every one whole and in order, and print
# the counters of chunks and doorbells, shown here as INFO lines.

check_lanes_rdma() {
    local t
    t=$(ls -t "$RXE_BIN_DIR"/deps/lanes_rdma-* 2>/dev/null | grep -v '\.d$' | head -n 1)
    [ -n "$t" ] && [ -x "$t" ] || { rxe_reason "lanes_rdma test binary not built (cargo test --release -p fastwake --test lanes_rdma --no-run)"; return $RXE_SKIP; }
    local out="$RXE_LOGDIR/$RXE_CUR_NAME.out" rc=0
    env FASTWAKE_TEST_VERBS_DEV="$RXE_DEV" "$t" --test-threads=1 --nocapture >"$out" 2>&1 || rc=$?
    cat "$out"
    # The counters first, so that a failure's log shows them too.
    local line
    while read -r line; do rxe_info "$line"; done < <(grep -oE 'lanes_rdma_[a-z]+ (latency|bulk): .*' "$out")
    [ $rc = 0 ] && grep -q '^test result: ok\. [1-9]' "$out" || { rxe_fail "lanes_rdma tests failed: $(grep -E '^test .* FAILED|panicked' "$out" | head -n 1)"; return 1; }
    ! grep -q '^SKIPPED' "$out" || { rxe_fail "a lanes test SKIPPED although $RXE_DEV exists: $(grep -m1 '^SKIPPED' "$out")"; return 1; }
}

#!/bin/bash
# The rxe-test check list. Runs INSIDE the qemu guest, chrooted into the host
# root (host bash, host rdma-core, host-built project binaries), as root,
# started by scripts/rxe/init.sh. Prints one line per check:
#   PASS name | FAIL name (reason) | SKIPPED name (reason)
# The host (scripts/rxe-test) counts them and prints "rxe: N passed, M failed".
#
# TO ADD A CHECK: write a function check_xxx below (see scripts/rxe/guest-lib.sh
# for the helpers and the contract) and add `rxe_check name check_xxx` to the
# list at the bottom. Checks needing the project's binaries start with
# `rxe_need_fastwake || return` / `rxe_need_preload || return`, so they print
# SKIPPED (never PASS) when the binary is not built.
#
# Timings under TCG are meaningless: check correctness, and compare modes only
# as ratios within one run (metrics.tsv in the results dir).
set -u
# init.sh passes RXE_ENV: the guest.env the host wrote into the results dir.
set -a
# shellcheck disable=SC1090
. "${RXE_ENV:?run by scripts/rxe/init.sh inside the rxe-test guest}"
set +a
RXE_SELF_DIR=$(cd "$(dirname "$0")" && pwd)
. "$RXE_SELF_DIR/guest-lib.sh"

# ---- checks ------------------------------------------------------------------

check_rxe_setup() {
    local nic="" d
    for d in /sys/class/net/*; do
        [ -e "$d/device" ] && { nic=$(basename "$d"); break; }   # skip dummy0, lo, ...
    done
    [ -n "$nic" ] || { rxe_fail "no NIC with /sys/class/net/*/device"; return 1; }
    ip link set lo up
    ip addr add "$RXE_IP/24" dev "$nic" 2>/dev/null || true
    ip link set "$nic" up || { rxe_fail "ip link set $nic up failed"; return 1; }
    if [ ! -e "/sys/class/infiniband/$RXE_DEV" ]; then
        rdma link add "$RXE_DEV" type rxe netdev "$nic" \
            || { rxe_fail "rdma link add $RXE_DEV type rxe netdev $nic failed (is crc32_generic loaded?)"; return 1; }
    fi
    rdma link show
    # GID index 1 must be the RoCE v2 IPv4-mapped address (-g 1 / -x 1 rely on it).
    # Read indexes 0-7 only: scanning all GID entries is very slow under TCG.
    # (Builtins only: every exec costs ~0.2 s under TCG.)
    local i gid="" typ n=0 want g="/sys/class/infiniband/$RXE_DEV/ports/1"
    # shellcheck disable=SC2086
    want="0000:0000:0000:0000:0000:ffff:$(printf '%02x%02x:%02x%02x' ${RXE_IP//./ })"
    while [ $n -lt 100 ]; do
        read -r gid <"$g/gids/$RXE_GID" 2>/dev/null
        [ "$gid" = "$want" ] && break
        sleep 0.1; n=$((n + 1))
    done
    for i in 0 1 2 3 4 5 6 7; do
        read -r gid <"$g/gids/$i" 2>/dev/null; typ=""; read -r typ <"$g/gid_attrs/types/$i" 2>/dev/null
        echo "gid[$i] $gid $typ"
    done
    read -r gid <"$g/gids/$RXE_GID"
    [ "$gid" = "$want" ] || { rxe_fail "GID $RXE_GID is '$gid', not ::ffff:$RXE_IP"; return 1; }
    rxe_info "$RXE_DEV on $nic ($RXE_IP), GID $RXE_GID = $gid"
}

check_ibv_devinfo() {
    local out; out=$(ibv_devinfo -d "$RXE_DEV" -v) || { rxe_fail "ibv_devinfo -d $RXE_DEV failed"; return 1; }
    echo "$out"
    [[ $out =~ hca_id:[[:space:]]+$RXE_DEV($'\n'|$) ]] || { rxe_fail "no hca_id $RXE_DEV"; return 1; }
    [[ $out == *PORT_ACTIVE* ]] || { rxe_fail "port 1 not PORT_ACTIVE"; return 1; }
    [[ $out =~ link_layer:[[:space:]]+Ethernet ]] || { rxe_fail "link_layer is not Ethernet"; return 1; }
    [[ $out =~ num_comp_vectors:[[:space:]]*([0-9]+) ]] && rxe_info "num_comp_vectors: ${BASH_REMATCH[1]}"
    return 0
}

# check_rc_pingpong [EXTRA ARGS]: ibv_rc_pingpong, server and client on
# different vCPUs, both must report exactly $RXE_PP_ITERS (1000) iterations.
check_rc_pingpong() {
    local iters=${RXE_PP_ITERS:-1000}
    rxe_pair rc -- ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" "$@" || return 1
    rxe_pingpong_verify rc "$iters"
}

# check_send_lat [EXTRA ARGS]: perftest ib_send_lat, $RXE_LAT_ITERS (200) iterations.
check_send_lat() {
    local iters=${RXE_LAT_ITERS:-200}
    rxe_pair send_lat -- ib_send_lat -d "$RXE_DEV" -x "$RXE_GID" -n "$iters" "$@" || return 1
    rxe_perftest_verify send_lat "$iters"
}

# ---- checks of the project's binaries (SKIPPED until they are built) ------------

# fastwake's own verbs ping-pong, every wait mode interleaved in one run.
# Small counts: under TCG each round trip costs tens of microseconds or more.
check_fastwake_bench_pingpong() {
    rxe_need_fastwake || return
    local out="$RXE_LOGDIR/fastwake-bench-pingpong.out" rc=0
    timeout -k 2 $((RXE_CHECK_TIMEOUT - 5)) "$RXE_FASTWAKE" bench pingpong --source verbs --local --dev "$RXE_DEV" \
        --mode poll,interrupt,hybrid --iters 1000 --warmup 100 --rounds 2 --cpus "$RXE_SERVER_CPU,$RXE_CLIENT_CPU" \
        >"$out" 2>&1 || rc=$?
    cat "$out"
    # A build from before the verbs source rejects --source verbs or --dev:
    # skip (loudly) only while its help does not mention verbs at all.
    if [ $rc != 0 ] && { grep -q "unknown source 'verbs'" "$out" ||
            ! "$RXE_FASTWAKE" bench pingpong --help 2>&1 | grep -qi verbs; }; then
        rxe_reason "this fastwake build has no verbs source yet"
        return $RXE_SKIP
    fi
    [ $rc = 0 ] || { rxe_fail "fastwake bench pingpong exit $rc: $(grep -v '^$' "$out" | tail -n 1)"; return 1; }
}

# ibv_rc_pingpong -e with both sides under `fastwake run --mode hybrid`
# (which preloads libfastwake_preload.so from next to the binary).
check_fastwake_run_rc_pingpong() {
    rxe_need_fastwake || return
    rxe_need_preload || return
    local iters=${RXE_PP_ITERS:-1000}
    rxe_pair rc -- "$RXE_FASTWAKE" run --mode hybrid --verbose -- \
        ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" -e || return 1
    rxe_pingpong_verify rc "$iters" || return 1
    rxe_shim_loaded_verify rc
}

# ibv_rc_pingpong with the preload shim on both sides (FASTWAKE_MODE
# $RXE_SHIM_MODE, default hybrid): the same protocol result as without it;
# compare the rc.usec_per_iter rows of metrics.tsv only as ratios.
check_shim_rc_pingpong() {
    rxe_need_preload || return
    local iters=${RXE_PP_ITERS:-1000}
    rxe_pair rc -- env LD_PRELOAD="$RXE_PRELOAD" FASTWAKE_MODE="${RXE_SHIM_MODE:-hybrid}" FASTWAKE_VERBOSE=1 \
        ibv_rc_pingpong -d "$RXE_DEV" -g "$RXE_GID" -n "$iters" "$@" || return 1
    rxe_pingpong_verify rc "$iters" || return 1
    rxe_shim_loaded_verify rc
}

# The verbs source and libibverbs shim checks (verbs-tests, verbs-bench-pingpong,
# shim-*-<mode>, shim-verbs-bad-env) live in their own file.
. "$RXE_SELF_DIR/verbs-checks.sh"

# ---- the list ------------------------------------------------------------------
read -r up _ </proc/uptime
echo "rxe-guest: [${up}s] checks start (accel $RXE_ACCEL, repo $RXE_REPO, binaries $RXE_BIN_DIR)"
RXE_ONLY='' rxe_check rxe-setup   check_rxe_setup   # always runs (FASTWAKE_RXE_ONLY ignored)
rxe_check ibv-devinfo             check_ibv_devinfo
rxe_check rc-pingpong             check_rc_pingpong
rxe_check rc-pingpong-events      check_rc_pingpong -e
rxe_check send-lat                check_send_lat
rxe_check send-lat-events         check_send_lat -e
rxe_check fastwake-bench-pingpong check_fastwake_bench_pingpong
rxe_check fastwake-run-hybrid-rc-pingpong-events check_fastwake_run_rc_pingpong
rxe_check shim-rc-pingpong-events check_shim_rc_pingpong -e
rxe_check shim-rc-pingpong        check_shim_rc_pingpong
rxe_verbs_checks
# --- RDMA as really written ---
. "$RXE_SELF_DIR/channel-checks.sh"
rxe_channel_checks
. "$RXE_SELF_DIR/bench2-checks.sh"
rxe_bench2_checks
. "$RXE_SELF_DIR/capi-checks.sh"
rxe_check c-abi-verbs             check_capi_verbs
rxe_check c-abi-shared-cq         check_capi_shared_cq
# --- end of RDMA as really written ---
. "$RXE_SELF_DIR/lanes-checks.sh"
rxe_check lanes-rdma              check_lanes_rdma
. "$RXE_SELF_DIR/fetch-checks.sh"
rxe_check fetch-rdma              check_fetch_rdma
rxe_check fetch-bench             check_fetch_bench
rxe_check c-abi-fetch             check_capi_fetch
# --- stall monitor, ODP guard ---
. "$RXE_SELF_DIR/stall-checks.sh"
rxe_stall_checks
# --- busy pollers sleep when idle ---
. "$RXE_SELF_DIR/pollers-checks.sh"
rxe_pollers_checks

# FASTWAKE_RXE_EXTRA on the host: a bash script run here, after the checks,
# with guest-lib.sh loaded (it may call rxe_check itself; its output goes to
# the console, and lines starting with PASS/FAIL/SKIPPED/INFO are shown and
# counted by the host; FASTWAKE_RXE_ONLY does not filter its checks). Its exit status gives "PASS extra" or "FAIL extra".
if [ -n "${RXE_EXTRA:-}" ]; then
    echo "rxe-guest: running FASTWAKE_RXE_EXTRA=$RXE_EXTRA"
    rxe_export_functions
    export RXE_CUR_NAME=extra RXE_CUR_REASON="$RXE_LOGDIR/.extra.reason" RXE_CUR_INFO="$RXE_LOGDIR/.extra.info"
    (cd /tmp && RXE_ONLY='' timeout -k 5 "$RXE_EXTRA_TIMEOUT" bash -c '. "$1"' extra "$RXE_EXTRA" </dev/null 2>&1) | tee "$RXE_LOGDIR/extra.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 0 ]; then rxe_emit PASS extra
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then rxe_emit FAIL extra "timed out after ${RXE_EXTRA_TIMEOUT}s"
    else rxe_emit FAIL extra "exit $rc; see logs/extra.log"; fi
fi
# Counted from results.txt, which also holds the extra script's checks.
n_pass=$(grep -c '^PASS ' "$RXE_RESULTS" 2>/dev/null); n_fail=$(grep -c '^FAIL ' "$RXE_RESULTS" 2>/dev/null)
n_skip=$(grep -c '^SKIPPED ' "$RXE_RESULTS" 2>/dev/null)
echo "rxe-guest: ${n_pass:-0} pass, ${n_fail:-0} fail, ${n_skip:-0} skipped in the guest"
[ "${n_fail:-0}" = 0 ]

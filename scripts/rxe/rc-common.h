// rc-common.h: what the guest's C test programs share (channel-wait.c,
// cq-idle.c): dying with a message, an RC QP's INIT -> RTR -> RTS on one
// port with a GID, and the payload pattern every message carries. A
// program defines PROG (its name, for messages) and MSG (its message
// size, > 8) before including it.
#ifndef RXE_RC_COMMON_H
#define RXE_RC_COMMON_H
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what, const char *who) {
    fprintf(stderr, PROG ": %s: %s failed: %s\n", who, what, strerror(errno));
    exit(1);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

// qp (in INIT) to RTR and RTS, connected to QP number qpn behind dgid
// (source GID index gid_index, port 1).
static void rc_connect(struct ibv_qp *qp, uint32_t qpn, union ibv_gid dgid, int gid_index, const char *who) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = qpn,
        .rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1, .port_num = 1, .grh = {.dgid = dgid, .sgid_index = gid_index, .hop_limit = 1}}};
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        die("ibv_modify_qp RTR", who);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        die("ibv_modify_qp RTS", who);
}

// Message seq's payload: its sequence number, then a pattern.
static void fill(char *p, uint64_t seq) {
    memcpy(p, &seq, 8);
    for (int i = 8; i < MSG; i++) p[i] = (char)(seq * 31 + i);
}

// Is p message seq's payload? *got: the sequence number it carries.
static int payload_ok(const char *p, uint64_t seq, uint64_t *got) {
    memcpy(got, p, 8);
    int ok = *got == seq;
    for (int i = 8; ok && i < MSG; i++) ok = p[i] == (char)(seq * 31 + i);
    return ok;
}
#endif

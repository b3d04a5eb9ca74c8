/* The verbs parts of tests/abi.c (fw_verbs_cq and the per-core shared CQ),
 * included by it: one test program, sharing its check(), pin() and clock
 * helpers. Kept apart because they need rdma-core and an RDMA device, and
 * run only where both are (scripts/c-abi-test builds them in when
 * <infiniband/verbs.h> is installed; the Soft-RoCE guest runs them). */

/* ---- RDMA verbs: a CQ and channel the program created (fw_verbs_cq) -------
 * Built with -DFW_TEST_VERBS -libverbs when <infiniband/verbs.h> is there
 * (scripts/c-abi-test); run on a real device (the Soft-RoCE guest:
 * `abi verbs`, check c-abi-verbs in scripts/rxe-test). Without a device
 * it prints one SKIPPED line (never a pass). Two RC QPs on one device,
 * connected to each other: a ping thread (CPU 0) and a pong thread (CPU 1)
 * exchange data-checked messages, each waiting with fw_verbs_cq_wait on a
 * CQ and channel it created itself, in every mode. */
#ifdef FW_TEST_VERBS
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>

_Static_assert(sizeof(struct ibv_wc) == 48, "struct ibv_wc as fastwake-verbs-sys has it");

enum { V_DEPTH = 16, V_MSG = 32 };

static struct {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    int roce, gid_index;
    union ibv_gid gid;
    uint16_t lid;
    enum ibv_mtu mtu;
} vd;

/* One end: its channel, its CQ (sends and receives of the pong end; the
 * ping end's sends go to a second CQ on the same channel, never armed by
 * the program, so the foreign-event check can use it), QP and memory. */
struct vend {
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq, *send_cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    char *buf; /* V_DEPTH receive slots, then one send slot */
    int unreaped; /* sends on cq not yet completed */
};

static int vend_qp(struct vend *e);

static int vend_init(struct vend *e, int cpu, int own_send_cq) {
    memset(e, 0, sizeof *e);
    int vec = -1;
    if (fw_verbs_comp_vector_for_cpu(vd.ctx, cpu, &vec)) return -1;
    e->ch = ibv_create_comp_channel(vd.ctx);
    if (!e->ch) return -1;
    /* fastwake leaves a channel's fd as the program made it: the ping end's
     * is non-blocking (as epoll programs make it), the pong end's blocking
     * (rdma-core's default). */
    if (own_send_cq && fcntl(e->ch->fd, F_SETFL, fcntl(e->ch->fd, F_GETFL) | O_NONBLOCK)) return -1;
    e->cq = ibv_create_cq(vd.ctx, 4 * V_DEPTH, NULL, e->ch, vec);
    e->send_cq = own_send_cq ? ibv_create_cq(vd.ctx, 4 * V_DEPTH, NULL, e->ch, vec) : e->cq;
    return vend_qp(e);
}

/* e's buffer, memory region and QP, on e->send_cq and e->cq. */
static int vend_qp(struct vend *e) {
    e->buf = calloc(V_DEPTH + 1, V_MSG);
    if (!e->cq || !e->send_cq || !e->buf) return -1;
    e->mr = ibv_reg_mr(vd.pd, e->buf, (V_DEPTH + 1) * V_MSG, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_qp_init_attr qa = {
        .send_cq = e->send_cq,
        .recv_cq = e->cq,
        .cap = {.max_send_wr = V_DEPTH, .max_recv_wr = V_DEPTH, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 1,
    };
    e->qp = e->mr ? ibv_create_qp(vd.pd, &qa) : NULL;
    return e->qp ? 0 : -1;
}

static int vend_post_recv(struct vend *e, int slot) {
    struct ibv_sge sge = {(uintptr_t)(e->buf + slot * V_MSG), V_MSG, e->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(e->qp, &wr, &bad);
}

/* The message of round trip seq in direction dir (0 ping, 1 pong). */
static void v_fill(char *m, uint32_t seq, int dir) {
    for (int i = 0; i < V_MSG; i++) m[i] = (char)(seq * 7 + (uint32_t)i * 13 + (uint32_t)dir * 101);
}

static int vend_send(struct vend *e, uint32_t seq, int dir) {
    char *m = e->buf + V_DEPTH * V_MSG;
    v_fill(m, seq, dir);
    struct ibv_sge sge = {(uintptr_t)m, V_MSG, e->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = 1000000 + seq, .sg_list = &sge, .num_sge = 1,
                             .opcode = IBV_WR_SEND_WITH_IMM, .imm_data = htonl(seq)}, *bad;
    if (e->unreaped >= V_DEPTH - 1) return -1;
    e->unreaped++;
    return ibv_post_send(e->qp, &wr, &bad);
}

static int vend_connect(struct vend *e, struct vend *peer) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = 0};
    if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = vd.mtu;
    a.dest_qp_num = peer->qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = vd.lid;
    a.ah_attr.port_num = 1;
    if (vd.roce) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = vd.gid;
        a.ah_attr.grh.sgid_index = (uint8_t)vd.gid_index;
        a.ah_attr.grh.hop_limit = 1;
    }
    if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -1;
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void vend_free(struct vend *e) {
    if (e->qp) ibv_destroy_qp(e->qp);
    if (e->mr) ibv_dereg_mr(e->mr);
    if (e->send_cq && e->send_cq != e->cq) ibv_destroy_cq(e->send_cq);
    if (e->cq) ibv_destroy_cq(e->cq);
    if (e->ch) ibv_destroy_comp_channel(e->ch);
    free(e->buf);
}

/* Consume the work completions in wc[0..n): sends settle e->unreaped; the
 * receive of seq (dir) is checked (imm, length, every byte), its slot
 * re-posted. Returns 1 when that receive was among them, 0 if not, -1 on
 * anything wrong (*why says what). */
static int v_consume(struct vend *e, struct ibv_wc *wc, int n, uint32_t seq, int dir, const char **why) {
    int got = 0;
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS) return *why = ibv_wc_status_str(wc[i].status), -1;
        if (wc[i].opcode == IBV_WC_SEND) {
            e->unreaped--;
            continue;
        }
        if (wc[i].opcode != IBV_WC_RECV) return *why = "unexpected opcode", -1;
        char want[V_MSG];
        v_fill(want, seq, dir);
        int slot = (int)wc[i].wr_id;
        if (got || slot < 0 || slot >= V_DEPTH || !(wc[i].wc_flags & IBV_WC_WITH_IMM) ||
            ntohl(wc[i].imm_data) != seq || wc[i].byte_len != V_MSG || memcmp(e->buf + slot * V_MSG, want, V_MSG))
            return *why = "lost, duplicated, reordered or corrupted message", -1;
        if (vend_post_recv(e, slot)) return *why = "ibv_post_recv", -1;
        got = 1;
    }
    return got;
}

/* One wait of up to 8 work completions, 10 s at most, on a fw_verbs_cq or
 * on a shared CQ's inbox. */
typedef int (*v_wait_fn)(fw_waiter *w, void *src, struct ibv_wc *wc, int *n);
static int v_wait_cq(fw_waiter *w, void *v, struct ibv_wc *wc, int *n) {
    return fw_verbs_cq_wait(w, v, 10000000000LL, wc, 8, n);
}
static int v_wait_inbox(fw_waiter *w, void *in, struct ibv_wc *wc, int *n) {
    return fw_verbs_inbox_wait(w, in, 10000000000LL, wc, 8, n);
}

/* Wait (in w's mode) until the receive of seq arrives on e's CQ. */
static int v_await(fw_waiter *w, v_wait_fn wait, void *src, struct vend *e, uint32_t seq, int dir,
                   const char **why) {
    for (;;) {
        struct ibv_wc wc[8];
        int n = -1, rc = wait(w, src, wc, &n);
        if (rc) return *why = rc == ETIMEDOUT ? "timed out (lost completion?)" : fw_last_error(), -1;
        if (n < 1 || n > 8) return *why = "bad count", -1;
        int r = v_consume(e, wc, n, seq, dir, why);
        if (r) return r < 0 ? -1 : 0;
    }
}

/* Reap the ping end's own send completions (its send CQ is not fastwake's). */
static int v_reap_sends(struct vend *e) {
    struct ibv_wc wc[8];
    int n;
    while ((n = ibv_poll_cq(e->send_cq, 8, wc)) > 0)
        for (int i = 0; i < n; i++) {
            if (wc[i].status != IBV_WC_SUCCESS) return -1;
            e->unreaped--;
        }
    return n;
}

struct vpong {
    struct vend *e;
    const char *mode;
    int n;
    const char *why;
    struct fw_wait_stats ws;
    struct fw_verbs_stats vs;
    struct fw_dispatch_wait_stats ds;
};

static void *v_pong(void *p) {
    struct vpong *a = p;
    pin(1);
    fw_waiter *w = NULL;
    fw_verbs_cq *v = NULL;
    if (fw_waiter_create(a->mode, &w) || fw_verbs_cq_create(a->e->cq, a->e->ch, &v)) {
        a->why = fw_last_error();
        goto out;
    }
    for (uint32_t i = 0; i < (uint32_t)a->n && !a->why; i++)
        if (v_await(w, v_wait_cq, v, a->e, i, 0, &a->why) == 0 && vend_send(a->e, i, 1)) a->why = "ibv_post_send (pong)";
    /* Its last sends complete on the same CQ: wait for them too. */
    while (!a->why && a->e->unreaped > 0) {
        struct ibv_wc wc[8];
        int n = 0;
        if (fw_verbs_cq_wait(w, v, 10000000000LL, wc, 8, &n)) a->why = fw_last_error();
        else if (v_consume(a->e, wc, n, UINT32_MAX, 0, &a->why) != 0 && !a->why) a->why = "stray receive";
    }
    fw_waiter_stats(w, &a->ws);
    fw_verbs_cq_stats(v, &a->vs);
    fw_waiter_dispatch_stats(w, &a->ds);
out:
    fw_verbs_cq_destroy(v);
    fw_waiter_destroy(w);
    return NULL;
}

static struct vend v_ping, v_pong_end;

/* n data-checked round trips with both ends waiting in mode; d: the
 * dispatcher serving CPU 1 (the pong end), or NULL. With retry != 0, a run
 * in which d made no hand-off because every pong wait fell back to
 * interrupt mode (the dispatcher not seen running: under TCG the guest's
 * kernel work can starve a SCHED_IDLE thread for over 500 µs at a time)
 * is not judged: it says so and returns 1, for the caller to run again.
 * A dispatcher that runs and still never hands off fails either way. */
static int verbs_round_trips(const char *mode, int n, fw_dispatcher *d, int retry) {
    char name[96];
    snprintf(name, sizeof name, "verbs: %d round trips over RC, %s", n, mode);
    struct fw_dispatch_stats d0 = {0}, d1 = {0};
    if (d) fw_dispatcher_stats(d, &d0);
    struct vpong a = {.e = &v_pong_end, .mode = mode, .n = n};
    fw_waiter *w = NULL;
    fw_verbs_cq *v = NULL;
    const char *why = NULL;
    if (fw_waiter_create(mode, &w) || fw_verbs_cq_create(v_ping.cq, v_ping.ch, &v)) {
        check(0, name, "create");
        fw_waiter_destroy(w);
        return 0;
    }
    pin(0);
    pthread_t t;
    pthread_create(&t, NULL, v_pong, &a);
    for (uint32_t i = 0; i < (uint32_t)n && !why; i++) {
        if (v_reap_sends(&v_ping) < 0) why = "send completion (ping)";
        else if (vend_send(&v_ping, i, 0)) why = "ibv_post_send (ping)";
        else v_await(w, v_wait_cq, v, &v_ping, i, 1, &why);
    }
    pthread_join(t, NULL);
    for (int k = 0; k < 1000 && !why && v_ping.unreaped > 0; k++) {
        if (v_reap_sends(&v_ping) < 0) why = "send completion (ping)";
        usleep(1000);
    }
    struct fw_wait_stats ws;
    struct fw_verbs_stats vs;
    fw_waiter_stats(w, &ws);
    fw_verbs_cq_stats(v, &vs);
    fw_verbs_cq_destroy(v); /* acks its events; the CQ stays ours */
    fw_waiter_destroy(w);
    pin(-1);
    if (d) fw_dispatcher_stats(d, &d1);
    uint64_t handoffs = d1.handoffs - d0.handoffs;
    if (!why && a.why) why = a.why;
    if (!why && (ws.completions < (uint64_t)n || a.ws.completions < (uint64_t)n)) why = "too few completions";
    if (!why && v_ping.unreaped) why = "ping sends not completed";
    if (!why && (vs.events < vs.acked || vs.events - vs.acked >= 16 || a.vs.events - a.vs.acked >= 16))
        why = "ack accounting";
    int polling = strcmp(mode, "poll") == 0, interrupt = strcmp(mode, "interrupt") == 0;
    if (!why && polling && (ws.sleeps || a.ws.sleeps || vs.events || a.vs.events)) why = "poll mode slept";
    if (!why && interrupt && (a.ws.sleeps == 0 || a.vs.events == 0)) why = "interrupt mode never slept on the channel";
    if (!why && d && handoffs == 0 && retry && a.ds.fallbacks > 0 && a.ds.handoffs == 0) {
        printf("INFO %s: no hand-off: all %llu of the pong's dispatch waits fell back to interrupt mode "
               "(dispatcher not seen running); running it again\n",
               name, (unsigned long long)a.ds.fallbacks);
        return 1;
    }
    if (!why && d && handoffs == 0) why = "no hand-off by the dispatcher";
    check(!why, name, why ? why : "");
    printf("INFO verbs %s: ping completions=%llu sleeps=%llu events=%llu acked=%llu arms=%llu | pong "
           "completions=%llu sleeps=%llu events=%llu acked=%llu arms=%llu",
           mode, (unsigned long long)ws.completions, (unsigned long long)ws.sleeps, (unsigned long long)vs.events,
           (unsigned long long)vs.acked, (unsigned long long)vs.arms, (unsigned long long)a.ws.completions,
           (unsigned long long)a.ws.sleeps, (unsigned long long)a.vs.events, (unsigned long long)a.vs.acked,
           (unsigned long long)a.vs.arms);
    if (d) printf(" | dispatcher handoffs=%llu rescued=%llu | pong dispatch waits: handoffs=%llu fallbacks=%llu",
                  (unsigned long long)handoffs, (unsigned long long)(d1.rescued - d0.rescued),
                  (unsigned long long)a.ds.handoffs, (unsigned long long)a.ds.fallbacks);
    printf("\n");
    return 0;
}

/* Open the device (FASTWAKE_TEST_VERBS_DEV, else the first) and pick the
 * GID (FASTWAKE_TEST_VERBS_GID, else on RoCE the first IPv4-mapped one). */
static const char *verbs_open(void) {
    int num = 0;
    struct ibv_device **list = ibv_get_device_list(&num);
    if (!list || num == 0) {
        if (list) ibv_free_device_list(list);
        return "no RDMA device found";
    }
    const char *want = getenv("FASTWAKE_TEST_VERBS_DEV");
    for (int i = 0; i < num && !vd.ctx; i++)
        if (!want || !strcmp(want, ibv_get_device_name(list[i]))) vd.ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!vd.ctx) return "cannot open the RDMA device";
    struct ibv_port_attr pa;
    if (ibv_query_port(vd.ctx, 1, &pa) || pa.state != IBV_PORT_ACTIVE) return "port 1 is not active";
    vd.pd = ibv_alloc_pd(vd.ctx);
    vd.roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    vd.lid = pa.lid;
    vd.mtu = pa.active_mtu < IBV_MTU_1024 ? pa.active_mtu : IBV_MTU_1024;
    const char *g = getenv("FASTWAKE_TEST_VERBS_GID");
    vd.gid_index = g ? atoi(g) : -1;
    for (int i = 0; vd.gid_index < 0 && vd.roce && i < 8; i++) {
        union ibv_gid x;
        static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!ibv_query_gid(vd.ctx, 1, i, &x) && !memcmp(x.raw, v4, 12)) vd.gid_index = i;
    }
    if (vd.gid_index < 0) vd.gid_index = 0;
    if (ibv_query_gid(vd.ctx, 1, vd.gid_index, &vd.gid)) return "ibv_query_gid";
    return vd.pd ? NULL : "ibv_alloc_pd";
}

/* Open the device for the part `what`: 0 (and one SKIPPED line saying
 * why) where it cannot run. */
static int verbs_can_run(const char *what) {
    const char *why = verbs_open();
    if (why) {
        printf("SKIPPED %s: %s (the verbs parts of the C ABI run in the Soft-RoCE guest: scripts/rxe-test)\n", what,
               why);
        return 0;
    }
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("SKIPPED %s: needs 2 CPUs\n", what);
        return 0;
    }
    return 1;
}

/* Close what verbs_open opened, so that the next part opens it again. */
static void verbs_close(void) {
    ibv_dealloc_pd(vd.pd);
    ibv_close_device(vd.ctx);
    memset(&vd, 0, sizeof vd);
}

/* Bad input: errno and one line, never a crash. No device needed. */
static void verbs_bad_input(void) {
    fw_verbs_cq *v = (fw_verbs_cq *)1;
    struct ibv_wc wc[2];
    int n = 7, vec = 7;
    check(fw_verbs_cq_create(NULL, NULL, &v) == EINVAL && v == (fw_verbs_cq *)1 && strlen(fw_last_error()) > 0 &&
              !strchr(fw_last_error(), '\n'),
          "verbs: NULL CQ is EINVAL with a one-line cause", "accepted");
    check(fw_verbs_cq_wait(NULL, NULL, 0, wc, 2, &n) == EINVAL && n == 0, "verbs: wait on NULL is EINVAL, n = 0",
          "accepted");
    n = 7;
    check(fw_verbs_cq_poll(NULL, wc, 2, &n) == EINVAL && n == 0, "verbs: poll on NULL is EINVAL", "accepted");
    struct fw_verbs_stats st;
    check(fw_verbs_cq_stats(NULL, &st) == EINVAL, "verbs: stats of NULL is EINVAL", "accepted");
    check(fw_verbs_comp_vector_for_cpu(NULL, 0, &vec) == EINVAL && vec == 7, "verbs: vector for a NULL context is EINVAL",
          "accepted");
    fw_verbs_cq_destroy(NULL);
}

/* With a device: the vector helper, channel rules, timeouts, a CQ without a
 * channel, an event for another CQ on the channel. */
static void verbs_rules(void) {
    int vec = -1;
    int ncpu = (int)sysconf(_SC_NPROCESSORS_CONF);
    check(fw_verbs_comp_vector_for_cpu(vd.ctx, -1, &vec) == 0 && vec >= 0 &&
              (vd.ctx->num_comp_vectors == 0 || vec < vd.ctx->num_comp_vectors),
          "verbs: vector for the current CPU", "failed");
    const char *dev = ibv_get_device_name(vd.ctx->device);
    if (!strncmp(dev, "rxe", 3) && vd.ctx->num_comp_vectors >= 2 && ncpu >= 2)
        check(fw_verbs_comp_vector_for_cpu(vd.ctx, 1, &vec) == 0 && vec == 1,
              "verbs: rxe (no IRQs) gives vector = CPU", "wrong vector");
    check(fw_verbs_comp_vector_for_cpu(vd.ctx, ncpu + 1000, &vec) == EINVAL, "verbs: vector for a missing CPU is EINVAL",
          "accepted");
    check(fw_verbs_comp_vector_for_cpu(vd.ctx, -2, &vec) == EINVAL, "verbs: vector for CPU -2 is EINVAL", "accepted");
    check(fw_verbs_comp_vector_for_cpu(vd.ctx, 0, NULL) == EINVAL, "verbs: NULL vector pointer is EINVAL", "accepted");

    struct ibv_comp_channel *other = ibv_create_comp_channel(vd.ctx);
    struct ibv_cq *bare = ibv_create_cq(vd.ctx, 8, NULL, NULL, 0);
    fw_verbs_cq *v = NULL;
    check(fw_verbs_cq_create(v_ping.cq, other, &v) == EINVAL && v == NULL, "verbs: a channel not the CQ's is EINVAL",
          "accepted");
    check(fw_verbs_cq_create(v_ping.cq, NULL, &v) == EINVAL, "verbs: NULL channel for a CQ with one is EINVAL",
          "accepted");
    check(fw_verbs_cq_create(bare, other, &v) == EINVAL, "verbs: a channel for a CQ without one is EINVAL", "accepted");
    check(fw_verbs_cq_create(v_ping.cq, v_ping.ch, NULL) == EINVAL, "verbs: NULL output is EINVAL", "accepted");

    fw_waiter *wi = NULL, *wp = NULL;
    fw_waiter_create("interrupt", &wi);
    fw_waiter_create("poll", &wp);
    struct ibv_wc wc[4];
    int n = 7;
    if (fw_verbs_cq_create(bare, NULL, &v) == 0) {
        check(fw_verbs_cq_wait(wi, v, 1000000, wc, 4, &n) == EINVAL && n == 0 && strstr(fw_last_error(), "poll"),
              "verbs: CQ without channel in interrupt mode is EINVAL", "accepted");
        check(fw_verbs_cq_wait(wp, v, 1000000, wc, 4, &n) == ETIMEDOUT, "verbs: CQ without channel, poll mode times out",
              "no ETIMEDOUT");
        check(fw_verbs_cq_wait(wp, v, 0, NULL, 4, &n) == EINVAL, "verbs: NULL wc array is EINVAL", "accepted");
        check(fw_verbs_cq_wait(wp, v, 0, wc, 0, &n) == EINVAL, "verbs: max 0 is EINVAL", "accepted");
        fw_verbs_cq_destroy(v);
    } else {
        check(0, "verbs: CQ without channel accepted", "refused");
    }
    check(bare && ibv_destroy_cq(bare) == 0, "verbs: the caller destroys its channel-less CQ", "failed");
    check(other && ibv_destroy_comp_channel(other) == 0, "verbs: the caller destroys its unused channel", "failed");

    v = NULL;
    int ok = fw_verbs_cq_create(v_ping.cq, v_ping.ch, &v) == 0;
    check(ok && fw_verbs_cq_wait(wi, v, 2000000, wc, 4, &n) == ETIMEDOUT && n == 0,
          "verbs: empty wait times out (interrupt)", "no ETIMEDOUT");
    n = 7;
    check(ok && fw_verbs_cq_poll(v, wc, 4, &n) == 0 && n == 0, "verbs: poll of an empty CQ gives 0", "wrong");
    /* An event for the other CQ on the ping end's channel (its send CQ):
     * fastwake acks it and fails the wait; that CQ's ibv_destroy_cq must not
     * hang later (checked by verbs_checks, under the test's timeout). */
    ibv_req_notify_cq(v_ping.send_cq, 0);
    if (ok && vend_send(&v_ping, 999999, 0) == 0) {
        int rc = fw_verbs_cq_wait(wi, v, 5000000000LL, wc, 4, &n);
        check(rc == EINVAL && strstr(fw_last_error(), "another CQ"), "verbs: an event for another CQ is EINVAL (acked)",
              rc == ETIMEDOUT ? "timed out" : "wrong errno");
        for (int k = 0; k < 1000 && v_ping.unreaped; k++) {
            v_reap_sends(&v_ping);
            usleep(1000);
        }
    }
    struct fw_verbs_stats st;
    check(ok && fw_verbs_cq_stats(v, &st) == 0 && st.arms > 0 && st.stashed == 0, "verbs: stats", "failed");
    fw_verbs_cq_destroy(v);
    fw_waiter_destroy(wi);
    fw_waiter_destroy(wp);
}

static void verbs_checks(int n) {
    verbs_bad_input();
    if (!verbs_can_run("verbs")) return;
    if (vend_init(&v_ping, 0, 1) || vend_init(&v_pong_end, 1, 0) || vend_connect(&v_ping, &v_pong_end) ||
        vend_connect(&v_pong_end, &v_ping)) {
        check(0, "verbs: set up two connected RC QPs", strerror(errno));
        return;
    }
    for (int i = 0; i < V_DEPTH; i++)
        if (vend_post_recv(&v_ping, i) || vend_post_recv(&v_pong_end, i)) {
            check(0, "verbs: post receives", strerror(errno));
            return;
        }
    printf("INFO verbs: device %s, %s, GID index %d, %d comp vectors\n", ibv_get_device_name(vd.ctx->device),
           vd.roce ? "RoCE" : "IB", vd.gid_index, vd.ctx->num_comp_vectors);
    const char *modes[] = {"poll", "interrupt", "hybrid:20us", "adaptive"};
    for (int m = 0; m < 4; m++) verbs_round_trips(modes[m], n, NULL, 0);
    fw_dispatcher *d = NULL;
    /* Never idle: under TCG a round trip can take longer than any idle
     * threshold, and an idle dispatcher hands waits back to interrupt mode. */
    struct sibling sb; /* so that the pong end is handed off, not alone */
    if (fw_dispatcher_start(1, -1, 0, &d) == 0 && sibling_start(&sb) == 0) {
        for (int left = 2; verbs_round_trips("dispatch", n, d, left > 0); left--) {
        }
        sibling_stop(&sb);
        fw_dispatcher_stop(d);
    } else {
        check(0, "verbs: dispatcher for CPU 1", fw_last_error());
    }
    verbs_rules();
    /* Every event fastwake read was acked: the program's own teardown
     * cannot hang (ibv_destroy_cq waits for acks). */
    int bad = ibv_destroy_qp(v_ping.qp) | ibv_destroy_qp(v_pong_end.qp);
    v_ping.qp = v_pong_end.qp = NULL;
    bad |= ibv_destroy_cq(v_ping.send_cq) | ibv_destroy_cq(v_ping.cq) | ibv_destroy_cq(v_pong_end.cq);
    v_ping.send_cq = v_ping.cq = v_pong_end.cq = v_pong_end.send_cq = NULL;
    check(!bad, "verbs: the program destroys its QPs and CQs (no unacked event left)", "a destroy failed");
    vend_free(&v_ping);
    vend_free(&v_pong_end);
    verbs_close();
}

/* ---- RDMA verbs: one shared CQ for many QPs (fw_verbs_shared_cq) ----------
 * `abi shared-cq [N]` (check c-abi-shared-cq in scripts/rxe-test). S_CONNS
 * server QPs share one CQ and channel made by fastwake on CPU 1's vector,
 * routed by QP number; an owner thread per QP on CPU 1 waits on its inbox.
 * The client (CPU 0) sends every connection a data-checked request per
 * round, all at once, and polls its own plain CQ for the replies. Every
 * request and reply is checked (connection, sequence, every byte), and
 * the shared CQ's counters must account for every completion, none
 * unrouted. A completion for a QP without an inbox is kept and taken back
 * with fw_verbs_shared_cq_take_unrouted. */
enum { S_CONNS = 4 };

/* [S_CONNS]: a server QP without an inbox, and its client. */
static struct vend s_srv[S_CONNS + 1], s_cli[S_CONNS + 1];
static struct ibv_cq *s_cli_cq;

struct sowner {
    int k, n, dispatched;
    const char *mode;
    fw_verbs_inbox *in;
    const char *why;
    struct fw_wait_stats ws;
    struct fw_dispatch_wait_stats ds;
};

/* Owner k: connection k's requests (dir 10 + k), answered with replies
 * (dir 20 + k). */
static void *s_owner(void *p) {
    struct sowner *a = p;
    struct vend *e = &s_srv[a->k];
    pin(1);
    fw_waiter *w = NULL;
    if (fw_waiter_create(a->mode, &w)) {
        a->why = fw_last_error();
        return NULL;
    }
    /* Staggered first waits, each after CPU 1 idled: a dispatch-mode wait
     * trusts the SCHED_IDLE dispatcher only if it was seen running lately,
     * and under TCG four owners that start at once keep it off the CPU
     * past that, so every first wait fell back, and the waits after them. */
    if (a->dispatched) usleep(2000 * (a->k + 1));
    for (uint32_t i = 0; i < (uint32_t)a->n && !a->why; i++)
        if (v_await(w, v_wait_inbox, a->in, e, i, 10 + a->k, &a->why) == 0 && vend_send(e, i, 20 + a->k))
            a->why = "ibv_post_send (owner)";
    /* Its last replies' send completions come to its inbox too. */
    while (!a->why && e->unreaped > 0) {
        struct ibv_wc wc[8];
        int n = 0;
        if (v_wait_inbox(w, a->in, wc, &n)) a->why = fw_last_error();
        else if (v_consume(e, wc, n, UINT32_MAX, 0, &a->why) != 0 && !a->why) a->why = "stray receive";
    }
    fw_waiter_stats(w, &a->ws);
    fw_waiter_dispatch_stats(w, &a->ds);
    fw_waiter_destroy(w);
    return NULL;
}

/* The client end that qp_num belongs to, or -1. */
static int s_client_of(uint32_t qp_num) {
    for (int k = 0; k <= S_CONNS; k++)
        if (s_cli[k].qp && s_cli[k].qp->qp_num == qp_num) return k;
    return -1;
}

/* Poll the client's CQ until connections lo..hi-1 have the reply of round
 * seq and every send completed (10 s at most). */
static const char *s_client_replies(uint32_t seq, int lo, int hi) {
    int got[S_CONNS] = {0}, left = hi - lo, unreaped = 1;
    uint64_t until = now_ns() + 10000000000ULL;
    while (left > 0 || unreaped > 0) {
        struct ibv_wc wc[8];
        int n = ibv_poll_cq(s_cli_cq, 8, wc);
        if (n < 0) return "ibv_poll_cq (client)";
        if (n == 0 && now_ns() > until) return "timed out waiting for replies (lost completion?)";
        for (int i = 0; i < n; i++) {
            int k = s_client_of(wc[i].qp_num);
            if (k < lo || k >= hi) return "a completion for an unknown or idle client QP";
            const char *why = NULL;
            int r = v_consume(&s_cli[k], &wc[i], 1, seq, 20 + k, &why);
            if (r < 0) return why;
            if (r > 0 && got[k]++) return "two replies on one connection in one round";
            left -= r;
        }
        unreaped = 0;
        for (int k = 0; k < S_CONNS; k++) unreaped += s_cli[k].unreaped;
    }
    return NULL;
}

/* n rounds with every owner waiting in mode; d: the dispatcher of CPU 1
 * or NULL; retry as for verbs_round_trips. A round sends every connection
 * its request at once (completions of several owners in one poll of the
 * shared CQ), except with a dispatcher: there one connection at a time, so
 * that under TCG the owners leave the SCHED_IDLE dispatcher room to run
 * (four owners busy at once starved it past its 500 µs liveness rule in
 * two of three runs, and every dispatch wait fell back). */
static int shared_cq_rounds(fw_verbs_shared_cq *s, fw_verbs_inbox **in, const char *mode, int n, fw_dispatcher *d,
                            int retry) {
    char name[128];
    snprintf(name, sizeof name, "shared CQ: %d rounds over %d RC QPs, %s", n, S_CONNS, mode);
    struct fw_shared_cq_stats s0, s1;
    struct fw_dispatch_stats d0 = {0}, d1 = {0};
    fw_verbs_shared_cq_stats(s, &s0);
    if (d) fw_dispatcher_stats(d, &d0);
    struct sowner a[S_CONNS];
    pthread_t t[S_CONNS];
    for (int k = 0; k < S_CONNS; k++) {
        a[k] = (struct sowner){.k = k, .n = n, .dispatched = d != NULL, .mode = mode, .in = in[k]};
        pthread_create(&t[k], NULL, s_owner, &a[k]);
    }
    pin(0);
    const char *why = NULL;
    int step = d ? 1 : S_CONNS;
    for (uint32_t i = 0; i < (uint32_t)n && !why; i++)
        for (int lo = 0; lo < S_CONNS && !why; lo += step) {
            for (int k = lo; k < lo + step && !why; k++)
                if (vend_send(&s_cli[k], i, 10 + k)) why = "ibv_post_send (client)";
            if (!why) why = s_client_replies(i, lo, lo + step);
        }
    for (int k = 0; k < S_CONNS; k++) pthread_join(t[k], NULL);
    pin(-1);
    fw_verbs_shared_cq_stats(s, &s1);
    if (d) fw_dispatcher_stats(d, &d1);
    uint64_t handoffs = d1.handoffs - d0.handoffs, fallbacks = 0, dhandoffs = 0, relays = 0, sleeps = 0;
    for (int k = 0; k < S_CONNS; k++) {
        if (!why && a[k].why) why = a[k].why;
        if (!why && a[k].ws.completions < (uint64_t)n) why = "too few completions at an owner";
        fallbacks += a[k].ds.fallbacks;
        dhandoffs += a[k].ds.handoffs;
        relays += a[k].ds.relays;
        sleeps += a[k].ws.sleeps;
    }
    /* Every request's receive and every reply's send completion went
     * through the shared CQ into its owner's inbox, and nothing else. */
    uint64_t routed = s1.routed - s0.routed, want = 2ULL * S_CONNS * (uint64_t)n;
    if (!why && routed != want) why = "not 2 completions routed per message (lost or extra ones)";
    if (!why && s1.unrouted != s0.unrouted) why = "completions went unrouted";
    if (!why && s1.events - s1.acked >= 16) why = "ack accounting";
    if (!why && !strcmp(mode, "interrupt") && (sleeps == 0 || s1.events == s0.events))
        why = "interrupt mode never slept on the shared channel";
    /* Judged by the owners' waits that a hand-off ended: with four owners
     * on one CPU most hand-offs are made by an owner about to sleep, which
     * relays for its core, not by the dispatcher (its own count). */
    if (!why && d && dhandoffs == 0 && retry && fallbacks > 0) {
        printf("INFO %s: no hand-off: all %llu of the owners' dispatch waits fell back to interrupt mode "
               "(dispatcher not seen running); running it again\n",
               name, (unsigned long long)fallbacks);
        return 1;
    }
    if (!why && d && dhandoffs == 0) why = "no hand-off by the dispatcher";
    check(!why, name, why ? why : "");
    printf("INFO shared-cq %s: routed=%llu pumps=%llu handed_over=%llu notices=%llu rings=%llu events=%llu arms=%llu "
           "| owners: sleeps=%llu",
           mode, (unsigned long long)routed, (unsigned long long)(s1.pumps - s0.pumps),
           (unsigned long long)(s1.handed_over - s0.handed_over), (unsigned long long)(s1.notices - s0.notices),
           (unsigned long long)(s1.rings - s0.rings), (unsigned long long)(s1.events - s0.events),
           (unsigned long long)(s1.arms - s0.arms), (unsigned long long)sleeps);
    if (d)
        printf(" | dispatcher handoffs=%llu | owners' dispatch waits: handoffs=%llu (relayed by owners %llu) "
               "fallbacks=%llu",
               (unsigned long long)handoffs, (unsigned long long)dhandoffs, (unsigned long long)relays,
               (unsigned long long)fallbacks);
    printf("\n");
    return 0;
}

/* A completion for a QP without an inbox is kept, counted, and given back
 * by take_unrouted. */
static void shared_cq_unrouted(fw_verbs_shared_cq *s, fw_verbs_inbox *any) {
    struct vend *e = &s_srv[S_CONNS];
    struct fw_shared_cq_stats st = {0};
    struct ibv_wc wc[4];
    int n = 0;
    const char *why = NULL;
    if (vend_send(&s_cli[S_CONNS], 0, 30)) why = "ibv_post_send";
    /* Any owner's poll polls the shared CQ and routes what it holds. */
    for (int k = 0; k < 10000 && !why; k++) {
        if (fw_verbs_inbox_poll(any, wc, 4, &n)) why = fw_last_error();
        else if (n != 0) why = "a completion in the wrong inbox";
        else if (fw_verbs_shared_cq_stats(s, &st) == 0 && st.unrouted > 0) break;
        else usleep(1000);
    }
    if (!why && st.unrouted != 1) why = "not counted as unrouted";
    if (!why && (fw_verbs_shared_cq_take_unrouted(s, wc, 4, &n) || n != 1)) why = "take_unrouted did not give it back";
    if (!why && wc[0].qp_num != e->qp->qp_num) why = "take_unrouted gave a completion of another QP";
    const char *cw = NULL;
    if (!why && v_consume(e, wc, 1, 0, 30, &cw) != 1) why = cw ? cw : "not the message sent";
    check(!why, "shared CQ: a completion without an inbox is kept and taken back", why ? why : "");
    /* Its client's send completion. */
    for (int k = 0; k < 1000 && s_cli[S_CONNS].unreaped; k++) {
        struct ibv_wc c[4];
        int m = ibv_poll_cq(s_cli_cq, 4, c);
        for (int i = 0; i < m; i++)
            if (s_client_of(c[i].qp_num) >= 0) s_cli[s_client_of(c[i].qp_num)].unreaped--;
        if (m <= 0) usleep(1000);
    }
}

/* FW_ROUTE_WR_ID_HIGH: one QP, two owners keyed by the high 32 bits of its
 * receives' wr_id. Receives posted alternately for keys 1 and 2 are
 * consumed in order, so messages 0, 2, 4... must reach inbox 1 and 1, 3,
 * 5... inbox 2, each with its own key's slots. */
static void shared_cq_wr_id_route(void) {
    enum { MSGS = 8 };
    const char *why = NULL;
    fw_verbs_shared_cq *s = NULL;
    fw_verbs_inbox *in[2] = {0};
    fw_waiter *w = NULL;
    struct vend srv = {0}, cli = {0};
    if (fw_verbs_shared_cq_create(vd.ctx, 64, 1, FW_ROUTE_WR_ID_HIGH, 32, &s) ||
        fw_verbs_shared_cq_inbox(s, 1, &in[0]) || fw_verbs_shared_cq_inbox(s, 2, &in[1]) ||
        fw_waiter_create("interrupt", &w))
        why = fw_last_error();
    srv.cq = srv.send_cq = fw_verbs_shared_cq_cq(s);
    cli.cq = cli.send_cq = s_cli_cq;
    if (!why && (vend_qp(&srv) || vend_qp(&cli) || vend_connect(&srv, &cli) || vend_connect(&cli, &srv)))
        why = "set up a connected RC QP pair";
    for (int i = 0; i < MSGS && !why; i++) {
        struct ibv_sge sge = {(uintptr_t)(srv.buf + i * V_MSG), V_MSG, srv.mr->lkey};
        struct ibv_recv_wr wr = {.wr_id = ((uint64_t)(1 + i % 2) << 32) | (uint64_t)i, .sg_list = &sge, .num_sge = 1},
                           *bad;
        if (ibv_post_recv(srv.qp, &wr, &bad)) why = "ibv_post_recv";
    }
    /* One send at a time: they share the client's send buffer. */
    for (uint32_t i = 0; i < MSGS && !why; i++) {
        if (vend_send(&cli, i, 40)) why = "ibv_post_send";
        for (int k = 0; k < 10000 && !why && cli.unreaped; k++) {
            struct ibv_wc c;
            int m = ibv_poll_cq(s_cli_cq, 1, &c);
            if (m < 0 || (m == 1 && c.status != IBV_WC_SUCCESS)) why = "client send completion";
            else if (m == 1) cli.unreaped--;
            else usleep(1000);
        }
        if (!why && cli.unreaped) why = "a client send did not complete";
    }
    for (int k = 0; k < 2 && !why; k++)
        for (uint32_t i = (uint32_t)k; i < MSGS && !why; i += 2) {
            struct ibv_wc wc;
            int n = 0;
            char want[V_MSG];
            v_fill(want, i, 40);
            if (fw_verbs_inbox_wait(w, in[k], 10000000000LL, &wc, 1, &n) || n != 1) why = fw_last_error();
            else if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) why = "not a good receive";
            else if (wc.wr_id != (((uint64_t)(k + 1) << 32) | i) || ntohl(wc.imm_data) != i ||
                     memcmp(srv.buf + i * V_MSG, want, V_MSG))
                why = "a message in the wrong inbox, or out of order";
        }
    struct fw_shared_cq_stats st = {0};
    if (!why && (fw_verbs_shared_cq_stats(s, &st) || st.routed != MSGS || st.unrouted != 0))
        why = "not every receive routed by its wr_id";
    check(!why, "shared CQ: FW_ROUTE_WR_ID_HIGH routes by wr_id >> 32 (two owners, one QP)", why ? why : "");
    if (srv.qp) ibv_destroy_qp(srv.qp);
    if (cli.qp) ibv_destroy_qp(cli.qp);
    srv.qp = cli.qp = NULL;
    srv.cq = srv.send_cq = cli.cq = cli.send_cq = NULL;
    vend_free(&srv);
    vend_free(&cli);
    fw_waiter_destroy(w);
    fw_verbs_inbox_destroy(in[0]);
    fw_verbs_inbox_destroy(in[1]);
    fw_verbs_shared_cq_destroy(s);
}

/* Bad input: errno and one line, never a crash. No device needed. */
static void shared_cq_bad_input(void) {
    fw_verbs_shared_cq *s = (fw_verbs_shared_cq *)1;
    fw_verbs_inbox *in = (fw_verbs_inbox *)1;
    struct ibv_wc wc[2];
    int n = 7;
    check(fw_verbs_shared_cq_create(NULL, 64, -1, FW_ROUTE_QP_NUM, 0, &s) == EINVAL && s == (fw_verbs_shared_cq *)1 &&
              strstr(fw_last_error(), "context") && !strchr(fw_last_error(), '\n'),
          "shared CQ: NULL context is EINVAL with a one-line cause", "accepted");
    check(fw_verbs_shared_cq_create(NULL, 0, -1, FW_ROUTE_QP_NUM, 0, &s) == EINVAL && strstr(fw_last_error(), "entries"),
          "shared CQ: 0 entries is EINVAL", "accepted");
    check(fw_verbs_shared_cq_create(NULL, 64, -2, FW_ROUTE_QP_NUM, 0, &s) == EINVAL && strstr(fw_last_error(), "cpu"),
          "shared CQ: cpu -2 is EINVAL", "accepted");
    check(fw_verbs_shared_cq_create(NULL, 64, -1, 7, 0, &s) == EINVAL && strstr(fw_last_error(), "route"),
          "shared CQ: an unknown route is EINVAL", "accepted");
    check(fw_verbs_shared_cq_create(NULL, 64, -1, FW_ROUTE_WR_ID_HIGH, 64, &s) == EINVAL &&
              strstr(fw_last_error(), "shift"),
          "shared CQ: shift 64 is EINVAL", "accepted");
    check(fw_verbs_shared_cq_create(NULL, 64, -1, FW_ROUTE_QP_NUM, 0, NULL) == EINVAL,
          "shared CQ: NULL output is EINVAL", "accepted");
    check(fw_verbs_shared_cq_cq(NULL) == NULL, "shared CQ: the CQ of NULL is NULL", "not NULL");
    check(fw_verbs_shared_cq_inbox(NULL, 1, &in) == EINVAL && in == (fw_verbs_inbox *)1,
          "shared CQ: an inbox of NULL is EINVAL", "accepted");
    check(fw_verbs_inbox_wait(NULL, NULL, 0, wc, 2, &n) == EINVAL && n == 0,
          "shared CQ: wait on NULL is EINVAL, n = 0", "accepted");
    n = 7;
    check(fw_verbs_inbox_poll(NULL, wc, 2, &n) == EINVAL && n == 0, "shared CQ: poll of NULL is EINVAL", "accepted");
    n = 7;
    check(fw_verbs_shared_cq_take_unrouted(NULL, wc, 2, &n) == EINVAL && n == 0,
          "shared CQ: take_unrouted of NULL is EINVAL", "accepted");
    struct fw_shared_cq_stats st;
    check(fw_verbs_shared_cq_stats(NULL, &st) == EINVAL, "shared CQ: stats of NULL is EINVAL", "accepted");
    fw_verbs_inbox_destroy(NULL);
    fw_verbs_shared_cq_destroy(NULL);
}

static void shared_cq_checks(int n) {
    shared_cq_bad_input();
    if (!verbs_can_run("shared CQ")) return;
    fw_verbs_shared_cq *s = NULL;
    fw_verbs_inbox *in[S_CONNS] = {0};
    int vec = -1, entries = 4 * V_DEPTH * (S_CONNS + 1);
    if (fw_verbs_shared_cq_create(vd.ctx, entries, 1, FW_ROUTE_QP_NUM, 0, &s) ||
        fw_verbs_comp_vector_for_cpu(vd.ctx, 0, &vec) || !(s_cli_cq = ibv_create_cq(vd.ctx, entries, NULL, NULL, vec))) {
        check(0, "shared CQ: create", fw_last_error());
        return;
    }
    for (int k = 0; k <= S_CONNS; k++) {
        s_srv[k].cq = s_srv[k].send_cq = fw_verbs_shared_cq_cq(s);
        s_cli[k].cq = s_cli[k].send_cq = s_cli_cq;
        if (vend_qp(&s_srv[k]) || vend_qp(&s_cli[k]) || vend_connect(&s_srv[k], &s_cli[k]) ||
            vend_connect(&s_cli[k], &s_srv[k])) {
            check(0, "shared CQ: set up connected RC QPs", strerror(errno));
            return;
        }
        for (int i = 0; i < V_DEPTH; i++)
            if (vend_post_recv(&s_srv[k], i) || vend_post_recv(&s_cli[k], i)) {
                check(0, "shared CQ: post receives", strerror(errno));
                return;
            }
        if (k < S_CONNS && fw_verbs_shared_cq_inbox(s, s_srv[k].qp->qp_num, &in[k])) {
            check(0, "shared CQ: inbox", fw_last_error());
            return;
        }
    }
    fw_verbs_inbox *dup = NULL;
    check(fw_verbs_shared_cq_inbox(s, s_srv[0].qp->qp_num, &dup) == EINVAL && dup == NULL,
          "shared CQ: a second inbox for one key is EINVAL", "accepted");
    fw_verbs_shared_cq *nowhere = NULL;
    int ncpu = (int)sysconf(_SC_NPROCESSORS_CONF);
    check(fw_verbs_shared_cq_create(vd.ctx, 64, ncpu + 1000, FW_ROUTE_QP_NUM, 0, &nowhere) == EINVAL &&
              nowhere == NULL && strstr(fw_last_error(), "does not exist"),
          "shared CQ: a CPU that does not exist is EINVAL", "accepted");
    const char *modes[] = {"interrupt", "hybrid:20us", "adaptive"};
    for (int m = 0; m < 3; m++) shared_cq_rounds(s, in, modes[m], n, NULL, 0);
    fw_dispatcher *d = NULL;
    /* Never idle, as in verbs_checks. */
    if (fw_dispatcher_start(1, -1, 0, &d) == 0) {
        for (int left = 4; shared_cq_rounds(s, in, "dispatch", n, d, left > 0); left--) {
        }
        fw_dispatcher_stop(d);
    } else {
        check(0, "shared CQ: dispatcher for CPU 1", fw_last_error());
    }
    shared_cq_unrouted(s, in[0]);
    shared_cq_wr_id_route();
    /* Teardown in the documented order: the QPs, the inboxes, the shared CQ
     * (which destroys its CQ and channel; every event it read was acked). */
    int bad = 0;
    for (int k = 0; k <= S_CONNS; k++) {
        bad |= ibv_destroy_qp(s_srv[k].qp) | ibv_destroy_qp(s_cli[k].qp);
        s_srv[k].qp = s_cli[k].qp = NULL;
        s_srv[k].cq = s_srv[k].send_cq = s_cli[k].cq = s_cli[k].send_cq = NULL;
        vend_free(&s_srv[k]);
        vend_free(&s_cli[k]);
    }
    for (int k = 0; k < S_CONNS; k++) fw_verbs_inbox_destroy(in[k]);
    fw_verbs_shared_cq_destroy(s);
    bad |= ibv_destroy_cq(s_cli_cq);
    check(!bad, "shared CQ: teardown (QPs, inboxes, the shared CQ, the client's CQ)", "a destroy failed");
    verbs_close();
}
#else
static void verbs_checks(int n) {
    (void)n;
    printf("SKIPPED verbs: built without <infiniband/verbs.h> (install libibverbs-dev)\n");
}
static void shared_cq_checks(int n) {
    (void)n;
    printf("SKIPPED shared CQ: built without <infiniband/verbs.h> (install libibverbs-dev)\n");
}
#endif

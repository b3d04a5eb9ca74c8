// cq-idle: a busy-polling RDMA program with idle gaps, for the preload
// shim's FASTWAKE_POLLERS=sleep. Two threads of one process
// talk over two RC QPs on one device, each with a send CQ and a receive CQ
// created WITHOUT a completion channel (how polling programs make them:
// perftest without -e), and neither ever calls a wait:
//
// - the client sends bursts of 1-4 messages, then busy-polls its send CQ
//   and receive CQ (ibv_poll_cq) until every send has completed and every
//   reply has come; then it arms a timerfd for an idle gap of 1 ms to
//   GAP_MAX_MS (default 10) and
//   busy-polls its two CQs and the timerfd (poll() with a zero timeout, the
//   way event loops poll their timers) until the timer fires;
// - the server busy-polls its receive CQ and send CQ, and replies to each
//   message as it arrives.
//
// Every message carries its sequence number and a pattern, checked at the
// receiving end: a lost, duplicated, reordered or corrupt message fails the
// run. The burst sizes and gaps come from SEED (default 1); the payloads,
// and so the checksum, depend only on the number of messages.
//
// usage: cq-idle DEV GID_INDEX BURSTS [SEED [GAP_MAX_MS]]
// prints: "cq-idle ok bursts=B msgs=M sum=S cpu_s=C sys_s=Y server_cpu_s=SC
//          client_cpu_s=CC wall_s=W gap_ms=G empty_polls=E"
// cpu_s: the process's CPU seconds (user + system, getrusage RUSAGE_SELF)
// from just before the threads start to just after both are done; sys_s:
// the system part of it;
// server_cpu_s/client_cpu_s: each thread's own (RUSAGE_THREAD); gap_ms:
// the idle gaps' total; empty_polls: ibv_poll_cq calls that returned 0.
// Exit 0 only when every message was checked.
// Build: cc -O2 -pthread cq-idle.c -libverbs (scripts/rxe/pollers-checks.sh
// does, in the guest; rc-common.h beside it).
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define RECVS 16
#define SENDS 16
#define MSG 64
#define MAX_BURST 4
// A run that makes no progress for this long has hung.
#define STUCK_NS (20LL * 1000000000LL)
#define PROG "cq-idle"
#include "rc-common.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static int gid_index;
static union ibv_gid gid;
static long total_msgs;

struct end {
    const char *name;
    struct ibv_cq *rcq, *scq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    char *buf; // RECVS receive slots, then SENDS send slots
    uint64_t sum;
    long sent, send_done, received, empty_polls;
    double cpu_s;
};

static double tv_s(struct timeval t) { return t.tv_sec + t.tv_usec / 1e6; }

// CPU seconds, user + system; *sys (if given): the system part.
static double cpu_of(int who, double *sys) {
    struct rusage ru;
    if (getrusage(who, &ru)) die("getrusage", "main");
    if (sys) *sys = tv_s(ru.ru_stime);
    return tv_s(ru.ru_utime) + tv_s(ru.ru_stime);
}

static void post_recv(struct end *e, int slot) {
    struct ibv_sge sge = {(uintptr_t)(e->buf + slot * MSG), MSG, e->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(e->qp, &wr, &bad)) die("ibv_post_recv", e->name);
}

static void setup(struct end *e) {
    // No completion channel: a polling program's CQs.
    e->rcq = ibv_create_cq(ctx, RECVS * 2, NULL, NULL, 0);
    e->scq = ibv_create_cq(ctx, SENDS * 2, NULL, NULL, 0);
    if (!e->rcq || !e->scq) die("ibv_create_cq", e->name);
    e->buf = calloc(RECVS + SENDS, MSG);
    e->mr = ibv_reg_mr(pd, e->buf, (RECVS + SENDS) * MSG, IBV_ACCESS_LOCAL_WRITE);
    if (!e->mr) die("ibv_reg_mr", e->name);
    struct ibv_qp_init_attr qa = {.send_cq = e->scq, .recv_cq = e->rcq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = SENDS, .max_recv_wr = RECVS, .max_send_sge = 1, .max_recv_sge = 1}};
    e->qp = ibv_create_qp(pd, &qa);
    if (!e->qp) die("ibv_create_qp", e->name);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
        .qp_access_flags = 0};
    if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("ibv_modify_qp INIT", e->name);
    for (int i = 0; i < RECVS; i++) post_recv(e, i);
}

static void check(struct end *e, const char *p, uint64_t seq) {
    uint64_t got;
    if (!payload_ok(p, seq, &got)) {
        fprintf(stderr, "cq-idle: %s: message %llu arrived as %llu or corrupt\n", e->name,
                (unsigned long long)seq, (unsigned long long)got);
        exit(1);
    }
    for (int i = 0; i < MSG; i++) e->sum = e->sum * 131 + (unsigned char)p[i];
}

// Post message seq from the next send slot (free: at most SENDS - 1 sends
// are outstanding, the callers see to it).
static void send_msg(struct end *e, uint64_t seq) {
    char *p = e->buf + (RECVS + e->sent % SENDS) * MSG;
    fill(p, seq);
    struct ibv_sge sge = {(uintptr_t)p, MSG, e->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = seq, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
        .send_flags = IBV_SEND_SIGNALED}, *bad;
    if (ibv_post_send(e->qp, &wr, &bad)) die("ibv_post_send", e->name);
    e->sent++;
}

// One busy look at both CQs: send completions retire their slots, each
// received message is checked (it must be message `*next_in`) and its slot
// re-posted; returns the messages received.
static int poll_both(struct end *e, uint64_t *next_in, uint64_t step) {
    struct ibv_wc wc[8];
    int n = ibv_poll_cq(e->scq, 8, wc);
    if (n < 0) die("ibv_poll_cq (send)", e->name);
    if (n == 0) e->empty_polls++;
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_SEND) {
            fprintf(stderr, "cq-idle: %s: send %llu: %s (opcode %d)\n", e->name,
                    (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status), wc[i].opcode);
            exit(1);
        }
        e->send_done++;
    }
    int r = ibv_poll_cq(e->rcq, 8, wc);
    if (r < 0) die("ibv_poll_cq (recv)", e->name);
    if (r == 0) e->empty_polls++;
    for (int i = 0; i < r; i++) {
        if (wc[i].status != IBV_WC_SUCCESS || wc[i].byte_len != MSG) {
            fprintf(stderr, "cq-idle: %s: recv: %s (%u bytes)\n", e->name,
                    ibv_wc_status_str(wc[i].status), wc[i].byte_len);
            exit(1);
        }
        check(e, e->buf + wc[i].wr_id * MSG, *next_in);
        *next_in += step;
        post_recv(e, (int)wc[i].wr_id);
        e->received++;
    }
    return r;
}

static void stuck(struct end *e, long long since, const char *what) {
    if (now_ns() - since > STUCK_NS) {
        fprintf(stderr, "cq-idle: %s: no progress for 20 s (%s; sent %ld, send completions %ld, received %ld)\n",
                e->name, what, e->sent, e->send_done, e->received);
        exit(1);
    }
}

static struct end ends[2] = {{.name = "client"}, {.name = "server"}};

// The server: message 2i in, reply 2i+1 out, until every message came.
static void *server(void *arg) {
    struct end *e = arg;
    uint64_t next_in = 0;
    long long last = now_ns();
    for (unsigned long loops = 1; e->received < total_msgs || e->send_done < e->sent; loops++) {
        long before = e->received + e->send_done;
        int r = poll_both(e, &next_in, 2);
        // Each message received is answered at once (its reply's slot is
        // free: the client's burst is at most MAX_BURST, and it waits for
        // every reply before the next).
        for (int i = 0; i < r; i++) send_msg(e, next_in - 2 * (uint64_t)(r - i) + 1);
        if (e->received + e->send_done != before) last = now_ns();
        else if ((loops & 0xfff) == 0) stuck(e, last, "server");
    }
    e->cpu_s = cpu_of(RUSAGE_THREAD, NULL);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 6) {
        fprintf(stderr, "usage: cq-idle DEV GID_INDEX BURSTS [SEED [GAP_MAX_MS]]\n");
        return 2;
    }
    gid_index = atoi(argv[2]);
    long bursts = atol(argv[3]);
    unsigned seed = argc >= 5 ? (unsigned)strtoul(argv[4], NULL, 0) : 1;
    long gap_max_ms = argc == 6 ? atol(argv[5]) : 10;
    if (bursts <= 0) {
        fprintf(stderr, "cq-idle: BURSTS must be > 0\n");
        return 2;
    }
    if (gap_max_ms < 1 || gap_max_ms > 1000) {
        fprintf(stderr, "cq-idle: GAP_MAX_MS must be 1 to 1000\n");
        return 2;
    }
    // The schedule: burst sizes 1-MAX_BURST and gaps 1 ms-GAP_MAX_MS, from
    // the seed (the sizes, and so the checksum, do not depend on the gaps).
    int *size = calloc(bursts, sizeof *size);
    long *gap_us = calloc(bursts, sizeof *gap_us);
    unsigned r = seed;
    long long gap_total = 0;
    for (long b = 0; b < bursts; b++) {
        size[b] = 1 + rand_r(&r) % MAX_BURST;
        gap_us[b] = 1000 + rand_r(&r) % (gap_max_ms * 1000 - 999);
        total_msgs += size[b];
        gap_total += gap_us[b];
    }
    int n;
    struct ibv_device **list = ibv_get_device_list(&n), *dev = NULL;
    for (int i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), argv[1])) dev = list[i];
    if (!dev) {
        fprintf(stderr, "cq-idle: no device %s\n", argv[1]);
        return 1;
    }
    ctx = ibv_open_device(dev);
    if (!ctx || !(pd = ibv_alloc_pd(ctx))) die("open/alloc_pd", "main");
    if (ibv_query_gid(ctx, 1, gid_index, &gid)) die("ibv_query_gid", "main");
    setup(&ends[0]);
    setup(&ends[1]);
    rc_connect(ends[0].qp, ends[1].qp->qp_num, gid, gid_index, ends[0].name);
    rc_connect(ends[1].qp, ends[0].qp->qp_num, gid, gid_index, ends[1].name);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    if (tfd < 0) die("timerfd_create", "client");

    double sys0, sys1, cpu0 = cpu_of(RUSAGE_SELF, &sys0);
    long long t0 = now_ns();
    pthread_t t;
    if (pthread_create(&t, NULL, server, &ends[1])) die("pthread_create", "main");
    struct end *c = &ends[0];
    uint64_t next_in = 1;
    double client_cpu0 = cpu_of(RUSAGE_THREAD, NULL);
    for (long b = 0; b < bursts; b++) {
        long want = c->received + size[b];
        for (int j = 0; j < size[b]; j++) send_msg(c, 2 * (uint64_t)c->sent);
        long long last = now_ns();
        for (unsigned long loops = 1; c->received < want || c->send_done < c->sent; loops++) {
            long before = c->received + c->send_done;
            poll_both(c, &next_in, 2);
            if (c->received + c->send_done != before) last = now_ns();
            else if ((loops & 0xfff) == 0) stuck(c, last, "burst");
        }
        // The idle gap: the CQs and the timer, polled.
        struct itimerspec its = {.it_value = {.tv_sec = gap_us[b] / 1000000, .tv_nsec = gap_us[b] % 1000000 * 1000}};
        if (timerfd_settime(tfd, 0, &its, NULL)) die("timerfd_settime", "client");
        for (;;) {
            if (poll_both(c, &next_in, 2) != 0) {
                fprintf(stderr, "cq-idle: client: a message in an idle gap\n");
                return 1;
            }
            struct pollfd p = {.fd = tfd, .events = POLLIN};
            int k = poll(&p, 1, 0);
            if (k < 0 && errno != EINTR) die("poll", "client");
            if (k == 1) {
                uint64_t x;
                if (read(tfd, &x, sizeof x) != sizeof x) die("read timerfd", "client");
                break;
            }
        }
    }
    c->cpu_s = cpu_of(RUSAGE_THREAD, NULL) - client_cpu0;
    pthread_join(t, NULL);
    double cpu = cpu_of(RUSAGE_SELF, &sys1) - cpu0;
    double wall = (now_ns() - t0) / 1e9;
    for (int i = 0; i < 2; i++) {
        struct end *e = &ends[i];
        if (ibv_destroy_qp(e->qp) || ibv_destroy_cq(e->rcq) || ibv_destroy_cq(e->scq) || ibv_dereg_mr(e->mr))
            die("destroy", e->name);
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    if (c->received != total_msgs || ends[1].received != total_msgs) {
        fprintf(stderr, "cq-idle: %ld/%ld messages\n", c->received, ends[1].received);
        return 1;
    }
    printf("cq-idle ok bursts=%ld msgs=%ld sum=%016llx cpu_s=%.3f sys_s=%.3f server_cpu_s=%.3f client_cpu_s=%.3f wall_s=%.3f gap_ms=%lld empty_polls=%ld\n",
           bursts, total_msgs, (unsigned long long)(ends[0].sum ^ ends[1].sum), cpu, sys1 - sys0, ends[1].cpu_s,
           c->cpu_s, wall, gap_total / 1000, ends[0].empty_polls + ends[1].empty_polls);
    return 0;
}

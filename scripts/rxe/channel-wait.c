// channel-wait: two threads ping-pong N messages over two RC QPs on one RDMA
// device, each waiting for its receive completions the way UCX, rsockets'
// rpoll, libfabric and Ceph do: a NON-BLOCKING completion channel whose fd
// sits in an epoll (or poll, or select) set; after the wait, ibv_get_cq_event until
// EAGAIN, ack, re-arm, poll the CQ. Every message carries its sequence
// number and a pattern, checked at both ends: a lost, duplicated or
// reordered completion fails the run.
//
// usage: channel-wait DEV GID_INDEX N epoll|poll|select|block [SEED]
// block: a BLOCKING channel, waited for in ibv_get_cq_event itself (the
// rc_pingpong -e way). With CHANNEL_WAIT_SERVICE_US=D the server is busy D us
// before each reply: a steady service time, what a pre-wake is for.
// With SEED, a randomized stress: the client sends bursts of 1-8 messages
// before reading their replies and both ends pause at random (0-300 us)
// before some waits, so CQEs, arms, synthetic readiness and the kernel's
// events race in ever other orders; the payloads (and so the checksum) do
// not depend on the seed.
// prints: "channel-wait ok n=N mode=M sum=S waits=W empty_wakes=E events=V"
// (sum: checksum of every payload, the same for every run of N; empty_wakes:
// waits that returned the fd ready but ibv_get_cq_event gave EAGAIN at once).
// With CHANNEL_WAIT_CQ_EX=1 the receive CQs are extended CQs
// (ibv_create_cq_ex with IBV_WC_STANDARD_FLAGS, read in ibv_start_poll/
// ibv_end_poll batches, every field checked) and the messages carry their
// sequence number as immediate data; the line then ends
// "cq_ex_batches=B". With CHANNEL_WAIT_SCQ_EX=1 the send CQs are extended
// CQs without a channel (IBV_WC_EX_WITH_QP_NUM; what a polling program
// makes, which the shim passes through), each send's completion read in a
// start_poll/end_poll batch of one and checked (a SEND on this end's QP).
// Exit 0 only when all N round trips were checked. Build: cc -O2 -pthread
// channel-wait.c -libverbs (scripts/rxe/channel-checks.sh does, in the
// guest; rc-common.h beside it).
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#define RECVS 16
#define MSG 64
#define WAIT_MS 10000
#define PROG "channel-wait"
#include "rc-common.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static int gid_index, use_epoll, use_select, use_block, iters;
static long service_us;
static unsigned seed;
static int use_cq_ex, use_scq_ex;
static union ibv_gid gid;

struct end {
    const char *name;
    struct ibv_comp_channel *ch;
    struct ibv_cq *rcq, *scq;
    struct ibv_cq_ex *rcq_ex; // with use_cq_ex: rcq is ibv_cq_ex_to_cq(rcq_ex)
    struct ibv_cq_ex *scq_ex; // with use_scq_ex: scq is ibv_cq_ex_to_cq(scq_ex)
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    char *buf; // RECVS receive slots, then one send slot
    int ep;    // epoll fd (epoll mode)
    unsigned unacked;
    long waits, empty, events;
    uint64_t sum;
    long batches; // extended CQ: start_poll batches that returned a CQE
};

static void post_recv(struct end *e, int slot) {
    struct ibv_sge sge = {(uintptr_t)(e->buf + slot * MSG), MSG, e->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(e->qp, &wr, &bad)) die("ibv_post_recv", e->name);
}

static void setup(struct end *e) {
    e->ch = ibv_create_comp_channel(ctx);
    if (!e->ch) die("ibv_create_comp_channel", e->name);
    int fl = fcntl(e->ch->fd, F_GETFL);
    if (!use_block && (fl < 0 || fcntl(e->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0))
        die("fcntl O_NONBLOCK", e->name);
    if (use_cq_ex) {
        struct ibv_cq_init_attr_ex ca = {.cqe = RECVS * 2, .cq_context = e, .channel = e->ch,
            .wc_flags = IBV_WC_STANDARD_FLAGS};
        e->rcq_ex = ibv_create_cq_ex(ctx, &ca);
        e->rcq = e->rcq_ex ? ibv_cq_ex_to_cq(e->rcq_ex) : NULL;
    } else {
        e->rcq = ibv_create_cq(ctx, RECVS * 2, e, e->ch, 0);
    }
    if (use_scq_ex) {
        struct ibv_cq_init_attr_ex ca = {.cqe = RECVS * 2, .wc_flags = IBV_WC_EX_WITH_QP_NUM};
        e->scq_ex = ibv_create_cq_ex(ctx, &ca);
        e->scq = e->scq_ex ? ibv_cq_ex_to_cq(e->scq_ex) : NULL;
    } else {
        e->scq = ibv_create_cq(ctx, RECVS * 2, NULL, NULL, 0);
    }
    if (!e->rcq || !e->scq) die("ibv_create_cq", e->name);
    e->buf = calloc(RECVS + 1, MSG);
    e->mr = ibv_reg_mr(pd, e->buf, (RECVS + 1) * MSG, IBV_ACCESS_LOCAL_WRITE);
    if (!e->mr) die("ibv_reg_mr", e->name);
    struct ibv_qp_init_attr qa = {.send_cq = e->scq, .recv_cq = e->rcq, .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 4, .max_recv_wr = RECVS, .max_send_sge = 1, .max_recv_sge = 1}};
    e->qp = ibv_create_qp(pd, &qa);
    if (!e->qp) die("ibv_create_qp", e->name);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
        .qp_access_flags = 0};
    if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        die("ibv_modify_qp INIT", e->name);
    for (int i = 0; i < RECVS; i++) post_recv(e, i);
    if (use_epoll) {
        e->ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = e};
        if (e->ep < 0 || epoll_ctl(e->ep, EPOLL_CTL_ADD, e->ch->fd, &ev)) die("epoll", e->name);
    }
}

static void connect_to(struct end *e, uint32_t qpn) {
    rc_connect(e->qp, qpn, gid, gid_index, e->name);
}

// Start a batch on an extended CQ: 1 with w's wr_id and status filled from
// the CQE it stands on (the caller reads the rest, then ends the batch),
// 0 when the CQ is empty, -1 on error.
static int start_one(struct ibv_cq_ex *cq, struct ibv_wc *w) {
    struct ibv_poll_cq_attr pa = {0};
    int ret = ibv_start_poll(cq, &pa);
    if (ret == ENOENT) return 0;
    if (ret) return -1;
    *w = (struct ibv_wc){.wr_id = cq->wr_id, .status = cq->status};
    return 1;
}

// One receive completion if there is one: ibv_poll_cq, or an extended CQ's
// batch of one: start_poll, every field the CQ was created with read
// through the ibv_wc_read_* calls and checked (a receive of MSG bytes on
// this end's QP, with immediate data), end_poll. One CQE per batch: rxe in
// rdma-core 44 advances its consumer index twice when next_poll returns
// ENOENT and end_poll follows, as the man page asks (rdma-core PR #1512),
// and then reads entries the kernel has not written. Multi-CQE batches are
// covered on the host (crates/fastwake-preload/src/verbs/cq_ex_tests.rs).
static int poll_recv(struct end *e, struct ibv_wc *wc) {
    if (!use_cq_ex) return ibv_poll_cq(e->rcq, 1, wc);
    struct ibv_cq_ex *cq = e->rcq_ex;
    struct ibv_wc w;
    int ret = start_one(cq, &w);
    if (ret <= 0) return ret;
    e->batches++;
    if (w.status == IBV_WC_SUCCESS) {
        w.opcode = ibv_wc_read_opcode(cq);
        w.byte_len = ibv_wc_read_byte_len(cq);
        w.qp_num = ibv_wc_read_qp_num(cq);
        w.wc_flags = ibv_wc_read_wc_flags(cq);
        w.imm_data = ibv_wc_read_imm_data(cq);
        w.src_qp = ibv_wc_read_src_qp(cq);
        w.vendor_err = ibv_wc_read_vendor_err(cq);
    }
    ibv_end_poll(cq);
    if (w.status == IBV_WC_SUCCESS &&
        (w.opcode != IBV_WC_RECV || w.byte_len != MSG || w.qp_num != e->qp->qp_num ||
         !(w.wc_flags & IBV_WC_WITH_IMM) || w.vendor_err)) {
        fprintf(stderr, "channel-wait: %s: extended CQE wr_id %llu: opcode %d byte_len %u qp_num %u (QP %u) wc_flags %#x vendor_err %u\n",
                e->name, (unsigned long long)w.wr_id, w.opcode, w.byte_len, w.qp_num,
                e->qp->qp_num, w.wc_flags, w.vendor_err);
        exit(1);
    }
    *wc = w;
    return 1;
}

// One send completion if there is one: ibv_poll_cq, or an extended send
// CQ's batch of one (the status, and on success the opcode and QP number
// read and checked).
static int poll_send(struct end *e, struct ibv_wc *wc) {
    if (!use_scq_ex) return ibv_poll_cq(e->scq, 1, wc);
    struct ibv_cq_ex *cq = e->scq_ex;
    struct ibv_wc w;
    int ret = start_one(cq, &w);
    if (ret <= 0) return ret;
    if (w.status == IBV_WC_SUCCESS) {
        w.opcode = ibv_wc_read_opcode(cq);
        w.qp_num = ibv_wc_read_qp_num(cq);
    }
    ibv_end_poll(cq);
    if (w.status == IBV_WC_SUCCESS && (w.opcode != IBV_WC_SEND || w.qp_num != e->qp->qp_num)) {
        fprintf(stderr, "channel-wait: %s: extended send CQE wr_id %llu: opcode %d qp_num %u (QP %u)\n",
                e->name, (unsigned long long)w.wr_id, w.opcode, w.qp_num, e->qp->qp_num);
        exit(1);
    }
    *wc = w;
    return 1;
}

static void check(struct end *e, const char *p, uint64_t seq) {
    uint64_t got;
    if (!payload_ok(p, seq, &got)) {
        fprintf(stderr, "channel-wait: %s: message %llu arrived as %llu or corrupt\n", e->name,
                (unsigned long long)seq, (unsigned long long)got);
        exit(1);
    }
    for (int i = 0; i < MSG; i++) e->sum = e->sum * 131 + (unsigned char)p[i];
}

// The immediate data an extended CQ's receive must carry: the sequence number.
static void check_imm(struct end *e, const struct ibv_wc *wc, uint64_t seq) {
    if (use_cq_ex && ntohl(wc->imm_data) != (uint32_t)seq) {
        fprintf(stderr, "channel-wait: %s: message %llu carried immediate data %u\n", e->name,
                (unsigned long long)seq, ntohl(wc->imm_data));
        exit(1);
    }
}

static void send_msg(struct end *e, uint64_t seq) {
    char *p = e->buf + RECVS * MSG;
    fill(p, seq);
    struct ibv_sge sge = {(uintptr_t)p, MSG, e->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = seq, .sg_list = &sge, .num_sge = 1,
        .opcode = use_cq_ex ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND,
        .imm_data = htonl((uint32_t)seq), .send_flags = IBV_SEND_SIGNALED}, *bad;
    if (ibv_post_send(e->qp, &wr, &bad)) die("ibv_post_send", e->name);
    struct ibv_wc wc;
    int n;
    while ((n = poll_send(e, &wc)) == 0) // the send slot is reused: wait for it
        ;
    if (n < 0 || wc.status != IBV_WC_SUCCESS) {
        fprintf(stderr, "channel-wait: %s: send %llu: %s\n", e->name, (unsigned long long)seq,
                n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
        exit(1);
    }
}

// One receive completion, waited for like UCX/rsockets: poll, arm, poll,
// wait for the fd, drain the channel until EAGAIN.
static void recv_msg(struct end *e, uint64_t seq) {
    struct ibv_wc wc;
    for (;;) {
        int n = poll_recv(e, &wc);
        if (n == 0) {
            if (ibv_req_notify_cq(e->rcq, 0)) die("ibv_req_notify_cq", e->name);
            n = poll_recv(e, &wc);
        }
        if (n < 0) die("ibv_poll_cq", e->name);
        if (n == 1) {
            if (wc.status != IBV_WC_SUCCESS) {
                fprintf(stderr, "channel-wait: %s: recv: %s\n", e->name, ibv_wc_status_str(wc.status));
                exit(1);
            }
            check(e, e->buf + wc.wr_id * MSG, seq);
            check_imm(e, &wc, seq);
            post_recv(e, (int)wc.wr_id);
            return;
        }
        e->waits++;
        if (use_block) {
            struct ibv_cq *cq;
            void *cctx;
            if (ibv_get_cq_event(e->ch, &cq, &cctx)) {
                if (errno == EINTR) continue;
                die("ibv_get_cq_event", e->name);
            }
            if (cq != e->rcq || cctx != e) {
                fprintf(stderr, "channel-wait: %s: event for a foreign CQ\n", e->name);
                exit(1);
            }
            e->events++;
            if (++e->unacked >= 16) {
                ibv_ack_cq_events(e->rcq, e->unacked);
                e->unacked = 0;
            }
            continue;
        }
        int r;
        if (use_epoll) {
            struct epoll_event ev;
            r = epoll_wait(e->ep, &ev, 1, WAIT_MS);
            if (r == 1 && ev.data.ptr != e) {
                fprintf(stderr, "channel-wait: %s: epoll_wait returned data %p, registered %p\n",
                        e->name, ev.data.ptr, (void *)e);
                exit(1);
            }
        } else if (use_select) {
            fd_set rs;
            FD_ZERO(&rs);
            FD_SET(e->ch->fd, &rs);
            struct timeval tv = {.tv_sec = WAIT_MS / 1000, .tv_usec = (WAIT_MS % 1000) * 1000};
            r = select(e->ch->fd + 1, &rs, NULL, NULL, &tv);
            if (r == 1 && !FD_ISSET(e->ch->fd, &rs)) {
                fprintf(stderr, "channel-wait: %s: select returned 1 without the channel fd\n", e->name);
                exit(1);
            }
        } else {
            struct pollfd p = {.fd = e->ch->fd, .events = POLLIN};
            r = poll(&p, 1, WAIT_MS);
            if (r == 1 && !(p.revents & POLLIN)) {
                fprintf(stderr, "channel-wait: %s: poll revents %#x\n", e->name, p.revents);
                exit(1);
            }
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die(use_epoll ? "epoll_wait" : use_select ? "select" : "poll", e->name);
        if (r == 0) {
            fprintf(stderr, "channel-wait: %s: no completion event within %d ms (message %llu)\n",
                    e->name, WAIT_MS, (unsigned long long)seq);
            exit(1);
        }
        struct ibv_cq *cq;
        void *cctx;
        int got = 0;
        while (ibv_get_cq_event(e->ch, &cq, &cctx) == 0) {
            if (cq != e->rcq || cctx != e) {
                fprintf(stderr, "channel-wait: %s: event for a foreign CQ\n", e->name);
                exit(1);
            }
            got++;
            e->events++;
            if (++e->unacked >= 16) {
                ibv_ack_cq_events(e->rcq, e->unacked);
                e->unacked = 0;
            }
        }
        if (errno != EAGAIN) die("ibv_get_cq_event", e->name);
        if (!got) e->empty++;
    }
}

static struct end ends[2] = {{.name = "client"}, {.name = "server"}};

// The server's work before a reply: busy for us microseconds. Not a sleep:
// under TCG the client's waits behind a 2 ms nanosleep fell in two modes,
// 2.2-2.7 ms and 3.4-4.2 ms (the guest's timers), which is no steady
// service time; behind a busy 2 ms they stay within 1.95-2.4 ms, a rare
// outlier aside.
static void serve_for(long us) {
    long long end = now_ns() + us * 1000LL;
    while (now_ns() < end)
        ;
}

// A random pause before some waits (stress mode only).
static void jitter(unsigned *r) {
    if (seed && rand_r(r) % 4 == 0) usleep(rand_r(r) % 300);
}

static void *server(void *arg) {
    struct end *e = arg;
    unsigned r = seed * 7 + 1;
    for (uint64_t i = 0; i < (uint64_t)iters; i++) {
        jitter(&r);
        recv_msg(e, 2 * i);
        if (service_us > 0) serve_for(service_us);
        send_msg(e, 2 * i + 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 6) {
        fprintf(stderr, "usage: channel-wait DEV GID_INDEX N epoll|poll|select|block [SEED]\n");
        return 2;
    }
    if (strcmp(argv[4], "epoll") && strcmp(argv[4], "poll") && strcmp(argv[4], "select") &&
        strcmp(argv[4], "block")) {
        fprintf(stderr, "channel-wait: unknown wait form '%s' (epoll, poll, select or block)\n", argv[4]);
        return 2;
    }
    gid_index = atoi(argv[2]);
    iters = atoi(argv[3]);
    use_epoll = !strcmp(argv[4], "epoll");
    use_block = !strcmp(argv[4], "block");
    use_select = !strcmp(argv[4], "select");
    service_us = getenv("CHANNEL_WAIT_SERVICE_US") ? atol(getenv("CHANNEL_WAIT_SERVICE_US")) : 0;
    seed = argc == 6 ? (unsigned)strtoul(argv[5], NULL, 0) : 0;
    use_cq_ex = getenv("CHANNEL_WAIT_CQ_EX") && !strcmp(getenv("CHANNEL_WAIT_CQ_EX"), "1");
    use_scq_ex = getenv("CHANNEL_WAIT_SCQ_EX") && !strcmp(getenv("CHANNEL_WAIT_SCQ_EX"), "1");
    int n;
    struct ibv_device **list = ibv_get_device_list(&n), *dev = NULL;
    for (int i = 0; list && i < n; i++)
        if (!strcmp(ibv_get_device_name(list[i]), argv[1])) dev = list[i];
    if (!dev) {
        fprintf(stderr, "channel-wait: no device %s\n", argv[1]);
        return 1;
    }
    ctx = ibv_open_device(dev);
    if (!ctx || !(pd = ibv_alloc_pd(ctx))) die("open/alloc_pd", "main");
    if (ibv_query_gid(ctx, 1, gid_index, &gid)) die("ibv_query_gid", "main");
    setup(&ends[0]);
    setup(&ends[1]);
    connect_to(&ends[0], ends[1].qp->qp_num);
    connect_to(&ends[1], ends[0].qp->qp_num);
    pthread_t t;
    pthread_create(&t, NULL, server, &ends[1]);
    struct end *c = &ends[0];
    unsigned r = seed;
    for (uint64_t i = 0; i < (uint64_t)iters;) {
        uint64_t k = seed ? 1 + rand_r(&r) % 8 : 1;
        if (k > (uint64_t)iters - i) k = (uint64_t)iters - i;
        for (uint64_t j = 0; j < k; j++) send_msg(c, 2 * (i + j));
        jitter(&r);
        for (uint64_t j = 0; j < k; j++) recv_msg(c, 2 * (i + j) + 1);
        i += k;
    }
    pthread_join(t, NULL);
    long waits = 0, empty = 0, events = 0, batches = 0;
    for (int i = 0; i < 2; i++) {
        struct end *e = &ends[i];
        waits += e->waits;
        empty += e->empty;
        events += e->events;
        batches += e->batches;
        if (e->unacked) ibv_ack_cq_events(e->rcq, e->unacked);
        // Destroy must not hang: every event read was acked.
        if (ibv_destroy_qp(e->qp) || ibv_destroy_cq(e->rcq) || ibv_destroy_cq(e->scq) ||
            ibv_destroy_comp_channel(e->ch) || ibv_dereg_mr(e->mr))
            die("destroy", e->name);
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    printf("channel-wait ok n=%d mode=%s sum=%016llx waits=%ld empty_wakes=%ld events=%ld", iters,
           argv[4], (unsigned long long)(ends[0].sum ^ ends[1].sum), waits, empty, events);
    if (use_cq_ex) printf(" cq_ex_batches=%ld", batches);
    printf("\n");
    return 0;
}

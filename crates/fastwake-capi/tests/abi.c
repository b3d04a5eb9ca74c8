/* C ABI test: the header compiles, struct layouts match what the Rust side
 * was built with, every entry point behaves as documented, and two threads
 * ping-pong through the library in every mode with no lost completion.
 * Built and run by scripts/c-abi-test. Prints one line per check (PASS,
 * FAIL, SKIPPED, and INFO lines with counters) and "c-abi: N passed, M
 * failed". With -DFW_TEST_VERBS (and -libverbs) it also has a verbs part,
 * which needs an RDMA device (the Soft-RoCE guest runs `abi verbs [N]` and
 * `abi shared-cq [N]`, only those parts) and says SKIPPED without one. */
#include "fastwake.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(struct fw_channel_config) == 12, "fw_channel_config layout");
_Static_assert(sizeof(struct fw_wait_stats) == 48, "fw_wait_stats layout");
_Static_assert(offsetof(struct fw_wait_stats, spin_skipped_same_cpu) == 40, "fw_wait_stats layout");
_Static_assert(sizeof(struct fw_dispatch_stats) == 64, "fw_dispatch_stats layout");
_Static_assert(offsetof(struct fw_dispatch_stats, idle_after_ns) == 48, "fw_dispatch_stats layout");
_Static_assert(offsetof(struct fw_dispatch_stats, state) == 56, "fw_dispatch_stats layout");
_Static_assert(sizeof(struct fw_verbs_stats) == 40, "fw_verbs_stats layout");
_Static_assert(offsetof(struct fw_verbs_stats, stashed) == 32, "fw_verbs_stats layout");
_Static_assert(sizeof(struct fw_dispatch_wait_stats) == 64, "fw_dispatch_wait_stats layout");
_Static_assert(offsetof(struct fw_dispatch_wait_stats, reserved) == 40, "fw_dispatch_wait_stats layout");
_Static_assert(sizeof(struct fw_prewake_stats) == 64, "fw_prewake_stats layout");
_Static_assert(offsetof(struct fw_prewake_stats, pauses) == 32, "fw_prewake_stats layout");
_Static_assert(offsetof(struct fw_prewake_stats, margin_ns) == 40, "fw_prewake_stats layout");
_Static_assert(offsetof(struct fw_prewake_stats, reserved) == 48, "fw_prewake_stats layout");
_Static_assert(sizeof(struct fw_notice_stats) == 32, "fw_notice_stats layout");
_Static_assert(offsetof(struct fw_notice_stats, late_notices) == 16, "fw_notice_stats layout");
_Static_assert(sizeof(struct fw_shared_cq_stats) == 96, "fw_shared_cq_stats layout");
_Static_assert(offsetof(struct fw_shared_cq_stats, events) == 48, "fw_shared_cq_stats layout");
_Static_assert(offsetof(struct fw_shared_cq_stats, reserved) == 72, "fw_shared_cq_stats layout");
_Static_assert(sizeof(fw_lanes_config) == 72, "fw_lanes_config layout");
_Static_assert(offsetof(fw_lanes_config, batch_bytes) == 48, "fw_lanes_config layout");
_Static_assert(offsetof(fw_lanes_config, bulk_mode) == 64, "fw_lanes_config layout");
_Static_assert(sizeof(struct fw_lanes_stats) == 112, "fw_lanes_stats layout");
_Static_assert(offsetof(struct fw_lanes_stats, handed) == 104, "fw_lanes_stats layout");
_Static_assert(offsetof(struct fw_lanes_stats, received) == 80, "fw_lanes_stats layout");
_Static_assert(sizeof(fw_fetch_config) == 80, "fw_fetch_config layout");
_Static_assert(offsetof(fw_fetch_config, buckets) == 32, "fw_fetch_config layout");
_Static_assert(offsetof(fw_fetch_config, pin_server) == 64, "fw_fetch_config layout");
_Static_assert(sizeof(struct fw_fetch_stats) == 96, "fw_fetch_stats layout");
_Static_assert(offsetof(struct fw_fetch_stats, switches) == 80, "fw_fetch_stats layout");

static int passed, failed;

static void check(int ok, const char *name, const char *why) {
    if (ok) {
        passed++;
        printf("PASS %s\n", name);
    } else {
        failed++;
        printf("FAIL %s (%s; last error: %s)\n", name, why, fw_last_error());
    }
}

struct pong_arg {
    fw_sender *tx;
    fw_receiver *rx;
    const char *mode;
    int n;
    int cpu; /* pin the pong thread here; -1: anywhere */
    int bad;
    struct fw_dispatch_wait_stats ds; /* how its waits ended */
};

/* Pin the calling thread to cpu; -1: every CPU again. */
static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < n && c < CPU_SETSIZE; c++)
        if (cpu < 0 || c == cpu) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static void *pong(void *p) {
    struct pong_arg *a = p;
    if (a->cpu >= 0) pin(a->cpu);
    fw_waiter *w = NULL;
    if (fw_waiter_create(a->mode, &w)) {
        a->bad = 1;
        return NULL;
    }
    for (int i = 0; i < a->n; i++) {
        uint64_t tag = 0;
        char buf[16];
        size_t len = 0;
        if (fw_wait(w, a->rx, 5000000000LL, &tag, buf, sizeof buf, &len) || tag != (uint64_t)i ||
            len != 5 || memcmp(buf, "hello", 5)) {
            a->bad = 1;
            break;
        }
        if (fw_send(a->tx, tag, "world", 5)) {
            a->bad = 1;
            break;
        }
    }
    if (fw_waiter_dispatch_stats(w, &a->ds)) a->bad = 1;
    fw_waiter_destroy(w);
    return NULL;
}

/* Echo msg_size-byte messages back on a socket source until the peer
 * closes (EPIPE ends it normally). */
struct sock_echo_arg {
    fw_socket *s;
    int bad;
};

static void *sock_echo(void *p) {
    struct sock_echo_arg *a = p;
    fw_waiter *w = NULL;
    if (fw_waiter_create("interrupt", &w)) {
        a->bad = 1;
        return NULL;
    }
    char m[16];
    int rc;
    while ((rc = fw_socket_wait(w, a->s, 5000000000LL, m, sizeof m)) == 0)
        if (fw_socket_send(a->s, m, sizeof m)) {
            a->bad = 1;
            break;
        }
    if (rc != 0 && rc != EPIPE) a->bad = 1;
    fw_waiter_destroy(w);
    return NULL;
}

/* The socket source: bad arguments, fd duplication, a round trip per
 * mode with the payload intact, a timeout, and the peer's close. */
static void socket_checks(void) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        check(0, "socketpair", strerror(errno));
        return;
    }
    fw_socket *a = NULL, *b = NULL, *x = NULL;
    check(fw_socket_create(-1, 16, 0, &x) == EBADF && x == NULL, "socket: bad fd is EBADF", "");
    check(fw_socket_create(sv[0], 0, 0, &x) == EINVAL && x == NULL, "socket: msg_size 0 is EINVAL",
          "");
    check(fw_socket_create(sv[0], 16, 0, NULL) == EINVAL, "socket: NULL out is EINVAL", "");
    int ok = fw_socket_create(sv[0], 16, 0, &a) == 0 && fw_socket_create(sv[1], 16, 0, &b) == 0;
    check(ok, "socket: create", "");
    if (!ok) return;
    /* The library holds duplicates: the caller's fds may go. */
    close(sv[0]);
    close(sv[1]);
    check(fw_socket_fd(a) >= 0 && fw_socket_fd(NULL) == -1, "socket: notify fd", "");

    struct sock_echo_arg e = {b, 0};
    pthread_t t;
    pthread_create(&t, NULL, sock_echo, &e);
    const char *modes[] = {"poll", "interrupt", "hybrid:20us", "adaptive"};
    for (int k = 0; k < 4; k++) {
        fw_waiter *w = NULL;
        int good = fw_waiter_create(modes[k], &w) == 0;
        for (uint32_t i = 0; good && i < 500; i++) {
            char out[16], in[16];
            memset(out, 'a' + k, sizeof out);
            memcpy(out, &i, sizeof i);
            good = fw_socket_send(a, out, sizeof out) == 0 &&
                   fw_socket_wait(w, a, 5000000000LL, in, sizeof in) == 0 &&
                   memcmp(in, out, sizeof in) == 0;
        }
        char name[64];
        snprintf(name, sizeof name, "socket: 500 round trips, %s", modes[k]);
        check(good, name, "lost, late or corrupted message");
        if (k == 3) {
            check(fw_socket_wait(w, a, 1000000, NULL, 0) == ETIMEDOUT, "socket: timeout",
                  "expected ETIMEDOUT");
        }
        fw_waiter_destroy(w);
    }
    /* Closing our end ends the echo thread with EPIPE... */
    fw_socket_destroy(a);
    pthread_join(t, NULL);
    check(!e.bad, "socket: echo side saw the close as EPIPE", "echo thread failed");
    fw_socket_destroy(b);
    fw_socket_destroy(NULL);
}

/* Lanes: bad parameters, a listener and an endpoint in one thread (the
 * kernel's backlog completes the connections before the accept), a small
 * message on the latency lane and a large one on the bulk lane, both
 * whole; truncation; a timeout; a second message buffered; the peer's close. */
#include "abi_lanes.c"

static void fetch_checks(void) {
    fw_fetch_server *s = NULL;
    fw_fetch_config bad = {0};
    bad.max_object = 1ull << 31;
    check(fw_fetch_server_create(&bad, &s) == EINVAL && s == NULL,
          "fetch: a max object over 1 GiB is EINVAL", "");
    fw_fetch_config c = {0};
    c.capacity = 1 << 20;
    c.timeout_ns = 2000000000ull;
    int rc = fw_fetch_server_create(&c, &s);
    if (rc != 0) {
        const char *e = fw_last_error();
        check(s == NULL && e && *e && !strchr(e, '\n'), "fetch: no device is one line", e);
        printf("SKIPPED fetch round trip: %s\n", e);
        return;
    }
    fw_fetch_client *cl = NULL;
    c.path = "adaptive";
    int ok = fw_fetch_client_create(s, &c, &cl) == 0 && fw_fetch_put(s, 7, "hello", 5) == 0;
    check(ok, "fetch: server, client, put", fw_last_error());
    const int paths[] = {FW_FETCH_READ2, FW_FETCH_READ, FW_FETCH_RPC, FW_FETCH_BY_POLICY};
    for (int i = 0; i < 4; i++) {
        char got[16] = {0};
        size_t len = 0;
        int took = -2;
        ok = fw_fetch_get(cl, 7, paths[i], got, sizeof got, &len, &took) == 0 && len == 5 &&
             memcmp(got, "hello", 5) == 0 && took >= 0 && took <= 2;
        check(ok, "fetch: every path returns the object", fw_last_error());
        check(fw_fetch_get(cl, 8, paths[i], got, sizeof got, &len, NULL) == ENOENT,
              "fetch: a missing key is ENOENT on every path", "");
    }
    char small[2];
    size_t len = 0;
    check(fw_fetch_get(cl, 7, FW_FETCH_RPC, small, sizeof small, &len, NULL) == EMSGSIZE && len == 5,
          "fetch: an object over the buffer is EMSGSIZE with its length", "");
    check(fw_fetch_get(cl, 7, 9, small, sizeof small, &len, NULL) == EINVAL, "fetch: unknown path", "");
    struct fw_fetch_stats st;
    check(fw_fetch_client_stats(cl, &st) == 0 && st.read + st.read2 + st.rpc >= 9 && st.missing == 4,
          "fetch: stats", "");
    check(fw_fetch_remove(s, 7) == 0 && fw_fetch_remove(s, 7) == ENOENT, "fetch: remove", "");
    fw_fetch_client_destroy(cl);
    fw_fetch_server_destroy(s);
    fw_fetch_client_destroy(NULL);
    fw_fetch_server_destroy(NULL);
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Ping on ping_cpu, pong on pong_cpu (-1: anywhere), both in mode. */
/* served: for "dispatch" with a pinned pong end, 1 if a dispatcher serves
 * its CPU (its waits must count hand-offs), 0 if none does (they must
 * count fallbacks and no hand-off). */
static void pingpong_served(const char *mode, int ping_cpu, int pong_cpu, int served) {
    struct fw_channel_config cfg = {64, 16, FW_DOORBELL_FUTEX};
    fw_sender *tx1, *tx2;
    fw_receiver *rx1, *rx2;
    char name[64];
    snprintf(name, sizeof name, "pingpong %s%s", mode, pong_cpu >= 0 ? " (pinned)" : "");
    if (fw_channel_create(&cfg, &tx1, &rx1) || fw_channel_create(&cfg, &tx2, &rx2)) {
        check(0, name, "fw_channel_create");
        return;
    }
    struct pong_arg a = {.tx = tx2, .rx = rx1, .mode = mode, .n = 2000, .cpu = pong_cpu, .bad = 0};
    pthread_t t;
    pthread_create(&t, NULL, pong, &a);
    if (ping_cpu >= 0) pin(ping_cpu);
    fw_waiter *w = NULL;
    int bad = fw_waiter_create(mode, &w) != 0;
    /* A pinned dispatch-mode pong end must sleep now and then for its
     * stats to show who woke it: every tenth request comes 100 us late,
     * past any spin in place (hybrid's 50 us budget), so that wait is
     * handed off (or falls back). Without the delay a quick ping end had
     * every reply caught in place, and no hand-off to count. */
    int late = !strcmp(mode, "dispatch") && pong_cpu >= 0;
    for (int i = 0; i < a.n && !bad; i++) {
        uint64_t tag = 0;
        char buf[16];
        size_t len = 0;
        if (late && i % 10 == 9) {
            uint64_t end = now_ns() + 100000;
            while (now_ns() < end) {
            }
        }
        bad |= fw_send(tx1, (uint64_t)i, "hello", 5) != 0;
        bad |= fw_wait(w, rx2, 5000000000LL, &tag, buf, sizeof buf, &len) != 0;
        bad |= tag != (uint64_t)i || len != 5 || memcmp(buf, "world", 5) != 0;
    }
    pthread_join(t, NULL);
    struct fw_wait_stats st;
    bad |= fw_waiter_stats(w, &st) != 0 || st.completions != (uint64_t)a.n;
    check(!bad && !a.bad, name, "lost, reordered or corrupted completion");
    if (!strcmp(mode, "dispatch") && pong_cpu >= 0) {
        /* The pinned pong thread's waits: handed off by the dispatcher on
         * its CPU, or all in interrupt mode without one. */
        struct fw_dispatch_wait_stats ds = a.ds;
        char why[96];
        snprintf(why, sizeof why, "handoffs=%llu fallbacks=%llu paused=%llu", (unsigned long long)ds.handoffs,
                 (unsigned long long)ds.fallbacks, (unsigned long long)ds.paused);
        if (served)
            check(ds.handoffs > 0 && ds.reserved[0] == 0 && ds.reserved[2] == 0,
                  "waiter's dispatch stats count its hand-offs", why);
        else
            check(ds.handoffs == 0 && ds.fallbacks > 0, "waiter's dispatch stats count its fallbacks (no dispatcher)",
                  why);
        fw_waiter *iw = NULL;
        memset(&ds, 0xff, sizeof ds);
        check(fw_waiter_create("interrupt", &iw) == 0 && fw_waiter_dispatch_stats(iw, &ds) == 0 &&
                  ds.handoffs == 0 && ds.fallbacks == 0 && ds.reserved[1] == 0,
              "waiter's dispatch stats are zero where it never dispatched", "non-zero");
        fw_waiter_destroy(iw);
        check(fw_waiter_dispatch_stats(NULL, &ds) == EINVAL && fw_waiter_dispatch_stats(w, NULL) == EINVAL,
              "waiter dispatch stats NULL is EINVAL", "accepted");
    }
    fw_waiter_destroy(w);
    fw_sender_destroy(tx1);
    fw_sender_destroy(tx2);
    fw_receiver_destroy(rx1);
    fw_receiver_destroy(rx2);
    if (ping_cpu >= 0) pin(-1);
}

static void pingpong_on(const char *mode, int ping_cpu, int pong_cpu) {
    pingpong_served(mode, ping_cpu, pong_cpu, 1);
}

static void pingpong(const char *mode) { pingpong_on(mode, -1, -1); }

#include "abi_sibling.c"
#include "abi_slice.c"

static void pingpong_beside_a_sibling(const char *mode, int ping_cpu, int pong_cpu) {
    struct sibling sb;
    if (sibling_start(&sb)) return;
    pingpong_on(mode, ping_cpu, pong_cpu);
    sibling_stop(&sb);
}

/* A dispatcher on CPU 1 serving the pong thread pinned there. */
static void on_usr1(int sig) { (void)sig; }

struct intr_arg {
    fw_receiver *rx;
    int interruptible;
    volatile int started;
    volatile int rc;
};

/* A dispatch-mode wait on CPU 1 for a completion that never comes. */
static void *intr_wait(void *p) {
    struct intr_arg *a = p;
    pin(1);
    fw_waiter *w = NULL;
    fw_waiter_create("dispatch", &w);
    fw_waiter_set_interruptible(w, a->interruptible);
    a->started = 1;
    a->rc = fw_wait(w, a->rx, 300000000LL, NULL, NULL, 0, NULL);
    fw_waiter_destroy(w);
    return NULL;
}

/* Signal the waiting thread every 10 ms until it returns; its result. */
static int signalled_wait(int interruptible) {
    fw_sender *tx = NULL;
    struct intr_arg a = {NULL, interruptible, 0, -1};
    fw_channel_create(NULL, &tx, &a.rx);
    pthread_t t;
    pthread_create(&t, NULL, intr_wait, &a);
    while (!a.started) usleep(1000);
    usleep(30000);
    for (int i = 0; i < 100 && a.rc == -1; i++) {
        pthread_kill(t, SIGUSR1);
        usleep(10000);
    }
    pthread_join(t, NULL);
    fw_sender_destroy(tx);
    fw_receiver_destroy(a.rx);
    return a.rc;
}

static void interruptible_checks(void) {
    check(fw_waiter_set_interruptible(NULL, 1) == EINVAL, "set_interruptible NULL is EINVAL", "accepted");
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("SKIPPED interruptible dispatch waits: needs 2 CPUs (this host has 1)\n");
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1; /* no SA_RESTART */
    sigaction(SIGUSR1, &sa, NULL);
    fw_dispatcher *d = NULL;
    /* Never idle: an idle dispatcher hands waiters to interrupt mode. */
    if (fw_dispatcher_start(1, -1, 0, &d)) {
        check(0, "interruptible: dispatcher", "did not start");
        return;
    }
    check(signalled_wait(1) == EINTR, "interruptible dispatch wait ends with EINTR on a signal", "no EINTR");
    check(signalled_wait(0) == ETIMEDOUT, "plain dispatch wait sleeps on to its timeout", "ended early");
    fw_dispatcher_stop(d);
}

static void dispatcher_checks(void) {
    fw_dispatcher *d = NULL;
    check(fw_dispatcher_start(100000, 2000000, 0, &d) == EINVAL && d == NULL &&
              strlen(fw_last_error()) > 0,
          "dispatcher on a missing CPU is EINVAL", "accepted");
    check(fw_dispatcher_start(0, 0, 0, NULL) == EINVAL, "dispatcher NULL output is EINVAL", "accepted");
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("SKIPPED dispatcher ping-pong: needs 2 CPUs (this host has 1)\n");
        return;
    }
    check(fw_dispatcher_start(1, 2000000, 1, &d) == 0 && d != NULL, "dispatcher starts on CPU 1", "failed");
    if (!d) return;
    fw_dispatcher *d2 = NULL;
    check(fw_dispatcher_start(1, 2000000, 0, &d2) == EBUSY && d2 == NULL,
          "second dispatcher for a CPU is EBUSY", "accepted");
    pingpong_on("dispatch", 0, 1);
    struct fw_dispatch_stats st;
    memset(&st, 0xff, sizeof st);
    int rc = fw_dispatcher_stats(d, &st);
    check(rc == 0 && st.handoffs + st.rescued + st.relayed > 0 && st.state != 2 && st.reserved == 0,
          "dispatcher handed off to the pinned waiter", "no hand-off counted");
    check(fw_dispatcher_stats(d, NULL) == EINVAL, "dispatcher stats NULL is EINVAL", "accepted");
    /* Learned (learn_idle 1): whether a ping-pong's gaps get pre-wakes is
     * the learner's call; the accounting is not. */
    struct fw_prewake_stats ps;
    memset(&ps, 0xff, sizeof ps);
    rc = fw_dispatcher_prewake_stats(d, &ps);
    printf("INFO learned dispatcher pre-wakes: %llu planned, %llu early, %llu caught, %llu late, "
           "%llu pauses, margin %llu ns\n",
           (unsigned long long)ps.prewakes, (unsigned long long)ps.early, (unsigned long long)ps.caught,
           (unsigned long long)ps.late, (unsigned long long)ps.pauses, (unsigned long long)ps.margin_ns);
    check(rc == 0 && ps.early + ps.caught + ps.late <= ps.prewakes && ps.reserved[0] == 0 &&
              ps.reserved[1] == 0,
          "learned dispatcher's pre-wake arrivals never outnumber its pre-wakes", "inconsistent counters");
    fw_dispatcher_stop(d);
    /* Without a dispatcher dispatch mode is interrupt mode: still no loss. */
    pingpong_served("dispatch", 0, 1, 0);
    fw_dispatcher_stop(NULL);
}

/* A server on CPU 0 that answers each request after 270-330 us of busy
 * work: a steady service time, as in the library's test
 * prewakes_a_steady_service_time_without_losing_a_reply
 * (crates/fastwake/tests/adaptive_waiter.rs). It waits in interrupt mode
 * and keeps that waiter's pre-wake counters. */
struct steady_arg {
    fw_sender *tx;
    fw_receiver *rx;
    int n;
    int bad;
    struct fw_prewake_stats ps;
};

static void *steady_server(void *p) {
    struct steady_arg *a = p;
    pin(0);
    fw_waiter *w = NULL;
    if (fw_waiter_create("interrupt", &w)) {
        a->bad = 1;
        return NULL;
    }
    uint32_t x = 16; /* xorshift: the same service times every run */
    for (int i = 0; i < a->n; i++) {
        uint64_t tag = 0;
        if (fw_wait(w, a->rx, 5000000000LL, &tag, NULL, 0, NULL)) {
            a->bad = 1;
            break;
        }
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        uint64_t end = now_ns() + 270000 + x % 60001;
        while (now_ns() < end) {
        }
        if (fw_send(a->tx, tag, NULL, 0)) {
            a->bad = 1;
            break;
        }
    }
    memset(&a->ps, 0xff, sizeof a->ps);
    if (fw_waiter_prewake_stats(w, &a->ps)) a->bad = 1;
    fw_waiter_destroy(w);
    return NULL;
}

static int prewake_all_zero(const struct fw_prewake_stats *ps) {
    static const struct fw_prewake_stats zero;
    return memcmp(ps, &zero, sizeof zero) == 0;
}

/* fw_waiter_prewake_stats and fw_dispatcher_prewake_stats: NULL, the zeros
 * of a non-adaptive waiter and of a dispatcher without learn_idle, and an
 * adaptive waiter that pre-wakes for a steady service time. */
static void prewake_checks(void) {
    struct fw_prewake_stats ps;
    fw_waiter *w = NULL;
    fw_waiter_create("adaptive", &w);
    memset(&ps, 0xff, sizeof ps);
    check(fw_waiter_prewake_stats(NULL, &ps) == EINVAL && fw_waiter_prewake_stats(w, NULL) == EINVAL,
          "waiter pre-wake stats NULL is EINVAL", "accepted");
    check(fw_waiter_prewake_stats(w, &ps) == 0 && prewake_all_zero(&ps),
          "new adaptive waiter has no pre-wakes", "non-zero or failed");
    check(fw_dispatcher_prewake_stats(NULL, &ps) == EINVAL, "dispatcher pre-wake stats NULL is EINVAL",
          "accepted");
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        /* Adaptive mode never pre-wakes against a producer on its CPU. */
        printf("SKIPPED pre-wakes of a steady service time: needs 2 CPUs (this host has 1)\n");
        fw_waiter_destroy(w);
        return;
    }

    /* 1500 round trips of ~300 us (~0.5 s; the server spins on CPU 0 for
     * its service time, the waiter on CPU 1 only for a pre-wake's end). */
    struct fw_channel_config cfg = {64, 16, FW_DOORBELL_FUTEX};
    fw_sender *req_tx, *rep_tx;
    fw_receiver *req_rx, *rep_rx;
    if (fw_channel_create(&cfg, &req_tx, &req_rx) || fw_channel_create(&cfg, &rep_tx, &rep_rx)) {
        check(0, "pre-wakes: channels", "fw_channel_create");
        fw_waiter_destroy(w);
        return;
    }
    struct steady_arg a = {.tx = rep_tx, .rx = req_rx, .n = 1500, .bad = 0};
    pthread_t t;
    pthread_create(&t, NULL, steady_server, &a);
    pin(1);
    int bad = 0;
    for (int i = 0; i < a.n && !bad; i++) {
        uint64_t tag = ~0ull;
        bad = fw_send(req_tx, (uint64_t)i, NULL, 0) != 0 ||
              fw_wait(w, rep_rx, 5000000000LL, &tag, NULL, 0, NULL) != 0 || tag != (uint64_t)i;
    }
    pin(-1);
    pthread_join(t, NULL);
    memset(&ps, 0xff, sizeof ps);
    int rc = fw_waiter_prewake_stats(w, &ps);
    printf("INFO adaptive waiter, steady 300 us service: %llu pre-wakes of %d waits, %llu early, "
           "%llu caught, %llu late, %llu pauses, margin %llu ns\n",
           (unsigned long long)ps.prewakes, a.n, (unsigned long long)ps.early, (unsigned long long)ps.caught,
           (unsigned long long)ps.late, (unsigned long long)ps.pauses, (unsigned long long)ps.margin_ns);
    check(!bad && !a.bad, "pre-wakes: every reply, in order", "lost, reordered or failed");
    /* Exact: every wait returned a completion, so each pre-wake has one
     * arrival. */
    check(rc == 0 && ps.early + ps.caught + ps.late == ps.prewakes && ps.reserved[0] == 0 &&
              ps.reserved[1] == 0,
          "pre-wakes: each has exactly one arrival", "early + caught + late != prewakes");
    /* Timing-dependent, so loose: the library's own test of this load asks
     * for pre-wakes on more than half the waits and caught on more than
     * half of those; here one of each suffices. */
    check(rc == 0 && ps.prewakes > 0 && ps.caught > 0 && ps.prewakes <= (uint64_t)a.n,
          "pre-wakes: a steady service time is pre-woken and caught", "none planned or none caught");
    check(a.ps.prewakes != ~0ull && prewake_all_zero(&a.ps),
          "pre-wakes: an interrupt-mode waiter reports zeros", "non-zero or failed");
    fw_waiter_destroy(w);
    fw_sender_destroy(req_tx);
    fw_sender_destroy(rep_tx);
    fw_receiver_destroy(req_rx);
    fw_receiver_destroy(rep_rx);

    /* Without learn_idle a dispatcher plans no pre-wake, however busy. */
    fw_dispatcher *d = NULL;
    if (fw_dispatcher_start(1, -1, 0, &d)) {
        check(0, "pre-wakes: dispatcher without learn_idle", "did not start");
        return;
    }
    pingpong_beside_a_sibling("dispatch", 0, 1);
    struct fw_dispatch_stats st;
    memset(&ps, 0xff, sizeof ps);
    check(fw_dispatcher_stats(d, &st) == 0 && st.handoffs + st.relayed > 0 &&
              fw_dispatcher_prewake_stats(d, &ps) == 0 && prewake_all_zero(&ps),
          "dispatcher without learn_idle: hand-offs, no pre-wakes", "no hand-off, or non-zero");
    check(fw_dispatcher_prewake_stats(d, NULL) == EINVAL, "dispatcher pre-wake stats NULL out is EINVAL",
          "accepted");
    fw_dispatcher_stop(d);
}

/* A bare io_uring (raw syscalls: the test needs no liburing), enough to
 * submit timeouts and reap their completions as a liburing program does. */
struct uring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array;
    struct io_uring_sqe *sqes;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_cqe *cqes;
};

static int uring_init(struct uring *u) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    u->fd = (int)syscall(__NR_io_uring_setup, 8, &p);
    if (u->fd < 0) return -1;
    size_t sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (!(p.features & IORING_FEAT_SINGLE_MMAP)) return -1;
    size_t sz = sq_sz > cq_sz ? sq_sz : cq_sz;
    char *q = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd, IORING_OFF_SQ_RING);
    void *sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_POPULATE, u->fd, IORING_OFF_SQES);
    if (q == MAP_FAILED || sqes == MAP_FAILED) return -1;
    u->sqes = sqes;
    u->sq_tail = (unsigned *)(q + p.sq_off.tail);
    u->sq_mask = (unsigned *)(q + p.sq_off.ring_mask);
    u->sq_array = (unsigned *)(q + p.sq_off.array);
    u->cq_head = (unsigned *)(q + p.cq_off.head);
    u->cq_tail = (unsigned *)(q + p.cq_off.tail);
    u->cq_mask = (unsigned *)(q + p.cq_off.ring_mask);
    u->cqes = (struct io_uring_cqe *)(q + p.cq_off.cqes);
    return 0;
}

static struct __kernel_timespec two_ms = {0, 2000000};

/* Submit a 2 ms timeout: its completion is posted later, from the timer. */
static int uring_timeout(struct uring *u, uint64_t data) {
    unsigned tail = *u->sq_tail, idx = tail & *u->sq_mask;
    struct io_uring_sqe *e = &u->sqes[idx];
    memset(e, 0, sizeof *e);
    e->opcode = IORING_OP_TIMEOUT;
    e->fd = -1;
    e->addr = (uint64_t)(uintptr_t)&two_ms;
    e->len = 1;
    e->user_data = data;
    u->sq_array[idx] = idx;
    __atomic_store_n(u->sq_tail, tail + 1, __ATOMIC_RELEASE);
    return (int)syscall(__NR_io_uring_enter, u->fd, 1, 0, 0, NULL, 0) == 1 ? 0 : -1;
}

/* Reap one completion: 1 and its data and result, or 0 if none. */
static int uring_reap(struct uring *u, uint64_t *data, int *res) {
    unsigned head = *u->cq_head;
    if (head == __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE)) return 0;
    struct io_uring_cqe *c = &u->cqes[head & *u->cq_mask];
    *data = c->user_data;
    *res = c->res;
    __atomic_store_n(u->cq_head, head + 1, __ATOMIC_RELEASE);
    return 1;
}

/* 20 timeouts waited for with fw_ring_wait in `mode`, each reaped. */
static int uring_rounds(struct uring *u, fw_ring *r, const char *mode) {
    fw_waiter *w = NULL;
    if (fw_waiter_create(mode, &w)) return 0;
    int ok = 1;
    for (uint64_t i = 1; ok && i <= 20; i++) {
        unsigned ready = 0;
        uint64_t data = 0;
        int res = 0;
        ok = uring_timeout(u, i) == 0 && fw_ring_wait(w, r, 1000000000LL, &ready) == 0 && ready == 1 &&
             uring_reap(u, &data, &res) == 1 && data == i && res == -ETIME;
    }
    fw_waiter_destroy(w);
    return ok;
}

static void ring_checks(void) {
    struct uring u;
    if (uring_init(&u)) {
        printf("SKIPPED io_uring ring checks: io_uring_setup failed (%s)\n", strerror(errno));
        return;
    }
    fw_ring *r = NULL;
    check(fw_ring_create(NULL, u.cq_tail, u.fd, FW_RING_LEVEL, &r) == EINVAL && r == NULL,
          "ring: NULL counter is EINVAL", "accepted");
    check(fw_ring_create(u.cq_head, u.cq_tail, u.fd, 7, &r) == EINVAL, "ring: unknown kind is EINVAL", "accepted");
    check(fw_ring_create(u.cq_head, u.cq_tail, -1, FW_RING_LEVEL, &r) == EBADF, "ring: bad fd is EBADF", "accepted");
    int blocking = eventfd(0, 0);
    check(fw_ring_create(u.cq_head, u.cq_tail, blocking, FW_RING_EVENTFD, &r) == EINVAL,
          "ring: blocking eventfd is EINVAL", "accepted");
    close(blocking);
    check(fw_ring_create(u.cq_head, u.cq_tail, u.fd, FW_RING_LEVEL, &r) == 0 && r != NULL,
          "ring: io_uring CQ accepted", "refused");
    if (!r) return;
    fw_waiter *w = NULL;
    fw_waiter_create("interrupt", &w);
    check(fw_ring_wait(w, r, 1000000, NULL) == ETIMEDOUT, "ring: empty wait times out", "no timeout");
    fw_waiter_destroy(w);
    const char *modes[] = {"poll", "interrupt", "hybrid:20us", "adaptive"};
    for (int m = 0; m < 4; m++) {
        char name[64];
        snprintf(name, sizeof name, "ring: io_uring timeouts in %s mode", modes[m]);
        check(uring_rounds(&u, r, modes[m]), name, "lost, late or wrong completion");
    }
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("SKIPPED ring: dispatch mode: needs 2 CPUs (this host has 1)\n");
    } else {
        fw_dispatcher *d = NULL;
        /* Never idle: each wait lasts 2 ms, the default idle threshold. */
        if (fw_dispatcher_start(1, -1, 0, &d) == 0) {
            pin(1);
            int ok = uring_rounds(&u, r, "dispatch");
            pin(-1);
            struct fw_dispatch_stats st;
            fw_dispatcher_stats(d, &st);
            check(ok && st.handoffs + st.relayed + st.rescued > 0, "ring: io_uring timeouts handed off by a dispatcher",
                  ok ? "no hand-off" : "lost, late or wrong completion");
            fw_dispatcher_stop(d);
        } else {
            check(0, "ring: dispatcher for the dispatch check", "did not start");
        }
    }
    fw_ring_destroy(r);
    fw_ring_destroy(NULL);
    close(u.fd);
}

/* ---- A ring of the program's own, with ready notices ---------------------
 * A single-producer ring between two threads: the producer (CPU 0) writes
 * a slot, stores the tail (release), calls fw_ring_published, writes the
 * eventfd; the owner (CPU 1, "dispatch" mode, a dispatcher on CPU 1 that
 * never idles) waits with fw_ring_wait and reaps. Every value once, in
 * order; the hand-offs come through notices, and the dispatcher's safety
 * net finds no wait a notice did not name. */
enum { UR_CAP = 8, UR_N = 2000 };

struct user_ring {
    _Alignas(64) unsigned head;
    _Alignas(64) unsigned tail;
    _Alignas(64) uint64_t slots[UR_CAP];
    int efd;
    fw_ring_producer *p;
    int bad;
};

static void *user_ring_produce(void *arg) {
    struct user_ring *u = arg;
    pin(0);
    for (uint64_t v = 0; v < UR_N; v++) {
        unsigned t = u->tail; /* the producer's own counter */
        while (t - __atomic_load_n(&u->head, __ATOMIC_ACQUIRE) == UR_CAP) sched_yield();
        u->slots[t % UR_CAP] = v;
        __atomic_store_n(&u->tail, t + 1, __ATOMIC_RELEASE);
        if (fw_ring_published(u->p) != 0) u->bad = 1;
        uint64_t one = 1;
        if (write(u->efd, &one, sizeof one) != sizeof one) u->bad = 1;
        /* Now and then a pause, so the owner waits (and sleeps). */
        if (v % 8 == 0) usleep(100);
    }
    return NULL;
}

/* Reap what fw_ring_wait reported; 0 if a value is not the next one. */
static int user_ring_reap(struct user_ring *u, unsigned ready, uint64_t *next) {
    unsigned h = u->head, t = __atomic_load_n(&u->tail, __ATOMIC_ACQUIRE);
    if (ready == 0 || t - h < ready) return 0;
    for (unsigned i = 0; i < ready; i++)
        if (u->slots[(h + i) % UR_CAP] != (*next)++) return 0;
    __atomic_store_n(&u->head, h + ready, __ATOMIC_RELEASE);
    return 1;
}

static void user_ring_checks(void) {
    static struct user_ring u;
    u.efd = eventfd(0, EFD_NONBLOCK);
    fw_ring *plain = NULL, *r = NULL;
    fw_ring_producer *p = NULL;
    check(fw_ring_create(&u.head, &u.tail, u.efd, FW_RING_EVENTFD, &plain) == 0 &&
              fw_ring_producer_create(plain, &p) == EINVAL && p == NULL,
          "ring: producer handle of a ring without FW_RING_NOTICES is EINVAL", "accepted");
    fw_ring_destroy(plain);
    check(fw_ring_create(&u.head, &u.tail, u.efd, 7 | FW_RING_NOTICES, &r) == EINVAL && r == NULL,
          "ring: unknown kind with FW_RING_NOTICES is EINVAL", "accepted");
    check(fw_ring_producer_create(NULL, &p) == EINVAL, "ring: producer handle of NULL is EINVAL", "accepted");
    check(fw_ring_published(NULL) == EINVAL, "ring: fw_ring_published(NULL) is EINVAL", "accepted");
    check(fw_dispatcher_notice_stats(NULL, NULL) == EINVAL, "ring: notice stats of NULL is EINVAL", "accepted");
    check(fw_ring_create(&u.head, &u.tail, u.efd, FW_RING_EVENTFD | FW_RING_NOTICES, &r) == 0 && r != NULL,
          "ring: FW_RING_NOTICES accepted", "refused");
    if (!r) return;
    check(fw_ring_producer_create(r, NULL) == EINVAL, "ring: producer handle NULL output is EINVAL", "accepted");
    check(fw_ring_producer_create(r, &p) == 0 && p != NULL, "ring: producer handle created", "refused");
    if (!p) return;
    check(fw_ring_published(p) == 0, "ring: fw_ring_published with no owner waiting is 0", "failed");
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
        printf("SKIPPED ring: notices in dispatch mode: needs 2 CPUs (this host has 1)\n");
    } else {
        fw_dispatcher *d = NULL;
        /* Never idle: every wait is the dispatcher's to hand off. */
        if (fw_dispatcher_start(1, -1, 0, &d) == 0) {
            u.p = p;
            pthread_t th;
            pthread_create(&th, NULL, user_ring_produce, &u);
            pin(1);
            fw_waiter *w = NULL;
            fw_waiter_create("dispatch", &w);
            uint64_t next = 0;
            int ok = 1;
            while (ok && next < UR_N) {
                unsigned ready = 0;
                ok = fw_ring_wait(w, r, 1000000000LL, &ready) == 0 && user_ring_reap(&u, ready, &next);
            }
            pthread_join(th, NULL);
            pin(-1);
            fw_waiter_destroy(w);
            check(ok && !u.bad && next == UR_N, "ring: notices: every value once, in order",
                  "lost, duplicated, reordered or late");
            /* The dispatcher publishes its late-notice count every few
             * hundred empty passes. */
            usleep(20000);
            struct fw_notice_stats ns;
            fw_dispatcher_notice_stats(d, &ns);
            printf("INFO ring notices: notices %llu scan_found %llu late_notices %llu\n",
                   (unsigned long long)ns.notices, (unsigned long long)ns.scan_found,
                   (unsigned long long)ns.late_notices);
            check(ns.notices > 0, "ring: hand-offs came through notices", "no notice");
            /* Not scan_found == late_notices, as for a channel: a ring's
             * producer stores its tail and then calls fw_ring_published,
             * and the safety net may find the entry in between (the
             * producer preempted there); if the owner has asked again by
             * the time the call runs, the call owes nothing and no late
             * notice follows. A lost notice shows as many finds (a
             * producer that never calls: hundreds here), not a few. */
            check(ns.scan_found <= ns.late_notices + 2 + ns.notices / 50,
                  "ring: the safety net found few waits without a notice (a preempted producer's window)",
                  "notices lost");
            fw_dispatcher_stop(d);
        } else {
            check(0, "ring: dispatcher for the notice check", "did not start");
        }
    }
    fw_ring_producer_destroy(p);
    fw_ring_producer_destroy(NULL);
    fw_ring_destroy(r);
    close(u.efd);
}

/* RDMA verbs: a CQ the program created, and the shared CQ (abi_verbs.c). */
#include "abi_verbs.c"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* every line out before a crash, into a file too */
    /* `abi verbs [N]`: only the verbs part (the Soft-RoCE guest runs it). */
    if (argc > 1 && !strcmp(argv[1], "verbs")) {
        verbs_checks(argc > 2 ? atoi(argv[2]) : 500);
        printf("c-abi: %d passed, %d failed\n", passed, failed);
        return failed != 0;
    }
    /* `abi shared-cq [N]`: only the shared CQ part (the guest runs it). */
    if (argc > 1 && !strcmp(argv[1], "shared-cq")) {
        shared_cq_checks(argc > 2 ? atoi(argv[2]) : 100);
        printf("c-abi: %d passed, %d failed\n", passed, failed);
        return failed != 0;
    }
    /* `abi fetch`: only the fetch part (the guest runs it on its device). */
    if (argc > 1 && !strcmp(argv[1], "fetch")) {
        fetch_checks();
        printf("c-abi: %d passed, %d failed\n", passed, failed);
        return failed != 0;
    }
    check(fw_abi_version() == FW_ABI_VERSION, "abi version", "header and library differ");
    slice_checks();

    fw_waiter *w = NULL;
    check(fw_waiter_create("bogus", &w) == EINVAL && w == NULL && strlen(fw_last_error()) > 0 &&
              !strchr(fw_last_error(), '\n'),
          "bad mode is EINVAL with a one-line cause", "wrong errno or message");
    struct fw_channel_config bad = {3, 8, 0};
    fw_sender *tx = NULL;
    fw_receiver *rx = NULL;
    check(fw_channel_create(&bad, &tx, &rx) == EINVAL, "bad capacity is EINVAL", "accepted");
    struct fw_channel_config badbell = {4, 8, 7};
    check(fw_channel_create(&badbell, &tx, &rx) == EINVAL, "bad doorbell is EINVAL", "accepted");
    check(fw_channel_create(NULL, NULL, &rx) == EINVAL, "NULL output is EINVAL", "accepted");

    /* Full ring, timeout, close. */
    struct fw_channel_config small = {2, 8, FW_DOORBELL_EVENTFD};
    int rc = fw_channel_create(&small, &tx, &rx);
    check(rc == 0 && fw_receiver_fd(rx) >= 0, "eventfd receiver exposes its fd", "no fd");
    check(fw_try_send(tx, 1, "a", 1) == 0 && fw_try_send(tx, 2, "b", 1) == 0 &&
              fw_try_send(tx, 3, "c", 1) == EAGAIN,
          "full ring is EAGAIN", "wrong return");
    check(fw_try_send(tx, 4, "123456789", 9) == EINVAL, "oversized payload is EINVAL", "accepted");
    check(fw_receiver_ready(rx) == 1, "ready peeks", "not ready");
    fw_waiter_create("interrupt", &w);
    uint64_t tag;
    check(fw_wait(w, rx, 0, &tag, NULL, 0, NULL) == 0 && tag == 1, "wait takes the first", "wrong tag");
    check(fw_wait(w, rx, 0, &tag, NULL, 0, NULL) == 0 && tag == 2, "wait takes the second", "wrong tag");
    check(fw_wait(w, rx, 1000000, &tag, NULL, 0, NULL) == ETIMEDOUT, "empty wait times out", "no timeout");
    fw_sender_destroy(tx);
    check(fw_wait(w, rx, -1, &tag, NULL, 0, NULL) == EPIPE, "closed sender is EPIPE", "no EPIPE");
    fw_waiter_destroy(w);
    fw_receiver_destroy(rx);

    /* Cross-process through a shared channel. */
    fw_shared *sh = NULL;
    struct fw_channel_config c2 = {16, 8, FW_DOORBELL_FUTEX};
    rc = fw_shared_create(&c2, &sh);
    pid_t pid = rc == 0 ? fork() : -1;
    if (pid == 0) {
        fw_sender *ctx = NULL;
        if (fw_sender_attach(fw_shared_memory_fd(sh), -1, &ctx)) _exit(1);
        for (uint64_t i = 0; i < 1000; i++)
            if (fw_send(ctx, i, "p", 1)) _exit(2);
        fw_sender_destroy(ctx);
        _exit(0);
    }
    int ok = pid > 0;
    fw_receiver *prx = NULL;
    ok = ok && fw_shared_receiver(sh, &prx) == 0;
    fw_waiter_create("hybrid", &w);
    for (uint64_t i = 0; ok && i < 1000; i++)
        ok = fw_wait(w, prx, 5000000000LL, &tag, NULL, 0, NULL) == 0 && tag == i;
    int status = 1;
    if (pid > 0) waitpid(pid, &status, 0);
    check(ok && WIFEXITED(status) && WEXITSTATUS(status) == 0, "cross-process channel", "lost or child failed");
    fw_waiter_destroy(w);
    fw_receiver_destroy(prx);
    fw_shared_destroy(sh);

    pingpong("poll");
    pingpong("interrupt");
    pingpong("hybrid:20us");
    pingpong("adaptive");
    pingpong("adaptive:cap=20%,catch=99%");
    dispatcher_checks();
    prewake_checks();
    socket_checks();
    lanes_checks();
    fetch_checks();
    ring_checks();
    user_ring_checks();
    interruptible_checks();
    verbs_checks(500);
    shared_cq_checks(100);

    /* NULL is accepted by every destroy. */
    fw_sender_destroy(NULL);
    fw_receiver_destroy(NULL);
    fw_waiter_destroy(NULL);
    fw_shared_destroy(NULL);

    printf("c-abi: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}

/* uring-wait: a small liburing program (dynamically linked, as Debian's
 * programs are) that waits the ways liburing offers, for scripts/uring-test
 * to run plain and under the shim: results must be identical, and under a
 * spinning mode the shim's counters must show the waits served.
 *
 *   io_uring_wait_cqe            (inline: a peek, then __io_uring_get_cqe)
 *   io_uring_wait_cqe_timeout    (exported)
 *
 * A writer thread fills a pipe after a delay; the main thread reads it
 * through io_uring (IORING_OP_READ). Prints one line per check; exit 0 when
 * all hold. usage: uring-wait [ROUNDS]
 *
 * uring-wait bench N: a ping-pong for latency instead. The main thread
 * (CPU 1) reads requests from a pipe through io_uring, waiting in
 * io_uring_wait_cqe, and answers on another pipe; a client thread (CPU 0)
 * busy-polls the answer with non-blocking reads (passed through by the
 * shim). Prints the round trip's p50 and p99 in ns.
 *
 * uring-wait steady N: a steady ~300 us service (270-330 us), for the
 * adaptive mode's pre-wakes: a server thread busy-reads a request byte
 * from a non-blocking pipe, spins for the service time and writes the byte
 * back; the main thread reads each reply through io_uring, waiting N times
 * in io_uring_wait_cqe and N times in io_uring_wait_cqe_timeout (1 s, in
 * turn),
 * and checks every completion: its user_data, its result, its byte.
 * Prints one line; exit 0 when all hold. uring-wait steady N signals: the
 * same with a 1 ms service, during which (after 100 rounds) the server
 * sends the main thread SIGUSR1 (an SA_RESTART handler) 300 us in: each
 * signal must end a wait with -EINTR (io_uring_enter returns it whatever
 * the handler's flags) when it comes, the rest of that wait is peeked for,
 * and no completion may be lost or taken twice. Prints the counts too. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int wfd;
static int delay_us;

static void *writer(void *p) {
    (void)p;
    usleep(delay_us);
    if (write(wfd, "ping", 4) != 4) exit(3);
    return NULL;
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Submit a read of `fd` and wait for it with wait_cqe (timeout_ms < 0) or
 * wait_cqe_timeout; the completion's result, or the wait's error. */
static int one(struct io_uring *ring, int fd, int after_us, int timeout_ms, char *buf) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
    io_uring_prep_read(sqe, fd, buf, 16, 0);
    io_uring_submit(ring);
    pthread_t t;
    delay_us = after_us;
    if (after_us >= 0) pthread_create(&t, NULL, writer, NULL);
    struct io_uring_cqe *cqe = NULL;
    int r;
    if (timeout_ms < 0) {
        r = io_uring_wait_cqe(ring, &cqe);
    } else {
        struct __kernel_timespec ts = {.tv_sec = timeout_ms / 1000, .tv_nsec = (timeout_ms % 1000) * 1000000LL};
        r = io_uring_wait_cqe_timeout(ring, &cqe, &ts);
    }
    int res = r == 0 ? cqe->res : r;
    if (r == 0) io_uring_cqe_seen(ring, cqe);
    if (after_us >= 0) pthread_join(t, NULL);
    return res;
}

static int req[2], rsp[2];
static int bench_n;
static long long *rtts;

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static void *client(void *p) {
    (void)p;
    pin(0);
    char b[8];
    for (int i = 0; i < bench_n + 1000; i++) {
        long long t0 = now_ns();
        if (write(req[1], "ping", 4) != 4) exit(3);
        while (read(rsp[0], b, sizeof b) != 4) {
        }
        if (i >= 1000) rtts[i - 1000] = now_ns() - t0;
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

static int bench(int n) {
    bench_n = n;
    rtts = calloc(n, sizeof *rtts);
    if (pipe(req) || pipe2(rsp, O_NONBLOCK)) return 2;
    struct io_uring ring;
    if (io_uring_queue_init(8, &ring, 0)) return 2;
    pin(1);
    pthread_t t;
    pthread_create(&t, NULL, client, NULL);
    char buf[16];
    for (int i = 0; i < n + 1000; i++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
        io_uring_prep_read(sqe, req[0], buf, 4, 0);
        io_uring_submit(&ring);
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&ring, &cqe) || cqe->res != 4) return 1;
        io_uring_cqe_seen(&ring, cqe);
        if (write(rsp[1], "pong", 4) != 4) return 1;
    }
    pthread_join(t, NULL);
    qsort(rtts, n, sizeof *rtts, cmp);
    printf("p50_ns=%lld p99_ns=%lld\n", rtts[n / 2], rtts[n * 99 / 100]);
    return 0;
}

static int steady_n;
static volatile sig_atomic_t handled;
static int steady_signals;
static pthread_t steady_main;

static volatile long long handled_at;

static void on_usr1(int sig) {
    (void)sig;
    handled++;
    handled_at = now_ns();
}

static void spin_until(long long end) {
    while (now_ns() < end) {
    }
}

static void *server(void *p) {
    (void)p;
    unsigned long long seed = 7;
    char b;
    for (int i = 0; i < 2 * steady_n; i++) {
        while (read(req[0], &b, 1) != 1) {
        }
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        long long start = now_ns(), jitter = (long long)((seed >> 33) % 61) * 1000;
        if (steady_signals) {
            /* 1 ms; after 100 rounds to learn from, a signal 300 us in. */
            if (i >= 100) {
                spin_until(start + 300000);
                pthread_kill(steady_main, SIGUSR1);
            }
            spin_until(start + 970000 + jitter);
        } else {
            spin_until(start + 270000 + jitter);
        }
        if (write(rsp[1], &b, 1) != 1) exit(3);
    }
    return NULL;
}

static int steady(int n, int signals) {
    steady_n = n;
    steady_signals = signals;
    if (signals) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGUSR1, &sa, NULL);
        steady_main = pthread_self();
        alarm(60);
    }
    if (pipe2(req, O_NONBLOCK) || pipe(rsp)) return 2;
    struct io_uring ring;
    if (io_uring_queue_init(8, &ring, 0)) return 2;
    pthread_t t;
    pthread_create(&t, NULL, server, NULL);
    int bad = 0, eintr = 0, prompt = 0;
    for (int i = 0; i < 2 * n; i++) {
        char want = (char)('a' + i % 26), got = 0;
        struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
        io_uring_prep_read(sqe, rsp[0], &got, 1, 0);
        io_uring_sqe_set_data64(sqe, (unsigned long long)i);
        io_uring_submit(&ring);
        long long t0 = now_ns();
        if (write(req[1], &want, 1) != 1) return 2;
        struct io_uring_cqe *cqe = NULL;
        int r;
        if (i % 2 == 0) {
            r = io_uring_wait_cqe(&ring, &cqe);
        } else {
            struct __kernel_timespec ts = {.tv_sec = 1, .tv_nsec = 0};
            r = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
        }
        if (r == -EINTR && signals) {
            eintr++;
            /* Handled when it came (300 us in), not when a sleep ended. */
            if (handled_at - t0 < 600000) prompt++;
            /* The rest by peeking (a look, which the shim passes through),
             * so the waits it learns from stay the steady 1 ms ones. */
            while ((r = io_uring_peek_cqe(&ring, &cqe)) == -EAGAIN) {
            }
        }
        if (r != 0) {
            fprintf(stderr, "uring-wait steady: wait %d returned %d\n", i, r);
            return 1;
        }
        if (cqe->user_data != (unsigned long long)i || cqe->res != 1 || got != want) bad++;
        io_uring_cqe_seen(&ring, cqe);
    }
    pthread_join(t, NULL);
    if (signals) {
        /* Each signal came during a wait and ended it with -EINTR (a
         * loaded host may delay a few past it). */
        printf("signals: %d handled, %d waits ended with -EINTR, %d handled within 600 us\n", (int)handled, eintr, prompt);
        if (handled != 2 * n - 100 || eintr < handled * 3 / 4 || prompt < handled / 2) bad++;
    }
    io_uring_queue_exit(&ring);
    printf("steady: %d replies, %d bad\n", 2 * n, bad);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "bench")) return bench(atoi(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "steady")) return steady(atoi(argv[2]), argc > 3 && !strcmp(argv[3], "signals"));
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    struct io_uring ring;
    if (io_uring_queue_init(8, &ring, 0)) {
        fprintf(stderr, "uring-wait: io_uring_queue_init failed\n");
        return 2;
    }
    int p[2];
    if (pipe(p)) return 2;
    wfd = p[1];
    char buf[16];
    int bad = 0;
    /* Data while a spin would still be going (50 us) and long after (5 ms). */
    for (int i = 0; i < rounds; i++) {
        int r = one(&ring, p[0], i % 2 ? 5000 : 50, -1, buf);
        if (r != 4 || memcmp(buf, "ping", 4)) bad++;
    }
    printf("wait_cqe: %d reads of 4 bytes, %d bad\n", rounds, bad);
    int bad2 = 0;
    for (int i = 0; i < rounds; i++) {
        int r = one(&ring, p[0], i % 2 ? 3000 : 50, 1000, buf);
        if (r != 4 || memcmp(buf, "ping", 4)) bad2++;
    }
    printf("wait_cqe_timeout with data: %d reads, %d bad\n", rounds, bad2);
    /* Nothing comes: -ETIME after the timeout, never before. The read
     * stays in flight; the writer then completes it below. */
    long long t0 = now_ns();
    int r = one(&ring, p[0], -1, 30, buf);
    long long took_ms = (now_ns() - t0) / 1000000;
    int early = took_ms < 30;
    printf("wait_cqe_timeout without data: %s, %s\n", r == -ETIME ? "-ETIME" : "WRONG", early ? "EARLY" : "not early");
    if (write(wfd, "late", 4) != 4) return 2;
    struct io_uring_cqe *cqe;
    if (io_uring_wait_cqe(&ring, &cqe) || cqe->res != 4) bad++;
    else io_uring_cqe_seen(&ring, cqe);
    io_uring_queue_exit(&ring);
    return (bad || bad2 || r != -ETIME || early) ? 1 : 0;
}

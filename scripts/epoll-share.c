/* epoll-share: an unmodified epoll program with many threads sharing one
 * core, the case the shim's dispatch mode is for (FastWake approach 1 for
 * kernel threads). Driven by scripts/shim-share, which runs it plain and
 * under `fastwake run --mode ...`.
 *
 * CONNS server threads, all pinned to SERVER_CPU, each block in
 * epoll_wait on one end of its own Unix stream socketpair and echo 8-byte
 * messages. One client thread on CLIENT_CPU sends one request at a time,
 * rotating over the connections, and busy-polls for the reply with
 * recv(MSG_DONTWAIT) (which the shim passes through). Prints each round
 * trip in ns after WARMUP on stdout, then "cpu_us=N" (user + system CPU of
 * the whole process, dispatcher threads included) on stderr.
 *
 * With LISTENER = 1, one more thread on SERVER_CPU blocks in epoll_wait
 * for the whole run on a socket nothing arrives on: the listener of a
 * server between connections (such a sibling must not switch
 * the workers' spinning off).
 *
 * usage: epoll-share CONNS ITERS WARMUP SERVER_CPU CLIENT_CPU [LISTENER] */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s)) {
        perror("epoll-share: sched_setaffinity");
        exit(2);
    }
}

struct server {
    int fd, cpu;
};

static void *serve(void *p) {
    struct server *s = p;
    pin(s->cpu);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = s->fd};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev)) {
        perror("epoll-share: epoll");
        exit(2);
    }
    char buf[8];
    for (;;) {
        int n = epoll_wait(ep, &ev, 1, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            perror("epoll-share: epoll_wait");
            exit(2);
        }
        ssize_t r = read(s->fd, buf, sizeof buf);
        if (r == 0) break;
        if (r != (ssize_t)sizeof buf || write(s->fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
            perror("epoll-share: echo");
            exit(2);
        }
    }
    close(ep);
    return NULL;
}

/* The listener: asleep in epoll_wait on an fd that never becomes ready. */
static void *listen_idle(void *p) {
    int cpu = *(int *)p, sp[2];
    pin(cpu);
    int ep = epoll_create1(0);
    if (ep < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, sp)) {
        perror("epoll-share: listener");
        exit(2);
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = sp[0]};
    epoll_ctl(ep, EPOLL_CTL_ADD, sp[0], &ev);
    for (;;) epoll_wait(ep, &ev, 1, -1);
    return NULL;
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: epoll-share CONNS ITERS WARMUP SERVER_CPU CLIENT_CPU [LISTENER]\n");
        return 2;
    }
    int conns = atoi(argv[1]), iters = atoi(argv[2]), warm = atoi(argv[3]);
    int scpu = atoi(argv[4]), ccpu = atoi(argv[5]);
    if (argc == 7 && atoi(argv[6])) {
        pthread_t lt;
        pthread_create(&lt, NULL, listen_idle, &scpu);
        /* Let it reach its wait before the workers start theirs. */
        usleep(20000);
    }
    if (conns < 1 || iters < 1 || warm < 0) {
        fprintf(stderr, "epoll-share: CONNS and ITERS must be >= 1, WARMUP >= 0\n");
        return 2;
    }
    int *cfd = calloc(conns, sizeof *cfd);
    struct server *sv = calloc(conns, sizeof *sv);
    pthread_t *th = calloc(conns, sizeof *th);
    long long *rtt = calloc(iters, sizeof *rtt);
    for (int k = 0; k < conns; k++) {
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp)) {
            perror("epoll-share: socketpair");
            return 2;
        }
        cfd[k] = sp[0];
        sv[k] = (struct server){.fd = sp[1], .cpu = scpu};
        pthread_create(&th[k], NULL, serve, &sv[k]);
    }
    pin(ccpu);
    char msg[8] = "request", buf[8];
    for (int i = 0; i < warm + iters; i++) {
        int fd = cfd[i % conns];
        long long t0 = now_ns();
        if (send(fd, msg, sizeof msg, 0) != (ssize_t)sizeof msg) {
            perror("epoll-share: send");
            return 2;
        }
        size_t got = 0;
        while (got < sizeof buf) {
            ssize_t r = recv(fd, buf + got, sizeof buf - got, MSG_DONTWAIT);
            if (r > 0) got += (size_t)r;
            else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                perror("epoll-share: recv");
                return 2;
            }
        }
        if (i >= warm) rtt[i - warm] = now_ns() - t0;
    }
    for (int k = 0; k < conns; k++) close(cfd[k]);
    for (int k = 0; k < conns; k++) pthread_join(th[k], NULL);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    for (int i = 0; i < iters; i++) printf("%lld\n", rtt[i]);
    long long cpu = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000LL + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
    fprintf(stderr, "cpu_us=%lld\n", cpu);
    return 0;
}

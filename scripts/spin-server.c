/* spin-server: a busy-polling TCP server, written the way kernel-bypass
 * style loops are: every socket non-blocking, one thread that calls
 * accept() on the listener and recv() on each connection in a loop,
 * EAGAIN after EAGAIN, never waiting. It speaks sockperf's ping-pong
 * protocol as scripts/echo-threads.c does (a 14-byte header: sequence u64,
 * flags u16, length u32, big-endian; a message asking for a reply (0x2)
 * goes back with the client bit (0x1) cleared). For scripts/pollers-bench.
 * At SIGTERM or SIGINT it prints the messages answered and a checksum of
 * their sequence numbers (what the server saw, to compare runs).
 *
 * With SPIN_SERVER_DELAYS=1 in its environment it also dates each
 * message's arrival (SO_TIMESTAMPNS: when the kernel queued it on the
 * socket) and, at SIGUSR1 and at exit, prints to stderr the percentiles of
 * the server's own part of the round trip (arrival to the reply's send),
 * then starts them again: a round trip's delay split between server and
 * client.
 *
 * usage: spin-server PORT   (listens on 127.0.0.1) */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HEADER 14
#define REPLY 0x2
#define CLIENT 0x1
#define MAX_CONNS 64
#define BUF (1 << 17)

static volatile sig_atomic_t stop, report;
static void on_signal(int sig) { (void)sig; stop = 1; }
static void on_report(int sig) { (void)sig; report = 1; }

/* The server's delays (arrival to the reply's send), in ns, since the last
 * report. */
#define MAX_DELAYS (1 << 20)
static uint64_t delays[MAX_DELAYS];
static size_t ndelays;

static int by_value(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void print_delays(void) {
    if (ndelays == 0) return;
    qsort(delays, ndelays, sizeof delays[0], by_value);
#define Q(q) (delays[(size_t)(ndelays * (q))] / 1e3)
    fprintf(stderr,
            "spin-server: delays n=%zu p10=%.2fus p25=%.2fus p50=%.2fus p75=%.2fus p90=%.2fus "
            "p99=%.2fus max=%.2fus\n",
            ndelays, Q(0.1), Q(0.25), Q(0.5), Q(0.75), Q(0.9), Q(0.99), delays[ndelays - 1] / 1e3);
#undef Q
    ndelays = 0;
}

static uint64_t ns_of(const struct timespec *t) {
    return (uint64_t)t->tv_sec * 1000000000u + (uint64_t)t->tv_nsec;
}

/* recv, and with dating on, the arrival of what it read (0 if none). */
static ssize_t recv_dated(int fd, char *p, size_t n, int dating, uint64_t *arrival) {
    *arrival = 0;
    if (!dating) return recv(fd, p, n, 0);
    struct iovec v = {.iov_base = p, .iov_len = n};
    union {
        char buf[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } c;
    struct msghdr h = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = c.buf,
                       .msg_controllen = sizeof c.buf};
    ssize_t r = recvmsg(fd, &h, 0);
    for (struct cmsghdr *m = r > 0 ? CMSG_FIRSTHDR(&h) : NULL; m; m = CMSG_NXTHDR(&h, m))
        if (m->cmsg_level == SOL_SOCKET && m->cmsg_type == SCM_TIMESTAMPNS) {
            struct timespec t;
            memcpy(&t, CMSG_DATA(m), sizeof t);
            *arrival = ns_of(&t);
        }
    return r;
}

struct conn {
    int fd;
    size_t have;
    char buf[BUF];
};
static struct conn conns[MAX_CONNS];

static int send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: spin-server PORT\n");
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    const char *d = getenv("SPIN_SERVER_DELAYS");
    int dating = d && strcmp(d, "1") == 0;
    struct sigaction sr = {.sa_handler = on_report};
    if (dating) sigaction(SIGUSR1, &sr, NULL);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 16)) {
        perror("spin-server: bind/listen");
        return 1;
    }
    int n = 0;
    uint64_t answered = 0, sum = 0;
    while (!stop) {
        int c = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
        if (c >= 0) {
            if (n == MAX_CONNS) {
                close(c);
            } else {
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                if (dating) setsockopt(c, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
                conns[n].fd = c;
                conns[n].have = 0;
                n++;
            }
        }
        if (report) {
            report = 0;
            print_delays();
        }
        for (int i = 0; i < n; i++) {
            struct conn *k = &conns[i];
            uint64_t arrival;
            ssize_t r = recv_dated(k->fd, k->buf + k->have, BUF - k->have, dating, &arrival);
            if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            int bad = r <= 0;
            if (!bad) {
                k->have += (size_t)r;
                size_t at = 0;
                while (k->have - at >= HEADER) {
                    unsigned char *m = (unsigned char *)k->buf + at;
                    size_t len = (size_t)m[10] << 24 | (size_t)m[11] << 16 |
                                 (size_t)m[12] << 8 | m[13];
                    if (len < HEADER || len > BUF) { bad = 1; break; }
                    if (k->have - at < len) break;
                    if (m[9] & REPLY) {
                        uint64_t seq = 0;
                        for (int b = 0; b < 8; b++) seq = seq << 8 | m[b];
                        sum = sum * 31 + seq;
                        answered++;
                        m[9] &= (unsigned char)~CLIENT;
                        if (arrival && ndelays < MAX_DELAYS) {
                            struct timespec now;
                            clock_gettime(CLOCK_REALTIME, &now);
                            delays[ndelays++] = ns_of(&now) - arrival;
                        }
                        if (send_all(k->fd, (char *)m, len)) { bad = 1; break; }
                    }
                    at += len;
                }
                if (!bad) {
                    memmove(k->buf, k->buf + at, k->have - at);
                    k->have -= at;
                }
            }
            if (bad) {
                close(k->fd);
                conns[i] = conns[--n];
                i--;
            }
        }
    }
    print_delays();
    printf("spin-server: answered=%llu checksum=%llu\n", (unsigned long long)answered,
           (unsigned long long)sum);
    return 0;
}

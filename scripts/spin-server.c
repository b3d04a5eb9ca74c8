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
#include <unistd.h>

#define HEADER 14
#define REPLY 0x2
#define CLIENT 0x1
#define MAX_CONNS 64
#define BUF (1 << 17)

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

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
                conns[n].fd = c;
                conns[n].have = 0;
                n++;
            }
        }
        for (int i = 0; i < n; i++) {
            struct conn *k = &conns[i];
            ssize_t r = recv(k->fd, k->buf + k->have, BUF - k->have, 0);
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
    printf("spin-server: answered=%llu checksum=%llu\n", (unsigned long long)answered,
           (unsigned long long)sum);
    return 0;
}

/* echo-threads: a thread-per-connection TCP echo server, written the way
 * such servers are: the main thread blocks in accept(), each connection's
 * thread blocks in recv() and sends back each whole message it got. The
 * messages are sockperf's (a 14-byte header: sequence u64, flags u16,
 * length u32, big-endian; the length counts the header): a message whose
 * flags ask for a reply (0x2) goes back with the client bit (0x1)
 * cleared, every other byte as received, which is what sockperf's
 * ping-pong client expects of its own server. For scripts/sockperf-bench
 * (kind "threads"): the listener sleeps in accept() between connections,
 * the sibling a worker's spin must not wait for.
 *
 * usage: echo-threads PORT   (listens on 127.0.0.1; runs until killed) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HEADER 14
#define REPLY 0x2
#define CLIENT 0x1

static int send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void *serve(void *arg) {
    int fd = (int)(long)arg;
    static __thread char buf[1 << 17];
    size_t have = 0;
    for (;;) {
        ssize_t n = recv(fd, buf + have, sizeof buf - have, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        have += (size_t)n;
        size_t at = 0;
        while (have - at >= HEADER) {
            unsigned char *m = (unsigned char *)buf + at;
            size_t len = (size_t)m[10] << 24 | (size_t)m[11] << 16 | (size_t)m[12] << 8 | m[13];
            if (len < HEADER || len > sizeof buf) goto out; /* not sockperf's */
            if (have - at < len) break;
            if (m[9] & REPLY) {
                m[9] &= (unsigned char)~CLIENT;
                if (send_all(fd, (char *)m, len)) goto out;
            }
            at += len;
        }
        memmove(buf, buf + at, have - at);
        have -= at;
    }
out:
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: echo-threads PORT\n");
        return 2;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 128)) {
        perror("echo-threads: bind/listen");
        return 1;
    }
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            perror("echo-threads: accept");
            return 1;
        }
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_t t;
        if (pthread_create(&t, NULL, serve, (void *)(long)c)) {
            close(c);
            continue;
        }
        pthread_detach(t);
    }
}

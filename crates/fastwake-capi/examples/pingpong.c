/*
 * pingpong.c — the canonical fastwake C example (as rc_pingpong is for
 * rdma-core): two threads bounce a message over two in-process channels,
 * each end waiting in the given wait mode.
 *
 *   cc pingpong.c $(pkg-config --cflags --libs fastwake) -o pingpong
 *   cc pingpong.c $(pkg-config --static --cflags --libs fastwake) -static-libgcc -o pingpong
 *   ./pingpong [MODE [ROUND_TRIPS]]        MODE: docs/reference/grammar.md, default hybrid
 *
 * Prints one line: the mode as the library read it, round trips, mean
 * round-trip time and how often the pinging thread slept. Exit 0 on
 * success, 2 on a bad mode (with the library's one-line reason), 1 if a
 * completion was lost, reordered or corrupted.
 */
#define _GNU_SOURCE
#include <fastwake.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct end {
    fw_sender *tx;
    fw_receiver *rx;
    const char *mode;
    long n;
    int bad;
};

/* Wait for `i`, answer with `i`; on the pong thread and the ping thread. */
static int bounce(fw_waiter *w, fw_receiver *rx, uint64_t want) {
    uint64_t tag = 0;
    char buf[8];
    size_t len = 0;
    int rc = fw_wait(w, rx, 5000000000LL, &tag, buf, sizeof buf, &len);
    return rc != 0 || tag != want || len != 4 || memcmp(buf, "ping", 4) != 0;
}

static void *pong(void *p) {
    struct end *e = p;
    fw_waiter *w = NULL;
    if (fw_waiter_create(e->mode, &w) != 0) {
        e->bad = 1;
        return NULL;
    }
    for (long i = 0; i < e->n && !e->bad; i++) {
        e->bad |= bounce(w, e->rx, (uint64_t)i);
        e->bad |= fw_send(e->tx, (uint64_t)i, "ping", 4) != 0;
    }
    fw_waiter_destroy(w);
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "hybrid";
    long n = argc > 2 ? atol(argv[2]) : 10000;
    if (fw_abi_version() != FW_ABI_VERSION) {
        fprintf(stderr, "pingpong: header ABI %d, library ABI %u\n", FW_ABI_VERSION, fw_abi_version());
        return 1;
    }
    fw_waiter *w = NULL;
    if (fw_waiter_create(mode, &w) != 0) {
        fprintf(stderr, "pingpong: bad mode '%s': %s\n", mode, fw_last_error());
        return 2;
    }
    struct fw_channel_config cfg = {64, 8, FW_DOORBELL_FUTEX};
    fw_sender *tx1, *tx2;
    fw_receiver *rx1, *rx2;
    if (fw_channel_create(&cfg, &tx1, &rx1) || fw_channel_create(&cfg, &tx2, &rx2)) {
        fprintf(stderr, "pingpong: fw_channel_create: %s\n", fw_last_error());
        return 1;
    }
    struct end e = {.tx = tx2, .rx = rx1, .mode = mode, .n = n, .bad = 0};
    pthread_t t;
    pthread_create(&t, NULL, pong, &e);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int bad = 0;
    for (long i = 0; i < n && !bad; i++) {
        bad |= fw_send(tx1, (uint64_t)i, "ping", 4) != 0;
        bad |= bounce(w, rx2, (uint64_t)i);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(t, NULL);
    struct fw_wait_stats st;
    fw_waiter_stats(w, &st);
    double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 1e3;
    printf("pingpong %s: %ld round trips, %.2f us mean round trip, %llu sleeps\n", mode, n,
           n > 0 ? us / (double)n : 0.0, (unsigned long long)st.sleeps);
    fw_waiter_destroy(w);
    fw_sender_destroy(tx1);
    fw_sender_destroy(tx2);
    fw_receiver_destroy(rx1);
    fw_receiver_destroy(rx2);
    if (bad || e.bad || st.completions != (uint64_t)n) {
        fprintf(stderr, "pingpong: lost, reordered or corrupted completion\n");
        return 1;
    }
    return 0;
}

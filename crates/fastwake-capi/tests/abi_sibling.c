/* Included by abi.c: a second dispatch-mode waiter on CPU 1, asleep while
 * a check runs. With it a thread waiting on CPU 1 is not alone on its core,
 * so its waits are handed off by the dispatcher: a waiter alone on its
 * dispatcher's core spins in place for hybrid's budget, which ping-pong
 * replies never outlast. */

struct sibling {
    fw_sender *tx;
    fw_receiver *rx;
    volatile int waiting;
    pthread_t t;
};

static void *sibling_wait(void *p) {
    struct sibling *s = p;
    fw_waiter *w = NULL;
    uint64_t tag = 0;
    pin(1);
    fw_waiter_create("dispatch", &w);
    s->waiting = 1;
    fw_wait(w, s->rx, 60000000000LL, &tag, NULL, 0, NULL);
    fw_waiter_destroy(w);
    return NULL;
}

/* Start it; non-zero (and a failed check) when it cannot be. */
static int sibling_start(struct sibling *s) {
    s->waiting = 0;
    if (fw_channel_create(NULL, &s->tx, &s->rx)) {
        check(0, "sibling waiter", "fw_channel_create");
        return 1;
    }
    pthread_create(&s->t, NULL, sibling_wait, s);
    while (!s->waiting) usleep(1000);
    usleep(20000); /* its wait registered and asleep */
    return 0;
}

/* Wake it and wait for it to end. */
static void sibling_stop(struct sibling *s) {
    fw_send(s->tx, 0, NULL, 0);
    pthread_join(s->t, NULL);
    fw_sender_destroy(s->tx);
    fw_receiver_destroy(s->rx);
}

/* Included by abi.c: lanes, a latency lane and a bulk lane over TCP. */

static void lanes_checks(void) {
    fw_lanes_listener *l = NULL;
    fw_lanes *a = NULL, *b = NULL;
    fw_lanes_config bad = {0};
    bad.polite_chunk = 1 << 20; /* more than the chunk */
    check(fw_lanes_listen("127.0.0.1:0", &bad, &l) == EINVAL && l == NULL,
          "lanes: polite chunk over chunk is EINVAL", "");
    check(fw_lanes_listen("nowhere", NULL, &l) == EINVAL, "lanes: bad address is EINVAL", "");
    fw_lanes_config c = {0};
    c.latency_mode = "interrupt";
    uint16_t port = 0;
    int ok = fw_lanes_listen("127.0.0.1:0", &c, &l) == 0 && fw_lanes_listener_port(l, &port) == 0;
    check(ok && port != 0, "lanes: listen", "");
    if (!ok) return;
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
    ok = fw_lanes_connect(addr, &c, &a) == 0 && fw_lanes_accept(l, &b) == 0;
    check(ok, "lanes: connect and accept", "");
    if (!ok) return;
    static char big[300000], got[300000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (char)(i * 7);
    size_t len = 0;
    char small[8];
    ok = fw_lanes_send(a, "ping", 4, FW_LANES_BY_SIZE) == 0 &&
         fw_lanes_send(a, big, 20000, FW_LANE_BULK | FW_LANES_MORE) == 0 &&
         fw_lanes_send(a, big + 20000, sizeof big - 20000, FW_LANE_BULK | FW_LANES_MORE) == 0 &&
         fw_lanes_flush(a) == 0 &&
         fw_lanes_recv(b, FW_LANE_BULK, 5000000000LL, got, sizeof got, &len) == 0 && len == 20000 &&
         memcmp(got, big, len) == 0 &&
         fw_lanes_recv(b, FW_LANE_BULK, 5000000000LL, got, sizeof got, &len) == 0 &&
         len == sizeof big - 20000 && memcmp(got, big + 20000, len) == 0 &&
         fw_lanes_recv(b, FW_LANE_LATENCY, 5000000000LL, small, sizeof small, &len) == 0 &&
         len == 4 && memcmp(small, "ping", 4) == 0;
    check(ok, "lanes: a small message and two batched bulk ones, each whole on its lane", "");
    struct fw_lanes_stats st;
    check(fw_lanes_stats(a, FW_LANE_BULK, &st) == 0 && st.messages_sent == 2 &&
              st.bytes_sent == sizeof big && st.chunked == 1,
          "lanes: bulk stats", "");
    ok = fw_lanes_send(a, "0123456789", 10, FW_LANE_LATENCY) == 0 &&
         fw_lanes_recv(b, FW_LANE_LATENCY, 5000000000LL, small, 4, &len) == EMSGSIZE && len == 10;
    check(ok, "lanes: a message over the buffer is EMSGSIZE with its length", "");
    check(fw_lanes_recv(b, FW_LANE_LATENCY, 1000000, NULL, 0, NULL) == ETIMEDOUT, "lanes: timeout",
          "expected ETIMEDOUT");
    check(fw_lanes_send(a, "x", 1, 7) == EINVAL, "lanes: unknown lane is EINVAL", "");
    int buffered = -1, after = -1;
    ok = fw_lanes_send(a, "one", 3, FW_LANE_LATENCY) == 0 &&
         fw_lanes_send(a, "two", 3, FW_LANE_LATENCY) == 0 &&
         fw_lanes_recv(b, FW_LANE_LATENCY, 5000000000LL, small, sizeof small, &len) == 0 &&
         fw_lanes_buffered(b, FW_LANE_LATENCY, &buffered) == 0 &&
         fw_lanes_recv(b, FW_LANE_LATENCY, 5000000000LL, small, sizeof small, &len) == 0 &&
         len == 3 && memcmp(small, "two", 3) == 0 &&
         fw_lanes_buffered(b, FW_LANE_LATENCY, &after) == 0;
    check(ok && buffered == 1 && after == 0, "lanes: buffered says a second message waits",
          "expected 1 then 0");
    check(fw_lanes_buffered(b, 7, &buffered) == EINVAL && fw_lanes_buffered(b, 0, NULL) == EINVAL,
          "lanes: buffered with a bad lane or NULL is EINVAL", "");
    fw_lanes_destroy(a);
    check(fw_lanes_recv(b, FW_LANE_LATENCY, 5000000000LL, NULL, 0, NULL) == EPIPE,
          "lanes: the peer's close is EPIPE", "");
    fw_lanes_destroy(b);
    fw_lanes_listener_destroy(l);
    fw_lanes_destroy(NULL);
    fw_lanes_listener_destroy(NULL);
}

/* Fetch: bad parameters are EINVAL before any device is opened; without
 * an RDMA device creating a server fails with one line; with one, a
 * round trip on every path. */

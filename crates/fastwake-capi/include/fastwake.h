/*
 * fastwake.h — C ABI of fastwake: interrupt-mode I/O with polling-class
 * latency. Link with -lfastwake (libfastwake.so or libfastwake.a).
 *
 * Conventions (as in Demikernel):
 *   - Every function that can fail returns 0 on success or a positive errno
 *     value (EINVAL, EPIPE, ETIMEDOUT, EAGAIN, EBUSY, ENOMEM, ...).
 *   - Objects are opaque and created/destroyed in pairs; *_destroy accepts
 *     NULL.
 *   - fw_last_error() returns a one-line, human-readable cause of the last
 *     failure in the calling thread (valid until the next fastwake call).
 *
 * Thread model: a channel has exactly one sender and one receiver, each used
 * by one thread at a time. A waiter is used by one thread at a time.
 */
#ifndef FASTWAKE_H
#define FASTWAKE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FW_ABI_VERSION 1

/* How a channel's producer wakes a sleeping consumer. */
enum fw_doorbell {
    FW_DOORBELL_FUTEX = 0,   /* futex word in the shared mapping (cheapest) */
    FW_DOORBELL_EVENTFD = 1, /* eventfd: the receiver gets a pollable fd  */
};

struct fw_channel_config {
    uint32_t capacity;  /* ring slots, power of two, 2..2^24 */
    uint32_t slot_size; /* max payload bytes per completion, <= 1 MiB */
    uint32_t doorbell;  /* enum fw_doorbell */
};

struct fw_wait_stats {
    uint64_t completions;           /* completions returned */
    uint64_t without_sleep;         /* found without blocking */
    uint64_t sleeps;                /* times the thread slept */
    uint64_t rechecks_hit;          /* arm -> re-check found a completion */
    uint64_t spurious;              /* wake-ups with nothing to take */
    uint64_t spin_skipped_same_cpu; /* hybrid skipped spinning: producer on our CPU */
};

/* What a dispatcher did (fw_dispatcher_stats). */
struct fw_dispatch_stats {
    uint64_t handoffs;    /* threads woken by the dispatcher: their source was ready */
    uint64_t rescued;     /* threads woken by its watchdog (dispatcher starved of CPU) */
    uint64_t relayed;     /* threads woken by another waiting thread's relay */
    uint64_t idle_sleeps; /* times it went idle (waiters back to interrupt mode) */
    uint64_t paused;      /* waits handed back to interrupt mode on going idle */
    uint64_t registered;  /* threads registered now */
    int64_t idle_after_ns; /* idle threshold in force (learned or fixed); -1: never */
    uint32_t state;       /* 0 polling, 1 sleeping, 2 dead */
    uint32_t reserved;
};

/* Pre-wakes ("sleep, then poll") of an adaptive waiter
 * (fw_waiter_prewake_stats) or of a dispatcher with a learned idle policy
 * (fw_dispatcher_prewake_stats). Where the recent waits are concentrated
 * (a steady service time, a periodic stream) the controller plans a
 * pre-wake: sleep until a timer set a margin before the shortest recent
 * wait, then spin until a high order statistic of the waits; a completion
 * during the sleep wakes it as in interrupt mode. A dispatcher does the
 * same with the gaps between its hand-offs: it sleeps right after a
 * hand-off, the waiters it paused come back to it at the timer, and it
 * polls until the spin's end. The counters count from the waiter's
 * creation or the dispatcher's start; margin_ns is the value now. */
struct fw_prewake_stats {
    uint64_t prewakes;  /* pre-wakes planned */
    uint64_t early;     /* of those, the completion came before the timer */
    uint64_t caught;    /* it came while spinning (polling) after the timer: the aim */
    uint64_t late;      /* none by the spin's end: slept again until it came */
    uint64_t pauses;    /* times pre-wakes were paused (for 1 s) because most recent ones came early */
    uint64_t margin_ns; /* margin in force: how far before the shortest recent wait the timer is set; 0: no pre-wake plan now */
    uint64_t reserved[2]; /* 0 (room for later counters within ABI 1) */
};

/* How a waiter's dispatch-mode waits ended (fw_waiter_dispatch_stats):
 * the counters a "dispatch" waiter (or an "adaptive" one whose plan
 * handed waits to a dispatcher) keeps, from its creation. */
struct fw_dispatch_wait_stats {
    uint64_t handoffs;  /* woken by the dispatcher (or its watchdog, or a relaying thread): source ready */
    uint64_t relays;    /* hand-offs this thread made to another waiting thread of its core while relaying */
    uint64_t fallbacks; /* waits done in interrupt mode: no live dispatcher on the CPU, a source without a
                           peek handle, or the dispatcher starved of CPU */
    uint64_t paused;    /* waits handed back to interrupt mode by an idle dispatcher */
    uint64_t resumed;   /* of the paused waits, those that came back to the dispatcher at its pre-wake's
                           resume time, before their completion */
    uint64_t reserved[3]; /* 0 (room for later counters within ABI 1) */
};

/* How a dispatcher's hand-offs through ready notices went
 * (fw_dispatcher_notice_stats): the sources whose producer pushes a
 * notice when their owner waits (an in-process channel, a ring created
 * with FW_RING_NOTICES whose producer calls fw_ring_published). Counters
 * since the dispatcher started. */
struct fw_notice_stats {
    uint64_t notices;      /* hand-offs found through a notice */
    uint64_t scan_found;   /* waits the safety net found ready although no notice named them:
                              a lost or late notice (expected 0), e.g. a fw_ring_published call missed */
    uint64_t late_notices; /* of those, notices that came after all (the producer was held up) */
    uint64_t reserved;     /* 0 (room for a later counter within ABI 1) */
};

typedef struct fw_shared fw_shared;     /* a channel's shared memory, to hand to another process */
typedef struct fw_sender fw_sender;     /* producing end */
typedef struct fw_receiver fw_receiver; /* consuming end */
typedef struct fw_waiter fw_waiter;     /* a wait mode plus its statistics */
typedef struct fw_dispatcher fw_dispatcher; /* a per-core dispatcher thread */
typedef struct fw_socket fw_socket;     /* a stream socket read in fixed-size messages */
typedef struct fw_lanes fw_lanes;       /* a message endpoint: a latency lane and a bulk lane */
typedef struct fw_lanes_listener fw_lanes_listener; /* accepts fw_lanes endpoints */
typedef struct fw_fetch_server fw_fetch_server; /* a table of objects clients fetch over RDMA */
typedef struct fw_fetch_client fw_fetch_client; /* fetches objects by key: READ, READ-2 or RPC */
typedef struct fw_ring fw_ring;         /* a completion ring the caller owns (io_uring CQ) */
typedef struct fw_ring_producer fw_ring_producer; /* its producer's handle (FW_RING_NOTICES) */
typedef struct fw_verbs_cq fw_verbs_cq; /* an RDMA CQ (+ completion channel) the caller owns */
typedef struct fw_verbs_shared_cq fw_verbs_shared_cq; /* one CQ for many QPs, routed per owner */
typedef struct fw_verbs_inbox fw_verbs_inbox; /* one owner's completions from a shared CQ */

/* libibverbs' types, declared only: include <infiniband/verbs.h> to use
 * the fw_verbs_* functions; nothing else here needs it. */
struct ibv_context;
struct ibv_cq;
struct ibv_comp_channel;
struct ibv_wc;

/* What a fw_verbs_cq did (fw_verbs_cq_stats). */
struct fw_verbs_stats {
    uint64_t events;    /* completion events fastwake read from the channel */
    uint64_t acked;     /* of those, acked with ibv_ack_cq_events so far */
    uint64_t ack_calls; /* ibv_ack_cq_events calls (acks are batched) */
    uint64_t arms;      /* ibv_req_notify_cq calls */
    uint64_t stashed;   /* work completions polled by a peek, not yet returned */
};

/* What a fw_verbs_shared_cq did (fw_verbs_shared_cq_stats). */
struct fw_shared_cq_stats {
    uint64_t routed;      /* work completions routed into an inbox */
    uint64_t unrouted;    /* for a key with no inbox, or left in a destroyed one (kept) */
    uint64_t pumps;       /* polls of the CQ that found work completions */
    uint64_t handed_over; /* polls that found another thread polling and left it the work */
    uint64_t notices;     /* ready notices pushed to dispatchers (owners waiting in dispatch mode) */
    uint64_t rings;       /* doorbells rung (owners asleep in interrupt mode) */
    uint64_t events;      /* completion events read from the channel */
    uint64_t arms;        /* ibv_req_notify_cq calls */
    uint64_t acked;       /* events acked with ibv_ack_cq_events */
    uint64_t reserved[3];
};

/* fw_verbs_shared_cq_create's routes. */
#define FW_ROUTE_QP_NUM 0     /* by wc.qp_num: one inbox per QP, its sends and receives */
#define FW_ROUTE_WR_ID_HIGH 1 /* by wc.wr_id >> shift: the owner's key in the high bits */

/* Version of this ABI in the loaded library; compare with FW_ABI_VERSION. */
uint32_t fw_abi_version(void);

/* One-line cause of the calling thread's last failure ("" if none). */
const char *fw_last_error(void);

/* In-process channel: both ends at once. cfg may be NULL for defaults. */
int fw_channel_create(const struct fw_channel_config *cfg, fw_sender **tx, fw_receiver **rx);

/* Cross-process channel: create here, pass fw_shared_memory_fd() (and
 * fw_shared_doorbell_fd() for FW_DOORBELL_EVENTFD) to the other process,
 * attach there with fw_sender_attach()/fw_receiver_attach(). */
int fw_shared_create(const struct fw_channel_config *cfg, fw_shared **out);
int fw_shared_memory_fd(const fw_shared *sh);   /* borrowed fd, or -1 */
int fw_shared_doorbell_fd(const fw_shared *sh); /* borrowed fd, or -1 */
int fw_shared_sender(fw_shared *sh, fw_sender **tx);
int fw_shared_receiver(fw_shared *sh, fw_receiver **rx);
void fw_shared_destroy(fw_shared *sh);

/* Attach to a channel created elsewhere. The fds are duplicated; the caller
 * keeps its own. doorbell_fd is -1 for FW_DOORBELL_FUTEX channels. */
int fw_sender_attach(int memory_fd, int doorbell_fd, fw_sender **tx);
int fw_receiver_attach(int memory_fd, int doorbell_fd, fw_receiver **rx);

/* Queue one completion (tag + len bytes of data) and ring the doorbell if
 * the receiver is asleep. fw_send waits while the ring is full; fw_try_send
 * returns EAGAIN instead. EPIPE: the receiver is gone. */
int fw_send(fw_sender *tx, uint64_t tag, const void *data, size_t len);
int fw_try_send(fw_sender *tx, uint64_t tag, const void *data, size_t len);
/* Destroying the sender tells the receiver (its waits return EPIPE once the
 * ring is drained). */
void fw_sender_destroy(fw_sender *tx);

/* Non-blocking, non-destructive: 1 if a completion is ready, else 0. */
int fw_receiver_ready(const fw_receiver *rx);
/* The eventfd a FW_DOORBELL_EVENTFD receiver sleeps on (borrowed), or -1. */
int fw_receiver_fd(const fw_receiver *rx);
void fw_receiver_destroy(fw_receiver *rx);

/* A waiter in a mode, written in fastwake's one grammar (docs/reference/grammar.md;
 * the same strings as `fastwake run --mode`, `fastwake bench --mode` and
 * FASTWAKE_MODE):
 *   "poll", "interrupt", "hybrid" (50 us budget), "hybrid:<duration>"
 *       (hybrid:20us, hybrid:0.5ms, hybrid:1500ns; a bare number is us),
 *   "adaptive" or "adaptive:<options>" (comma-separated cap=<share> (CPU
 *       cap: 20%, 0.2 or 20), worth=N (us of CPU one us of latency is
 *       worth), idle=N (waits/s below which it waits in interrupt mode),
 *       catch=<share> (of waits a spin should catch, >= 50%),
 *       wake=learn|model (measured wake-up latency as the cost of a
 *       sleep, or the default 4.3 us), prewake=on|off (sleep, then poll,
 *       where the waits are predictable), backlog=on|off (stop spinning
 *       while the waiter falls behind), slice=<duration>|off (the
 *       scheduler slice a sleep runs under while others keep the CPU
 *       busy: 100us to 100ms, default 100us; the thread's own comes back
 *       before the wait returns)): the controller picks spin,
 *       interrupt, pre-wake or hand-off to the core's dispatcher per wait;
 *   "dispatch": register with the dispatcher serving the CPU the thread
 *       runs on and sleep until it hands off; without one, interrupt mode.
 * EINVAL (and fw_last_error, one line naming the accepted forms) for
 * anything else. */
int fw_waiter_create(const char *mode, fw_waiter **out);
/* Wait for one completion. timeout_ns < 0 waits forever. On success stores
 * the tag and copies min(len, buf_len) payload bytes to buf, the full length
 * to *len (either pointer may be NULL). ETIMEDOUT: nothing within the
 * timeout. EPIPE: the sender is gone and the ring is empty. */
int fw_wait(fw_waiter *w, fw_receiver *rx, int64_t timeout_ns, uint64_t *tag, void *buf,
            size_t buf_len, size_t *len);
int fw_waiter_stats(const fw_waiter *w, struct fw_wait_stats *out);
/* The pre-wake counters of w's adaptive controller (struct
 * fw_prewake_stats above). Between waits, early + caught + late ==
 * prewakes, less one for each wait that was planned as a pre-wake and
 * ended without a completion (ETIMEDOUT, EPIPE, any other error). All
 * zero, with success, for a waiter whose mode is not "adaptive" (a
 * "dispatch" waiter's pre-wakes are its dispatcher's:
 * fw_dispatcher_prewake_stats), with "adaptive:prewake=off", and for an
 * adaptive waiter that has planned none: waits too irregular, too few
 * yet, a producer on its CPU, or the CPU cap spent. EINVAL: w or out
 * NULL. */
int fw_waiter_prewake_stats(const fw_waiter *w, struct fw_prewake_stats *out);
/* How w's dispatch-mode waits ended (struct fw_dispatch_wait_stats above):
 * all zero, with success, for a waiter that never waited in dispatch mode.
 * With handoffs == 0 and fallbacks > 0 the dispatcher served none of
 * them: start one on the waiter's CPU (fw_dispatcher_start). EINVAL: w or
 * out NULL. */
int fw_waiter_dispatch_stats(const fw_waiter *w, struct fw_dispatch_wait_stats *out);
/* Dispatch-mode waits (and adaptive waits handed to a dispatcher): with
 * on != 0, a signal that interrupts the sleep ends the wait with EINTR, as
 * a blocking syscall does; with 0 (the default) the wait sleeps on until a
 * completion or its timeout. Interrupt-mode sleeps on a channel treat a
 * signal as a spurious wake-up either way. EINVAL: w is NULL. */
int fw_waiter_set_interruptible(fw_waiter *w, int on);
void fw_waiter_destroy(fw_waiter *w);

/* The calling thread's scheduler slice (Linux 6.12 or later, no privilege
 * needed). fw_slice_set asks for slice_ns (100 us to 100 ms) for the
 * calling thread; 0 goes back to the kernel's default. A thread woken by
 * its completion then preempts a busy neighbour whose slice is longer,
 * instead of waiting for its turn to end; its share of the CPU stays
 * fair. It changes how the thread is scheduled while it computes too, so
 * fastwake never sets it on its own: call it in the threads that wait.
 * Threads the thread creates afterwards inherit it. EINVAL: out of range,
 * or the thread is not SCHED_OTHER/SCHED_BATCH; EOPNOTSUPP: the kernel
 * does not keep a thread's own slice. fw_slice_get stores the thread's
 * slice as the kernel reports it (its own, or the default while it has
 * none), 0 where the kernel reports none. EINVAL: slice_ns NULL. */
int fw_slice_set(uint64_t slice_ns);
int fw_slice_get(uint64_t *slice_ns);

/* Start a dispatcher thread for CPU cpu (SCHED_IDLE, on that CPU): it
 * peeks the sources of the "dispatch" (and "adaptive") waiters running on
 * that CPU and wakes the one whose completion is ready. It goes idle
 * (waiters back to interrupt mode) after idle_after_ns without a hand-off
 * (< 0: never); with learn_idle != 0 that threshold is learned from the
 * gaps between hand-offs, idle_after_ns being its ceiling. EINVAL: no such
 * CPU; EBUSY: a dispatcher already serves it. */
int fw_dispatcher_start(uint32_t cpu, int64_t idle_after_ns, int learn_idle, fw_dispatcher **out);
int fw_dispatcher_stats(const fw_dispatcher *d, struct fw_dispatch_stats *out);
/* The pre-wake counters of d's learned idle policy (struct
 * fw_prewake_stats above; its "waits" are the gaps between hand-offs, its
 * "timer" the time the waiters it paused come back to it, its "spin" its
 * polling after that). Always early + caught + late <= prewakes: a
 * pre-wake's arrival is counted when the next hand-off or wake-up ends its
 * gap, so once hand-offs stop prewakes exceeds that sum by at most one.
 * All zero, with success, for a dispatcher started with learn_idle == 0,
 * and until its gaps are regular enough. EINVAL: d or out NULL. */
int fw_dispatcher_prewake_stats(const fw_dispatcher *d, struct fw_prewake_stats *out);
/* d's ready-notice counters (struct fw_notice_stats above). EINVAL: d or
 * out NULL. */
int fw_dispatcher_notice_stats(const fw_dispatcher *d, struct fw_notice_stats *out);
/* Stop it: its waiters fall back to interrupt mode, none is lost. */
void fw_dispatcher_stop(fw_dispatcher *d);

/* A connected stream socket (TCP, Unix) as a source of messages of
 * msg_size bytes each, for every wait mode above. fd is duplicated: the
 * caller keeps its own and may close it. busy_poll_us > 0 also asks the
 * kernel to busy-poll the device queue (SO_BUSY_POLL; no effect over
 * loopback). EINVAL: msg_size 0; EBADF: fd not open. */
int fw_socket_create(int fd, size_t msg_size, uint32_t busy_poll_us, fw_socket **out);
/* Send len bytes (whole; blocks while the socket buffer is full). */
int fw_socket_send(fw_socket *s, const void *data, size_t len);
/* Wait for one whole message; copies min(msg_size, buf_len) bytes to buf
 * (may be NULL). ETIMEDOUT: none within timeout_ns (< 0: forever). EPIPE:
 * the peer closed. */
int fw_socket_wait(fw_waiter *w, fw_socket *s, int64_t timeout_ns, void *buf, size_t buf_len);
/* An epoll fd that is readable when a message may be waiting (to nest in
 * your own epoll), or -1. */
int fw_socket_fd(const fw_socket *s);
void fw_socket_destroy(fw_socket *s);

/* Lanes: a message endpoint to one peer made of two TCP connections, a
 * latency lane for small messages and a bulk lane for the rest, so no
 * small message waits behind a bulk transfer (docs/guide/lanes.md). Each lane
 * delivers whole messages in the order they were sent on it; nothing is
 * ordered between lanes. An endpoint may be used by several threads at
 * once: each lane sends one message at a time and receives one at a time.
 * Zero in any field of the config means its default; a NULL config means
 * all defaults. */
#define FW_LANES_LAYOUT_LANES 0  /* one connection per lane */
#define FW_LANES_LAYOUT_SHARED 1 /* one connection for both (for comparison) */
#define FW_LANE_LATENCY 0
#define FW_LANE_BULK 1
#define FW_LANES_BY_SIZE 2       /* fw_lanes_send: the lane by size (threshold) */
#define FW_LANES_MORE 0x100      /* fw_lanes_send, OR'ed in: more messages follow */
typedef struct fw_lanes_config {
    uint32_t layout;          /* FW_LANES_LAYOUT_* */
    uint32_t no_batching;     /* 1: every bulk message goes out on its own, no MSG_MORE */
    uint64_t threshold;       /* largest message FW_LANES_BY_SIZE puts on the latency lane (16 KiB) */
    uint64_t chunk;           /* bytes per bulk sendmsg (64 KiB) */
    uint64_t polite_chunk;    /* ... while a latency message is in flight (16 KiB) */
    uint64_t max_message;     /* largest message either side accepts (64 MiB) */
    uint32_t batch_messages;  /* messages per batched sendmsg (16, i10) */
    uint32_t batch_delay_ns;  /* queued bulk bytes wait at most this for a receiving thread (50000) */
    uint64_t batch_bytes;     /* bytes queued / per batched sendmsg (64 KiB) */
    const char *latency_mode; /* "interrupt", "hybrid[:D]", "adaptive[:O]", "dispatch" (NULL: "hybrid") */
    const char *bulk_mode;    /* "interrupt" or "adaptive[:O]" (NULL: "interrupt") */
} fw_lanes_config;
/* One lane's counters (fw_lanes_stats). */
struct fw_lanes_stats {
    uint64_t messages_sent;  /* messages sent (queued ones included) */
    uint64_t bytes_sent;     /* their payload bytes */
    uint64_t sendmsgs;       /* sendmsg calls, those that found the socket full included */
    uint64_t more;           /* of those, flagged MSG_MORE */
    uint64_t batched;        /* of those, carrying parts of more than one message */
    uint64_t polite;         /* of those, cut to the polite chunk */
    uint64_t chunked;        /* messages that went out in more than one sendmsg */
    uint64_t queued;         /* messages (or tails) copied to the batch queue (sent with more,
                                socket full, or ending a batch) */
    uint64_t room_polls;     /* syscalls spent waiting for room */
    uint64_t queued_bytes;   /* bytes in the batch queue now */
    uint64_t received;       /* whole messages received */
    uint64_t received_bytes; /* their payload bytes */
    uint64_t turn_waits;     /* sends that found the lane's turn taken and waited for it */
    uint64_t handed;         /* small messages that found the turn taken and were left with
                                the thread holding it, which sent them before leaving */
};
/* Listen on address ("IP:PORT"; port 0: any, see fw_lanes_listener_port).
 * The config's layout is ignored: an accepted endpoint has the layout its
 * peer connected with. EINVAL: a bad address or parameter (fw_last_error
 * says which, in one line). */
int fw_lanes_listen(const char *address, const fw_lanes_config *c, fw_lanes_listener **out);
int fw_lanes_listener_port(const fw_lanes_listener *l, uint16_t *port);
/* Accept connections until one completes an endpoint (both its lanes).
 * EPROTO: a connection without a valid hello (closed; call again). */
int fw_lanes_accept(const fw_lanes_listener *l, fw_lanes **out);
void fw_lanes_listener_destroy(fw_lanes_listener *l);
/* Open an endpoint to a listener at address. */
int fw_lanes_connect(const char *address, const fw_lanes_config *c, fw_lanes **out);
/* Send len bytes as one message on lane (FW_LANE_* or FW_LANES_BY_SIZE),
 * from the calling thread. With FW_LANES_MORE OR'ed in, more messages
 * follow: it may wait in the lane's batch (up to 16 messages, 64 KiB or
 * 50 us, i10's rule) to go out in one sendmsg with them. A bulk message
 * that finds the socket full may be queued (copied) too. Queued bytes are
 * pushed by the next send without FW_LANES_MORE (in the same sendmsg when
 * it fits the batch), by a thread waiting in
 * fw_lanes_recv once they are 50 us old, or by fw_lanes_flush. EINVAL:
 * over max_message, or an unknown lane; EPIPE: the peer is gone. */
int fw_lanes_send(const fw_lanes *e, const void *data, size_t len, int lane);
/* Wait for the next whole message on lane; copies min(length, cap) bytes
 * to buf (may be NULL) and stores its length in *len (may be NULL).
 * ETIMEDOUT: none within timeout_ns (< 0: forever); EMSGSIZE: it was
 * longer than cap (consumed, truncated); EPIPE: the peer closed; EPROTO:
 * the peer closed mid-message (nothing of it delivered). */
int fw_lanes_recv(const fw_lanes *e, int lane, int64_t timeout_ns, void *buf, size_t cap,
                  size_t *len);
/* *out = 1 when a whole message waits in lane's receive buffer, so the
 * next fw_lanes_recv on it returns without a syscall, else 0 (also while
 * another thread receives on the lane). A server answers with
 * FW_LANES_MORE while this is 1 and without it for the last answer: the
 * answers to requests that arrived together leave in one sendmsg. */
int fw_lanes_buffered(const fw_lanes *e, int lane, int *out);
/* Push every queued bulk byte, waiting for room as long as it takes. */
int fw_lanes_flush(const fw_lanes *e);
int fw_lanes_stats(const fw_lanes *e, int lane, struct fw_lanes_stats *out);
/* Close both connections; no other thread may use e any more. */
void fw_lanes_destroy(fw_lanes *e);

/* Fetch: a server keeps a table of objects (key -> bytes) in memory its
 * clients READ over RDMA, and an RPC thread (waiting in server_mode) that
 * answers lookups; a client fetches by key by one READ (the address
 * cached from an earlier fetch), READ-2 (the key's buckets, then the
 * object) or an RPC, the path chosen per fetch from what each costs now
 * (path "adaptive[:cap=N%,paths=read+read2+rpc]") or fixed ("read",
 * "read2", "rpc"). Every path returns the same bytes: a READ torn by a
 * concurrent fw_fetch_put is READ again, never returned. Clients are made
 * in the server's process (fw_fetch_client_create). Zero or NULL in any
 * field of the config means its default; a NULL config means all. */
#define FW_FETCH_BY_POLICY (-1) /* fw_fetch_get: the path the config's path picks */
#define FW_FETCH_READ 0
#define FW_FETCH_READ2 1
#define FW_FETCH_RPC 2
typedef struct fw_fetch_config {
    const char *device;      /* RDMA device (NULL: the first) */
    const char *server_mode; /* how the RPC thread waits (NULL: "adaptive") */
    const char *client_mode; /* how a client waits (NULL: "hybrid") */
    const char *path;        /* "adaptive[:O]", "read", "read2", "rpc" (NULL: "adaptive") */
    uint64_t buckets;        /* index buckets (4096) */
    uint64_t capacity;       /* bytes for objects (16 MiB) */
    uint64_t max_object;     /* largest object (64 KiB) */
    uint64_t timeout_ns;     /* longest a fetch may take, retries included (1 s) */
    uint32_t pin_server;     /* 1: pin the RPC thread to server_cpu */
    uint32_t server_cpu;
    uint32_t retries;        /* torn READs before a fetch goes by RPC (8) */
    uint32_t cache;          /* addresses a client caches (65536) */
} fw_fetch_config;
/* A client's counters (fw_fetch_client_stats). */
struct fw_fetch_stats {
    uint64_t read, read2, rpc; /* fetches per path that returned */
    uint64_t missing;          /* of those, keys not found */
    uint64_t torn;             /* torn READs, READ again */
    uint64_t moved;            /* cached addresses whose object had moved */
    uint64_t fallbacks;        /* fetches that went by RPC after `retries` torn READs */
    uint64_t timeouts;         /* fetches that timed out */
    uint64_t late;             /* late completions and replies skipped */
    uint64_t load_reads;       /* READs of the server's load word */
    uint64_t switches;         /* changes of the adaptive path, all sizes */
    uint64_t probes;           /* adaptive fetches that probed another path */
};
/* A server on the config's device; its RPC thread runs from now. ENODEV
 * or ENOENT: no RDMA device (fw_last_error says why). */
int fw_fetch_server_create(const fw_fetch_config *c, fw_fetch_server **out);
/* Insert or rewrite key's object; a rewrite of the same length is made in
 * place while clients READ it. EINVAL: over max_object; ENOSPC: no room
 * (capacity, or the key's 8 buckets full). */
int fw_fetch_put(const fw_fetch_server *s, uint64_t key, const void *data, size_t len);
/* Remove key; ENOENT: not there. */
int fw_fetch_remove(const fw_fetch_server *s, uint64_t key);
/* A client of s, connected (in this process). */
int fw_fetch_client_create(const fw_fetch_server *s, const fw_fetch_config *c,
                           fw_fetch_client **out);
/* Fetch key by path (FW_FETCH_*): copies min(length, cap) bytes to buf
 * (may be NULL), stores the length in *len and the path taken in *took
 * (either may be NULL). ENOENT: no such key (on every path); EMSGSIZE:
 * longer than cap (truncated); ETIMEDOUT: no answer within timeout_ns;
 * EIO: the connection broke (the server is gone). One thread at a time. */
int fw_fetch_get(fw_fetch_client *c, uint64_t key, int path, void *buf, size_t cap,
                 size_t *len, int *took);
int fw_fetch_client_stats(const fw_fetch_client *c, struct fw_fetch_stats *out);
void fw_fetch_client_destroy(fw_fetch_client *c);
/* Stop the RPC thread and free the table; its clients' fetches fail from
 * then on. */
void fw_fetch_server_destroy(fw_fetch_server *s);

/* A completion ring the caller owns and consumes, waited on in every mode
 * above (including dispatch: a dispatcher peeks the counters). head and
 * tail are the ring's 32-bit consumer and producer counters; fd is its
 * doorbell. For an io_uring set up with liburing:
 *     fw_ring_create(ring.cq.khead, ring.cq.ktail, ring.ring_fd, FW_RING_LEVEL, &r);
 * (not with IORING_SETUP_DEFER_TASKRUN: its completions only appear when
 * the owner enters the kernel). FW_RING_LEVEL: fd is readable while the
 * ring holds entries (an io_uring fd). FW_RING_EVENTFD: fd is a
 * non-blocking eventfd the producer writes after publishing the tail (an
 * io_uring registered eventfd, or your own ring's doorbell); fastwake
 * drains it. fastwake never writes head or tail; they and fd must outlive
 * the fw_ring. EINVAL: NULL or misaligned counters, unknown kind, or a
 * blocking eventfd; EBADF: fd not open.
 *
 * A dispatcher peeks such a ring on every pass while its owner waits. For
 * a ring whose producer is your own code (not the kernel), OR
 * FW_RING_NOTICES into kind and have the producer call
 * fw_ring_published after every store of the tail (a release store), with
 * a handle from fw_ring_producer_create: the dispatcher then serves the
 * ring through ready notices, pushed only while its owner waits, so its
 * passes cost what is ready, not what it watches. The call costs a
 * producer whose owner is not waiting one full fence and one load from
 * its cache. The producer must still write fd as kind says (a dispatcher
 * that goes idle hands its waiters back to interrupt mode). A publish
 * without the call is served late, by the dispatcher's safety net, and
 * counted (fw_dispatcher_notice_stats: scan_found). */
#define FW_RING_LEVEL 0
#define FW_RING_EVENTFD 1
#define FW_RING_NOTICES 0x100
int fw_ring_create(const unsigned *head, const unsigned *tail, int fd, int kind, fw_ring **out);
/* Wait until the ring holds at least one entry; *ready (may be NULL) gets
 * how many. Nothing is consumed: reap them your own way
 * (io_uring_peek_cqe / io_uring_cqe_seen), or the next wait returns at
 * once. ETIMEDOUT: none within timeout_ns (< 0: forever). EBADF: the fd
 * was closed. */
int fw_ring_wait(fw_waiter *w, fw_ring *r, int64_t timeout_ns, unsigned *ready);
void fw_ring_destroy(fw_ring *r);
/* The producer's handle of a ring created with FW_RING_NOTICES (call it
 * where r is not in use, e.g. before handing r to its owner); usable from
 * any thread, concurrently, and it may outlive r. EINVAL: r or out NULL,
 * or r created without FW_RING_NOTICES. */
int fw_ring_producer_create(const fw_ring *r, fw_ring_producer **out);
/* After every release store of the ring's tail, while the ring's memory
 * is mapped: pushes the owner's dispatcher a notice if the owner waits
 * for one. EINVAL: p NULL. */
int fw_ring_published(const fw_ring_producer *p);
void fw_ring_producer_destroy(fw_ring_producer *p);

/* ---- RDMA verbs: a CQ and completion channel the caller created ----------
 *
 * fw_verbs_cq_create(cq, channel, &v) makes the caller's CQ a source for
 * every wait mode above, "dispatch" and "adaptive" included (a dispatcher
 * peeks the CQ); fw_verbs_cq_wait(w, v, timeout_ns, wc, max, &n) waits and
 * returns work completions, like ibv_poll_cq after ibv_get_cq_event:
 *
 *     struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
 *     int vec;
 *     fw_verbs_comp_vector_for_cpu(ctx, -1, &vec);   // the vector for this CPU
 *     struct ibv_cq *cq = ibv_create_cq(ctx, 256, NULL, ch, vec);
 *     fw_verbs_cq *v; fw_waiter *w; struct ibv_wc wc[16]; int n;
 *     fw_verbs_cq_create(cq, ch, &v);
 *     fw_waiter_create("hybrid:20us", &w);
 *     ... post work ...
 *     if (fw_verbs_cq_wait(w, v, -1, wc, 16, &n) == 0)
 *         for (int i = 0; i < n; i++) handle(&wc[i]);
 *     ...
 *     fw_verbs_cq_destroy(v);        // first: acks every event fastwake read
 *     ibv_destroy_cq(cq);            // then the caller's own teardown
 *     ibv_destroy_comp_channel(ch);
 *
 * Ownership. The CQ and the channel stay the caller's: fastwake creates
 * and destroys neither, and leaves the channel's fd as it is (blocking or
 * not). Both must outlive the fw_verbs_cq. Destroy the fw_verbs_cq before
 * ibv_destroy_cq (and before destroying anything its CQ depends on).
 *
 * What fastwake does to them. It polls the CQ (ibv_poll_cq, through the
 * context's ops as verbs.h does), arms it (ibv_req_notify_cq(cq, 0)), reads
 * events from the channel (ibv_get_cq_event) and acks them
 * (ibv_ack_cq_events).
 *
 * Rules, while the fw_verbs_cq exists:
 *   - Poll the CQ only through fastwake: fw_verbs_cq_wait and fw_verbs_cq_poll,
 *     not ibv_poll_cq. fastwake's peeks (a hybrid or poll spin, the re-check
 *     after arming, a dispatcher on another thread) take CQEs from the CQ
 *     and keep them for the caller; the two calls return those first, in
 *     the CQ's order. A direct ibv_poll_cq could return later CQEs first.
 *   - Acks: fastwake acks exactly the events it read, in batches of 16, and
 *     all that are left when the fw_verbs_cq is destroyed (so ibv_destroy_cq
 *     never blocks because of fastwake). Events the caller reads itself with
 *     ibv_get_cq_event (between fastwake's waits, never during one) are the
 *     caller's to ack. A wait may leave the CQ armed: that arm's event may
 *     then sit in the channel for the caller's next read, an event that
 *     brings no CQE, which rdma-core allows.
 *   - The channel must serve this CQ only while fastwake waits on it. An
 *     event for another CQ on the same channel is acked (so that CQ's
 *     ibv_destroy_cq does not hang) and the wait fails with EINVAL.
 *   - One thread at a time uses a fw_verbs_cq, as for the other sources.
 *     Posting work requests on the CQ's QPs from any thread is fine.
 * A CQ created without a completion channel (channel NULL in both calls) can
 * be waited on with a "poll" waiter only.
 */

/* Make the caller's cq a source. channel is the completion channel cq was
 * created with, or NULL if it was created with none. EINVAL: cq NULL,
 * channel not the CQ's, or out NULL; ENOTSUP: the provider has no
 * poll_cq/req_notify_cq ops, or libibverbs.so.1 cannot be loaded. */
int fw_verbs_cq_create(struct ibv_cq *cq, struct ibv_comp_channel *channel, fw_verbs_cq **out);
/* Wait, in w's mode, until the CQ has at least one work completion, then
 * copy up to max of them to wc (max >= 1) and their count to *n (may be
 * NULL; 0 on failure). ETIMEDOUT: none within timeout_ns (< 0: forever).
 * EINVAL: NULL w, v or wc, max < 1, a mode other than "poll" on a CQ without
 * a channel, or an event for another CQ on the channel. EBADF: the channel's
 * fd was closed. A work completion
 * with an error status is returned like any other (check wc[i].status);
 * an error of ibv_poll_cq itself is returned as its errno. A signal does not
 * end the wait unless fw_waiter_set_interruptible (dispatch mode). */
int fw_verbs_cq_wait(fw_waiter *w, fw_verbs_cq *v, int64_t timeout_ns, struct ibv_wc *wc, int max,
                     int *n);
/* Without waiting: copy up to max work completions to wc, *n = how many
 * (0: none). What to call instead of ibv_poll_cq while v exists. */
int fw_verbs_cq_poll(fw_verbs_cq *v, struct ibv_wc *wc, int max, int *n);
int fw_verbs_cq_stats(const fw_verbs_cq *v, struct fw_verbs_stats *out);
/* Ack every event fastwake read, stop peeking, free v. The CQ and the
 * channel are left to the caller. NULL is accepted. */
void fw_verbs_cq_destroy(fw_verbs_cq *v);

/* The completion vector (for ibv_create_cq) whose completions are signalled
 * on CPU cpu (-1: the CPU the calling thread runs on now): the vector whose
 * interrupt is delivered to that CPU (mlx5: /proc/interrupts and the IRQ's
 * effective affinity), vector = CPU on providers without interrupts (rxe,
 * siw), else vector 0. The same choice fastwake makes for its own CQs
 * (docs/guide/rdma.md, "Completion-vector affinity"). Create the CQ of a thread
 * pinned to a CPU on that CPU's vector and its wake-ups stay on that CPU.
 * EINVAL: ctx or vector NULL, cpu < -1 or not a CPU of this host. */
int fw_verbs_comp_vector_for_cpu(struct ibv_context *ctx, int cpu, int *vector);

/* ---- RDMA verbs: one shared CQ for the connections of one core -----------
 *
 * A dispatcher that peeks one CQ per connection pays for every connection
 * it watches. A shared CQ is one CQ (and one completion channel) for many
 * QPs: fastwake polls it, routes each work completion to the inbox of its
 * owner (by QP number, or by the high bits of wr_id), and a dispatcher
 * polls that one CQ per pass whatever the number of connections. Each
 * inbox is a source for every wait mode; owners asleep in interrupt mode
 * share the channel (one event wakes one of them, which routes for all).
 *
 *     fw_verbs_shared_cq *s; fw_verbs_inbox *in[K]; fw_waiter *w;
 *     fw_verbs_shared_cq_create(ctx, 1024, 1, FW_ROUTE_QP_NUM, 0, &s); // CPU 1's vector
 *     struct ibv_qp_init_attr qa = {.send_cq = fw_verbs_shared_cq_cq(s),
 *                                   .recv_cq = fw_verbs_shared_cq_cq(s), ...};
 *     for (k = 0; k < K; k++) {
 *         qp[k] = ibv_create_qp(pd, &qa);
 *         fw_verbs_shared_cq_inbox(s, qp[k]->qp_num, &in[k]);
 *     }
 *     ... owner k (a thread on CPU 1): ...
 *     fw_waiter_create("dispatch", &w);
 *     if (fw_verbs_inbox_wait(w, in[k], -1, wc, 16, &n) == 0) ...
 *     ...
 *     for (k = 0; k < K; k++) ibv_destroy_qp(qp[k]);   // first, as for any CQ
 *     for (k = 0; k < K; k++) fw_verbs_inbox_destroy(in[k]);
 *     fw_verbs_shared_cq_destroy(s);   // the CQ goes with the last handle
 *
 * Ownership. fastwake creates the CQ and its channel on the caller's
 * context (the context must stay open until the shared CQ and all its
 * inboxes are destroyed) and destroys both when the last of the shared
 * CQ and its inboxes is destroyed. The QPs are the caller's: create them on
 * fw_verbs_shared_cq_cq, never poll or arm that CQ yourself, and destroy
 * the QPs first.
 *
 * Nothing is lost: a completion whose key has no inbox is kept, counted
 * (unrouted) and goes to an inbox created later with that key, or to
 * fw_verbs_shared_cq_take_unrouted; so do the completions an inbox held
 * when it was destroyed.
 *
 * Threads: the shared CQ's calls may be made from any thread at once,
 * except its destroy; an inbox is used by one thread at a time (its
 * owner's), as every other source.
 */

/* A shared CQ of entries entries (room for the completions of every QP it
 * serves) on the completion vector for CPU cpu (-1: the calling thread's,
 * as fw_verbs_comp_vector_for_cpu chooses), routed by route (shift: for
 * FW_ROUTE_WR_ID_HIGH, 0-63; ignored otherwise). EINVAL: ctx or out NULL,
 * entries < 1, cpu < -1 or not a CPU of this host, an unknown route or
 * shift; ENOTSUP: the provider
 * has no poll_cq/req_notify_cq ops, or libibverbs.so.1 cannot be loaded;
 * ibv_create_cq's errno otherwise. */
int fw_verbs_shared_cq_create(struct ibv_context *ctx, int entries, int cpu, int route, int shift,
                              fw_verbs_shared_cq **out);
/* The CQ, to create QPs on (ibv_create_qp's send_cq and recv_cq); NULL for a
 * NULL s. */
struct ibv_cq *fw_verbs_shared_cq_cq(const fw_verbs_shared_cq *s);
/* The inbox of the owner of key (a qp_num, or wr_id >> shift): completions
 * kept for key so far come first. EINVAL: s or out NULL, or key already has
 * an inbox. */
int fw_verbs_shared_cq_inbox(const fw_verbs_shared_cq *s, uint64_t key, fw_verbs_inbox **out);
/* Wait, in w's mode, until the inbox has a work completion, then copy up to
 * max of them to wc (max >= 1) and their count to *n (may be NULL; 0 on
 * failure), in the CQ's order. ETIMEDOUT: none within timeout_ns (< 0:
 * forever). EINVAL: NULL w, in or wc, or max < 1. An error of ibv_poll_cq
 * is returned as its errno, to this and every later wait. */
int fw_verbs_inbox_wait(fw_waiter *w, fw_verbs_inbox *in, int64_t timeout_ns, struct ibv_wc *wc, int max, int *n);
/* Without waiting: copy up to max of the inbox's work completions to wc
 * (polling the shared CQ if it has none), *n = how many (0: none). */
int fw_verbs_inbox_poll(fw_verbs_inbox *in, struct ibv_wc *wc, int max, int *n);
/* The oldest kept completions nobody owns (at most max), *n = how many. */
int fw_verbs_shared_cq_take_unrouted(const fw_verbs_shared_cq *s, struct ibv_wc *wc, int max, int *n);
int fw_verbs_shared_cq_stats(const fw_verbs_shared_cq *s, struct fw_shared_cq_stats *out);
/* Free the inbox; the completions it held are kept as unrouted. NULL is
 * accepted. */
void fw_verbs_inbox_destroy(fw_verbs_inbox *in);
/* Free this handle; the CQ and its channel are destroyed with the last of
 * it and its inboxes. NULL is accepted. */
void fw_verbs_shared_cq_destroy(fw_verbs_shared_cq *s);

#ifdef __cplusplus
}
#endif

#endif /* FASTWAKE_H */

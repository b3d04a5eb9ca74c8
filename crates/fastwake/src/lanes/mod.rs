//! Lanes: a message endpoint between two peers whose small messages never
//! wait behind a bulk transfer.
//!
//! One connection shared by small requests and bulk transfers is one
//! queue: a 4 KiB reply waits behind every byte of a 1 MiB write queued
//! before it, in the sender's socket buffer and in the receiver's
//! single reading thread, and no wait mode can fix that (the NVMe/TCP host
//! measured 80K read IOPS with a 14 ms four-nines tail that way, and 171K
//! with reads on queues of their own). An [`Endpoint`] is made of two
//! TCP connections to its peer, one per [`Class`]:
//!
//! - the **latency lane** carries messages up to [`Config::threshold`]
//!   bytes (default [`THRESHOLD`], 16 KiB) and waits in a spinning-capable
//!   mode (`hybrid` by default; `adaptive`, `dispatch` or `interrupt`);
//! - the **bulk lane** carries the rest and waits in `interrupt` (or
//!   `adaptive`) mode: a bulk transfer is long enough that a wake-up is
//!   noise, and spinning for it would take the CPU the latency lane needs.
//!
//! The sender picks the lane by size ([`Endpoint::send`]) or by an
//! explicit class ([`Endpoint::send_as`]); each lane delivers whole
//! messages, in the order they were sent on it ([`Endpoint::recv`]).
//! Nothing is ordered *between* lanes: that is the point.
//!
//! # The bulk lane is polite and batched
//!
//! A bulk message goes to the kernel in chunks of at most
//! [`Config::chunk`] bytes, one `sendmsg` each, and is read in `recv`s of
//! at most as many. While the latency lane of the same endpoint has a
//! message in flight (see [`Endpoint::latency_in_flight`]) and last ran on
//! the calling thread's CPU, the chunks shrink to [`Config::polite_chunk`],
//! as Justitia paces RDMA flows: the kernel here does not preempt a
//! syscall (`PREEMPT_NONE`), and over loopback a `sendmsg` does the
//! receiver's TCP work too, so a chunk is a stretch a latency message's
//! thread waits behind when it shares the CPU. Bulk work on a CPU of its
//! own (what Linux's NVMe/TCP queue maps arrange) keeps full chunks: there,
//! small chunks only cost throughput.
//!
//! With [`Config::batch`] set (the default, i10's numbers), a lane's sends
//! batch in two cases. A sender that says more messages follow
//! ([`Endpoint::send_more`], `MSG_MORE` at the level of messages) leaves
//! its message in the lane's batch without a syscall while the batch has
//! room ([`Batch::messages`], [`Batch::bytes`]) and is younger than
//! [`Batch::delay`] (i10's delayed doorbell); a full or old batch goes out
//! in one `sendmsg`. And a message that finds the socket full is queued
//! (copied) when it fits the batch. The queue goes out in `sendmsg`s of
//! at most a batch each, flagged `MSG_MORE` while more of it follows; a
//! message's own chunks carry `MSG_MORE` but the last. A message too big
//! for the batch waits for room in the calling thread, through the
//! lane's wait mode. Queued bytes are pushed by the next plain send (in
//! the same `sendmsg` when it fits the batch), by a thread in
//! [`Endpoint::recv`] once they are [`Batch::delay`] old (a receive that
//! finds bytes queued when it starts or when its wait ends waits in
//! slices of the delay and pushes them itself: there is no I/O thread;
//! one already asleep when they were queued pushes them when it next
//! wakes), and by [`Endpoint::flush`], which a program that stops sending
//! and does not receive must call.
//!
//! Batching serves the latency lane too, where a request/answer server
//! meets it: requests that arrive together are read by one `recv`, and
//! while [`Endpoint::buffered`] says another whole one waits, the server
//! answers with [`Endpoint::send_more_as`] and sends the last answer
//! plainly, so all the answers leave in one `sendmsg` (the NVMe/TCP
//! host's `MSG_MORE` while more is queued). A client whose threads know
//! that others send right after them does the same with its requests
//! (`fastwake bench lanes` does both).
//!
//! # No needless context switch
//!
//! A send goes to the kernel from the calling thread; a receive is taken by
//! the thread that waits for it, through [`crate::Waiter`] in the lane's
//! mode. Nothing runs in between.
//!
//! # Layouts
//!
//! [`Layout::Shared`] puts both classes on one connection (what lanes
//! replace, kept so the two can be compared with the same code); the
//! receiver of a shared endpoint gets every message from either
//! [`Class`]'s `recv`.
//!
//! Connecting: [`connect()`] opens the lanes of one endpoint; a [`Listener`]
//! accepts them and pairs them by the small handshake each connection
//! starts with (see [`mod@connect`]).

pub mod connect;
mod endpoint;
mod frame;
pub mod rdma;
mod room;
mod send;
mod turns;

use crate::{Fail, Result, WaitMode};
use std::time::Duration;

pub use connect::{Listener, connect};
pub use endpoint::{Endpoint, LaneStats, Sent};
pub use send::SendCounters;

/// Messages up to this many bytes go on the latency lane by default.
///
/// Why 16 KiB: up to it a message crosses loopback for about what a small
/// one costs (hybrid one-way p50 6.3 µs at 4 KiB, 7.6 µs at 16 KiB), and
/// from there the copy counts (15.7 µs at 64 KiB, 33 µs at 256 KiB;
/// docs/results, record `2026-11-28-tcp-message-size`); it equals the
/// polite chunk, so no latency message costs its lane-mates more than a
/// polite bulk chunk would; and a storage stack's small I/O (4-16 KiB)
/// stays on the latency lane.
pub const THRESHOLD: usize = 16 << 10;

/// Bytes per bulk `sendmsg` by default: four loopback segments, few
/// enough syscalls per MiB (16) that batching has little left to win on a
/// 1 MiB message, short enough (tens of µs) that a latency message waits
/// little behind it.
pub const CHUNK: usize = 64 << 10;

/// Bytes per bulk `sendmsg` while the latency lane has a message in
/// flight, by default.
pub const POLITE_CHUNK: usize = 16 << 10;

/// The largest message by default (a bigger frame header is a protocol
/// error at the receiver, and a bad parameter at the sender).
pub const MAX_MESSAGE: usize = 64 << 20;

/// Which lane a message takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Small messages whose latency matters.
    Latency,
    /// Large messages whose throughput matters.
    Bulk,
}

impl Class {
    /// `latency` or `bulk`.
    pub fn name(self) -> &'static str {
        match self {
            Class::Latency => "latency",
            Class::Bulk => "bulk",
        }
    }
}

/// How an endpoint's classes map onto connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One connection per class.
    Lanes,
    /// One connection for both (one queue).
    Shared,
}

/// i10's flush rule for the bulk lane's queue: a `sendmsg` carries at most
/// `messages` messages and `bytes` bytes, and queued bytes wait at most
/// `delay` for a waiting thread to push them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Messages per `sendmsg` at most.
    pub messages: usize,
    /// Bytes queued (and per `sendmsg`) at most.
    pub bytes: usize,
    /// How long queued bytes may wait for a receiving thread to push them.
    pub delay: Duration,
}

impl Batch {
    /// i10's delayed doorbell: 16 requests, 64 KiB or 50 µs.
    pub const I10: Batch = Batch {
        messages: 16,
        bytes: 64 << 10,
        delay: Duration::from_micros(50),
    };
}

/// An endpoint's parameters; [`Config::default`] states every default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// One connection per class, or one for both.
    pub layout: Layout,
    /// Largest message [`Endpoint::send`] puts on the latency lane.
    pub threshold: usize,
    /// Bytes per bulk `sendmsg`.
    pub chunk: usize,
    /// Bytes per bulk `sendmsg` while a latency message is in flight.
    pub polite_chunk: usize,
    /// Batch bulk sends (`None`: every message goes out on its own, from
    /// the calling thread, without `MSG_MORE`).
    pub batch: Option<Batch>,
    /// How the latency lane waits.
    pub latency_mode: WaitMode,
    /// How the bulk lane waits.
    pub bulk_mode: WaitMode,
    /// Largest message either side accepts.
    pub max_message: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            layout: Layout::Lanes,
            threshold: THRESHOLD,
            chunk: CHUNK,
            polite_chunk: POLITE_CHUNK,
            batch: Some(Batch::I10),
            latency_mode: WaitMode::Hybrid {
                budget: crate::wait::DEFAULT_BUDGET,
            },
            bulk_mode: WaitMode::Interrupt,
            max_message: MAX_MESSAGE,
        }
    }
}

impl Config {
    /// One line on the first bad parameter.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Fail::invalid(format!("lanes: {m}")));
        if self.max_message == 0 || self.max_message > (u32::MAX as usize) {
            return bad(format!(
                "max message {} must be between 1 and {}",
                self.max_message,
                u32::MAX
            ));
        }
        if self.threshold > self.max_message {
            return bad(format!(
                "threshold {} exceeds the max message {}",
                self.threshold, self.max_message
            ));
        }
        if self.chunk == 0 || self.polite_chunk == 0 || self.polite_chunk > self.chunk {
            return bad(format!(
                "chunk sizes must satisfy 1 <= polite chunk ({}) <= chunk ({})",
                self.polite_chunk, self.chunk
            ));
        }
        if let Some(b) = self.batch
            && (b.messages == 0 || b.messages > MAX_BATCH_MESSAGES || b.bytes == 0)
        {
            return bad(format!(
                "batch of {} messages and {} bytes: messages must be 1..={MAX_BATCH_MESSAGES}, bytes at least 1",
                b.messages, b.bytes
            ));
        }
        match self.latency_mode {
            WaitMode::Poll => {
                return bad(
                    "the latency lane waits in interrupt, hybrid, adaptive or dispatch mode, not poll (a whole core per lane)".into(),
                );
            }
            WaitMode::Interrupt
            | WaitMode::Hybrid { .. }
            | WaitMode::Dispatch
            | WaitMode::Adaptive(_) => {}
        }
        match self.bulk_mode {
            WaitMode::Interrupt | WaitMode::Adaptive(_) => {}
            m => {
                return bad(format!(
                    "the bulk lane waits in interrupt or adaptive mode, not {}",
                    m.name()
                ));
            }
        }
        Ok(())
    }
}

/// A latency message sent (or received) this long ago without an answer
/// no longer makes the bulk lane polite: past it, it is a one-way
/// message, not a request waiting behind bulk bytes.
pub(crate) const IN_FLIGHT_WINDOW_NS: u64 = 1_000_000;

/// Messages one batched `sendmsg` may carry: two iovecs each (header and
/// payload), well under the kernel's 1024.
pub const MAX_BATCH_MESSAGES: usize = 256;

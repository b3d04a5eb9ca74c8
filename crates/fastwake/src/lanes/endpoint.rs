//! The endpoint: its lanes, which lane a message takes, and the waits of
//! its receivers.

use super::frame::Frames;
use super::send::{Pace, SendCounters, Tx};
use super::turns::TurnKind;
use super::{Class, Config, IN_FLIGHT_WINDOW_NS, Layout};
use crate::cpu::monotonic_ns;
use crate::wait::WaitStats;
use crate::{Fail, Result, Waiter};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What one send did, as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// The lane it took.
    pub class: Class,
    /// Syscalls it made (`sendmsg` calls, and peeks and sleeps while the
    /// socket was full, including pushing what was queued before it).
    pub syscalls: u64,
    /// Some of it waits in the bulk batch queue (see the module docs:
    /// the next send, a waiting receiver or [`Endpoint::flush`] pushes it).
    pub queued: bool,
}

/// One lane's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LaneStats {
    /// The sending side.
    pub send: SendCounters,
    /// Whole messages received.
    pub received: u64,
    /// Their payload bytes.
    pub received_bytes: u64,
    /// The receiving waits.
    pub wait: WaitStats,
}

struct Rx {
    frames: Frames,
    waiter: Waiter,
    received: u64,
    bytes: u64,
}

struct Lane {
    sock: Arc<OwnedFd>,
    tx: Tx,
    rx: Mutex<Rx>,
}

/// A message endpoint of one or two connections (see the
/// [module docs](super)). Every method takes `&self`: threads share an
/// endpoint, each lane sends one message at a time and receives one at a
/// time.
pub struct Endpoint {
    config: Config,
    lanes: Vec<Lane>,
    latency_sent: AtomicU64,
    latency_received: AtomicU64,
    latency_last_ns: AtomicU64,
    /// The CPU of the last latency send or receive (`u32::MAX`: none yet).
    latency_cpu: AtomicU32,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("layout", &self.config.layout)
            .field("connections", &self.lanes.len())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A receiver that panicked mid-wait left the frames as they were (a
    // take is one step), so the lane stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Endpoint {
    /// An endpoint over connected sockets: one for [`Layout::Shared`],
    /// latency then bulk for [`Layout::Lanes`].
    pub(super) fn new(config: Config, socks: Vec<OwnedFd>) -> Result<Endpoint> {
        config.validate()?;
        let want = match config.layout {
            Layout::Lanes => 2,
            Layout::Shared => 1,
        };
        if socks.len() != want {
            return Err(Fail::invalid(format!(
                "lanes: {:?} layout needs {want} connections, got {}",
                config.layout,
                socks.len()
            )));
        }
        let mut lanes = Vec::with_capacity(want);
        for (i, s) in socks.into_iter().enumerate() {
            rustix::io::ioctl_fionbio(&s, true).map_err(|e| Fail::os("set O_NONBLOCK", e))?;
            // Small messages must not wait for Nagle.
            rustix::net::sockopt::set_tcp_nodelay(&s, true)
                .map_err(|e| Fail::os("set TCP_NODELAY on a lane", e))?;
            let sock = Arc::new(s);
            let bulk = config.layout == Layout::Lanes && i == 1;
            let mode = if bulk {
                config.bulk_mode
            } else {
                config.latency_mode
            };
            lanes.push(Lane {
                tx: Tx::new(sock.clone(), config.batch, mode)?,
                rx: Mutex::new(Rx {
                    frames: Frames::new(sock.clone(), config.max_message)?,
                    waiter: Waiter::new(mode),
                    received: 0,
                    bytes: 0,
                }),
                sock,
            });
        }
        Ok(Endpoint {
            config,
            lanes,
            latency_sent: AtomicU64::new(0),
            latency_received: AtomicU64::new(0),
            latency_last_ns: AtomicU64::new(0),
            latency_cpu: AtomicU32::new(u32::MAX),
        })
    }

    /// The parameters it was made with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Connections it holds (2 for lanes, 1 shared).
    pub fn connections(&self) -> usize {
        self.lanes.len()
    }

    /// The class [`Endpoint::send`] picks for a message of `len` bytes.
    pub fn class_of(&self, len: usize) -> Class {
        if len <= self.config.threshold {
            Class::Latency
        } else {
            Class::Bulk
        }
    }

    fn lane(&self, class: Class) -> &Lane {
        match (self.config.layout, class) {
            (Layout::Lanes, Class::Bulk) => &self.lanes[1],
            _ => &self.lanes[0],
        }
    }

    /// The socket of `class`'s lane (the same one for both in a shared
    /// layout), for options and for `shutdown`.
    pub fn socket(&self, class: Class) -> BorrowedFd<'_> {
        self.lane(class).sock.as_fd()
    }

    /// Has the latency lane a message in flight: one side of a
    /// request/answer pair is ahead of the other (sent and not yet
    /// answered, or received and not yet answered) and the last latency
    /// message went within the last millisecond? (One-way messages count
    /// for a millisecond each.)
    pub fn latency_in_flight(&self) -> bool {
        self.latency_sent.load(Ordering::Relaxed) != self.latency_received.load(Ordering::Relaxed)
            && monotonic_ns().saturating_sub(self.latency_last_ns.load(Ordering::Relaxed))
                < IN_FLIGHT_WINDOW_NS
    }

    /// Should bulk work of the calling thread go in polite chunks now: a
    /// latency message is in flight and the latency lane last ran on this
    /// CPU? Over loopback a `sendmsg` or `recv` does the peer's TCP work
    /// too, in a stretch the kernel does not preempt, so bulk bytes delay
    /// a latency message only where they share its CPU; bulk on a CPU of
    /// its own (queue maps' alignment) keeps full chunks.
    fn polite(&self) -> bool {
        self.latency_in_flight()
            && crate::cpu::current() == Some(self.latency_cpu.load(Ordering::Relaxed))
    }

    /// The latency lane is active on the calling thread's CPU.
    fn latency_here(&self) {
        self.latency_last_ns
            .store(monotonic_ns(), Ordering::Relaxed);
        if let Some(c) = crate::cpu::current() {
            self.latency_cpu.store(c, Ordering::Relaxed);
        }
    }

    fn pace<'a>(&self, class: Class, polite: &'a dyn Fn() -> bool) -> Pace<'a> {
        let bulk_lane = self.config.layout == Layout::Lanes && class == Class::Bulk;
        Pace {
            chunk: self.config.chunk,
            polite_chunk: if bulk_lane {
                self.config.polite_chunk
            } else {
                self.config.chunk
            },
            polite,
            turn: if class == Class::Latency {
                TurnKind::Barging
            } else {
                TurnKind::InOrder
            },
        }
    }

    /// Send `msg` on the lane its size picks ([`Config::threshold`]).
    pub fn send(&self, msg: &[u8]) -> Result<Sent> {
        self.send_as(msg, self.class_of(msg.len()))
    }

    /// Send `msg` on `class`'s lane, whatever its size.
    pub fn send_as(&self, msg: &[u8], class: Class) -> Result<Sent> {
        self.send_with(msg, class, false)
    }

    fn send_with(&self, msg: &[u8], class: Class, more: bool) -> Result<Sent> {
        if msg.len() > self.config.max_message {
            return Err(Fail::invalid(format!(
                "lanes: a {}-byte message exceeds the {}-byte max message",
                msg.len(),
                self.config.max_message
            )));
        }
        let polite = || self.polite();
        let pace = self.pace(class, &polite);
        if class == Class::Latency {
            self.latency_sent.fetch_add(1, Ordering::Relaxed);
            self.latency_here();
        }
        let tx = &self.lane(class).tx;
        let done = if more {
            tx.send_more(msg, &pace)?
        } else {
            tx.send(msg, &pace)?
        };
        Ok(Sent {
            class,
            syscalls: done.syscalls,
            queued: done.queued,
        })
    }

    /// Send `msg` on the lane its size picks, saying more messages follow
    /// (see [`Endpoint::send_more_as`]).
    pub fn send_more(&self, msg: &[u8]) -> Result<Sent> {
        self.send_more_as(msg, self.class_of(msg.len()))
    }

    /// Send `msg` on `class`'s lane, saying more messages follow: it may
    /// wait in the lane's batch (i10's delayed doorbell: up to
    /// [`super::Batch::messages`] messages, [`super::Batch::bytes`] bytes
    /// or [`super::Batch::delay`]) to go out in one `sendmsg` with the
    /// next ones. The batch is pushed by the next plain send, by a thread
    /// waiting in a receive once the delay has passed, or by
    /// [`Endpoint::flush`]: end a run of these with one of them. Without
    /// batching the same as [`Endpoint::send_as`].
    pub fn send_more_as(&self, msg: &[u8], class: Class) -> Result<Sent> {
        self.send_with(msg, class, true)
    }

    /// Push every queued bulk byte to the kernel, waiting for room as long
    /// as that takes.
    pub fn flush(&self) -> Result<()> {
        let polite = || self.polite();
        for (i, lane) in self.lanes.iter().enumerate() {
            let class = if i == 1 { Class::Bulk } else { Class::Latency };
            lane.tx.flush(&self.pace(class, &polite))?;
        }
        Ok(())
    }

    /// The waiting thread's share of i10's timer: push queued bytes whose
    /// delay has passed. Returns whether bytes stay queued.
    fn tick(&self) -> Result<bool> {
        let Some(b) = self.config.batch else {
            return Ok(false);
        };
        let polite = || self.polite();
        let mut left = false;
        for (i, lane) in self.lanes.iter().enumerate() {
            let class = if i == 1 { Class::Bulk } else { Class::Latency };
            left |= lane.tx.tick(b.delay, &self.pace(class, &polite))?;
        }
        Ok(left)
    }

    /// Wait for the next message on `class`'s lane and return a copy.
    pub fn recv(&self, class: Class) -> Result<Vec<u8>> {
        self.recv_with(class, |m| m.to_vec())
    }

    /// Wait for the next message on `class`'s lane and hand it to `f`
    /// without copying it.
    pub fn recv_with<R>(&self, class: Class, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        match self.recv_deadline(class, None, f)? {
            Some(r) => Ok(r),
            None => Err(Fail::timed_out()),
        }
    }

    /// As [`Endpoint::recv_with`], waiting at most `timeout`; `Ok(None)`
    /// when it passes with no whole message.
    pub fn recv_timeout_with<R>(
        &self,
        class: Class,
        timeout: Duration,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        self.recv_deadline(class, Some(Instant::now() + timeout), f)
    }

    fn recv_deadline<R>(
        &self,
        class: Class,
        deadline: Option<Instant>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>> {
        let mut rx = lock(&self.lane(class).rx);
        let rx = &mut *rx;
        let polite = || self.polite();
        rx.frames.set_cap(self.pace(class, &polite).chunk_now());
        let len = loop {
            // While bulk bytes wait in a batch queue, wait in slices of
            // the batch delay and push them between slices (no I/O
            // thread does it for us).
            let slice = match self.tick()? {
                true => self.config.batch.map(|b| Instant::now() + b.delay),
                false => None,
            };
            let until = match (slice, deadline) {
                (Some(s), Some(d)) => Some(s.min(d)),
                (s, d) => s.or(d),
            };
            let got = match until {
                None => Some(rx.waiter.wait(&mut rx.frames)?),
                Some(u) => rx
                    .waiter
                    .wait_timeout(&mut rx.frames, u.saturating_duration_since(Instant::now()))?,
            };
            match got {
                Some(len) => break len,
                None if deadline.is_some_and(|d| Instant::now() >= d) => return Ok(None),
                None => {}
            }
        };
        rx.received += 1;
        rx.bytes += len as u64;
        if class == Class::Latency || self.config.layout == Layout::Shared {
            self.latency_received.fetch_add(1, Ordering::Relaxed);
            self.latency_here();
        }
        Ok(Some(f(rx.frames.message())))
    }

    /// Does a whole message wait in `class`'s receive buffer, so that
    /// the next receive on that lane returns it without a syscall? A
    /// server answering requests sends its answers with
    /// [`Endpoint::send_more_as`] while this holds and a plain send for
    /// the last one: the answers to requests that arrived together leave
    /// in one `sendmsg` (the NVMe/TCP host's `MSG_MORE` while more is
    /// queued). False while another thread receives on the lane.
    pub fn buffered(&self, class: Class) -> bool {
        match self.lane(class).rx.try_lock() {
            Ok(rx) => rx.frames.buffered(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().frames.buffered(),
            Err(std::sync::TryLockError::WouldBlock) => false,
        }
    }

    /// `class`'s lane's sending counters alone (the one connection's in a
    /// shared layout): unlike [`Endpoint::stats`], this does not wait for
    /// a thread that is receiving on the lane.
    pub fn send_counters(&self, class: Class) -> SendCounters {
        self.lane(class).tx.counters()
    }

    /// `class`'s lane's counters (the one connection's in a shared
    /// layout). The receiving half waits for a thread that is receiving
    /// on the lane to take its message.
    pub fn stats(&self, class: Class) -> LaneStats {
        let lane = self.lane(class);
        let rx = lock(&lane.rx);
        LaneStats {
            send: lane.tx.counters(),
            received: rx.received,
            received_bytes: rx.bytes,
            wait: rx.waiter.stats(),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Queued bulk bytes were accepted by `send`; push what the kernel
        // takes now rather than drop them silently. A peer that stopped
        // reading gets the rest as a close mid-message.
        let polite = || false;
        for (i, lane) in self.lanes.iter().enumerate() {
            let class = if i == 1 { Class::Bulk } else { Class::Latency };
            let _ = lane.tx.tick(Duration::ZERO, &self.pace(class, &polite));
        }
    }
}

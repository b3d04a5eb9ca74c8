//! A lane's sending side: direct sends from the calling thread, in
//! chunks, and the bulk lane's batch queue (see the [module docs](super)
//! for the rules and their numbers).

use super::Batch;
use super::frame::{HEADER, header};
use super::room::Room;
use super::turns::{Entry, Turn, TurnKind, Turns};
use crate::cpu::monotonic_ns;
use crate::{Fail, Result, WaitMode, Waiter};
use std::collections::VecDeque;
use std::io::IoSlice;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How big each `sendmsg` of a message may be, asked before each one:
/// the bulk lane's chunk shrinks while the latency lane has a message in
/// flight.
pub(super) struct Pace<'a> {
    pub chunk: usize,
    pub polite_chunk: usize,
    pub polite: &'a dyn Fn() -> bool,
    /// How the message takes its turn on the lane.
    pub turn: TurnKind,
}

impl Pace<'_> {
    /// The chunk a transfer starting now uses.
    pub(super) fn chunk_now(&self) -> usize {
        self.next().0
    }

    /// The chunk for the next `sendmsg`, and whether it is the polite one.
    fn next(&self) -> (usize, bool) {
        if self.polite_chunk < self.chunk && (self.polite)() {
            (self.polite_chunk, true)
        } else {
            (self.chunk, false)
        }
    }
}

/// What a lane's sends did, counted since the endpoint was made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SendCounters {
    /// Messages sent (queued ones included).
    pub messages: u64,
    /// Payload bytes of those messages.
    pub bytes: u64,
    /// `sendmsg` calls, those that found the socket full included.
    pub sendmsgs: u64,
    /// `sendmsg` calls flagged `MSG_MORE` (more of a message or of the
    /// queue followed at once).
    pub more: u64,
    /// `sendmsg` calls that carried parts of more than one message.
    pub batched: u64,
    /// `sendmsg` calls cut to the polite chunk.
    pub polite: u64,
    /// Messages that went out in more than one `sendmsg`.
    pub chunked: u64,
    /// Messages (or their tails) copied into the batch queue: said to
    /// have more behind them, found the socket full, or ended a batch
    /// (to leave in its `sendmsg`).
    pub queued: u64,
    /// Syscalls spent waiting for room (peeks and sleeps).
    pub room_polls: u64,
    /// Bytes waiting in the batch queue now.
    pub queued_bytes: u64,
    /// Sends that found the lane's turn taken and parked for it.
    pub turn_waits: u64,
    /// Small messages that found the turn taken and were left with the
    /// thread holding it, which sent them before leaving its turn.
    pub handed: u64,
}

/// One send's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SendDone {
    /// Syscalls the send made (`sendmsg`s, room peeks and sleeps,
    /// draining what was queued before it included).
    pub syscalls: u64,
    /// Its tail (or all of it) waits in the batch queue.
    pub queued: bool,
}

/// A send left with the thread holding the turn: no syscall of its own,
/// and it waits in that thread's hands until sent.
const HANDED: SendDone = SendDone {
    syscalls: 0,
    queued: true,
};

struct State {
    /// Framed bytes the kernel has not taken yet; the front one from
    /// `front_off`.
    queue: VecDeque<Vec<u8>>,
    front_off: usize,
    /// Bytes in `queue` not yet sent.
    queued: usize,
    /// When the oldest queued byte was queued ([`monotonic_ns`]).
    oldest_ns: u64,
    room: Room,
    waiter: Waiter,
    counters: SendCounters,
}

/// A lane's sending side. One sender at a time holds it for a whole
/// message, so messages never interleave on the wire, and senders take
/// turns in the order they came ([`Turns`]).
pub(super) struct Tx {
    sock: Arc<OwnedFd>,
    batch: Option<Batch>,
    turns: Turns,
    /// Locked only by the thread whose turn it is (and briefly by
    /// [`Tx::counters`]).
    state: Mutex<State>,
    /// Bytes were queued when the last turn ended: a receiver's
    /// [`Tx::tick`] looks here first, so that it takes no turn (and holds
    /// no lock a sender may need) on a lane with nothing to push, such as
    /// a bulk lane's receiver on its CPU ticking the latency lane.
    pending: AtomicBool,
}

fn closed_or(e: rustix::io::Errno) -> Fail {
    match e {
        rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET => Fail::closed("lane peer is gone"),
        e => Fail::os("sendmsg lane", e),
    }
}

impl Tx {
    pub(super) fn new(sock: Arc<OwnedFd>, batch: Option<Batch>, mode: WaitMode) -> Result<Tx> {
        Ok(Tx {
            batch,
            turns: Turns::default(),
            state: Mutex::new(State {
                queue: VecDeque::new(),
                front_off: 0,
                queued: 0,
                oldest_ns: 0,
                room: Room::new(sock.clone())?,
                waiter: Waiter::new(mode),
                counters: SendCounters::default(),
            }),
            pending: AtomicBool::new(false),
            sock,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A sender that panicked left the queue consistent (every change
        // to it is one step), so the lane stays usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn counters(&self) -> SendCounters {
        let st = self.lock();
        let mut c = st.counters;
        c.room_polls = st.room.polls;
        c.queued_bytes = st.queued as u64;
        c.turn_waits = self.turns.waits();
        c.handed = self.turns.handed();
        c
    }

    /// Take the lane's turn, or leave `msg` with the thread holding it
    /// (a small message, where the lane batches and it fits a batch).
    fn enter(&self, kind: TurnKind, msg: &[u8]) -> Entry<'_> {
        match self.batch {
            Some(b) if HEADER + msg.len() <= b.bytes => self.turns.enter_or_hand(
                kind,
                HEADER + msg.len(),
                |n, bytes| n <= b.messages && bytes <= b.bytes,
                || [&header(msg.len())[..], msg].concat(),
            ),
            _ => Entry::Turn(self.turns.enter(kind)),
        }
    }

    /// The state, for the holder of `turn`, with whatever earlier senders
    /// left with the turn queued first.
    fn hold(&self, turn: &Turn<'_>) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        st.absorb(turn.take_handed());
        st
    }

    /// Leave the turn, first sending the messages left with it (with
    /// `block`, waiting for room; else queueing what the socket does not
    /// take).
    fn finish(
        &self,
        turn: &mut Turn<'_>,
        st: &mut State,
        pace: &Pace<'_>,
        block: bool,
    ) -> Result<()> {
        while let Some(left) = turn.try_leave() {
            st.absorb(left);
            st.drain(&self.sock, self.batch, pace, block)?;
        }
        self.pending.store(st.queued > 0, Ordering::Release);
        Ok(())
    }

    /// Send one message: straight to the kernel when nothing is queued,
    /// waiting for room in the lane's mode unless its tail fits the batch
    /// queue; or left with the thread whose turn it is (see
    /// [`Turns::enter_or_hand`]).
    pub(super) fn send(&self, msg: &[u8], pace: &Pace<'_>) -> Result<SendDone> {
        let mut turn = match self.enter(pace.turn, msg) {
            Entry::Handed => return Ok(HANDED),
            Entry::Turn(t) => t,
        };
        let mut st = self.hold(&turn);
        let before = st.syscalls();
        self.send_turn(&mut st, msg, pace)?;
        self.finish(&mut turn, &mut st, pace, false)?;
        Ok(st.done(before, st.queued > 0))
    }

    fn send_turn(&self, st: &mut State, msg: &[u8], pace: &Pace<'_>) -> Result<()> {
        st.counters.messages += 1;
        st.counters.bytes += msg.len() as u64;
        let hdr = header(msg.len());
        let total = HEADER + msg.len();
        if st.queued > 0 {
            // Behind a batch: this message ends it. It joins the batch
            // when it fits, so the batch and its end leave in one
            // `sendmsg` (what the socket does not take stays queued); else
            // the batch goes first, waiting for room if it must.
            let fits = |st: &State| {
                self.batch
                    .is_some_and(|b| st.queued + total <= b.bytes && st.queue.len() < b.messages)
            };
            if !fits(st) {
                st.drain(&self.sock, self.batch, pace, false)?;
            }
            if st.queued > 0 {
                if fits(st) {
                    st.enqueue(&hdr, msg, 0);
                    return st.drain(&self.sock, self.batch, pace, false);
                }
                st.drain(&self.sock, self.batch, pace, true)?;
            }
        }
        let mut off = 0;
        let mut calls = 0;
        loop {
            off = st.send_direct(
                &self.sock,
                &hdr,
                msg,
                off,
                pace,
                self.batch.is_some(),
                &mut calls,
            )?;
            if off == total {
                break;
            }
            if let Some(b) = self.batch
                && total - off <= b.bytes
            {
                st.enqueue(&hdr, msg, off);
                break;
            }
            st.wait_room()?;
        }
        if calls > 1 {
            st.counters.chunked += 1;
        }
        Ok(())
    }

    /// Send one message that more will follow: i10's delayed doorbell. It
    /// joins the batch without a syscall while the batch has room (its
    /// messages and bytes) and is younger than its delay; a batch that is
    /// full or old is rung (one `sendmsg` for all of it) first, and a full
    /// one at once. Without batching, or for a message bigger than a
    /// batch, the same as [`Tx::send`].
    pub(super) fn send_more(&self, msg: &[u8], pace: &Pace<'_>) -> Result<SendDone> {
        let Some(b) = self.batch else {
            return self.send(msg, pace);
        };
        let total = HEADER + msg.len();
        if total > b.bytes {
            return self.send(msg, pace);
        }
        let mut turn = match self.enter(pace.turn, msg) {
            Entry::Handed => return Ok(HANDED),
            Entry::Turn(t) => t,
        };
        let mut st = self.hold(&turn);
        let before = st.syscalls();
        st.counters.messages += 1;
        st.counters.bytes += msg.len() as u64;
        let room = |st: &State| st.queued + total <= b.bytes && st.queue.len() < b.messages;
        let old = st.queued > 0
            && monotonic_ns().saturating_sub(st.oldest_ns) >= b.delay.as_nanos() as u64;
        if !room(&st) || old {
            st.drain(&self.sock, self.batch, pace, false)?;
            if !room(&st) {
                st.drain(&self.sock, self.batch, pace, true)?;
            }
        }
        st.enqueue(&header(msg.len()), msg, 0);
        if st.queued >= b.bytes || st.queue.len() >= b.messages {
            st.drain(&self.sock, self.batch, pace, false)?;
        }
        self.finish(&mut turn, &mut st, pace, false)?;
        Ok(st.done(before, st.queued > 0))
    }

    /// Push what the queue holds if its oldest byte has waited `delay`
    /// (without blocking, and without waiting for a sender that holds the
    /// lane: that one drains it). Returns whether bytes stay queued.
    pub(super) fn tick(&self, delay: Duration, pace: &Pace<'_>) -> Result<bool> {
        if !self.pending.load(Ordering::Acquire) {
            return Ok(false);
        }
        let Some(mut turn) = self.turns.try_enter() else {
            return Ok(false);
        };
        let mut st = self.hold(&turn);
        if st.queued > 0 && monotonic_ns().saturating_sub(st.oldest_ns) >= delay.as_nanos() as u64 {
            st.drain(&self.sock, self.batch, pace, false)?;
        }
        self.finish(&mut turn, &mut st, pace, false)?;
        Ok(st.queued > 0)
    }

    /// Send everything queued, waiting for room as long as it takes.
    pub(super) fn flush(&self, pace: &Pace<'_>) -> Result<()> {
        let mut turn = self.turns.enter(TurnKind::InOrder);
        let mut st = self.hold(&turn);
        st.drain(&self.sock, self.batch, pace, true)?;
        self.finish(&mut turn, &mut st, pace, true)
    }
}

impl State {
    fn syscalls(&self) -> u64 {
        self.counters.sendmsgs + self.room.polls
    }

    fn done(&self, before: u64, queued: bool) -> SendDone {
        SendDone {
            syscalls: self.syscalls() - before,
            queued,
        }
    }

    fn enqueue(&mut self, hdr: &[u8], msg: &[u8], off: usize) {
        let mut v = Vec::with_capacity(HEADER + msg.len() - off);
        if off < HEADER {
            v.extend_from_slice(&hdr[off..]);
            v.extend_from_slice(msg);
        } else {
            v.extend_from_slice(&msg[off - HEADER..]);
        }
        self.push(v);
    }

    fn push(&mut self, framed: Vec<u8>) {
        if self.queued == 0 {
            self.oldest_ns = monotonic_ns();
        }
        self.queued += framed.len();
        self.queue.push_back(framed);
        self.counters.queued += 1;
    }

    /// Queue whole framed messages other senders left with the turn.
    fn absorb(&mut self, handed: Vec<Vec<u8>>) {
        for framed in handed {
            self.counters.messages += 1;
            self.counters.bytes += (framed.len() - HEADER) as u64;
            self.push(framed);
        }
    }

    fn wait_room(&mut self) -> Result<()> {
        self.waiter.wait(&mut self.room)
    }

    /// Send frame bytes from `off` until all are sent or the socket is
    /// full; returns the new offset. `calls` counts the `sendmsg`s that
    /// took bytes.
    #[allow(clippy::too_many_arguments)]
    fn send_direct(
        &mut self,
        sock: &OwnedFd,
        hdr: &[u8; HEADER],
        msg: &[u8],
        mut off: usize,
        pace: &Pace<'_>,
        batching: bool,
        calls: &mut u32,
    ) -> Result<usize> {
        let total = HEADER + msg.len();
        while off < total {
            let (chunk, polite) = pace.next();
            let end = (off + chunk).min(total);
            let iov_h;
            let iov_m;
            let iovs: &[IoSlice<'_>] = if off < HEADER {
                iov_h = [
                    IoSlice::new(&hdr[off..]),
                    IoSlice::new(&msg[..end - HEADER]),
                ];
                &iov_h
            } else {
                iov_m = [IoSlice::new(&msg[off - HEADER..end - HEADER])];
                &iov_m
            };
            let last = end == total;
            let mut flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
            if batching && !last {
                flags |= rustix::net::SendFlags::MORE;
            }
            self.counters.sendmsgs += 1;
            match rustix::net::sendmsg(sock, iovs, &mut Default::default(), flags) {
                Ok(n) => {
                    off += n;
                    *calls += 1;
                    self.counters.more += u64::from(flags.contains(rustix::net::SendFlags::MORE));
                    self.counters.polite += u64::from(polite);
                }
                Err(rustix::io::Errno::AGAIN) => return Ok(off),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(closed_or(e)),
            }
        }
        Ok(off)
    }

    /// Send the queue in batches (the module docs' rule); with `block`,
    /// wait for room until it is empty, else stop when the socket is full.
    fn drain(
        &mut self,
        sock: &OwnedFd,
        batch: Option<Batch>,
        pace: &Pace<'_>,
        block: bool,
    ) -> Result<()> {
        let b = batch.unwrap_or(super::Batch::I10);
        while self.queued > 0 {
            let (chunk, polite) = pace.next();
            let limit = chunk.min(b.bytes).max(1);
            let mut iovs: Vec<IoSlice<'_>> = Vec::with_capacity(b.messages.min(self.queue.len()));
            let mut bytes = 0;
            for (i, v) in self.queue.iter().enumerate() {
                if iovs.len() == b.messages || bytes == limit {
                    break;
                }
                let from = if i == 0 { self.front_off } else { 0 };
                let take = (v.len() - from).min(limit - bytes);
                iovs.push(IoSlice::new(&v[from..from + take]));
                bytes += take;
            }
            let more = bytes < self.queued;
            let mut flags = rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL;
            if more {
                flags |= rustix::net::SendFlags::MORE;
            }
            let parts = iovs.len();
            self.counters.sendmsgs += 1;
            let r = rustix::net::sendmsg(sock, &iovs, &mut Default::default(), flags);
            drop(iovs);
            match r {
                Ok(n) => {
                    self.counters.more += u64::from(more);
                    self.counters.batched += u64::from(parts > 1);
                    self.counters.polite += u64::from(polite);
                    self.advance(n);
                }
                Err(rustix::io::Errno::AGAIN) if block => self.wait_room()?,
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(closed_or(e)),
            }
        }
        Ok(())
    }

    /// `n` queued bytes went to the kernel.
    fn advance(&mut self, mut n: usize) {
        self.queued -= n;
        while n > 0 {
            let front = self.queue[0].len() - self.front_off;
            if n >= front {
                n -= front;
                self.queue.pop_front();
                self.front_off = 0;
            } else {
                self.front_off += n;
                n = 0;
            }
        }
        if self.queued > 0 {
            // The rest has waited since it was queued, but a drain that
            // made progress restarts the clock: the kernel is taking it.
            self.oldest_ns = monotonic_ns();
        }
    }
}

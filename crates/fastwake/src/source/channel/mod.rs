//! The shared-memory channel: a bounded single-producer/single-consumer ring
//! of completions plus a doorbell, usable between threads and processes.
//!
//! It is fastwake's built-in default source and its IPC path.
//!
//! # Why the doorbell is conditional
//!
//! The producer rings the doorbell (a futex word or an eventfd) **only** when
//! the consumer has armed it, i.e. announced that it is about to sleep. A
//! polling consumer therefore never costs the producer a syscall: the
//! producer's whole notification cost is the one atomic add that publishes
//! its completions.
//!
//! # Why `armed` lives in the same word as `head`
//!
//! Arming and publishing must not miss each other: either the producer sees
//! the consumer armed, or the consumer's re-check sees the new completion.
//! With two separate words that needs Dekker-style store→load fences on both
//! sides, which is subtle and which model checkers handle poorly. Here the
//! word is `head << 2 | notice << 1 | armed`: the consumer arms with
//! `fetch_or(ARMED)` and the producer publishes with a compare-exchange
//! that adds `n << 2` and clears both request bits. Two read-modify-writes
//! of one location are totally ordered, so whichever comes second sees the
//! first: the producer's publish returns `armed = 1` (it rings), or the
//! consumer's `fetch_or` — and the re-check after it — returns the new
//! head. A stale ring (the consumer found work and disarmed, but the
//! producer had already seen the bit) costs one spurious wake-up, which
//! [`super::block_until_ready`] tolerates. The publish clears the bit in
//! the same step that reads it, so an arm that comes after it is always
//! seen by the next publish.
//!
//! `notice` is the same protocol for a dispatcher instead of a doorbell:
//! a consumer waiting in dispatch mode sets it
//! ([`super::Peek::arm_notice`]), and a publish that finds it set pushes
//! the channel's index into the dispatcher's [`super::notice::NoticeRing`]
//! (when one is attached: both ends in one process), so the dispatcher
//! need not peek the channel at all. The publish guesses that neither bit
//! is set (it knows the head), so a producer whose consumer does not wait
//! pays one compare-exchange, as it paid one add before.
//!
//! # Memory layout
//!
//! One memfd mapping: a line of constants, a colour pad, three hot cache
//! lines (the producer's `head|armed` word; the consumer's `tail`; the futex
//! doorbell), then `capacity` slots, each `16 + slot_size` bytes rounded up
//! to a cache line so the two ends never share a line.
//!
//! The ends' own state lives on the heap, not in the mapping, and each
//! piece written per operation (`Sender`, `Receiver`, the payload copy)
//! owns its cache lines, as does the `Region` both ends read: see
//! `PayloadBuf` for the false sharing this prevents.
//!
//! # Why channels are coloured
//!
//! Every mapping starts on a page boundary, so without the pad the hot
//! lines of every channel would sit at the same page offset and fall into
//! the same L1 set (the set index is the address bits 6..12). A dispatcher
//! that peeks 16 channels would then thrash one 8-way set and miss L1 on
//! every peek, and channels that move in lockstep (one request each, round
//! robin) would also collide slot for slot. Each new channel gets the next
//! of `COLOURS` pads of three lines, which spreads the hot lines and the
//! slots over the sets. (Each such miss is an L2 hit, a few ns: at 16
//! connections `fastwake bench share` moved by less than this VM's noise;
//! the pad is there for the hundreds-of-channels case, and costs nothing.) The pad is recorded in the constants, so a process
//! attaching to the channel finds the lines wherever the creator put them.

use super::notice::Notifier;
use super::publish::{ARMED, HEAD_SHIFT, NOTICE, publish};
use super::summary::Flag;
use super::{NO_CPU, Peek, Rechecked, Source};
use crate::sync::Ordering;
use crate::{Fail, Result};
use std::cell::Cell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

mod region;

use region::{LINE, Line, Region, SLOT_HEAD};

/// How the producer wakes a sleeping consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Doorbell {
    /// A futex word inside the shared mapping: nothing to pass between
    /// processes, the cheapest wake-up.
    #[default]
    Futex,
    /// An eventfd: costs a little more, but the consumer gets an fd it can
    /// put in epoll next to other fds ([`Source::notify_fd`]).
    EventFd,
}

/// Shape of a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Slots in the ring; a power of two.
    pub capacity: u32,
    /// Largest payload of one completion, in bytes.
    pub slot_size: u32,
    /// How the consumer is woken.
    pub doorbell: Doorbell,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            capacity: 256,
            slot_size: 64,
            doorbell: Doorbell::Futex,
        }
    }
}

impl Config {
    fn validate(&self) -> Result<()> {
        if !self.capacity.is_power_of_two() || self.capacity < 2 || self.capacity > 1 << 24 {
            return Err(Fail::invalid(format!(
                "channel capacity {} must be a power of two in 2..=16777216",
                self.capacity
            )));
        }
        if self.slot_size > 1 << 20 {
            return Err(Fail::invalid(format!(
                "channel slot size {} exceeds 1 MiB",
                self.slot_size
            )));
        }
        Ok(())
    }

    fn stride(&self) -> usize {
        (SLOT_HEAD + self.slot_size as usize).div_ceil(LINE) * LINE
    }

    /// Mapping size for a header of `header_bytes` (constants, pad, hot
    /// lines).
    fn bytes(&self, header_bytes: usize) -> usize {
        header_bytes + self.stride() * self.capacity as usize
    }
}

/// Create an in-process channel.
pub fn channel(cfg: Config) -> Result<(Sender, Receiver)> {
    let r = Region::create(cfg, true)?;
    Ok((Sender::claim(r.clone())?, Receiver::claim(r)?))
}

/// A channel meant to be shared with another process: hand
/// [`SharedChannel::memory_fd`] (and the doorbell fd, if any) to the other
/// process, by inheritance or SCM_RIGHTS, and attach there.
pub struct SharedChannel {
    region: Arc<Region>,
}

impl SharedChannel {
    /// Create the shared memory for a channel.
    pub fn create(cfg: Config) -> Result<SharedChannel> {
        Ok(SharedChannel {
            region: Region::create(cfg, false)?,
        })
    }

    /// The memfd holding the ring.
    pub fn memory_fd(&self) -> BorrowedFd<'_> {
        self.region.mem.as_fd()
    }

    /// The eventfd doorbell, for [`Doorbell::EventFd`] channels.
    pub fn doorbell_fd(&self) -> Option<BorrowedFd<'_>> {
        self.region.efd.as_ref().map(|f| f.as_fd())
    }

    /// Become this channel's producer in this process.
    pub fn sender(&self) -> Result<Sender> {
        Sender::claim(self.region.clone())
    }

    /// Become this channel's consumer in this process.
    pub fn receiver(&self) -> Result<Receiver> {
        Receiver::claim(self.region.clone())
    }
}

/// The producing end. Line aligned for the reason given on [`Receiver`].
#[repr(align(64))]
pub struct Sender {
    r: Arc<Region>,
    /// Next slot to fill (pushed, maybe not yet published).
    head: u64,
    /// Head as last published.
    published: u64,
    cached_tail: u64,
    /// Publishes until the producer's CPU is looked up again, and the CPU
    /// last stored (NO_CPU: none yet).
    cpu_countdown: u32,
    cpu: u32,
}

/// Publishes between two looks at the producer's CPU. The CPU is only a
/// hint for the consumer (never spin against a producer on your own
/// CPU), a thread rarely moves, and getcpu plus a store to the line the
/// consumer polls would sit in every publish's latency: after a move the
/// hint is stale for at most this many publishes.
const CPU_REFRESH: u32 = 64;

impl Sender {
    fn claim(r: Arc<Region>) -> Result<Sender> {
        let p = &r.header().prod.0;
        if p.producer_attached.swap(1, Ordering::AcqRel) != 0 {
            return Err(Fail::new(libc::EBUSY, "channel already has a producer"));
        }
        let head = p.head_armed.load(Ordering::Acquire) >> HEAD_SHIFT;
        let cached_tail = r.header().cons.0.tail.load(Ordering::Acquire);
        Ok(Sender {
            r,
            head,
            published: head,
            cached_tail,
            cpu_countdown: 0,
            cpu: NO_CPU,
        })
    }

    /// Attach as producer to a channel created in another process.
    pub fn attach(memory: OwnedFd, doorbell: Option<OwnedFd>) -> Result<Sender> {
        Sender::claim(Region::attach(memory, doorbell)?)
    }

    /// Largest payload one completion may carry.
    pub fn slot_size(&self) -> usize {
        self.r.cfg.slot_size as usize
    }

    /// Queue one completion without ringing; follow with [`Sender::flush`].
    /// `Ok(false)` when the ring is full.
    pub fn try_push(&mut self, tag: u64, data: &[u8]) -> Result<bool> {
        if data.len() > self.slot_size() {
            return Err(Fail::invalid(format!(
                "payload of {} bytes exceeds the channel's slot size {}",
                data.len(),
                self.slot_size()
            )));
        }
        let h = self.r.header();
        let cap = self.r.cfg.capacity as u64;
        if self.head - self.cached_tail >= cap {
            self.cached_tail = h.cons.0.tail.load(Ordering::Acquire);
            if self.head - self.cached_tail >= cap {
                if h.cons.0.consumer_closed.load(Ordering::Acquire) != 0 {
                    return Err(Fail::closed("channel consumer is gone"));
                }
                return Ok(false);
            }
        }
        let slot = self.r.slot(self.head);
        // SAFETY: slot `head` is outside [tail, published), so the consumer
        // does not read it until flush() publishes it with a release RMW;
        // the slot has SLOT_HEAD + slot_size bytes and data fits.
        unsafe {
            slot.cast::<u64>().write(tag);
            slot.add(8).cast::<u32>().write(data.len() as u32);
            std::ptr::copy_nonoverlapping(data.as_ptr(), slot.add(SLOT_HEAD), data.len());
        }
        self.head += 1;
        Ok(true)
    }

    /// Publish everything pushed so far, and ring the doorbell if, and only
    /// if, the consumer armed it.
    pub fn flush(&mut self) {
        let n = self.head - self.published;
        if n == 0 {
            return;
        }
        let p = &self.r.header().prod.0;
        if self.cpu_countdown == 0 {
            self.cpu_countdown = CPU_REFRESH;
            // Stored before the publish and only when it changed: a store
            // after it would pull the line back from a consumer that is
            // reading the new head.
            if let Some(cpu) = crate::cpu::current()
                && cpu != self.cpu
            {
                self.cpu = cpu;
                p.producer_cpu.store(cpu, Ordering::Relaxed);
            }
        }
        self.cpu_countdown -= 1;
        let prev = publish(&p.head_armed, self.published, n);
        self.published = self.head;
        if prev & NOTICE != 0 {
            // Before the ring: the dispatcher is polling, the sleeper is
            // not, so the notice is the faster of the two.
            self.r.notify();
        }
        if prev & ARMED != 0 {
            // Dated before the ring: the consumer that wakes measures from
            // here (see `Hints::rung_at`).
            self.r
                .header()
                .arm
                .0
                .rung_at
                .store(crate::cpu::monotonic_ns(), Ordering::Release);
            self.r.ring();
        }
        // A dispatcher watching this channel learns of the completion from
        // its summary instead of reading `head` every pass.
        self.r.raise_summary();
    }

    /// Queue one completion and notify; `Ok(false)` when the ring is full.
    pub fn try_send(&mut self, tag: u64, data: &[u8]) -> Result<bool> {
        let ok = self.try_push(tag, data)?;
        if ok {
            self.flush();
        }
        Ok(ok)
    }

    /// Queue one completion, waiting for space while the ring is full.
    pub fn send(&mut self, tag: u64, data: &[u8]) -> Result<()> {
        let mut spins = 0u32;
        while !self.try_send(tag, data)? {
            // A full ring means the consumer is behind; on a shared CPU it
            // cannot catch up unless we give the CPU away.
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.flush();
        let h = self.r.header();
        h.prod.0.producer_closed.store(1, Ordering::Release);
        // A consumer waiting for a notice gets one for the close, first:
        // the ring below is a syscall (a microsecond or more), and a
        // dispatcher's safety net would find the closed source meanwhile
        // and count the notice as missing.
        if h.prod.0.head_armed.fetch_and(!NOTICE, Ordering::AcqRel) & NOTICE != 0 {
            self.r.notify();
        }
        // Ring unconditionally: a consumer asleep must learn of the close.
        self.r.ring();
        // A dispatcher must learn of the close too (its peek reports it).
        self.r.raise_summary();
    }
}

/// One completion taken from a channel; its payload is in
/// [`Receiver::payload`] until the next take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg {
    /// The producer's tag (like a work request id).
    pub tag: u64,
    /// Payload length in bytes.
    pub len: u32,
}

/// The receiver's copy of the last payload, in cache lines of its own.
///
/// Why not a `Vec<u8>`: a small payload buffer is a small allocation, and
/// the allocator packs small allocations two or more to a line. The buffer
/// is written on every take by the consumer's CPU; the allocation next to
/// it was typically made by the same `channel()` call sequence and is read
/// on every operation by the *other* CPU (the next channel's `Region`, the
/// other end's buffer), so every take evicted a line from the other core.
/// `fastwake bench share` (16 connections) paid this on every hop; see
/// docs/design/dispatcher.md, "False sharing in the heap".
struct PayloadBuf {
    lines: Box<[Line<[u8; 64]>]>,
    len: usize,
}

impl PayloadBuf {
    fn new(capacity: usize) -> PayloadBuf {
        let n = capacity.div_ceil(64).max(1);
        PayloadBuf {
            lines: (0..n).map(|_| Line([0u8; 64])).collect(),
            len: 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the lines are one contiguous allocation of plain bytes
        // (`Line` is `repr(C)` and a multiple of its alignment in size, so
        // there is no padding), and `len` never exceeds its size (`fill`).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<u8>(), self.len) }
    }

    fn fill(&mut self, src: &[u8]) {
        let cap = self.lines.len() * 64;
        let n = src.len().min(cap);
        // SAFETY: as in `bytes`; `n` fits in the allocation, and `src`
        // cannot overlap a buffer we own exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.lines.as_mut_ptr().cast::<u8>(), n)
        };
        self.len = n;
    }
}

/// The consuming end; a [`Source`].
///
/// Line aligned, like [`Sender`]: each end writes its own fields on every
/// operation, and must not share a line with whatever the caller stores
/// next to it (often the other end of another channel, used on the other
/// CPU).
#[repr(align(64))]
pub struct Receiver {
    r: Arc<Region>,
    tail: u64,
    cached_head: Cell<u64>,
    armed_seq: u32,
    payload: PayloadBuf,
    /// The peek handle, made once: dispatch-mode waits ask for it on every
    /// wait to notice a changed source.
    peek: std::cell::OnceCell<Arc<dyn Peek>>,
}

impl Receiver {
    /// The one peek handle of this receiver (made on first use), so that
    /// it identifies the source (see [`Source::peek`]).
    fn cached_peek(&self) -> &Arc<dyn Peek> {
        self.peek
            .get_or_init(|| Arc::new(ChannelPeek { r: self.r.clone() }))
    }

    fn claim(r: Arc<Region>) -> Result<Receiver> {
        let c = &r.header().cons.0;
        if c.consumer_attached.swap(1, Ordering::AcqRel) != 0 {
            return Err(Fail::new(libc::EBUSY, "channel already has a consumer"));
        }
        let tail = c.tail.load(Ordering::Acquire);
        let payload = PayloadBuf::new(r.cfg.slot_size as usize);
        Ok(Receiver {
            r,
            tail,
            cached_head: Cell::new(tail),
            armed_seq: 0,
            payload,
            peek: std::cell::OnceCell::new(),
        })
    }

    /// Attach as consumer to a channel created in another process.
    pub fn attach(memory: OwnedFd, doorbell: Option<OwnedFd>) -> Result<Receiver> {
        Receiver::claim(Region::attach(memory, doorbell)?)
    }

    /// Payload of the completion taken last.
    pub fn payload(&self) -> &[u8] {
        self.payload.bytes()
    }

    /// Completions waiting in the ring now.
    pub fn pending(&self) -> u64 {
        (self.r.header().prod.0.head_armed.load(Ordering::Acquire) >> HEAD_SHIFT) - self.tail
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.r
            .header()
            .cons
            .0
            .consumer_closed
            .store(1, Ordering::Release);
    }
}

impl Source for Receiver {
    type Completion = Msg;

    fn name(&self) -> &'static str {
        "channel"
    }

    fn ready(&self) -> bool {
        if self.cached_head.get() > self.tail {
            return true;
        }
        let head = self.r.header().prod.0.head_armed.load(Ordering::Acquire) >> HEAD_SHIFT;
        self.cached_head.set(head);
        head > self.tail
    }

    fn try_take(&mut self) -> Result<Option<Msg>> {
        if !self.ready() {
            let p = &self.r.header().prod.0;
            if p.producer_closed.load(Ordering::Acquire) != 0 && !self.ready() {
                return Err(Fail::closed("channel producer is gone"));
            }
            return Ok(None);
        }
        let slot = self.r.slot(self.tail);
        // SAFETY: tail < head (acquired in ready()), so the producer finished
        // writing this slot and will not touch it until we release tail.
        let msg = unsafe {
            let tag = slot.cast::<u64>().read();
            let len = slot.add(8).cast::<u32>().read().min(self.r.cfg.slot_size);
            self.payload.fill(std::slice::from_raw_parts(
                slot.add(SLOT_HEAD),
                len as usize,
            ));
            Msg { tag, len }
        };
        self.tail += 1;
        self.r
            .header()
            .cons
            .0
            .tail
            .store(self.tail, Ordering::Release);
        Ok(Some(msg))
    }

    fn arm(&mut self) -> Result<()> {
        let h = self.r.header();
        // Read the bell before announcing: a ring after this point changes
        // it, so the futex wait in sleep() cannot miss it.
        self.armed_seq = h.arm.0.bell.load();
        let w = h.prod.0.head_armed.fetch_or(ARMED, Ordering::AcqRel);
        self.cached_head.set(w >> HEAD_SHIFT);
        Ok(())
    }

    fn disarm(&mut self) {
        let w = &self.r.header().prod.0.head_armed;
        // Skip the RMW on the producer's line when the producer already
        // cleared the bit (the usual case after a ring).
        if w.load(Ordering::Relaxed) & ARMED != 0 {
            w.fetch_and(!ARMED, Ordering::AcqRel);
        }
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> Result<()> {
        // A closed producer rang already; but if it closed before we armed,
        // the doorbell will not ring again: do not sleep then.
        let p = &self.r.header().prod.0;
        if p.producer_closed.load(Ordering::Acquire) != 0 {
            return Ok(());
        }
        match &self.r.efd {
            None => {
                self.r.header().arm.0.bell.wait(self.armed_seq, timeout);
                Ok(())
            }
            Some(efd) => super::wait_eventfd(efd, timeout, "poll eventfd doorbell"),
        }
    }

    fn notify_fd(&self) -> Option<BorrowedFd<'_>> {
        self.r.efd.as_ref().map(|f| f.as_fd())
    }

    fn hints(&self) -> super::Hints {
        let h = self.r.header();
        super::Hints {
            // 0 (never rang) is older than any sleep, so a waiter ignores it.
            rung_at: Some(h.arm.0.rung_at.load(Ordering::Acquire)),
            ..super::Hints::producer_on(h.prod.0.producer_cpu.load(Ordering::Relaxed))
        }
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(self.cached_peek())
    }
}

/// A channel's thread-safe peek: compares the shared published head with
/// the consumer's published `tail`, both atomics in the shared header.
struct ChannelPeek {
    r: Arc<Region>,
}

impl Peek for ChannelPeek {
    fn ready(&self) -> bool {
        let h = self.r.header();
        // Tail first: it only grows up to head, so reading it before head
        // can never report a completion that is not there.
        let tail = h.cons.0.tail.load(Ordering::Acquire);
        // A closed producer counts as ready: the owner's try_take reports
        // the close, which a waiter must see instead of waiting forever.
        (h.prod.0.head_armed.load(Ordering::Acquire) >> HEAD_SHIFT) > tail
            || h.prod.0.producer_closed.load(Ordering::Acquire) != 0
    }

    fn attach_summary(&self, flag: Flag) -> bool {
        if !self.r.local {
            return false;
        }
        self.r.summary.attach(flag, Flag::same_as);
        true
    }

    fn detach_summary(&self) {
        self.r.summary.detach();
    }

    fn attach_notices(&self, notifier: Notifier) -> bool {
        if !self.r.local {
            return false;
        }
        self.r.notifier.attach(notifier, Notifier::same_as);
        // A read-modify-write of the publish word after the store: a
        // publish ordered before it is seen by the caller's peek after
        // this; one ordered after it sees the notifier (`Region::notify`).
        self.r
            .header()
            .prod
            .0
            .head_armed
            .fetch_or(0, Ordering::AcqRel);
        true
    }

    fn detach_notices(&self) {
        self.r.notifier.detach();
    }

    fn arm_notice(&self) -> Option<bool> {
        if !self.r.local {
            return None;
        }
        let h = self.r.header();
        let w = h.prod.0.head_armed.fetch_or(NOTICE, Ordering::AcqRel);
        // The owner's own tail: the caller is the owner.
        let tail = h.cons.0.tail.load(Ordering::Relaxed);
        Some((w >> HEAD_SHIFT) > tail || h.prod.0.producer_closed.load(Ordering::Acquire) != 0)
    }

    fn counters(&self) -> Option<super::Counters<'_>> {
        let h = self.r.header();
        Some(super::Counters {
            produced: &h.prod.0.head_armed,
            shift: HEAD_SHIFT,
            consumed: &h.cons.0.tail,
            next_at: Some(super::NextAt {
                // SAFETY: slots_off is inside the mapping, which the
                // handle keeps alive.
                base: unsafe { self.r.base.as_ptr().add(self.r.slots_off) },
                stride: self.r.cfg.stride(),
                mask: self.r.cfg.capacity as u64 - 1,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines a heap object at `p` of `len` bytes touches.
    fn lines(p: usize, len: usize) -> std::ops::Range<usize> {
        p / 64..(p + len).div_ceil(64)
    }

    /// Memory written on every take by one CPU must not share a cache line
    /// with memory the other CPU reads on every operation. With the payload
    /// in a `Vec<u8>` the allocator put a receiver's 8-byte buffer in the
    /// same line as the next channel's `Region`, and this test fails.
    #[test]
    fn per_operation_state_owns_its_cache_lines() {
        let cfg = Config {
            capacity: 8,
            slot_size: 8,
            doorbell: Doorbell::Futex,
        };
        // The shape of a benchmark's set-up: request and reply channels
        // made back to back, so their heap objects are neighbours.
        let ends: Vec<(Sender, Receiver)> = (0..32).map(|_| channel(cfg).unwrap()).collect();
        let written: Vec<std::ops::Range<usize>> = ends
            .iter()
            .map(|(_, rx)| lines(rx.payload().as_ptr() as usize, cfg.slot_size as usize))
            .collect();
        for (_, rx) in &ends {
            // The Arc's counts sit before the Region in the same
            // allocation; the whole allocation is line aligned with it.
            let region = Arc::as_ptr(&rx.r) as usize;
            let read = lines(region, std::mem::size_of::<Region>());
            for w in &written {
                assert!(
                    w.end <= read.start || read.end <= w.start,
                    "a payload buffer shares a line with a Region: {w:?} vs {read:?}"
                );
            }
        }
    }

    /// Both ends and the shared region own whole lines wherever they are
    /// stored (the caller's `Vec`, a task's stack).
    #[test]
    fn ends_and_region_are_line_aligned() {
        assert_eq!(std::mem::align_of::<Region>(), 64);
        assert_eq!(std::mem::align_of::<Sender>(), 64);
        assert_eq!(std::mem::align_of::<Receiver>(), 64);
    }

    #[test]
    fn payload_buffer_holds_multi_line_payloads() {
        let cfg = Config {
            capacity: 4,
            slot_size: 150,
            doorbell: Doorbell::Futex,
        };
        let (mut tx, mut rx) = channel(cfg).unwrap();
        let data: Vec<u8> = (0..150u8).collect();
        assert!(tx.try_send(1, &data).unwrap());
        let m = rx.try_take().unwrap().unwrap();
        assert_eq!(m.len, 150);
        assert_eq!(rx.payload(), &data[..]);
        assert!(tx.try_send(2, b"ab").unwrap());
        rx.try_take().unwrap().unwrap();
        assert_eq!(rx.payload(), b"ab");
    }
}

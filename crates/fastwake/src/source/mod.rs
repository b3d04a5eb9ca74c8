//! Completion sources: where completions come from.
//!
//! A source is anything that produces completions a thread waits for: an
//! RDMA CQ with its completion channel, an io_uring CQ ring, a socket, the
//! shared-memory [`channel`]. Every wait mode works on every source because a
//! source offers exactly four things:
//!
//! 1. **peek** ([`Source::ready`]): a cheap, non-destructive check that a
//!    completion is there, with no syscall — what the FastWake dispatcher does
//!    when it looks at a CQE without popping it. Polling loops and the
//!    per-core dispatcher call only this.
//! 2. **consume** ([`Source::try_take`]): pop one completion.
//! 3. **arm** ([`Source::arm`]): ask to be notified of the *next* completion
//!    (`ibv_req_notify_cq`, setting the channel's armed flag, …).
//! 4. **sleep** ([`Source::sleep`]): block on the notification handle (an fd
//!    such as a completion channel or eventfd, or a futex word) until it
//!    fires. It may return spuriously.
//!
//! # The arm → re-check → sleep rule
//!
//! Arming only covers completions that arrive *after* the arm. One that landed
//! between the caller's last look and the arm raises no notification, and a
//! thread that slept then would sleep forever (a lost wake-up). So after
//! arming, the source must be checked once more, and the thread may sleep only
//! if it is still empty. rdma-core's man pages state the same rule for
//! `ibv_req_notify_cq`.
//!
//! The rule is implemented once, in [`block_until_ready`], and enforced by
//! types: [`Source::sleep`] demands a [`Rechecked`] token that only
//! `block_until_ready` can create, so neither a source nor a wait mode can put
//! a thread to sleep without the re-check.
//!
//! # Peeking from another thread: [`Peek`]
//!
//! [`Source::ready`] runs on the thread that owns the source and may use
//! thread-local caches (the channel keeps its last-seen head in a `Cell`).
//! The per-core dispatcher ([`crate::dispatch`]) must peek sources owned by
//! *other* threads, so a source that wants dispatcher service hands out a
//! [`Peek`] handle from [`Source::peek`]. The contract:
//!
//! - [`Peek::ready`] may be called from any thread, at any time, while the
//!   owner runs, waits, takes or drops the source; it never consumes and
//!   never blocks. Where the source's readiness sits in shared memory it
//!   makes no syscall: one or two cache-line reads for the channel,
//!   io_uring CQs and external rings, a user-space CQ poll for RDMA CQs.
//!   Where no shared-memory view exists it may make **one non-blocking
//!   syscall per peek**. The socket source does: a zero-timeout
//!   `poll(POLLIN)`, 0.5-0.75 µs a peek (unix socketpair 0.49-0.60 µs
//!   empty, 0.65-0.73 µs readable; loopback TCP 0.72-0.74 µs; best of
//!   3 × 200k peeks through the handle in a tiny loop, two runs, measured
//!   on this project's 2-vCPU VM), hundreds of times a counter peek. So
//!   a source like that also names the fd whose readiness the kernel
//!   tracks ([`Peek::kernel_ready_fd`]), and a dispatcher asks the
//!   kernel's ready list for all of them at once (one `epoll_wait` a pass)
//!   instead of peeking each.
//! - It is *eventually exact*: once a completion is in the source and not
//!   yet taken, every later `ready()` returns true until the owner takes it.
//!   A stale `true` (the owner took it a moment ago) is allowed: the owner
//!   re-checks with [`Source::try_take`].
//! - It also returns true once the source is closed for good, so the owner
//!   is resumed and learns of the close from [`Source::try_take`]; a closing
//!   producer raises the summary flag too.
//! - The handle keeps whatever shared state it reads alive on its own (an
//!   `Arc`), so it stays valid after the source is dropped; it then reports
//!   whatever the shared state says (typically `false`).
//! - Optionally ([`Peek::attach_summary`]) the source's *producer* raises a
//!   flag in a [`summary::Summary`] after each new completion, so a
//!   dispatcher watching hundreds of sources reads one summary instead of
//!   every source on every pass (the EQ of an RDMA NIC plays that role in
//!   the FastWake paper). A source that cannot do it returns `false` and is
//!   simply peeked every pass.
//! - Better ([`Peek::attach_notices`]): the producer pushes the source's
//!   index into the dispatcher's [`notice::NoticeRing`], but only when the
//!   owner asked for it as it started to wait ([`Peek::arm_notice`]), so
//!   the dispatcher pops what became ready and peeks nothing else, and a
//!   producer whose consumer is not waiting pays nothing. The channel
//!   does (both ends in one process), and so does a caller-owned ring
//!   whose producer calls [`ring::RingProducer::published`] (it pays a
//!   fence: its request word cannot be the caller's tail).
//!
//! Sources without a handle (the default) still work in
//! [`crate::WaitMode::Dispatch`]: the waiter falls back to interrupt mode.
//! Implementations: the channel (head and tail are atomics in the shared
//! header); RDMA CQs ([`verbs`]); the inboxes of a queue many sources
//! share ([`demux`], e.g. a per-core shared CQ: their counters, and the
//! shared queue as their [`Peek::pump`]); io_uring CQs and external rings
//! (the CQ ring's head and tail, [`uring`] and [`ring`]); sockets (the
//! one syscall above, [`socket`]).

mod attached;
pub mod channel;
pub mod demux;
pub mod notice;
mod publish;
pub mod ring;
pub mod socket;
pub mod summary;
pub mod uring;
pub mod verbs;

use crate::Result;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A thread-safe, non-destructive readiness check of one source; see the
/// [module docs](self#peeking-from-another-thread-peek) for the contract.
pub trait Peek: Send + Sync {
    /// Is a completion waiting to be taken? No syscall, no consumption.
    fn ready(&self) -> bool;

    /// Ask the producer to raise `flag` after every new completion (after
    /// the completion is visible to [`Peek::ready`]). Returns `false` when
    /// the source cannot, e.g. its producer lives in another process.
    /// Attaching again replaces the previous flag.
    fn attach_summary(&self, _flag: summary::Flag) -> bool {
        false
    }

    /// Stop raising the attached flag (a late raise may still happen and
    /// is harmless: flags are hints).
    fn detach_summary(&self) {}

    /// Ask the producer to push `notifier` ([`notice::Notifier::notify`])
    /// when it publishes a completion while the owner has asked for a
    /// notice ([`Peek::arm_notice`]), and when it closes. Once this
    /// returns, a completion published later is either notified or seen by
    /// the caller's next peek (the caller peeks once after attaching).
    /// Returns `false` when the source cannot (its producer lives in
    /// another process, or nothing on its producer's side answers
    /// requests, like a ring made without notices); it is then
    /// peeked instead. Attaching again replaces the previous notifier.
    fn attach_notices(&self, _notifier: notice::Notifier) -> bool {
        false
    }

    /// Stop pushing the attached notifier (a late notice may still come
    /// and is harmless: notices are hints).
    fn detach_notices(&self) {}

    /// **Owner only** (the thread that takes from the source, or its task
    /// runtime), as it announces a wait: ask the producer for a notice of
    /// the next completion. Returns whether a completion (or the close) is
    /// there now, read in the same atomic step as the request, so that
    /// either the producer sees the request or the caller sees the
    /// completion; `None` when the source offers no notices. The request
    /// holds until the producer's next publish answers it.
    fn arm_notice(&self) -> Option<bool> {
        None
    }

    /// Optional fast path: the two counters whose comparison *is* the
    /// readiness test, so a dispatcher can peek without a virtual call or
    /// pointer chase (it caches the addresses). The references must point
    /// into memory that stays put while this handle lives (the handle's own
    /// allocation, or a mapping it keeps). A source that is also ready for
    /// other reasons (closed) still reports those through
    /// [`Peek::ready`], which dispatchers call now and then.
    fn counters(&self) -> Option<Counters<'_>> {
        None
    }

    /// Optional: an fd whose level-triggered `EPOLLIN` readiness (with
    /// `EPOLLRDHUP`, `EPOLLHUP` and `EPOLLERR`) is exactly what
    /// [`Peek::ready`] reports, for a source whose readiness only the
    /// kernel knows (a socket). A dispatcher then puts the fd in one epoll
    /// set of its own and learns which of all such sources are ready from
    /// one `epoll_wait`, instead of calling [`Peek::ready`] (a syscall
    /// each) on every one, every pass.
    ///
    /// The contract:
    /// - the same fd, referring to the same file, for as long as the
    ///   handle lives and the source is open: the dispatcher registers it
    ///   once and deregisters it through this fd;
    /// - the fd belongs to the handle (never a number the source may close
    ///   and something else reopen while the handle lives);
    /// - when the source closes, the fd may be pointed at another file
    ///   that is never readable (the socket does, so a dispatcher holding
    ///   the handle does not keep the connection open); the dispatcher
    ///   copes with the registration that then outlives its deregistration
    ///   (`dispatch::kernel_list`).
    ///
    /// Ignored for a handle that offers [`Peek::counters`], or whose
    /// notices the dispatcher takes: those are cheaper than any syscall.
    fn kernel_ready_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// The shared queue this source's completions come through, when they
    /// come through one that many sources share (a per-core shared CQ,
    /// [`demux`]): its completions reach this source only when someone
    /// polls that queue and routes them. A dispatcher polls each distinct
    /// pump once per pass (compared by address), whatever the number of
    /// sources behind it, before it pops notices. Returns a clone (called
    /// when a source is registered, not per pass).
    fn pump(&self) -> Option<Arc<dyn Pump>> {
        None
    }
}

/// A queue shared by many sources: polling it moves its completions into
/// the sources they belong to (see [`Peek::pump`]). Never blocks; a pump
/// that finds another thread pumping leaves its request to that thread,
/// which polls again before it stops.
pub trait Pump: Send + Sync {
    /// Poll the shared queue and route what it holds.
    fn pump(&self);
}

/// See [`Peek::counters`]: ready iff `(produced >> shift) > consumed`.
#[derive(Clone, Copy)]
pub struct Counters<'a> {
    /// Completions published so far (shifted left by `shift`).
    pub produced: &'a crate::sync::AtomicU64,
    /// Low bits of `produced` that are not part of the count.
    pub shift: u32,
    /// Completions consumed so far.
    pub consumed: &'a crate::sync::AtomicU64,
    /// Where the next completion will be read from, if it sits at a fixed
    /// place in a ring; see [`NextAt`].
    pub next_at: Option<NextAt>,
}

/// The place of completion number `consumed` in a ring of slots: byte
/// `base + (consumed & mask) * stride`.
///
/// Why a dispatcher wants it: having seen `produced` move, it has paid one
/// cache-line transfer, and the owner it switches to (or wakes) will pay a
/// second one, for the slot, only after the switch. A dispatcher that
/// knows the slot prefetches it as it hands off, so that transfer overlaps
/// the switch instead of following it (the FastWake dispatcher gets this
/// for free: it peeks the CQE itself). A hint: a stale address costs a
/// wasted prefetch, never a wrong result.
#[derive(Clone, Copy, Debug)]
pub struct NextAt {
    /// Slot 0. Must stay mapped while the handle lives, as the counters.
    pub base: *const u8,
    /// Bytes between slots.
    pub stride: usize,
    /// Slots in the ring minus one (a power of two minus one).
    pub mask: u64,
}

// SAFETY: NextAt is an address used only as a prefetch hint (never
// dereferenced by a dispatcher); sending it between threads is sending a
// number.
unsafe impl Send for NextAt {}
// SAFETY: as above.
unsafe impl Sync for NextAt {}

impl NextAt {
    /// Start fetching the slot of completion number `consumed` into this
    /// core's cache. No effect on correctness, and none at all on
    /// targets without a prefetch instruction.
    #[inline]
    pub fn prefetch(&self, consumed: u64) {
        let p = self
            .base
            .wrapping_add((consumed & self.mask) as usize * self.stride);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults and never changes memory, even
        // for an address that is not mapped; SSE is baseline on x86_64.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }
}

impl std::fmt::Debug for Counters<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counters")
            .field("shift", &self.shift)
            .finish()
    }
}

/// Proof that the source was armed and then found empty. Only
/// [`block_until_ready`] can make one; [`Source::sleep`] requires it.
#[derive(Debug)]
pub struct Rechecked {
    _private: (),
}

/// A completion source. See the [module docs](self) for the contract.
pub trait Source {
    /// What one completion is.
    type Completion;

    /// A short name for reports (`"channel"`, `"verbs"`, …).
    fn name(&self) -> &'static str;

    /// Is a completion ready? Must not consume it, must not make a syscall,
    /// and must be cheap enough to call in a tight loop over many sources.
    fn ready(&self) -> bool;

    /// Consume one completion if one is ready.
    ///
    /// Returns `Err` only when no completion will ever come again (the peer
    /// closed); an empty source returns `Ok(None)`.
    fn try_take(&mut self) -> Result<Option<Self::Completion>>;

    /// Request a notification for the next completion.
    fn arm(&mut self) -> Result<()>;

    /// Withdraw interest after an arm, when the re-check or a wake-up found
    /// work. Sources whose arm is one-shot and harmless to leave may do
    /// nothing.
    fn disarm(&mut self) {}

    /// Sleep until the notification fires, `timeout` passes, or spuriously.
    /// Must consume (acknowledge) the notification it returns for.
    fn sleep(&mut self, proof: Rechecked, timeout: Option<Duration>) -> Result<()>;

    /// The fd the notification arrives on, if there is one, so callers can
    /// wait on many sources at once with epoll.
    fn notify_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// What the source knows that helps a waiter decide and measure (see
    /// [`Hints`]); none by default.
    fn hints(&self) -> Hints {
        Hints::NONE
    }

    /// The handle other threads use to peek this source (the per-core
    /// dispatcher does), lent by reference: a dispatch-mode wait asks on
    /// every wait and compares it with the handle it registered
    /// ([`Arc::ptr_eq`]), so a source keeps one handle for its life and
    /// the wait costs no reference-count traffic. `None` (the default): the
    /// source cannot be peeked from another thread, and dispatch-mode waits
    /// fall back to interrupt mode.
    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        None
    }
}

/// How sources keep "the producer's CPU is not known yet" in an atomic.
const NO_CPU: u32 = u32::MAX;

/// What a source knows that helps its waiter, besides its completions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    /// The CPU the producer last ran on, when known: a spinning consumer
    /// on that same CPU only delays the producer.
    pub peer_cpu: Option<u32>,
    /// When the producer last rang this source's doorbell, in
    /// [`crate::cpu::monotonic_ns`] time, if the source records it. A
    /// waiter that slept subtracts it from the time it woke: that is the
    /// wake-up latency of this host, which adaptive waits learn instead of
    /// assuming (see [`BlockReport::wake_ns`]).
    pub rung_at: Option<u64>,
}

impl Hints {
    /// Nothing known.
    pub const NONE: Hints = Hints {
        peer_cpu: None,
        rung_at: None,
    };

    /// The producer's CPU as sources keep it ([`NO_CPU`]: not known
    /// yet), and nothing else.
    pub(crate) fn producer_on(cpu: u32) -> Hints {
        Hints {
            peer_cpu: (cpu != NO_CPU).then_some(cpu),
            rung_at: None,
        }
    }
}

/// What happened in one [`block_until_ready`] call, for wait-mode statistics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BlockReport {
    /// Times the thread went to sleep.
    pub sleeps: u32,
    /// Times the re-check after arming found a completion (a wake-up the
    /// rule saved).
    pub rechecks_hit: u32,
    /// Wake-ups that found nothing (tolerated, as with verbs events that
    /// bring no CQE).
    pub spurious: u32,
    /// Ring-to-running time of the last wake-up, in ns, when the source
    /// dates its rings ([`Hints::rung_at`]) and the ring was for this
    /// call's sleep.
    pub wake_ns: Option<u64>,
}

/// Block until `src` yields a completion or `deadline` passes; the only
/// code path that puts a thread to sleep on a source.
pub fn block_until_ready<S: Source + ?Sized>(
    src: &mut S,
    deadline: Option<Instant>,
    report: &mut BlockReport,
) -> Result<Option<S::Completion>> {
    loop {
        if let Some(c) = src.try_take()? {
            return Ok(Some(c));
        }
        // Read before the arm, so a ring dated at or after it is one the
        // arm asked for; only sources that date rings pay the clock read.
        let armed_at = src.hints().rung_at.map(|_| crate::cpu::monotonic_ns());
        src.arm()?;
        // The re-check: a completion that landed before the arm took effect
        // raised no notification.
        if src.ready() {
            report.rechecks_hit += 1;
            src.disarm();
            continue;
        }
        let timeout = match deadline {
            None => None,
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    src.disarm();
                    return Ok(None);
                }
                Some(d - now)
            }
        };
        report.sleeps += 1;
        src.sleep(Rechecked { _private: () }, timeout)?;
        if let (Some(t0), Some(rung)) = (armed_at, src.hints().rung_at)
            && rung >= t0
        {
            report.wake_ns = Some(crate::cpu::monotonic_ns().saturating_sub(rung));
        }
        src.disarm();
        if !src.ready() {
            // Either a timeout (the loop's deadline check returns) or a
            // notification without a completion; both are fine.
            report.spurious += 1;
        }
    }
}

/// Sleep until `efd` (an eventfd doorbell) is readable or `timeout` passes,
/// then drain it. Returns on signal or spuriously, like every `sleep`.
/// Shared by the sources whose doorbell is an eventfd.
pub(crate) fn wait_eventfd(
    efd: &std::os::fd::OwnedFd,
    timeout: Option<Duration>,
    what: &str,
) -> Result<()> {
    use std::os::fd::AsFd;
    wait_readable(efd.as_fd(), timeout, true, what).map(drop)
}

/// Sleep until `fd` is readable or `timeout` passes; with `drain`, read
/// the eventfd counter it then holds (the fd must be non-blocking if
/// anyone else may drain it). Returns on signal or spuriously; `true` when
/// the fd was readable (a read of it will not block, unless someone else
/// reads first).
pub(crate) fn wait_readable(
    fd: BorrowedFd<'_>,
    timeout: Option<Duration>,
    drain: bool,
    what: &str,
) -> Result<bool> {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let ts = timeout.map(|d| rustix::time::Timespec {
        tv_sec: d.as_secs() as _,
        tv_nsec: d.subsec_nanos() as _,
    });
    match rustix::event::poll(&mut fds, ts.as_ref()) {
        Ok(n) if n > 0 => {
            if fds[0].revents().contains(rustix::event::PollFlags::NVAL) {
                // Closed under us: sleeping again would return at once,
                // forever.
                return Err(crate::Fail::new(libc::EBADF, format!("{what}: fd closed")));
            }
            if drain {
                let mut b = [0u8; 8];
                let _ = rustix::io::read(fd, &mut b);
            }
            Ok(true)
        }
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(crate::Fail::os(what, e)),
    }
}

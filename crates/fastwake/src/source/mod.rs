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

pub mod channel;
pub mod socket;
pub mod uring;
pub mod verbs;

use crate::Result;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

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

    /// The CPU the producer last ran on, when known. A spinning consumer on
    /// that same CPU only delays the producer.
    fn peer_cpu(&self) -> Option<u32> {
        None
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
        src.disarm();
        if !src.ready() {
            // Either a timeout (the loop's deadline check returns) or a
            // notification without a completion; both are fine.
            report.spurious += 1;
        }
    }
}

//! `ibv_get_cq_event` as a pre-wake's call (`wait::Prewaker`): under
//! `adaptive`, a blocking wait whose completions come at a steady delay
//! sleeps until shortly before the next is due, then looks at the
//! program's armed CQs, then blocks in the real call.
//!
//! - **The sleep** is on the channel's fd ([`fd_sleep`]), so a CQE on an
//!   armed CQ (whose real arm makes the kernel's event readable) ends it at
//!   once, as in interrupt mode, and a signal ends the call with -1/EINTR
//!   exactly where the plain read would have been interrupted. An event
//!   the shim owes itself (the real arm behind a synthetic event of an
//!   earlier wait) is read and swallowed there, which also re-arms for
//!   real where the program re-armed, and the sleep goes on: without
//!   that, every wait after a caught one would find the fd readable at
//!   once and never sleep.
//! - **The spin** looks as the spinning modes do: the armed CQs (a CQE
//!   found is reported as a synthetic event), and the fd now and then.
//! - **The rest** is the real read, as in interrupt mode.

use super::event::{Event, FD_EVERY, fd_readable, real_event, synthetic_event};
use super::real::GetCqEventFn;
use super::stats;
use crate::{fd_sleep, wait};
use fastwake::wait::{Ending, PREEMPTED_NS};
use fastwake_verbs_sys::ibv_comp_channel;
use std::ffi::c_int;

/// One `ibv_get_cq_event` being pre-woken. Its result: the event, or the
/// errno of the call's failure.
pub(super) struct CqEvent {
    real_get: GetCqEventFn,
    channel: *mut ibv_comp_channel,
    fd: c_int,
    /// The event a look took (a synthetic one is consumed by looking).
    taken: Option<Result<Event, c_int>>,
}

impl CqEvent {
    pub(super) fn new(real_get: GetCqEventFn, channel: *mut ibv_comp_channel, fd: c_int) -> Self {
        CqEvent {
            real_get,
            channel,
            fd,
            taken: None,
        }
    }

    /// Take an event if one is there without blocking: > 0 taken (or the
    /// read failed, kept for [`found`](wait::Prewaker::found)), 0 none.
    fn look(&mut self, fd_too: bool) -> c_int {
        loop {
            if let Some(ev) = synthetic_event(self.channel) {
                self.taken = Some(Ok(ev));
                return 1;
            }
            if !fd_too || !fd_readable(self.fd) {
                return 0;
            }
            // SAFETY: the caller's live channel, readable: the read does
            // not block (unless another thread read the event first, as
            // without the shim).
            match unsafe { real_event(self.real_get, self.channel) } {
                Ok(Some(ev)) => {
                    self.taken = Some(Ok(ev));
                    return 1;
                }
                // An event the shim owed itself: swallowed (and re-armed
                // for real where the program had re-armed); look again.
                Ok(None) => continue,
                Err(_) => {
                    self.taken = Some(Err(wait::errno()));
                    return 1;
                }
            }
        }
    }
}

impl wait::Prewaker for CqEvent {
    type Out = Result<Event, c_int>;

    fn sleep(&mut self, ns: u64) -> Option<c_int> {
        let deadline = fastwake::cpu::monotonic_ns().saturating_add(ns);
        loop {
            if self.look(true) > 0 {
                return Some(1);
            }
            let left = deadline.saturating_sub(fastwake::cpu::monotonic_ns());
            if left == 0 {
                return Some(0);
            }
            match fd_sleep::sleep_holding_signals(self.fd, left, false)? {
                // Readable: an event, or one the shim swallows; the look
                // above tells which.
                n if n > 0 => continue,
                n => return Some(n),
            }
        }
    }

    fn spin(&mut self, start: u64, budget: u64, ending: &mut Ending) -> c_int {
        let mut prev = start;
        let mut spins: u32 = 0;
        let n = loop {
            let n = self.look(spins.is_multiple_of(FD_EVERY));
            spins = spins.wrapping_add(1);
            let now = fastwake::cpu::monotonic_ns();
            if now.wrapping_sub(prev) > PREEMPTED_NS {
                // Lost the CPU mid-spin: the governor backs off.
                ending.preempted = true;
                break n;
            }
            prev = now;
            if n != 0 || now.wrapping_sub(start) >= budget {
                break n;
            }
            std::hint::spin_loop();
        };
        ending.now_ns = fastwake::cpu::monotonic_ns();
        ending.spun_ns = ending.now_ns.wrapping_sub(start);
        n
    }

    fn found(self, n: c_int) -> Self::Out {
        match self.taken {
            Some(r) => r,
            // The sleep was interrupted (errno EINTR, as the plain call).
            None if n < 0 => Err(wait::errno()),
            None => self.block(None),
        }
    }

    fn timed_out(self) -> Self::Out {
        // ibv_get_cq_event has no timeout: not reached, but a wait that
        // got here must still end with an event.
        self.block(None)
    }

    fn block(self, _left: Option<u64>) -> Self::Out {
        stats::add(|s| &s.blocked, 1);
        loop {
            if let Some(ev) = synthetic_event(self.channel) {
                return Ok(ev);
            }
            // SAFETY: the caller's live channel; the real blocking read.
            match unsafe { real_event(self.real_get, self.channel) } {
                Ok(Some(ev)) => return Ok(ev),
                Ok(None) => continue,
                Err(_) => return Err(wait::errno()),
            }
        }
    }

    fn failed(r: &Self::Out) -> bool {
        r.is_err()
    }
}

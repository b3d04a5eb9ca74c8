//! The shim's blocking `ibv_get_cq_event`: how it waits (a spin over the
//! program's armed CQs, or under `adaptive` a pre-wake, then the real
//! read), built on the event accounting of [`super::event`], whose rules
//! it keeps, and on the pre-wake's call ([`super::prewake`]).

use super::event::{
    FD_EVERY, deliver, fd_readable, nonblocking, real_event, report, synthetic_event,
};
use super::prewake::CqEvent;
use super::real::GetCqEventFn;
use super::stats;
use crate::config::mode;
use crate::wait::with_governor;
use fastwake::WaitMode;
use fastwake::preload_stats::{Call, Pass};
use fastwake::wait::{Decision, Ending};
use fastwake_verbs_sys::{ibv_comp_channel, ibv_cq};
use std::ffi::{c_int, c_void};

/// The shim's `ibv_get_cq_event`.
///
/// # Safety
/// libibverbs' contract for `ibv_get_cq_event`.
pub unsafe fn get_cq_event(
    real_get: GetCqEventFn,
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    let m = mode();
    let Some(m) = m.filter(|_| !channel.is_null() && !cq_out.is_null() && !ctx_out.is_null())
    else {
        let why = if m.is_none() {
            Pass::ModeOff
        } else {
            Pass::Other
        };
        crate::stats::passed(Call::IbvGetCqEvent, why);
        // SAFETY: forwarding unchanged.
        return unsafe { real_get(channel, cq_out, ctx_out) };
    };
    stats::add(|s| &s.waits, 1);
    crate::stats::served(Call::IbvGetCqEvent);
    // SAFETY: a live channel (caller's contract).
    let fd = unsafe { (*channel).fd };
    // A non-blocking channel (the program waits in epoll) is looked at
    // once and read: no spin, and nothing for the governor to learn.
    let nb = nonblocking(fd);
    let t0 = fastwake::cpu::monotonic_ns();
    let cpu = fastwake::cpu::current();
    // Interrupt mode is the plain kernel wait (only the vector choice
    // differs): no look at the CQs, no synthetic events.
    let looks = m != WaitMode::Interrupt;
    let budget = if nb {
        0
    } else {
        let planned = with_governor(|g, _| {
            // No peer CPU: the one the thread sampled is a socket's.
            let planned = crate::wait::plan_prewake(g, None, None);
            match planned.prewake_at() {
                // Sleep, then poll (adaptive): see `super::prewake`.
                Some(at) if looks => {
                    let call = CqEvent::new(real_get, channel, fd);
                    Err(crate::wait::prewake(g, planned, None, at, call))
                }
                _ => Ok(match planned.decision {
                    Decision::Spin(b) => b,
                    Decision::Dispatch | Decision::Block | Decision::Prewake { .. } => 0,
                }),
            }
        });
        match planned {
            Some(Ok(b)) => b,
            // SAFETY: out-pointers valid (checked non-null, caller's
            // contract).
            Some(Err(r)) => return unsafe { report(r, cq_out, ctx_out) },
            // The thread's state is busy (a signal handler's wait) or gone.
            None => 0,
        }
    };
    let mut blocked = false;
    let done = |blocked: bool, failed: bool| {
        if nb {
            return;
        }
        let now = fastwake::cpu::monotonic_ns();
        let waited = now.wrapping_sub(t0);
        let mut e = Ending::at(
            now,
            if blocked { budget.min(waited) } else { waited },
            blocked,
        );
        e.failed = failed;
        with_governor(|g, _| g.end(e));
    };
    let mut spinning = budget > 0;
    let mut spins: u32 = 0;
    let mut asleep = None;
    loop {
        if looks && let Some(ev) = synthetic_event(channel) {
            drop(asleep);
            done(blocked, false);
            // SAFETY: out-pointers valid (checked non-null, caller's
            // contract).
            return unsafe { deliver(ev, cq_out, ctx_out) };
        }
        // While spinning, read the fd only when it has something (so the
        // read cannot block); after the spin, the real blocking read.
        let go_real = !spinning || (spins.is_multiple_of(FD_EVERY) && fd_readable(fd));
        if go_real {
            if !spinning && !blocked {
                stats::add(|s| &s.blocked, 1);
                blocked = true;
                if !nb {
                    asleep = with_governor(|g, _| g.blocking(cpu, fastwake::cpu::monotonic_ns()));
                }
            }
            // SAFETY: the caller's channel.
            match unsafe { real_event(real_get, channel) } {
                // errno as the real call set it (EAGAIN, EINTR, …)
                Err(rc) => {
                    drop(asleep);
                    done(blocked, true);
                    return rc;
                }
                Ok(Some(ev)) => {
                    drop(asleep);
                    done(blocked, false);
                    // SAFETY: out-pointers valid.
                    return unsafe { deliver(ev, cq_out, ctx_out) };
                }
                Ok(None) => continue,
            }
        }
        spins = spins.wrapping_add(1);
        if budget != u64::MAX
            && spins.is_multiple_of(32)
            && fastwake::cpu::monotonic_ns().wrapping_sub(t0) >= budget
        {
            spinning = false;
        }
        std::hint::spin_loop();
    }
}

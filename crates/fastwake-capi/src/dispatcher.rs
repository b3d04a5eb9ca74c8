//! Dispatchers: a per-CPU thread that hands completions to sleeping waiters.

use crate::boundary::{check_out, destroy, guard, out, stats_of};
use crate::waiter::fw_prewake_stats;
use std::ffi::c_int;
use std::time::Duration;

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fw_dispatch_stats {
    pub handoffs: u64,
    pub rescued: u64,
    pub relayed: u64,
    pub idle_sleeps: u64,
    pub paused: u64,
    pub registered: u64,
    pub idle_after_ns: i64,
    pub state: u32,
    pub reserved: u32,
}

/// How a dispatcher's hand-offs through ready notices went (see the
/// header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fw_notice_stats {
    pub notices: u64,
    pub scan_found: u64,
    pub late_notices: u64,
    pub reserved: u64,
}

impl From<&fastwake::dispatch::DispatchStats> for fw_notice_stats {
    fn from(s: &fastwake::dispatch::DispatchStats) -> Self {
        fw_notice_stats {
            notices: s.notices,
            scan_found: s.scan_found,
            late_notices: s.late_notices,
            reserved: 0,
        }
    }
}

pub struct fw_dispatcher(pub(crate) fastwake::dispatch::Dispatcher);

/// # Safety
/// `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_start(
    cpu: u32,
    idle_after_ns: i64,
    learn_idle: c_int,
    d: *mut *mut fw_dispatcher,
) -> c_int {
    guard(|| {
        check_out(d)?;
        let mut cfg = fastwake::dispatch::Config::new(cpu);
        cfg.idle_after = u64::try_from(idle_after_ns).ok().map(Duration::from_nanos);
        if learn_idle != 0 {
            cfg.learn_idle = Some(fastwake::adaptive::Config::default());
        }
        out(
            d,
            fw_dispatcher(fastwake::dispatch::Dispatcher::start(cfg)?),
        )
    })
}

/// # Safety
/// `d` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_stats(
    d: *const fw_dispatcher,
    out: *mut fw_dispatch_stats,
) -> c_int {
    guard(|| {
        stats_of(d, out, |d| {
            let s = d.0.stats();
            fw_dispatch_stats {
                handoffs: s.handoffs,
                rescued: s.rescued,
                relayed: s.relayed,
                idle_sleeps: s.idle_sleeps,
                paused: s.paused,
                registered: s.registered,
                idle_after_ns: s.idle_after.map_or(-1, |t| t.as_nanos() as i64),
                state: match s.state {
                    fastwake::dispatch::State::Polling => 0,
                    fastwake::dispatch::State::Sleeping => 1,
                    fastwake::dispatch::State::Dead => 2,
                },
                reserved: 0,
            }
        })
    })
}

/// # Safety
/// `d` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_prewake_stats(
    d: *const fw_dispatcher,
    out: *mut fw_prewake_stats,
) -> c_int {
    guard(|| stats_of(d, out, |d| (&d.0.stats()).into()))
}

/// # Safety
/// `d` NULL or from this library; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_notice_stats(
    d: *const fw_dispatcher,
    out: *mut fw_notice_stats,
) -> c_int {
    guard(|| stats_of(d, out, |d| (&d.0.stats()).into()))
}

/// # Safety
/// `d` is NULL or from this library, stopped once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_stop(d: *mut fw_dispatcher) {
    destroy(d)
}

//! Waiters: a wait mode, waits on a channel, and the waiter's counters.

use crate::boundary::{check_out, destroy, guard, obj, out, stats_of, wait_for};
use crate::channel::fw_receiver;
use fastwake::{Fail, WaitMode, Waiter};
use std::ffi::{CStr, c_char, c_int, c_void};

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fw_wait_stats {
    pub completions: u64,
    pub without_sleep: u64,
    pub sleeps: u64,
    pub rechecks_hit: u64,
    pub spurious: u64,
    pub spin_skipped_same_cpu: u64,
}

/// How a waiter's dispatch-mode waits ended (see the header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fw_dispatch_wait_stats {
    pub handoffs: u64,
    pub relays: u64,
    pub fallbacks: u64,
    pub paused: u64,
    pub resumed: u64,
    pub reserved: [u64; 3],
}

/// Pre-wake ("sleep, then poll") counters of an adaptive waiter or of a
/// dispatcher with a learned idle policy.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fw_prewake_stats {
    pub prewakes: u64,
    pub early: u64,
    pub caught: u64,
    pub late: u64,
    pub pauses: u64,
    pub margin_ns: u64,
    pub reserved: [u64; 2],
}

impl From<&fastwake::adaptive::AdaptiveStats> for fw_prewake_stats {
    fn from(s: &fastwake::adaptive::AdaptiveStats) -> Self {
        fw_prewake_stats {
            prewakes: s.prewakes,
            early: s.prewake_early,
            caught: s.prewake_caught,
            late: s.prewake_late,
            pauses: s.prewake_pauses,
            margin_ns: s.margin_ns,
            reserved: [0; 2],
        }
    }
}

impl From<&fastwake::dispatch::DispatchStats> for fw_prewake_stats {
    fn from(s: &fastwake::dispatch::DispatchStats) -> Self {
        fw_prewake_stats {
            prewakes: s.prewakes,
            early: s.prewake_early,
            caught: s.prewake_caught,
            late: s.prewake_late,
            pauses: s.prewake_pauses,
            margin_ns: s.margin_ns,
            reserved: [0; 2],
        }
    }
}

pub struct fw_waiter(pub(crate) Waiter);

/// # Safety
/// `w` is NULL or from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_set_interruptible(w: *mut fw_waiter, on: c_int) -> c_int {
    guard(|| {
        obj(w)?.0.set_interruptible(on != 0);
        Ok(())
    })
}

/// # Safety
/// `mode` is a NUL-terminated string; `w` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_create(mode: *const c_char, w: *mut *mut fw_waiter) -> c_int {
    guard(|| {
        check_out(w)?;
        if mode.is_null() {
            return Err(Fail::invalid("mode is NULL"));
        }
        // SAFETY: non-null, NUL-terminated per the header.
        let s = unsafe { CStr::from_ptr(mode) }
            .to_str()
            .map_err(|_| Fail::invalid("mode is not UTF-8"))?;
        let m: WaitMode = s.parse()?;
        out(w, fw_waiter(Waiter::new(m)))
    })
}

/// # Safety
/// `w` and `rx` from this library; `tag`/`len` NULL or writable; `buf` NULL
/// or `buf_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_wait(
    w: *mut fw_waiter,
    rx: *mut fw_receiver,
    timeout_ns: i64,
    tag: *mut u64,
    buf: *mut c_void,
    buf_len: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        let w = obj(w)?;
        let r = obj(rx)?;
        let m = wait_for(&mut w.0, &mut r.0, timeout_ns)?;
        let p = r.0.payload();
        // SAFETY: each output pointer is NULL or writable per the header;
        // the copy is bounded by buf_len.
        unsafe {
            if !tag.is_null() {
                *tag = m.tag;
            }
            if !len.is_null() {
                *len = p.len();
            }
            if !buf.is_null() {
                std::ptr::copy_nonoverlapping(p.as_ptr(), buf.cast(), p.len().min(buf_len));
            }
        }
        Ok(())
    })
}

/// # Safety
/// `w` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_stats(w: *const fw_waiter, out: *mut fw_wait_stats) -> c_int {
    guard(|| {
        stats_of(w, out, |w| {
            let s = w.0.stats();
            fw_wait_stats {
                completions: s.completions,
                without_sleep: s.without_sleep,
                sleeps: s.sleeps,
                rechecks_hit: s.rechecks_hit,
                spurious: s.spurious,
                spin_skipped_same_cpu: s.spin_skipped_same_cpu,
            }
        })
    })
}

/// # Safety
/// `w` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_prewake_stats(
    w: *const fw_waiter,
    out: *mut fw_prewake_stats,
) -> c_int {
    guard(|| {
        stats_of(w, out, |w| {
            w.0.adaptive_stats()
                .map_or_else(fw_prewake_stats::default, |s| (&s).into())
        })
    })
}

/// # Safety
/// `w` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_dispatch_stats(
    w: *const fw_waiter,
    out: *mut fw_dispatch_wait_stats,
) -> c_int {
    guard(|| {
        stats_of(w, out, |w| {
            let s = w.0.stats();
            fw_dispatch_wait_stats {
                handoffs: s.handoffs,
                relays: s.relays,
                fallbacks: s.dispatch_fallbacks,
                paused: s.dispatch_paused,
                resumed: s.dispatch_resumed,
                reserved: [0; 3],
            }
        })
    })
}

/// # Safety
/// `w` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_destroy(w: *mut fw_waiter) {
    destroy(w)
}

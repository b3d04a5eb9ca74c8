//! The calling thread's scheduler slice: a waiter that wakes ahead of a
//! busy neighbour.
//!
//! A thread that sleeps in interrupt mode is woken by its completion, but
//! it runs only when the scheduler lets it. Beside a busy neighbour on its
//! CPU that can be the rest of the neighbour's slice later (milliseconds).
//! Since Linux 6.12 the EEVDF
//! scheduler lets any thread ask for its own slice, without privilege
//! (`sched_attr.sched_runtime` of a `SCHED_OTHER` thread, 0.1-100 ms), and
//! a waking thread whose slice is shorter than the running one's preempts
//! it (the kernel's `PREEMPT_SHORT`). It keeps its fair share: a short
//! slice changes how often a thread may run, not how much.
//!
//! [`set_slice`] changes how the thread is scheduled everywhere, not only
//! while it waits, so fastwake never calls it on its own: a program (or
//! `bench load --slice`) asks for it for the threads that wait. What
//! fastwake does by itself is narrower ([`ForSleep`]): an adaptive waiter
//! on a CPU others keep busy takes a short slice for the time it sleeps in
//! a wait, where a trial finds that it pays
//! ([`crate::adaptive::trial`]), and gives the thread's own back
//! before the wait returns.

use crate::{Fail, Result};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

/// The shortest slice the kernel takes.
pub const MIN: Duration = Duration::from_micros(100);
/// The longest slice the kernel takes.
pub const MAX: Duration = Duration::from_millis(100);

fn get() -> Result<libc::sched_attr> {
    // SAFETY: sched_attr is plain integers, valid when zeroed.
    let mut a: libc::sched_attr = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::sched_attr>() as libc::c_uint;
    // SAFETY: sched_getattr(0, attr, size, 0) writes at most `size` bytes
    // into `a`, which lives across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut a as *mut libc::sched_attr,
            size,
            0,
        )
    };
    if r != 0 {
        return Err(Fail::os(
            "sched_getattr",
            rustix::io::Errno::from_io_error(&std::io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::INVAL),
        ));
    }
    Ok(a)
}

fn set(a: &libc::sched_attr) -> Result<()> {
    // SAFETY: sched_setattr(0, attr, 0) reads `a.size` bytes of `a`, which
    // lives across the call; it changes only the calling thread.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, a as *const libc::sched_attr, 0) };
    if r != 0 {
        return Err(Fail::os(
            "sched_setattr",
            rustix::io::Errno::from_io_error(&std::io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::INVAL),
        ));
    }
    Ok(())
}

/// Write `a` back (as `sched_getattr` read it) with the slice
/// `runtime_ns` (0: none of its own). The nice value and the
/// reset-on-fork flag stay as read; the flags only `sched_getattr`
/// reports are dropped.
fn set_runtime(a: &mut libc::sched_attr, runtime_ns: u64) -> Result<()> {
    a.size = std::mem::size_of::<libc::sched_attr>() as u32;
    a.sched_runtime = runtime_ns;
    a.sched_flags &= libc::SCHED_FLAG_RESET_ON_FORK as u64;
    set(a)
}

/// Whether the thread's policy takes a slice of its own.
fn fair(policy: u32) -> bool {
    policy == libc::SCHED_OTHER as u32 || policy == libc::SCHED_BATCH as u32
}

/// The calling thread's slice as the kernel reports it: its own, or the
/// default one (`base_slice_ns`) while it has none. `None` where the
/// kernel reports none (before 6.12).
pub fn get_slice() -> Result<Option<Duration>> {
    let a = get()?;
    Ok(
        (fair(a.sched_policy) && a.sched_runtime > 0)
            .then(|| Duration::from_nanos(a.sched_runtime)),
    )
}

/// `s` is a slice the kernel takes ([`MIN`]..=[`MAX`]); `EINVAL` in one
/// line if not.
fn in_range(s: Duration) -> Result<Duration> {
    if (MIN..=MAX).contains(&s) {
        Ok(s)
    } else {
        Err(Fail::invalid(format!(
            "a slice of {s:?} is outside the kernel's 100us to 100ms"
        )))
    }
}

/// A slice in the one grammar ([`crate::grammar::duration`]: `100us`,
/// `0.5ms`), within [`MIN`]..=[`MAX`]: what `--slice` and
/// `FASTWAKE_SLICE` take.
pub fn parse(s: &str) -> Result<Duration> {
    in_range(crate::grammar::duration(s)?)
}

/// Ask the scheduler for a slice of `slice` for the calling thread (see
/// the module docs); `None` goes back to the default. Its policy and nice
/// value stay as they are.
///
/// Errors, each one line: a slice outside [`MIN`]..=[`MAX`] (`EINVAL`),
/// a thread not under the fair scheduler (`EINVAL`), and a kernel that
/// does not keep the slice (`EOPNOTSUPP`: custom slices need Linux 6.12).
pub fn set_slice(slice: Option<Duration>) -> Result<()> {
    if let Some(s) = slice {
        in_range(s)?;
    }
    let mut a = get()?;
    if !fair(a.sched_policy) {
        return Err(Fail::invalid(format!(
            "a slice applies to SCHED_OTHER and SCHED_BATCH threads; this one has policy {}",
            a.sched_policy
        )));
    }
    let want = slice.map_or(0, |s| s.as_nanos() as u64);
    set_runtime(&mut a, want)?;
    if want > 0 && get()?.sched_runtime != want {
        return Err(Fail::new(
            libc::EOPNOTSUPP,
            "this kernel does not keep a thread's own slice (custom slices need Linux 6.12 or later)",
        ));
    }
    Ok(())
}

/// Whether this kernel keeps a thread's own slice: not known yet, yes, no.
static KEPT: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;
/// The slice `sched_getattr` reports for a thread without one of its own
/// (the kernel's `base_slice_ns`), learned on the first give-back (0: not
/// yet). Only the kernel's knob changes it.
static BASE: AtomicU64 = AtomicU64::new(0);

/// A short slice for the time a waiter sleeps in a wait: woken by its
/// completion, the thread preempts a neighbour that holds its CPU (the
/// kernel's `PREEMPT_SHORT`) instead of waiting out the neighbour's turn.
/// Dropped when the wait returns, it gives the thread's own slice back
/// (the default, or the one the program asked for), so nothing outside
/// the wait changes. Taken by [`for_sleep`].
#[must_use = "the short slice lasts until the guard is dropped"]
#[derive(Debug)]
pub struct ForSleep {
    /// The slice the thread reported before (its own, or the default).
    before_ns: u64,
}

/// Give the calling thread a slice of `short` until the returned guard is
/// dropped (see [`ForSleep`]). `None`, with nothing changed, where there
/// is nothing to do or it cannot be done: a slice already that short, a
/// thread not under the fair scheduler, a kernel that does not keep a
/// thread's slice (before 6.12), or a refused call (both found out once
/// per process: no call is made again). Costs one `sched_getattr` and one
/// `sched_setattr` now and as many at the drop.
pub fn for_sleep(short: Duration) -> Option<ForSleep> {
    if KEPT.load(Ordering::Relaxed) == NO {
        return None;
    }
    let mut a = get().ok()?;
    let want = in_range(short).ok()?.as_nanos() as u64;
    if !fair(a.sched_policy) || (a.sched_runtime > 0 && a.sched_runtime <= want) {
        return None;
    }
    let before_ns = a.sched_runtime;
    if set_runtime(&mut a, want).is_err() {
        // Refused (a seccomp filter, a security module): it will be again,
        // so no sleep tries it again.
        KEPT.store(NO, Ordering::Relaxed);
        return None;
    }
    let guard = ForSleep { before_ns };
    if KEPT.load(Ordering::Relaxed) == UNKNOWN {
        let kept = get().is_ok_and(|now| now.sched_runtime == want);
        KEPT.store(if kept { YES } else { NO }, Ordering::Relaxed);
        if !kept {
            // Nothing to give back: the kernel ignored the slice.
            std::mem::forget(guard);
            return None;
        }
    }
    Some(guard)
}

impl Drop for ForSleep {
    fn drop(&mut self) {
        // Read again: another thread may have changed this one's nice value
        // or policy meanwhile; only the slice is given back.
        let Ok(mut a) = get() else { return };
        if !fair(a.sched_policy) {
            return;
        }
        // The default slice is given back as "none of its own" (0), which
        // follows the kernel's knob, not as a number that would pin it.
        let _ = set_runtime(&mut a, 0);
        if self.before_ns == BASE.load(Ordering::Relaxed) {
            return;
        }
        // Was the slice before the default? It is if the thread now
        // reports the same.
        match get() {
            Ok(now) if now.sched_runtime == self.before_ns => {
                BASE.store(self.before_ns, Ordering::Relaxed);
            }
            Ok(_) => {
                // The program's own slice.
                let _ = set_runtime(&mut a, self.before_ns);
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slice set on a thread reads back, the default comes back, the
    /// nice value stays; out-of-range slices are refused in one line.
    #[test]
    fn a_thread_gets_its_slice_and_gives_it_back() {
        std::thread::spawn(|| {
            // SAFETY: getpriority/setpriority on the calling thread (who 0).
            let nice = |set: Option<i32>| unsafe {
                if let Some(n) = set {
                    libc::setpriority(libc::PRIO_PROCESS, 0, n);
                }
                libc::getpriority(libc::PRIO_PROCESS, 0)
            };
            nice(Some(3));
            let default = get_slice().unwrap();
            match set_slice(Some(Duration::from_micros(300))) {
                Ok(()) => {
                    assert_eq!(get_slice().unwrap(), Some(Duration::from_micros(300)));
                    assert_eq!(nice(None), 3, "the nice value changed");
                    set_slice(None).unwrap();
                    assert_eq!(get_slice().unwrap(), default, "the default slice is back");
                }
                Err(e) if e.errno() == libc::EOPNOTSUPP => {
                    eprintln!("SKIPPED slice read-back: {e}");
                }
                Err(e) => panic!("set_slice: {e}"),
            }
            assert_eq!(parse("0.3ms").unwrap(), Duration::from_micros(300));
            // The slice for a sleep: short while held, the thread's own
            // after, whether that is the default or one it asked for.
            let default = get_slice().unwrap();
            let short = Duration::from_micros(100);
            if let Some(g) = for_sleep(short) {
                assert_eq!(get_slice().unwrap(), Some(short));
                assert_eq!(nice(None), 3, "the nice value changed");
                drop(g);
                assert_eq!(get_slice().unwrap(), default, "the default is back");
                // Given back as none of its own: 0 in the kernel's terms,
                // which reads back as the default (checked above); a
                // program's own slice comes back as itself.
                set_slice(Some(Duration::from_micros(700))).unwrap();
                let g = for_sleep(short).expect("kept once, kept again");
                assert_eq!(get_slice().unwrap(), Some(short));
                drop(g);
                assert_eq!(get_slice().unwrap(), Some(Duration::from_micros(700)));
                // A slice already that short is left alone.
                set_slice(Some(short)).unwrap();
                assert!(for_sleep(Duration::from_micros(200)).is_none());
                set_slice(None).unwrap();
            } else {
                eprintln!("SKIPPED slice for a sleep: this kernel does not keep a thread's slice");
            }
            for bad in ["99us", "101ms", "soon"] {
                let e = parse(bad).unwrap_err();
                assert_eq!(e.errno(), libc::EINVAL);
                assert!(!e.to_string().contains('\n'));
            }
            for bad in [Duration::from_micros(99), Duration::from_millis(101)] {
                let e = set_slice(Some(bad)).unwrap_err();
                assert_eq!(e.errno(), libc::EINVAL);
                assert!(!e.to_string().contains('\n'));
            }
        })
        .join()
        .unwrap();
    }
}

//! fork(2) without exec: what the library's process-wide state must do
//! about it.
//!
//! A child has one thread, the one that forked. The library's own threads
//! (dispatchers, their watchdogs, the pressure sampler) are not in it, and
//! a process-wide lock that one of them held at the fork would stay held
//! there forever: the child's first wait that takes it would hang. Pre-fork
//! servers (a master that forks workers, each waiting in `epoll_wait`) are
//! common, so the library keeps two promises across a fork:
//!
//! - a **generation** that a child bumps: a dispatcher made before the fork
//!   counts as dead in the child ([`current`]), so its waiters there fall
//!   back to interrupt mode or find a dispatcher the child starts;
//! - each process-wide lock is **held across the fork** (taken in
//!   `pthread_atfork`'s prepare handler, released in the parent and child
//!   handlers: [`hold_across_fork!`]), so the child gets it free and its
//!   data consistent, and may then reset what named the parent's threads.
//!
//! A fork from a signal handler that interrupted the library while it held
//! one of these locks would wait for itself in the prepare handler; the
//! library takes them only briefly, outside any wait, and never calls
//! `fork` itself.

use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

static GENERATION: AtomicU32 = AtomicU32::new(0);
static WATCH: Once = Once::new();

extern "C" fn bump() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The generation of this process, with the handler that bumps it in a
/// forked child installed: what a long-lived object made now records.
pub(crate) fn generation() -> u32 {
    WATCH.call_once(|| {
        // SAFETY: registers a plain function that touches one atomic; it
        // runs in the child only, which has one thread.
        unsafe { libc::pthread_atfork(None, None, Some(bump)) };
    });
    GENERATION.load(Ordering::Relaxed)
}

/// The generation now, without installing anything (one load): an object
/// whose recorded [`generation`] differs was made before a fork, in a
/// process whose threads this one does not have.
#[inline]
pub(crate) fn current() -> u32 {
    GENERATION.load(Ordering::Relaxed)
}

/// `hold_across_fork!(install, LOCK, T, |data: &mut T| reset)` defines
/// `fn install()`, which (once per process) makes `fork` take the static
/// `LOCK: Mutex<T>` before it forks and release it in parent and child,
/// running `reset` on the data in the child first (to forget the parent's
/// threads). Call `install()` before the lock is first taken by a thread
/// that could hold it at a fork. Poisoning is ignored, as everywhere the
/// library uses these locks (their data stays consistent across a panic).
macro_rules! hold_across_fork {
    ($install:ident, $lock:path, $t:ty, $reset:expr) => {
        fn $install() {
            use std::cell::RefCell;
            use std::sync::MutexGuard;
            static ONCE: std::sync::Once = std::sync::Once::new();
            thread_local! {
                // Only the forking thread touches it, between its own
                // prepare and parent/child handlers.
                static HELD: RefCell<Option<MutexGuard<'static, $t>>> =
                    const { RefCell::new(None) };
            }
            extern "C" fn prepare() {
                // try_with: a fork from a thread-local destructor skips the
                // hold (no panic may cross this extern "C" frame).
                let _ = HELD.try_with(|h| {
                    *h.borrow_mut() = Some($lock.lock().unwrap_or_else(|p| p.into_inner()));
                });
            }
            extern "C" fn parent() {
                let _ = HELD.try_with(|h| h.borrow_mut().take());
            }
            extern "C" fn child() {
                let _ = HELD.try_with(|h| {
                    if let Some(g) = h.borrow_mut().as_mut() {
                        let reset: fn(&mut $t) = $reset;
                        reset(&mut **g);
                    }
                    h.borrow_mut().take()
                });
            }
            ONCE.call_once(|| {
                // SAFETY: registers plain functions that only take and
                // release a lock of this module's (and reset its data in
                // the one-threaded child).
                unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
            });
        }
    };
}
pub(crate) use hold_across_fork;

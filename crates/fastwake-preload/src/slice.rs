//! `FASTWAKE_SLICE`: each thread asks for the configured scheduler slice
//! (`fastwake::slice`) at its first call to a hooked wait function, served
//! or passed through, so a thread that waits in interrupt mode (where the
//! shim passes the call to the kernel) gets it too. Off unless set: it
//! changes how the thread is scheduled while it computes, not only while
//! it waits. Threads and processes a thread makes after it asked inherit
//! the slice (the kernel passes it on at clone).

use crate::config;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    // Const-initialised, no destructor: safe from any hook at any time.
    static ASKED: Cell<bool> = const { Cell::new(false) };
}

/// Ask for the slice once per thread, if one is configured. A kernel that
/// refuses it is said once per process, in one line; the thread keeps the
/// kernel's slice and the call goes on unchanged.
#[inline]
pub fn take() {
    let Some(s) = config::slice() else { return };
    if ASKED.try_with(|a| a.replace(true)).unwrap_or(true) {
        return;
    }
    static SAID: AtomicBool = AtomicBool::new(false);
    if let Err(e) = fastwake::slice::set_slice(Some(s))
        && !SAID.swap(true, Ordering::Relaxed)
    {
        crate::diag(&format!(
            "FASTWAKE_SLICE: {e}; threads keep the kernel's slice"
        ));
    }
}

//! Sleeping on one fd the way a blocking read of it would: until it is
//! readable or a time passes, with asynchronous signals held and a
//! transient signalfd of those the caller's mask lets through, so a signal
//! ends the sleep with -1/EINTR exactly where the plain call would have
//! been interrupted and otherwise the sleep goes on, as the kernel's
//! restart of the plain call would have. What a pre-wake's sleep needs for
//! the blocking socket calls (`sockets`) and `ibv_get_cq_event` (`verbs`),
//! whose plain calls are reads of one fd.

use crate::wait;
use std::ffi::c_int;

/// Would one of `signals` have interrupted the plain call (-1/EINTR)
/// rather than let the kernel restart it? signal(7): a handler without
/// SA_RESTART interrupts it, and with a receive timeout on the socket
/// every handler does; default and ignored dispositions never return
/// EINTR to the call.
pub(crate) fn interrupts(signals: u64, has_timeout: bool) -> bool {
    (1..=64)
        .filter(|s| signals & (1u64 << (s - 1)) != 0)
        .any(|sig| {
            // SAFETY: sigaction is plain data; all-zero is a valid value.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a null new action only reads the current one into a
            // live sigaction.
            let ok = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } == 0;
            let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            ok && handled && (has_timeout || old.sa_flags & libc::SA_RESTART == 0)
        })
}

/// Sleep until `fd` is readable or `ns` pass, with the spin's signal
/// semantics ([`wait::spin_holding_signals`]): asynchronous signals are
/// held, and a transient signalfd of those the caller's mask lets through
/// wakes the sleep when one is pending. `interrupts` is then asked before
/// the mask comes back (the handler runs as it does): -1/EINTR where the
/// plain call would have been interrupted, else the sleep goes on, as the
/// kernel's restart of the plain call would have. The signalfd exists only
/// while every asynchronous signal is held, so no handler of this thread
/// ever sees it.
///
/// Returns > 0 readable, 0 nothing within `ns`, -1/EINTR interrupted;
/// `None` when this sleep cannot be made (no signalfd: out of fds, or
/// forbidden) or a signal glibc keeps for itself (thread cancellation,
/// set*id) was handled in it: the caller goes on as a plain wait, as the
/// spin does when a look handles one.
pub(crate) fn sleep_holding_signals(fd: c_int, ns: u64, has_timeout: bool) -> Option<c_int> {
    let deadline = fastwake::cpu::monotonic_ns().saturating_add(ns);
    loop {
        let block: u64 = !wait::NEVER_BLOCK;
        let mut old: u64 = 0;
        wait::sigmask(libc::SIG_SETMASK, &block, &mut old);
        let through: u64 = !old & !wait::NEVER_BLOCK;
        // SAFETY: signalfd4 reads an 8-byte kernel sigset from a live u64;
        // a raw syscall (no hooked wrapper). A new fd, closed below.
        let sfd = unsafe {
            libc::syscall(
                libc::SYS_signalfd4,
                -1,
                &through as *const u64,
                8usize,
                libc::SFD_CLOEXEC,
            )
        } as c_int;
        if sfd < 0 {
            wait::sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            return None;
        }
        let mut p = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let left = deadline.saturating_sub(fastwake::cpu::monotonic_ns());
        // SAFETY: two live pollfds; a null mask keeps the held one.
        let r = unsafe { crate::sys::ppoll_ns(p.as_mut_ptr(), 2, left, std::ptr::null()) };
        let e = wait::errno();
        let ready = r > 0 && p[0].revents != 0;
        let signals = if ready { 0 } else { wait::deliverable(old) };
        let interrupted = signals != 0 && interrupts(signals, has_timeout);
        // SAFETY: our own signalfd, made above; a raw close (the shim
        // hooks `close`).
        unsafe { libc::syscall(libc::SYS_close, sfd) };
        wait::sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if ready {
            return Some(1);
        }
        if interrupted {
            wait::set_errno(libc::EINTR);
            return Some(-1);
        }
        if r == 0 {
            return Some(0);
        }
        if r < 0 {
            // EINTR with every asynchronous signal held: one glibc keeps
            // for itself was handled (cancellation acts in the real call);
            // anything else: the sleep failed.
            wait::set_errno(e);
            return None;
        }
        // A signal the plain call would have been restarted after was
        // handled as the mask came back (or another thread took it):
        // sleep on, for what is left.
    }
}

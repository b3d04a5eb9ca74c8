//! Raw syscalls the shim makes for itself: never through libc's wrappers,
//! which the shim hooks, so a look cannot recurse into a hook. One place,
//! so each is written once and exists on every architecture (`ppoll`, not
//! `poll`, which aarch64 does not have).

use std::ffi::{c_int, c_long};

/// `ppoll` with a timeout of `ns` (a pre-wake's timed sleep; 0 = a look).
///
/// # Safety
/// As [`ppoll`].
pub unsafe fn ppoll_ns(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    ns: u64,
    mask: *const u64,
) -> c_int {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as _,
        tv_nsec: (ns % 1_000_000_000) as _,
    };
    // SAFETY: the caller's contract; `ts` is a live timespec.
    unsafe {
        libc::syscall(
            libc::SYS_ppoll,
            fds,
            nfds as c_long,
            &ts as *const libc::timespec,
            mask,
            8 as c_long,
        ) as c_int
    }
}

/// `ppoll(fds, nfds, timeout, mask)`: `timeout_ms` < 0 waits for ever;
/// `mask` null keeps the thread's mask, else points to an 8-byte kernel
/// sigset. Returns like libc: n, or -1 with errno set.
///
/// # Safety
/// `fds` points to `nfds` pollfds the kernel may write; `mask` is null or
/// points to 8 readable bytes.
pub unsafe fn ppoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout_ms: c_int,
    mask: *const u64,
) -> c_int {
    let ts = libc::timespec {
        tv_sec: (timeout_ms.max(0) / 1000) as _,
        tv_nsec: ((timeout_ms.max(0) % 1000) as i64 * 1_000_000) as _,
    };
    let tsp: *const libc::timespec = if timeout_ms < 0 {
        std::ptr::null()
    } else {
        &ts
    };
    // SAFETY: the caller's contract; `tsp` is null or a live timespec.
    unsafe { libc::syscall(libc::SYS_ppoll, fds, nfds as c_long, tsp, mask, 8 as c_long) as c_int }
}

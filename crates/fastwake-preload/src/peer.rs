//! Where the peer runs: a spinning waiter on the peer's own CPU only delays
//! the peer, so the governor does not spin there; this module is how the
//! shim finds the socket to ask (the asking itself is the library's
//! [`fastwake::source::socket::incoming_cpu`]).
//!
//! For a socket the kernel remembers which CPU processed the last incoming
//! packet (`SO_INCOMING_CPU`). Over loopback and veth that is the CPU of the
//! *sending* thread, since its `send` runs the receive path in softirq on
//! its own CPU; behind a real NIC it is the CPU that took the interrupt, on
//! which spinning would equally delay delivery. The shim samples it now and
//! then on a socket that just became ready.
//!
//! epoll reports user data, not fds. Programs usually store the fd there
//! (`ev.data.fd = fd`, as redis and libevent do); the shim records at
//! `epoll_ctl` which fds were registered that way, so it can tell an fd
//! from a pointer. Anything it cannot tell stays "unknown", and unknown
//! never blocks spinning.

use std::sync::atomic::{AtomicU8, Ordering};

/// fds below this are tracked (64 KiB of flags).
const TRACKED: usize = 1 << 16;
static DATA_IS_FD: [AtomicU8; TRACKED] = [const { AtomicU8::new(0) }; TRACKED];

/// `epoll_ctl(ADD|MOD, fd, {data})` happened.
pub fn note_registered(fd: i32, data: u64) {
    if let Ok(i) = usize::try_from(fd)
        && i < TRACKED
    {
        // The data.fd convention fills the low 32 bits with the fd; the high
        // bits may hold anything (they are often uninitialised).
        let is_fd = data as u32 as i32 == fd;
        DATA_IS_FD[i].store(is_fd as u8, Ordering::Relaxed);
    }
}

/// The fd an epoll event's data names, if it follows the data.fd
/// convention as registered.
pub fn fd_of_data(data: u64) -> Option<i32> {
    let fd = data as u32 as i32;
    let i = usize::try_from(fd).ok()?;
    (i < TRACKED && DATA_IS_FD[i].load(Ordering::Relaxed) == 1).then_some(fd)
}

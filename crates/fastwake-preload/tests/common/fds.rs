//! File descriptors for the shim's child scenarios: pipes, an epoll set,
//! one epoll_wait or poll, one byte written.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: a two-int array for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2 returned two fresh fds we now own.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

pub fn epoll_with(fds: &[i32]) -> OwnedFd {
    // SAFETY: plain epoll_create1.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0);
    for &fd in fds {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: a live event for a live fd.
        let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        assert_eq!(r, 0);
    }
    // SAFETY: fresh fd we own.
    unsafe { OwnedFd::from_raw_fd(ep) }
}

pub fn ewait(ep: &OwnedFd, timeout: i32) -> (i32, i32, Vec<libc::epoll_event>) {
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 16];
    // SAFETY: a buffer of 16 events.
    let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), evs.as_mut_ptr(), 16, timeout) };
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    evs.truncate(n.max(0) as usize);
    (n, e, evs)
}

pub fn poll1(fd: i32, timeout: i32) -> (i32, i32, i16) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout) };
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    (n, e, p.revents)
}

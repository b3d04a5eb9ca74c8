//! What a busy-polling thread polled (`crate::pollers`): the key of one
//! polling call, and the set of sources the thread polled in its current
//! run of empty polls, which its sleep waits for. Fixed arrays, no heap:
//! the set lives in a const-initialised thread-local that every polling
//! hook touches. A leaf module: the hooks and the pollers both use it.

use fastwake_verbs_sys::ibv_cq;
use std::ffi::c_int;

/// Which poll armed a thread's set: a kind and a number.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Key {
    /// An fd call (`epoll_wait` on this epoll fd, `poll`/`select` whose
    /// first fd this is, a socket's `recv`).
    Fd(u8, c_int),
    /// An `ibv_poll_cq` of this CQ.
    Cq(usize),
}

/// The kind of a socket call's key (`recv`, `accept` and their forms on
/// one socket): its readiness is its one fd's.
pub const KIND_SOCKET: u8 = 0;

/// fds one set holds (a poll set, an epoll fd, sockets). A thread that
/// polls more in one run is not put to sleep ([`Set::overflow`]).
pub const MAX_FDS: usize = 16;
/// CQs one set holds (perftest polls two: send and receive).
pub const MAX_CQS: usize = 8;

const NO_FD: libc::pollfd = libc::pollfd {
    fd: -1,
    events: 0,
    revents: 0,
};

/// A thread's polled sources.
#[derive(Clone, Copy)]
pub struct Set {
    fds: [libc::pollfd; MAX_FDS],
    nfds: usize,
    cqs: [usize; MAX_CQS],
    ncqs: usize,
    /// More sources than fit were polled in this run.
    pub overflow: bool,
}

impl Set {
    pub const EMPTY: Set = Set {
        fds: [NO_FD; MAX_FDS],
        nfds: 0,
        cqs: [0; MAX_CQS],
        ncqs: 0,
        overflow: false,
    };

    /// Forget every source (a completion, or a sleep, ended the run).
    #[inline]
    pub fn clear(&mut self) {
        self.nfds = 0;
        self.ncqs = 0;
        self.overflow = false;
    }

    /// Add `fd` waited for `events` (merged with the events it already
    /// has here).
    pub fn add_fd(&mut self, fd: i32, events: i16) {
        if fd < 0 {
            // poll(2) ignores negative fds; so does the sleep.
            return;
        }
        if let Some(p) = self.fds[..self.nfds].iter_mut().find(|p| p.fd == fd) {
            p.events |= events;
            return;
        }
        if self.nfds == MAX_FDS {
            self.overflow = true;
            return;
        }
        self.fds[self.nfds] = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        self.nfds += 1;
    }

    /// Add a CQ.
    pub fn add_cq(&mut self, cq: *mut ibv_cq) {
        let k = cq as usize;
        if self.cqs[..self.ncqs].contains(&k) {
            return;
        }
        if self.ncqs == MAX_CQS {
            self.overflow = true;
            return;
        }
        self.cqs[self.ncqs] = k;
        self.ncqs += 1;
    }

    pub fn fds(&self) -> &[libc::pollfd] {
        &self.fds[..self.nfds]
    }

    pub fn cqs(&self) -> impl Iterator<Item = *mut ibv_cq> + '_ {
        self.cqs[..self.ncqs].iter().map(|&k| k as *mut ibv_cq)
    }

    pub fn is_empty(&self) -> bool {
        self.nfds == 0 && self.ncqs == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_duplicates_and_notes_overflow() {
        let mut s = Set::EMPTY;
        s.add_fd(3, libc::POLLIN);
        s.add_fd(3, libc::POLLOUT);
        s.add_fd(-1, libc::POLLIN);
        assert_eq!(s.fds().len(), 1);
        assert_eq!(s.fds()[0].events, libc::POLLIN | libc::POLLOUT);
        for fd in 10..10 + MAX_FDS as i32 {
            s.add_fd(fd, libc::POLLIN);
        }
        assert!(s.overflow);
        s.add_cq(0x1000 as *mut ibv_cq);
        s.add_cq(0x1000 as *mut ibv_cq);
        assert_eq!(s.cqs().count(), 1);
        s.clear();
        assert!(s.is_empty() && !s.overflow);
    }
}

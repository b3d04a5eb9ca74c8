//! Room on a lane's socket as a completion source, so a sender that found
//! the socket full waits in its lane's mode through the one engine.

use super::frame::epoll_on;
use crate::Result;
use crate::source::{Rechecked, Source};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// A lane's sending side as a completion source: a completion is the
/// socket having room (`POLLOUT`), so a sender that found it full waits in
/// its lane's mode through the one engine.
pub(super) struct Room {
    sock: Arc<OwnedFd>,
    ep: OwnedFd,
    /// Waits that slept or peeked: the syscalls a send spent waiting.
    pub(super) polls: u64,
}

impl Room {
    pub(super) fn new(sock: Arc<OwnedFd>) -> Result<Room> {
        let ep = epoll_on(&sock, rustix::event::epoll::EventFlags::OUT)?;
        Ok(Room { sock, ep, polls: 0 })
    }

    fn writable(&self) -> bool {
        let mut p = [rustix::event::PollFd::new(
            &*self.sock,
            rustix::event::PollFlags::OUT,
        )];
        match rustix::event::poll(
            &mut p,
            Some(&rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            }),
        ) {
            // Room, or an error or hang-up the next send reports.
            Ok(n) => n != 0,
            Err(_) => true,
        }
    }
}

impl Source for Room {
    type Completion = ();

    fn name(&self) -> &'static str {
        "lane room"
    }

    fn ready(&self) -> bool {
        self.writable()
    }

    fn try_take(&mut self) -> Result<Option<()>> {
        self.polls += 1;
        Ok(self.writable().then_some(()))
    }

    fn arm(&mut self) -> Result<()> {
        Ok(())
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> Result<()> {
        self.polls += 1;
        // The epoll instance is readable while the socket has room.
        crate::source::wait_readable(self.ep.as_fd(), timeout, false, "ppoll lane room").map(drop)
    }

    fn notify_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.ep.as_fd())
    }
}

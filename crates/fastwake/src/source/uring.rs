//! An io_uring instance as a completion source: its completion queue.
//!
//! The caller owns what goes in (it pushes SQEs through
//! [`UringSource::ring`] and submits); the source hands out CQEs in every
//! wait mode.
//!
//! - **peek** ([`Source::ready`]): a load of the CQ ring's tail in shared
//!   memory, no syscall: what poll mode and a dispatcher spin on.
//! - **interrupt**, two ways ([`UringWake`]):
//!   - [`UringWake::Enter`]: block in `io_uring_enter(GETEVENTS, min 1)`
//!     with a timeout. The kernel checks the CQ and sleeps under its own
//!     lock, so no completion can slip between our re-check and the sleep.
//!   - [`UringWake::EventFd`]: a registered eventfd the kernel signals on
//!     every CQE, for callers that wait on many fds with epoll
//!     ([`Source::notify_fd`]). It stays enabled: toggling
//!     `IORING_CQ_EVENTFD_DISABLED` on arm/disarm would save the kernel a
//!     signal per CQE while polling, but nothing guarantees a full barrier
//!     between the kernel's CQ tail store and its read of that flag, so an
//!     arm could race a completion and lose the wake-up. A count left over
//!     from completions taken by polling costs at most one spurious wake-up.
//!
//! Setup note: the ring is created *without* `COOP_TASKRUN`/`DEFER_TASKRUN`.
//! Socket completions are finished by task work in the submitting thread;
//! with those flags a thread spinning in user space on the CQ tail would
//! never see them (nothing would make it enter the kernel to run the work).

use super::{Rechecked, Source};
use crate::{Fail, Result};
use io_uring::{IoUring, cqueue, types};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

/// How a sleeping waiter is woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UringWake {
    /// Blocking `io_uring_enter` waiting for one CQE.
    #[default]
    Enter,
    /// A registered eventfd (pollable, nestable in epoll).
    EventFd,
}

impl std::str::FromStr for UringWake {
    type Err = Fail;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "enter" => Ok(UringWake::Enter),
            "eventfd" => Ok(UringWake::EventFd),
            _ => Err(Fail::invalid(format!(
                "unknown io_uring wake-up '{s}': expected enter or eventfd"
            ))),
        }
    }
}

/// A completion queue as a source.
pub struct UringSource {
    ring: IoUring,
    wake: UringWake,
    efd: Option<OwnedFd>,
    peer: Option<OwnedFd>,
    peer_cpu: std::cell::Cell<u32>,
    taken: u64,
}

const NO_CPU: u32 = u32::MAX;
const PEER_SAMPLE: u64 = 16;

fn io_fail(op: &str, e: std::io::Error) -> Fail {
    Fail::new(e.raw_os_error().unwrap_or(libc::EIO), format!("{op}: {e}"))
}

impl UringSource {
    /// A ring with `entries` submission slots.
    pub fn new(entries: u32, wake: UringWake) -> Result<UringSource> {
        let ring = IoUring::new(entries).map_err(|e| {
            let f = io_fail("io_uring_setup", e);
            if f.errno() == libc::ENOSYS || f.errno() == libc::EPERM {
                Fail::unsupported(format!("io_uring is not available here ({})", f.cause()))
            } else {
                f
            }
        })?;
        let efd = match wake {
            UringWake::Enter => None,
            UringWake::EventFd => {
                let efd = rustix::event::eventfd(
                    0,
                    rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
                )
                .map_err(|e| Fail::os("eventfd", e))?;
                ring.submitter()
                    .register_eventfd(efd.as_raw_fd())
                    .map_err(|e| io_fail("io_uring register eventfd", e))?;
                Some(efd)
            }
        };
        Ok(UringSource {
            ring,
            wake,
            efd,
            peer: None,
            peer_cpu: std::cell::Cell::new(NO_CPU),
            taken: 0,
        })
    }

    /// The ring, to push submissions.
    pub fn ring(&mut self) -> &mut IoUring {
        &mut self.ring
    }

    /// Submit what was pushed, without waiting.
    pub fn submit(&mut self) -> Result<()> {
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(io_fail("io_uring_enter submit", e)),
            }
        }
    }

    /// Queue and submit one `recv` of up to `len` bytes from `sock` into
    /// `buf`; its CQE carries `user_data`.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid, and not be otherwise accessed, until
    /// the CQE for this request has been taken.
    pub unsafe fn recv(
        &mut self,
        sock: BorrowedFd<'_>,
        buf: *mut u8,
        len: u32,
        user_data: u64,
    ) -> Result<()> {
        let sqe = io_uring::opcode::Recv::new(types::Fd(sock.as_raw_fd()), buf, len)
            .build()
            .user_data(user_data);
        // SAFETY: the caller keeps the buffer valid until the CQE (this
        // function's contract); the SQE holds no other pointer.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| Fail::new(libc::EBUSY, "io_uring submission queue full"))?;
        self.submit()
    }

    /// Report the producer's CPU from this socket's `SO_INCOMING_CPU` (for
    /// rings that receive from one socket), so hybrid waits do not spin
    /// against a peer on their own CPU.
    pub fn watch_peer(&mut self, sock: BorrowedFd<'_>) -> Result<()> {
        self.peer = Some(
            sock.try_clone_to_owned()
                .map_err(|e| io_fail("dup socket", e))?,
        );
        Ok(())
    }

    /// The wake-up this source uses.
    pub fn wake(&self) -> UringWake {
        self.wake
    }
}

impl Source for UringSource {
    type Completion = cqueue::Entry;

    fn name(&self) -> &'static str {
        "uring"
    }

    fn ready(&self) -> bool {
        // SAFETY: `&self` excludes the `&mut self` methods, the only other
        // users of the completion queue, so this is the only view of it
        // while it lives; it just loads the tail.
        unsafe { !self.ring.completion_shared().is_empty() }
    }

    fn try_take(&mut self) -> Result<Option<cqueue::Entry>> {
        let e = self.ring.completion().next();
        if e.is_some() {
            self.taken += 1;
            if self.taken % PEER_SAMPLE == 1
                && let Some(p) = &self.peer
            {
                self.peer_cpu
                    .set(super::socket::incoming_cpu(p.as_fd()).unwrap_or(NO_CPU));
            }
        }
        Ok(e)
    }

    fn arm(&mut self) -> Result<()> {
        // Enter: the kernel re-checks under its lock. EventFd: always armed
        // (module docs).
        Ok(())
    }

    fn sleep(&mut self, _proof: Rechecked, timeout: Option<Duration>) -> Result<()> {
        match &self.efd {
            None => {
                let ts;
                let args = types::SubmitArgs::new();
                let args = match timeout {
                    Some(d) => {
                        ts = types::Timespec::from(d);
                        args.timespec(&ts)
                    }
                    None => args,
                };
                match self.ring.submitter().submit_with_args(1, &args) {
                    Ok(_) => Ok(()),
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                        ) =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(io_fail("io_uring_enter wait", e)),
                }
            }
            Some(efd) => super::wait_eventfd(efd, timeout, "poll io_uring eventfd"),
        }
    }

    fn notify_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(match &self.efd {
            Some(e) => e.as_fd(),
            // The ring fd itself polls readable while CQEs are waiting.
            // SAFETY: the ring owns this fd and outlives the borrow, which
            // is tied to `&self`.
            None => unsafe { BorrowedFd::borrow_raw(self.ring.as_raw_fd()) },
        })
    }

    fn hints(&self) -> super::Hints {
        let c = self.peer_cpu.get();
        super::Hints {
            peer_cpu: (c != NO_CPU).then_some(c),
            rung_at: None,
        }
    }
}

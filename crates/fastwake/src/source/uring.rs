//! An io_uring instance as a completion source: its completion queue.
//!
//! The caller owns what goes in (it pushes SQEs through
//! [`UringSource::ring`] and submits); the source hands out CQEs in every
//! wait mode.
//!
//! - **peek** ([`Source::ready`]): loads of the CQ ring's head and tail in
//!   shared memory, no syscall: what poll mode and a dispatcher spin on.
//! - **dispatch** ([`Source::peek`]): the same two loads from any
//!   thread, through the peek of [`super::ring`] (`tail != head`). The
//!   handle must stay valid after the source is dropped, and the
//!   `IoUring` unmaps its own view then, so the handle reads the counters
//!   through a second, read-only mapping of the CQ ring that it owns. When
//!   the source is dropped, that mapping is swapped in place for a zero
//!   page (`MAP_FIXED`, atomic for concurrent readers): a mapping of the
//!   ring holds its file, and without the swap a dispatcher's handle would
//!   keep the ring, and requests still in flight on it, alive after the
//!   source closed it. The retired handle reads `0 == 0`: not ready. No
//!   [`super::Peek::counters`] fast path: the kernel's 32-bit wrapping
//!   counters do not fit its shape (see `ring::RingPeek`).
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

use super::ring::RingPeek;
use super::{Peek, Rechecked, Source};
use crate::{Fail, Result};
use io_uring::{IoUring, cqueue, types};
use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
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
    /// The peek handle, built once: dispatch-mode waits compare it with
    /// the one they registered on every wait ([`Source::peek`]).
    peek: Arc<RingPeek<CqMap>>,
    /// `peek` as the dispatcher's handle (the same allocation).
    handle: Arc<dyn Peek>,
    wake: UringWake,
    efd: Option<OwnedFd>,
    peer: Option<OwnedFd>,
    peer_cpu: std::cell::Cell<u32>,
    taken: u64,
}

use super::NO_CPU;
const PEER_SAMPLE: u64 = 16;

fn io_fail(op: &str, e: std::io::Error) -> Fail {
    Fail::new(e.raw_os_error().unwrap_or(libc::EIO), format!("{op}: {e}"))
}

/// `mmap` offset of the CQ ring (`IORING_OFF_CQ_RING`, kernel ABI; the
/// `io_uring` crate keeps its constants private).
const IORING_OFF_CQ_RING: u64 = 0x800_0000;

/// The kernel's `struct io_uring_params` (`include/uapi/linux/io_uring.h`).
/// `io_uring::Parameters` is documented as a transparent wrapper over it
/// but does not expose the CQ ring offsets, which the peek handle needs.
#[repr(C)]
struct RawParams {
    /// `sq_entries`, `cq_entries`, `flags`, `sq_thread_cpu`,
    /// `sq_thread_idle`, `features`, `wq_fd`, `resv[3]`.
    _head: [u32; 10],
    /// `struct io_sqring_offsets`: eight `u32`s and a `u64`.
    _sq_off: [u32; 10],
    /// `struct io_cqring_offsets` starts with `head` and `tail`.
    cq_head: u32,
    cq_tail: u32,
    /// The rest of it: six `u32`s and a `u64`.
    _cq_rest: [u32; 8],
}

const _: () = assert!(
    std::mem::size_of::<RawParams>() == std::mem::size_of::<io_uring::Parameters>()
        && std::mem::size_of::<RawParams>() == 120
);

/// The CQ ring's head and tail, mapped once more for the peek handle (see
/// the module docs for why a mapping of its own).
struct CqMap {
    base: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is only read (through atomics, by `RingPeek`), and
// replaced or unmapped as a whole by its owner; its address may go to any
// thread.
unsafe impl Send for CqMap {}
// SAFETY: as above.
unsafe impl Sync for CqMap {}

impl CqMap {
    /// Map `ring`'s CQ head and tail; returns the mapping and their
    /// addresses in it.
    fn new(ring: &IoUring) -> Result<(CqMap, *const u32, *const u32)> {
        // SAFETY: `Parameters` is `#[repr(transparent)]` over the kernel's
        // `io_uring_params` (its documentation says so), whose layout
        // `RawParams` mirrors (size checked at compile time; it needs
        // 4-byte alignment, the original 8).
        let p = unsafe { &*(ring.params() as *const io_uring::Parameters).cast::<RawParams>() };
        let (head, tail) = (p.cq_head as usize, p.cq_tail as usize);
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = (head.max(tail) + 4).next_multiple_of(page);
        // SAFETY: the ring owns this fd and outlives the borrow.
        let fd = unsafe { BorrowedFd::borrow_raw(ring.as_raw_fd()) };
        // SAFETY: a new read-only shared mapping at an address the kernel
        // picks, of the region the kernel defines at this offset (the
        // rings); nothing of ours is overwritten.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                fd,
                IORING_OFF_CQ_RING,
            )
        }
        .map_err(|e| Fail::os("mmap io_uring CQ ring for the peek handle", e))?;
        let at = |off: usize| {
            base.cast::<u8>()
                .wrapping_add(off)
                .cast::<u32>()
                .cast_const()
        };
        Ok((CqMap { base, len }, at(head), at(tail)))
    }

    /// Swap the mapping, in place, for a zero page, so it no longer holds
    /// the ring's file (module docs). A reader sees the ring's page or the
    /// zero page, never a hole: `MAP_FIXED` replaces the old mapping under
    /// the address-space lock that page faults take.
    fn retire(&self) {
        // SAFETY: MAP_FIXED over exactly our own mapping, which only
        // `RingPeek` reads, through atomics that read 0 afterwards.
        let r = unsafe {
            rustix::mm::mmap_anonymous(
                self.base,
                self.len,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::FIXED,
            )
        };
        // On failure (out of memory) the ring's mapping stays: the ring
        // then lives until the last handle is dropped, which is still safe.
        let _ = r;
    }
}

impl Drop for CqMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping; the last user (the handle owning us) is
        // being dropped.
        let _ = unsafe { rustix::mm::munmap(self.base, self.len) };
    }
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
        let (map, head, tail) = CqMap::new(&ring)?;
        // SAFETY: `map` keeps the aligned kernel counters mapped and goes
        // into the handle with them.
        let peek = Arc::new(unsafe { RingPeek::new(head, tail, map) });
        Ok(UringSource {
            ring,
            handle: peek.clone(),
            peek,
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
        // The handle's two loads: the head `try_take` publishes (the
        // `io_uring` crate stores it when a take's queue view drops) and
        // the tail the kernel publishes.
        self.peek.ready()
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
        super::Hints::producer_on(self.peer_cpu.get())
    }

    fn peek(&self) -> Option<&Arc<dyn Peek>> {
        Some(&self.handle)
    }
}

impl Drop for UringSource {
    fn drop(&mut self) {
        // Before `ring` unmaps its view and closes its fd: with the
        // handle's mapping retired, that close releases the ring as it
        // did before the source had a handle.
        self.peek.keep().retire();
    }
}

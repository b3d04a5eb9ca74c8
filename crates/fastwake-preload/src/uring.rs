//! liburing's waiting entry points, for dynamically linked liburing
//! programs: `__io_uring_get_cqe` (what the inline `io_uring_wait_cqe`
//! and `io_uring_wait_cqe_nr` call once their own peek found nothing) and
//! `io_uring_wait_cqe_timeout`. liburing makes its own `io_uring_enter`
//! syscalls, so these exported functions are where a program can be met.
//!
//! A wait for one completion without a signal mask spins as the thread's
//! governor decides, peeking the CQ ring through liburing itself (the same
//! function with nothing to wait for, which reads the ring in user space
//! and makes no syscall), then makes the real call for what is left. The
//! spin never reads liburing's structures itself.
//!
//! Under `adaptive`, a wait whose recent waits are concentrated may be a
//! pre-wake (`wait::prewake`, the engine the fd hooks and socket calls
//! share): it sleeps in the kernel's own timed CQ wait
//! (`io_uring_enter(GETEVENTS | EXT_ARG)` for one completion, with a ns
//! timeout and no signal mask, as the plain call's) until shortly before
//! the completion is due, then peeks as above, then makes the real call
//! for what is left. A completion during the sleep ends the wait at once;
//! a signal ends it with -EINTR after its handler has run, as it ends the
//! real call (the same kernel wait). For this one wait the shim reads two
//! more words of `struct io_uring` (its `flags` and `features`, either side
//! of its fd, see [`ring_fd`]): rings set up with IOPOLL or SQPOLL, and
//! kernels without `IORING_FEAT_EXT_ARG` (before 5.11, where a timed wait
//! takes a timeout SQE in the program's ring), never pre-wake.
//!
//! Passed through untouched: mode `off` or `interrupt`; a wait for more
//! than one completion (`io_uring_wait_cqe_nr` with n > 1: a peek returns
//! at the first); a signal mask (it must hold during the wait); a zero
//! timeout. A signal during the spin ends the wait with -EINTR after its
//! handler has run, as `io_uring_enter` does (it is never restarted).
//!
//! `dispatch` mode: the dispatcher of the thread's CPU peeks the ring's fd
//! (an io_uring fd polls readable while its CQ holds a completion, or
//! has task work that will post one), and the woken thread takes the
//! completion with the same look. The fd is the one place the shim reads
//! `struct io_uring` ([`ring_fd`]): its offset has been the same since
//! liburing 2.0 (the struct keeps its size with pads), and the fd found
//! there is used only if the kernel says it is an io_uring; otherwise the
//! wait spins as in `hybrid`.

use crate::real::Sym;
use crate::wait;
use fastwake::preload_stats::{Call, Pass};
use fastwake::wait::{Decision, Ending};
use rustix::io_uring;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, Ordering};

static GET_CQE: Sym = Sym::new(c"__io_uring_get_cqe");
static WAIT_CQE_TIMEOUT: Sym = Sym::new(c"io_uring_wait_cqe_timeout");

/// liburing's `struct __kernel_timespec`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelTimespec {
    pub tv_sec: i64,
    pub tv_nsec: i64,
}

type GetCqeFn = unsafe extern "C" fn(
    *mut c_void,
    *mut *mut c_void,
    c_uint,
    c_uint,
    *mut libc::sigset_t,
) -> c_int;
type WaitCqeTimeoutFn =
    unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut KernelTimespec) -> c_int;

/// Resolve the real functions (from the library constructor).
pub fn resolve() {
    GET_CQE.get();
    WAIT_CQE_TIMEOUT.get();
}

/// Wait for one completion: spin with `peek` (0: a completion, -EAGAIN:
/// none, else an error to return) as the governor decides, or pre-wake
/// (adaptive, where [`prewake_fd`] gave the ring's fd: `ring_fd`), then
/// `real(left_ns)`. Returns liburing's code (0 or -errno).
fn serve(
    call: Call,
    timeout_ns: Option<u64>,
    ring_fd: Option<c_int>,
    mut peek: impl FnMut() -> c_int,
    real: impl FnOnce(Option<u64>) -> c_int,
) -> c_int {
    let mut real = Some(real);
    let done = crate::guarded(
        || {
            wait::with_governor(|gov, peer| {
                let real = real.take()?;
                crate::stats::served(call);
                wait::count(|e| &e.waits, 1);
                let planned = wait::plan_with(gov, peer, timeout_ns, ring_fd.is_some());
                if let (Some(at), Some(fd)) = (planned.prewake_at(), ring_fd) {
                    let call = Entered {
                        fd,
                        peek: &mut peek,
                        real,
                        err: 0,
                    };
                    return Some(wait::prewake(gov, planned, timeout_ns, at, call));
                }
                let wait::Planned {
                    t0,
                    cpu,
                    decision,
                    mut ending,
                } = planned;
                if let Decision::Spin(budget) = decision {
                    if let Some(r) = spin(&mut peek, t0, budget, &mut ending) {
                        ending.slept = false;
                        ending.failed = r != 0;
                        gov.end(ending);
                        return Some(r);
                    }
                    if let Some(t) = timeout_ns
                        && ending.spun_ns >= t
                    {
                        ending.slept = false;
                        gov.end(ending);
                        return Some(-libc::ETIME);
                    }
                }
                let left = timeout_ns.map(|t| t.saturating_sub(ending.spun_ns).max(1));
                Some(wait::block(gov, cpu, ending, || real(left), |&r| r != 0))
            })
            .flatten()
        },
        || None,
    );
    match (done, real.take()) {
        (Some(r), _) => r,
        (None, Some(real)) => {
            crate::stats::passed(call, Pass::Busy);
            real(None)
        }
        (None, None) => -libc::EINTR,
    }
}

/// Peek from `start` for `budget` ns with asynchronous signals held:
/// `Some(code)` when the wait ends (a completion, 0; an error; or -EINTR
/// for a signal whose handler has just run: io_uring_enter is never
/// restarted, so any signal would have interrupted the plain wait),
/// `None` when nothing came. Fills in `ending`'s time, spin and
/// preemption; counts the spin and its hit.
fn spin(
    peek: &mut impl FnMut() -> c_int,
    start: u64,
    budget: u64,
    ending: &mut Ending,
) -> Option<c_int> {
    let spin = wait::spin_holding_signals(
        start,
        budget,
        peek,
        |&r| r != -libc::EAGAIN,
        |_| true,
        *ending,
    );
    *ending = spin.ending;
    let r = spin.last;
    if r == 0 {
        wait::count(|e| &e.spin_hits, 1);
    }
    match (spin.signalled, r) {
        (false, r) if r == -libc::EAGAIN => None,
        (true, r) if r == -libc::EAGAIN => Some(-libc::EINTR),
        (_, r) => Some(r),
    }
}

/// The rings that can pre-wake: cleared when the kernel turns down a timed
/// CQ wait with EINVAL (no `IORING_ENTER_EXT_ARG`, which
/// `IORING_FEAT_EXT_ARG` said it had).
static TIMED_WAITS: AtomicBool = AtomicBool::new(true);

/// A liburing wait as a pre-wake's call ([`wait::Prewaker`]): its timed
/// sleep is the kernel's own timed CQ wait, `io_uring_enter(fd, 0, 1,
/// GETEVENTS | EXT_ARG)` with a ns timeout and no signal mask (the waits
/// served have none: the plain call's mask is the thread's), so a
/// completion ends it at once and a signal ends it with -EINTR, as either
/// ends the real call; its spin the peek; then the real call for what is
/// left.
struct Entered<'a, P, F> {
    /// The ring's fd ([`prewake_fd`]).
    fd: c_int,
    /// liburing's look at the CQ ring, taking a completion.
    peek: &'a mut P,
    real: F,
    /// The code a look or sleep that ended the wait returned (-errno).
    err: c_int,
}

impl<P, F> wait::Prewaker for Entered<'_, P, F>
where
    P: FnMut() -> c_int,
    F: FnOnce(Option<u64>) -> c_int,
{
    type Out = c_int;

    fn sleep(&mut self, ns: u64) -> Option<c_int> {
        let mut ts = KernelTimespec {
            tv_sec: (ns / 1_000_000_000) as i64,
            tv_nsec: (ns % 1_000_000_000) as i64,
        };
        let arg = io_uring::io_uring_getevents_arg {
            sigmask: io_uring::io_uring_ptr::null(),
            // What liburing passes (_NSIG / 8); read only with a mask.
            sigmask_sz: 8,
            min_wait_usec: 0,
            ts: io_uring::io_uring_ptr::new((&raw mut ts).cast()),
        };
        let flags = io_uring::IoringEnterFlags::GETEVENTS | io_uring::IoringEnterFlags::EXT_ARG;
        // SAFETY: `fd` is an io_uring the kernel named as such
        // ([`ring_fd`]), borrowed for this one call; `arg` and the
        // timespec it points to live across it and are only read. Nothing
        // is submitted: a wait for one completion, as the caller's.
        let r = unsafe {
            let fd = rustix::fd::BorrowedFd::borrow_raw(self.fd);
            io_uring::io_uring_enter_arg(fd, 0, 1, flags, Some(&arg))
        };
        match r {
            // A completion (or task work that posts one): take it.
            Ok(_) => match (self.peek)() {
                0 => Some(1),
                e if e == -libc::EAGAIN => Some(0),
                e => {
                    self.err = e;
                    Some(-1)
                }
            },
            Err(rustix::io::Errno::TIME) => Some(0),
            Err(rustix::io::Errno::INTR) => {
                // A signal, its handler run on the way out: the real call
                // returns -EINTR for it.
                self.err = -libc::EINTR;
                Some(-1)
            }
            Err(e) => {
                if e == rustix::io::Errno::INVAL {
                    TIMED_WAITS.store(false, Ordering::Relaxed);
                }
                // Anything else: no timed wait here; the wait goes on as a
                // plain one, whose real call meets whatever it was.
                None
            }
        }
    }

    fn spin(&mut self, start: u64, budget: u64, ending: &mut Ending) -> c_int {
        match spin(self.peek, start, budget, ending) {
            None => 0,
            Some(0) => 1,
            Some(e) => {
                self.err = e;
                -1
            }
        }
    }

    fn found(self, n: c_int) -> c_int {
        if n > 0 { 0 } else { self.err }
    }

    fn timed_out(self) -> c_int {
        -libc::ETIME
    }

    fn block(self, left: Option<u64>) -> c_int {
        (self.real)(left)
    }

    fn failed(r: &c_int) -> bool {
        *r != 0
    }
}

/// `offsetof(struct io_uring, ring_fd)` on LP64 since liburing 2.0: after
/// `struct io_uring_sq` (104 bytes), `struct io_uring_cq` (88) and
/// `unsigned flags`. scripts/uring-test compiles the check against the
/// installed header.
const RING_FD_OFFSET: usize = 196;

/// `offsetof(struct io_uring, flags)` and `(.., features)`: the words
/// either side of `ring_fd` since liburing 2.0 (checked as above).
const FLAGS_OFFSET: usize = 192;
const FEATURES_OFFSET: usize = 200;

/// The 32-bit word at `offset` in liburing's `ring`.
fn word(ring: *mut c_void, offset: usize) -> u32 {
    // SAFETY: `ring` is the caller's `struct io_uring`, which is larger
    // than the offset plus a word; read unaligned to assume nothing.
    unsafe { ring.cast::<u8>().add(offset).cast::<u32>().read_unaligned() }
}

thread_local! {
    // The last (ring, fd found in it) this thread checked, and whether the
    // kernel called that fd an io_uring, so the check runs once per ring.
    // Keyed by the fd too: a ring freed and made again at the same address
    // has a new fd, and is checked again.
    static LAST_RING: std::cell::Cell<(usize, c_int, bool)> =
        const { std::cell::Cell::new((0, -1, false)) };
}

/// The io_uring fd of liburing's `ring`, if the int at [`RING_FD_OFFSET`]
/// is an fd the kernel calls an io_uring.
fn ring_fd(ring: *mut c_void) -> Option<c_int> {
    let fd = word(ring, RING_FD_OFFSET) as c_int;
    if fd < 0 {
        return None;
    }
    let (last, last_fd, ok) = LAST_RING.try_with(|c| c.get()).ok()?;
    if (last, last_fd) == (ring as usize, fd) {
        return ok.then_some(fd);
    }
    let ok = std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[io_uring]");
    let _ = LAST_RING.try_with(|c| c.set((ring as usize, fd, ok)));
    ok.then_some(fd)
}

/// `ring`'s fd where the wait may pre-wake (adaptive): the kernel's own
/// timed CQ wait keeps the call's semantics there. Not on a ring set up
/// with `IORING_SETUP_IOPOLL` (its GETEVENTS polls the device and ignores
/// a timeout) or `IORING_SETUP_SQPOLL`, nor without
/// `IORING_FEAT_EXT_ARG` (before Linux 5.11: a timed wait would need a
/// timeout SQE of the shim's in the program's ring), nor where
/// [`ring_fd`] finds no io_uring.
fn prewake_fd(ring: *mut c_void) -> Option<c_int> {
    if !matches!(crate::config::mode(), Some(fastwake::WaitMode::Adaptive(_)))
        || !TIMED_WAITS.load(Ordering::Relaxed)
    {
        return None;
    }
    let setup = io_uring::IoringSetupFlags::from_bits_retain(word(ring, FLAGS_OFFSET));
    let features = io_uring::IoringFeatureFlags::from_bits_retain(word(ring, FEATURES_OFFSET));
    if setup.intersects(io_uring::IoringSetupFlags::IOPOLL | io_uring::IoringSetupFlags::SQPOLL)
        || !features.contains(io_uring::IoringFeatureFlags::EXT_ARG)
    {
        return None;
    }
    ring_fd(ring)
}

/// The wait in dispatch mode, taking with `look` (liburing's code: 0 a
/// completion, -EAGAIN none, -errno); `None`: not dispatched (see
/// `crate::fds::dispatched`, and a ring whose fd cannot be found).
/// Returns liburing's code, -ETIME after the timeout.
fn dispatched(
    call: Call,
    ring: *mut c_void,
    timeout_ns: Option<u64>,
    mut look: impl FnMut() -> c_int,
) -> Option<c_int> {
    if !crate::config::dispatch() {
        return None;
    }
    let fd = ring_fd(ring)?;
    let set = || {
        std::iter::once(libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
    };
    let take = || match look() {
        0 => 1,
        e if e == -libc::EAGAIN => 0,
        e => {
            // SAFETY: the thread's errno slot.
            unsafe { *libc::__errno_location() = -e };
            -1
        }
    };
    let n = crate::fds::dispatched(set, timeout_ns.map(std::time::Duration::from_nanos), take)?;
    crate::stats::served(call);
    Some(match n {
        1.. => 0,
        0 => -libc::ETIME,
        _ => -wait::errno(),
    })
}

/// Why the mode passes every call through, if it does.
fn pass() -> Option<Pass> {
    match crate::config::mode() {
        None => Some(Pass::ModeOff),
        Some(fastwake::WaitMode::Interrupt) => Some(Pass::Interrupt),
        Some(_) => None,
    }
}

/// # Safety
/// liburing's contract of `__io_uring_get_cqe`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __io_uring_get_cqe(
    ring: *mut c_void,
    cqe_ptr: *mut *mut c_void,
    submit: c_uint,
    wait_nr: c_uint,
    sigmask: *mut libc::sigset_t,
) -> c_int {
    let a = GET_CQE.get();
    if a == 0 {
        return -libc::ENOSYS;
    }
    // SAFETY: `a` is the address dlsym returned for this very symbol.
    let real: GetCqeFn = unsafe { std::mem::transmute(a) };
    // SAFETY: the caller's arguments, unchanged.
    let plain = || unsafe { real(ring, cqe_ptr, submit, wait_nr, sigmask) };
    let call = Call::IoUringGetCqe;
    if let Some(why) = pass() {
        crate::stats::passed(call, why);
        return plain();
    }
    if wait_nr != 1 || !sigmask.is_null() {
        crate::stats::passed(call, Pass::Other);
        return plain();
    }
    // Submit what is asked and look, as one call with nothing to wait for.
    // SAFETY: the caller's ring and result pointer.
    let first = unsafe { real(ring, cqe_ptr, submit, 0, std::ptr::null_mut()) };
    if first != -libc::EAGAIN {
        crate::stats::served(call);
        return first;
    }
    // SAFETY: as above; nothing to submit, nothing to wait for.
    let look = || unsafe { real(ring, cqe_ptr, 0, 0, std::ptr::null_mut()) };
    if let Some(r) = dispatched(call, ring, None, look) {
        return r;
    }
    serve(
        call,
        None,
        prewake_fd(ring),
        look,
        // SAFETY: the caller's call, less what was already submitted.
        |_| unsafe { real(ring, cqe_ptr, 0, 1, std::ptr::null_mut()) },
    )
}

/// # Safety
/// liburing's contract of `io_uring_wait_cqe_timeout`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn io_uring_wait_cqe_timeout(
    ring: *mut c_void,
    cqe_ptr: *mut *mut c_void,
    ts: *mut KernelTimespec,
) -> c_int {
    let a = WAIT_CQE_TIMEOUT.get();
    let g = GET_CQE.get();
    if a == 0 || g == 0 {
        return -libc::ENOSYS;
    }
    // SAFETY: `a` and `g` are dlsym's addresses for these symbols.
    let real: WaitCqeTimeoutFn = unsafe { std::mem::transmute(a) };
    // SAFETY: as above.
    let get: GetCqeFn = unsafe { std::mem::transmute(g) };
    // SAFETY: the caller's arguments, unchanged.
    let plain = || unsafe { real(ring, cqe_ptr, ts) };
    let call = Call::IoUringWaitCqeTimeout;
    if let Some(why) = pass() {
        crate::stats::passed(call, why);
        return plain();
    }
    let timeout_ns = if ts.is_null() {
        None
    } else {
        // SAFETY: a non-null timespec of the caller.
        let t = unsafe { ts.read() };
        let Ok(ns) = wait::secs_nsecs_to_ns(t.tv_sec, t.tv_nsec) else {
            crate::stats::passed(call, Pass::Other);
            return plain();
        };
        Some(ns)
    };
    if timeout_ns == Some(0) {
        crate::stats::passed(call, Pass::ZeroTimeout);
        return plain();
    }
    // SAFETY: the caller's ring; a look with nothing to wait for.
    let look = || unsafe { get(ring, cqe_ptr, 0, 0, std::ptr::null_mut()) };
    let first = look();
    if first != -libc::EAGAIN {
        crate::stats::served(call);
        return first;
    }
    if let Some(r) = dispatched(call, ring, timeout_ns, look) {
        return r;
    }
    serve(
        call,
        timeout_ns,
        prewake_fd(ring),
        look,
        |left| match left {
            None => plain(),
            Some(ns) => {
                let left = wait::ns_to_ts(ns);
                let mut t = KernelTimespec {
                    tv_sec: left.tv_sec,
                    tv_nsec: left.tv_nsec,
                };
                // SAFETY: the caller's ring with what is left of the timeout.
                unsafe { real(ring, cqe_ptr, &mut t) }
            }
        },
    )
}

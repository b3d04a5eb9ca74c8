//! Blocking socket calls: `recv`, `recvfrom`, `recvmsg`, `read` (on
//! sockets only), `accept`, `accept4`, and the fortified `__recv_chk`,
//! `__recvfrom_chk`, `__read_chk` that `_FORTIFY_SOURCE` builds call.
//! Thread-per-connection servers and most clients wait here, not in epoll
//! (sockperf's default server blocks in `recvfrom`).
//!
//! The shim never does the call's work: before a call that would block it
//! spins as the thread's governor decides, *peeking* readiness with a
//! zero-timeout `ppoll` (no data is ever taken from the socket by the
//! shim), then makes the real call, which reads, blocks, times out
//! (`SO_RCVTIMEO`), returns partial data, honours `MSG_PEEK`/`MSG_WAITALL`
//! or fails exactly as without the shim.
//!
//! Passed through untouched: mode `off` or `interrupt`; `MSG_DONTWAIT`;
//! fds that are not sockets (files, pipes, ttys: one `fstat` per fd
//! number, cached, the cache cleared by `close`/`dup2`/`dup3`; a stale
//! entry can only cost a look, never change a result, because a look
//! never consumes anything); non-blocking sockets (`O_NONBLOCK`, read
//! only when the call would block); a call whose first look finds data.
//! `dispatch` mode spins these waits as `hybrid` does (they are not handed
//! to the dispatcher).
//!
//! Signals: while spinning, asynchronous signals are blocked and a pending
//! one ends the spin. If its handler would have interrupted the plain call
//! (a handler without `SA_RESTART`, or `SO_RCVTIMEO` set on the socket,
//! as signal(7) says) the call returns -1/`EINTR` after the handler has
//! run, as the plain call would have; otherwise the real call is made,
//! which is what the kernel's restart would have done.
//!
//! Pre-wakes (`adaptive`, where the thread's recent waits are
//! concentrated: `wait::prewake`): the wait sleeps on the socket until
//! shortly before the reply is due, spins from there, then makes the real
//! call. The sleep keeps the spin's signal semantics: it is a `ppoll` on
//! the socket and a signalfd of the signals the caller's mask lets
//! through, with every asynchronous signal held (see
//! `sleep_holding_signals`), so a signal wakes it, and is either
//! turned into -1/`EINTR` or followed by more sleep, as the plain call
//! would have been interrupted or restarted. With `SO_RCVTIMEO`, what
//! follows a pre-wake's spin is such a sleep for what is left of the
//! timeout (then -1/`EAGAIN`), not the real call's whole timeout.

use crate::real::Sym;
use crate::{fd_sleep, wait};
use fastwake::preload_stats::{Call, Pass};
use fastwake::wait::{Decision, Ending, Governor};
use std::ffi::{c_int, c_void};
use std::ptr::null_mut as null;
use std::sync::atomic::{AtomicU8, Ordering};

static RECV: Sym = Sym::new(c"recv");
static RECVFROM: Sym = Sym::new(c"recvfrom");
static RECVMSG: Sym = Sym::new(c"recvmsg");
static READ: Sym = Sym::new(c"read");
static ACCEPT: Sym = Sym::new(c"accept");
static ACCEPT4: Sym = Sym::new(c"accept4");
static RECV_CHK: Sym = Sym::new(c"__recv_chk");
static RECVFROM_CHK: Sym = Sym::new(c"__recvfrom_chk");
static READ_CHK: Sym = Sym::new(c"__read_chk");
static CLOSE: Sym = Sym::new(c"close");
static DUP2: Sym = Sym::new(c"dup2");
static DUP3: Sym = Sym::new(c"dup3");

/// Resolve the real functions (from the library constructor).
pub fn resolve() {
    for s in [
        &RECV,
        &RECVFROM,
        &RECVMSG,
        &READ,
        &ACCEPT,
        &ACCEPT4,
        &RECV_CHK,
        &RECVFROM_CHK,
        &READ_CHK,
        &CLOSE,
        &DUP2,
        &DUP3,
    ] {
        s.get();
    }
}

// ------------------------------------------------------------ fd kinds

const UNKNOWN: u8 = 0;
const SOCKET: u8 = 1;
const OTHER: u8 = 2;
/// fd numbers the cache covers (64 KiB of zeroed memory); beyond, one
/// `fstat` per call that would otherwise be served.
const KINDS: usize = 1 << 16;
static KIND: [AtomicU8; KINDS] = [const { AtomicU8::new(UNKNOWN) }; KINDS];

/// Is `fd` a socket? Cached per fd number.
pub(crate) fn is_socket(fd: c_int) -> bool {
    let Ok(i) = usize::try_from(fd) else {
        return false;
    };
    let slot = KIND.get(i);
    match slot.map(|s| s.load(Ordering::Relaxed)) {
        Some(SOCKET) => return true,
        Some(OTHER) => return false,
        _ => {}
    }
    // SAFETY: the fd is only borrowed for one fstat (a raw syscall); if
    // it is not open the call fails and the fd counts as no socket.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    let sock = rustix::fs::fstat(b).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFSOCK);
    if let Some(s) = slot {
        s.store(if sock { SOCKET } else { OTHER }, Ordering::Relaxed);
    }
    sock
}

/// `fd` is closed or replaced: its kind is unknown again.
fn forget(fd: c_int) {
    if let Some(s) = usize::try_from(fd).ok().and_then(|i| KIND.get(i)) {
        s.store(UNKNOWN, Ordering::Relaxed);
    }
}

// ------------------------------------------------------------ the wait

/// A blocking socket call on `fd` with `flags` (0 for read/accept): spin
/// before `real` when it would block, else just `real`. `now`, where the
/// call has one, is the same call with `MSG_DONTWAIT` added (a raw
/// syscall): with data there it *is* the call, one syscall as without the
/// shim, which matters for the event loops that read ready non-blocking
/// sockets through these functions; its EAGAIN says "would block".
fn blocking(
    call: Call,
    fd: c_int,
    flags: c_int,
    now: Option<&dyn Fn() -> isize>,
    real: impl Fn() -> isize,
) -> isize {
    let r = blocking_once(call, fd, flags, now, &real);
    if !crate::pollers::on() {
        return r;
    }
    if r >= 0 {
        // Data, a connection or EOF: a completion for a polling thread.
        crate::pollers::completion();
        return r;
    }
    let e = wait::errno();
    if e != libc::EAGAIN || !is_socket(fd) || (flags & libc::MSG_DONTWAIT == 0 && !nonblocking(fd))
    {
        // A blocking socket's receive timeout, or an error: no poll.
        wait::set_errno(e);
        return r;
    }
    // A non-blocking socket had nothing: an empty poll.
    match crate::pollers::empty(
        crate::pollset::Key::Fd(crate::pollset::KIND_SOCKET, fd),
        |s| s.add_fd(fd, libc::POLLIN),
    ) {
        crate::pollers::Next::Empty | crate::pollers::Next::Quiet => {
            wait::set_errno(e);
            r
        }
        crate::pollers::Next::Again => {
            let r = real();
            if r >= 0 {
                // EOF too: the socket changed state.
                crate::pollers::completion();
            }
            r
        }
    }
}

/// [`blocking`]'s one call, as without `FASTWAKE_POLLERS`.
fn blocking_once(
    call: Call,
    fd: c_int,
    flags: c_int,
    now: Option<&dyn Fn() -> isize>,
    real: impl FnOnce() -> isize,
) -> isize {
    let pass = match crate::config::mode() {
        None => Some(Pass::ModeOff),
        Some(fastwake::WaitMode::Interrupt) => Some(Pass::Interrupt),
        Some(_) if flags & libc::MSG_DONTWAIT != 0 => Some(Pass::NonBlocking),
        Some(_) if !is_socket(fd) => Some(Pass::NotSocket),
        Some(_) => None,
    };
    if let Some(why) = pass {
        crate::stats::passed(call, why);
        return real();
    }
    // MSG_WAITALL waits for the whole length, which a non-blocking try
    // would cut short: that call looks instead.
    let now = now.filter(|_| flags & libc::MSG_WAITALL == 0);
    let mut real = Some(real);
    let done = crate::guarded(
        || {
            wait::with_governor(|gov, peer| {
                let r = real.take()?;
                Some(engine(gov, peer, call, fd, now, r))
            })
            .flatten()
        },
        || None,
    );
    match (done, real.take()) {
        (Some(n), _) => n,
        (None, Some(real)) => {
            crate::stats::passed(call, Pass::Busy);
            real()
        }
        // The engine took `real` and then panicked (it does not): the
        // call was made or not, unknown; say interrupted, which every
        // caller of a blocking call must handle.
        (None, None) => {
            wait::set_errno(libc::EINTR);
            -1
        }
    }
}

/// Readable now (data, a pending connection, EOF or an error)? A
/// zero-timeout `ppoll` with the thread's current mask: >0 yes, 0 no,
/// <0 failed (EINTR: a signal was handled during the look).
fn look(fd: c_int) -> c_int {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd; null mask keeps the thread's mask.
    unsafe { crate::sys::ppoll(&mut p, 1, 0, std::ptr::null()) }
}

fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL reads the file status flags; a bad fd fails.
    let fl = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) };
    fl >= 0 && fl as c_int & libc::O_NONBLOCK != 0
}

/// The socket's `SO_RCVTIMEO` in ns (`None`: none, the call waits for ever).
fn rcvtimeo_ns(fd: c_int) -> Option<u64> {
    // SAFETY: borrowed for one getsockopt.
    let b = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    rustix::net::sockopt::socket_timeout(b, rustix::net::sockopt::Timeout::Recv)
        .ok()
        .flatten()
        .map(|d| d.as_nanos().min(u64::MAX as u128) as u64)
        .filter(|&ns| ns > 0)
}

fn engine(
    gov: &mut Governor,
    peer_cpu: Option<u32>,
    call: Call,
    fd: c_int,
    now: Option<&dyn Fn() -> isize>,
    real: impl FnOnce() -> isize,
) -> isize {
    match now {
        Some(try_now) => {
            let n = try_now();
            if n >= 0 || wait::errno() != libc::EAGAIN {
                crate::stats::served(call);
                return n;
            }
            // Would block; a non-blocking socket's call returns that.
            if nonblocking(fd) {
                crate::stats::passed(call, Pass::NonBlocking);
                wait::set_errno(libc::EAGAIN);
                return -1;
            }
        }
        // Data (or a connection, or EOF) already there: the real call
        // returns at once. A look that handled a signal (EINTR) is a
        // signal handled just before the plain call: make the call.
        None if look(fd) != 0 => {
            crate::stats::served(call);
            return real();
        }
        None if nonblocking(fd) => {
            crate::stats::passed(call, Pass::NonBlocking);
            return real();
        }
        None => {}
    }
    crate::stats::served(call);
    let timeout_ns = rcvtimeo_ns(fd);
    wait::count(|e| &e.waits, 1);
    let planned = wait::plan_prewake(gov, peer_cpu, timeout_ns);
    if let Some(at) = planned.prewake_at() {
        let has_timeout = timeout_ns.is_some();
        let call = Peeked {
            fd,
            has_timeout,
            real,
        };
        return wait::prewake(gov, planned, timeout_ns, at, call);
    }
    let wait::Planned {
        t0,
        cpu,
        decision,
        mut ending,
    } = planned;
    if let Decision::Spin(budget) = decision {
        let spin = wait::spin_holding_signals(
            t0,
            budget,
            || look(fd),
            |&n| n != 0,
            |signals| fd_sleep::interrupts(signals, timeout_ns.is_some()),
            ending,
        );
        ending = spin.ending;
        let (n, eintr) = (spin.last, spin.interrupted);
        if eintr {
            ending.slept = false;
            gov.end(ending);
            wait::set_errno(libc::EINTR);
            return -1;
        }
        if n > 0 {
            wait::count(|e| &e.spin_hits, 1);
            ending.slept = false;
            gov.end(ending);
            return real();
        }
        if let Some(t) = timeout_ns
            && ending.spun_ns >= t
        {
            // The receive timeout ran out while spinning: what the plain
            // call returns when it does.
            ending.slept = false;
            gov.end(ending);
            wait::set_errno(libc::EAGAIN);
            return -1;
        }
    }
    // Block in the real call (for the whole SO_RCVTIMEO, if one is set:
    // the call cannot be given less, so such a wait is at most one spin
    // budget longer than without the shim).
    wait::block(gov, cpu, ending, real, |&r| r < 0)
}

/// A blocking socket call as a pre-wake's call ([`wait::Prewaker`]): it
/// sleeps and spins peeking readiness with signals held (never taking
/// data), and makes the real call once the socket is readable.
struct Peeked<F> {
    fd: c_int,
    /// SO_RCVTIMEO is set: every handler interrupts (see [`fd_sleep::interrupts`]).
    has_timeout: bool,
    real: F,
}

impl<F: FnOnce() -> isize> wait::Prewaker for Peeked<F> {
    type Out = isize;

    fn sleep(&mut self, ns: u64) -> Option<c_int> {
        fd_sleep::sleep_holding_signals(self.fd, ns, self.has_timeout)
    }

    fn spin(&mut self, start: u64, budget: u64, ending: &mut Ending) -> c_int {
        let (fd, has_timeout) = (self.fd, self.has_timeout);
        let spin = wait::spin_holding_signals(
            start,
            budget,
            || look(fd),
            |&n| n != 0,
            |signals| fd_sleep::interrupts(signals, has_timeout),
            *ending,
        );
        *ending = spin.ending;
        if spin.interrupted {
            wait::set_errno(libc::EINTR);
            -1
        } else if spin.last > 0 {
            wait::count(|e| &e.spin_hits, 1);
            1
        } else {
            // Nothing, or a look that handled a signal glibc keeps for
            // itself: on to the real call, as the plain spin does.
            0
        }
    }

    fn found(self, n: c_int) -> isize {
        if n > 0 {
            return (self.real)();
        }
        wait::set_errno(libc::EINTR);
        -1
    }

    fn timed_out(self) -> isize {
        // What the plain call returns when SO_RCVTIMEO runs out.
        wait::set_errno(libc::EAGAIN);
        -1
    }

    fn block(self, left: Option<u64>) -> isize {
        // With SO_RCVTIMEO, the real call would wait its whole timeout
        // again: sleep for what is left instead (every handler
        // interrupts), then make the call once the socket is readable.
        let Some(ns) = left else {
            return (self.real)();
        };
        match fd_sleep::sleep_holding_signals(self.fd, ns, true) {
            Some(0) => self.timed_out(),
            Some(n) if n < 0 => -1,
            _ => (self.real)(),
        }
    }

    fn failed(r: &isize) -> bool {
        *r < 0
    }
}

// ------------------------------------------------------------ the hooks

/// `recvfrom(fd, buf, len, flags | MSG_DONTWAIT, addr, addrlen)` as a raw
/// syscall (`recv` and `read` on a socket are this call with no address
/// and flags 0 for read).
fn recvfrom_now(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> isize {
    // SAFETY: the caller's buffers, as the real call would get them.
    unsafe {
        libc::syscall(
            libc::SYS_recvfrom,
            fd,
            buf,
            len,
            flags | libc::MSG_DONTWAIT,
            addr,
            addrlen,
        ) as isize
    }
}

/// `recvmsg(fd, msg, flags | MSG_DONTWAIT)` as a raw syscall.
fn recvmsg_now(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    // SAFETY: the caller's msghdr, as the real call would get it.
    unsafe { libc::syscall(libc::SYS_recvmsg, fd, msg, flags | libc::MSG_DONTWAIT) as isize }
}

macro_rules! real_fn {
    ($sym:expr, $ty:ty) => {{
        let a = $sym.get();
        // SAFETY: `a` is the address dlsym returned for this symbol, whose
        // C type is `$ty`.
        (a != 0).then(|| unsafe { std::mem::transmute::<usize, $ty>(a) })
    }};
}

fn enosys() -> isize {
    wait::set_errno(libc::ENOSYS);
    -1
}

type RecvFn = unsafe extern "C" fn(c_int, *mut c_void, usize, c_int) -> isize;
type RecvFromFn = unsafe extern "C" fn(
    c_int,
    *mut c_void,
    usize,
    c_int,
    *mut libc::sockaddr,
    *mut libc::socklen_t,
) -> isize;
type RecvMsgFn = unsafe extern "C" fn(c_int, *mut libc::msghdr, c_int) -> isize;
type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
type AcceptFn = unsafe extern "C" fn(c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> c_int;
type Accept4Fn =
    unsafe extern "C" fn(c_int, *mut libc::sockaddr, *mut libc::socklen_t, c_int) -> c_int;
type RecvChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, usize, c_int) -> isize;
type RecvFromChkFn = unsafe extern "C" fn(
    c_int,
    *mut c_void,
    usize,
    usize,
    c_int,
    *mut libc::sockaddr,
    *mut libc::socklen_t,
) -> isize;
type ReadChkFn = unsafe extern "C" fn(c_int, *mut c_void, usize, usize) -> isize;
type CloseFn = unsafe extern "C" fn(c_int) -> c_int;
type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;

/// # Safety
/// The libc contract of `recv`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    match real_fn!(RECV, RecvFn) {
        // SAFETY: the caller's arguments, unchanged.
        Some(f) => blocking(
            Call::Recv,
            fd,
            flags,
            Some(&|| recvfrom_now(fd, buf, len, flags, null(), null())),
            || unsafe { f(fd, buf, len, flags) },
        ),
        None => enosys(),
    }
}

/// # Safety
/// The libc contract of `recvfrom`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> isize {
    match real_fn!(RECVFROM, RecvFromFn) {
        // SAFETY: the caller's arguments, unchanged.
        Some(f) => blocking(
            Call::Recvfrom,
            fd,
            flags,
            Some(&|| recvfrom_now(fd, buf, len, flags, addr, addrlen)),
            || unsafe { f(fd, buf, len, flags, addr, addrlen) },
        ),
        None => enosys(),
    }
}

/// # Safety
/// The libc contract of `recvmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize {
    match real_fn!(RECVMSG, RecvMsgFn) {
        // SAFETY: the caller's arguments, unchanged.
        Some(f) => blocking(
            Call::Recvmsg,
            fd,
            flags,
            Some(&|| recvmsg_now(fd, msg, flags)),
            || unsafe { f(fd, msg, flags) },
        ),
        None => enosys(),
    }
}

/// # Safety
/// The libc contract of `read`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: usize) -> isize {
    match real_fn!(READ, ReadFn) {
        // SAFETY: the caller's arguments, unchanged.
        Some(f) => blocking(
            Call::Read,
            fd,
            0,
            Some(&|| recvfrom_now(fd, buf, count, 0, null(), null())),
            || unsafe { f(fd, buf, count) },
        ),
        None => enosys(),
    }
}

/// # Safety
/// The libc contract of `accept`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept(
    fd: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> c_int {
    match real_fn!(ACCEPT, AcceptFn) {
        // SAFETY: the caller's arguments, unchanged.
        Some(f) => blocking(
            Call::Accept,
            fd,
            0,
            None,
            || unsafe { f(fd, addr, addrlen) } as isize,
        ) as c_int,
        None => enosys() as c_int,
    }
}

/// # Safety
/// The libc contract of `accept4` (its flags are the new socket's, not
/// the wait's).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
    flags: c_int,
) -> c_int {
    match real_fn!(ACCEPT4, Accept4Fn) {
        // SAFETY: the caller's arguments, unchanged.
        Some(f) => blocking(
            Call::Accept4,
            fd,
            0,
            None,
            || unsafe { f(fd, addr, addrlen, flags) } as isize,
        ) as c_int,
        None => enosys() as c_int,
    }
}

/// # Safety
/// The libc contract of `__recv_chk` (`recv` under `_FORTIFY_SOURCE`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    buflen: usize,
    flags: c_int,
) -> isize {
    if len > buflen {
        // Let glibc's own check abort the program, as without the shim.
        return match real_fn!(RECV_CHK, RecvChkFn) {
            // SAFETY: the caller's arguments, unchanged.
            Some(chk) => unsafe { chk(fd, buf, len, buflen, flags) },
            None => enosys(),
        };
    }
    // SAFETY: within the buffer, `recv`'s contract holds: it is `recv`.
    unsafe { recv(fd, buf, len, flags) }
}

/// # Safety
/// The libc contract of `__recvfrom_chk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    buflen: usize,
    flags: c_int,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) -> isize {
    if len > buflen {
        // Let glibc's own check abort the program, as without the shim.
        return match real_fn!(RECVFROM_CHK, RecvFromChkFn) {
            // SAFETY: the caller's arguments, unchanged.
            Some(chk) => unsafe { chk(fd, buf, len, buflen, flags, addr, addrlen) },
            None => enosys(),
        };
    }
    // SAFETY: within the buffer, `recvfrom`'s contract holds: it is
    // `recvfrom`.
    unsafe { recvfrom(fd, buf, len, flags, addr, addrlen) }
}

/// # Safety
/// The libc contract of `__read_chk`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    nbytes: usize,
    buflen: usize,
) -> isize {
    if nbytes > buflen {
        // Let glibc's own check abort the program, as without the shim.
        return match real_fn!(READ_CHK, ReadChkFn) {
            // SAFETY: the caller's arguments, unchanged.
            Some(chk) => unsafe { chk(fd, buf, nbytes, buflen) },
            None => enosys(),
        };
    }
    // SAFETY: within the buffer, `read`'s contract holds: it is `read`.
    unsafe { read(fd, buf, nbytes) }
}

/// # Safety
/// The libc contract of `close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    forget(fd);
    match real_fn!(CLOSE, CloseFn) {
        // SAFETY: the caller's argument, unchanged.
        Some(f) => unsafe { f(fd) },
        None => enosys() as c_int,
    }
}

/// # Safety
/// The libc contract of `dup2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    forget(new);
    match real_fn!(DUP2, Dup2Fn) {
        // SAFETY: the caller's arguments, unchanged.
        Some(f) => unsafe { f(old, new) },
        None => enosys() as c_int,
    }
}

/// # Safety
/// The libc contract of `dup3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    forget(new);
    match real_fn!(DUP3, Dup3Fn) {
        // SAFETY: the caller's arguments, unchanged.
        Some(f) => unsafe { f(old, new, flags) },
        None => enosys() as c_int,
    }
}

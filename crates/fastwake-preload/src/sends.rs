//! The send-side calls, hooked only to see a polling thread's progress
//! (the hazard rule, [`crate::pollers::progress`]): `send`, `sendto`, `sendmsg`,
//! and `write`/`writev` on sockets. Each forwards its arguments unchanged
//! and returns the real call's result; with `FASTWAKE_POLLERS` off the
//! hook costs one load before the real call.

use crate::real::Sym;
use std::ffi::{c_int, c_void};

static SEND: Sym = Sym::new(c"send");
static SENDTO: Sym = Sym::new(c"sendto");
static SENDMSG: Sym = Sym::new(c"sendmsg");
static WRITE: Sym = Sym::new(c"write");
static WRITEV: Sym = Sym::new(c"writev");

/// Resolve the real functions (from the library constructor).
pub fn resolve() {
    for s in [&SEND, &SENDTO, &SENDMSG, &WRITE, &WRITEV] {
        s.get();
    }
}

type SendFn = unsafe extern "C" fn(c_int, *const c_void, usize, c_int) -> isize;
type SendtoFn = unsafe extern "C" fn(
    c_int,
    *const c_void,
    usize,
    c_int,
    *const libc::sockaddr,
    libc::socklen_t,
) -> isize;
type SendmsgFn = unsafe extern "C" fn(c_int, *const libc::msghdr, c_int) -> isize;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, usize) -> isize;
type WritevFn = unsafe extern "C" fn(c_int, *const libc::iovec, c_int) -> isize;

fn enosys() -> isize {
    crate::wait::set_errno(libc::ENOSYS);
    -1
}

/// A send on a socket is progress, for a thread under suspicion.
#[inline]
fn sent(fd: c_int, socket_known: bool) {
    if crate::pollers::on()
        && crate::pollers::suspect()
        && (socket_known || crate::sockets::is_socket(fd))
    {
        crate::pollers::progress();
    }
}

/// # Safety
/// The libc contract of `send`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    let a = SEND.get();
    if a == 0 {
        return enosys();
    }
    sent(fd, true);
    // SAFETY: the address dlsym returned for this symbol; the caller's
    // arguments, unchanged.
    unsafe { std::mem::transmute::<usize, SendFn>(a)(fd, buf, len, flags) }
}

/// # Safety
/// The libc contract of `sendto`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    addr: *const libc::sockaddr,
    alen: libc::socklen_t,
) -> isize {
    let a = SENDTO.get();
    if a == 0 {
        return enosys();
    }
    sent(fd, true);
    // SAFETY: as in `send`.
    unsafe { std::mem::transmute::<usize, SendtoFn>(a)(fd, buf, len, flags, addr, alen) }
}

/// # Safety
/// The libc contract of `sendmsg`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> isize {
    let a = SENDMSG.get();
    if a == 0 {
        return enosys();
    }
    sent(fd, true);
    // SAFETY: as in `send`.
    unsafe { std::mem::transmute::<usize, SendmsgFn>(a)(fd, msg, flags) }
}

/// # Safety
/// The libc contract of `write`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: usize) -> isize {
    let a = WRITE.get();
    if a == 0 {
        return enosys();
    }
    sent(fd, false);
    // SAFETY: as in `send`.
    unsafe { std::mem::transmute::<usize, WriteFn>(a)(fd, buf, len) }
}

/// # Safety
/// The libc contract of `writev`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> isize {
    let a = WRITEV.get();
    if a == 0 {
        return enosys();
    }
    sent(fd, false);
    // SAFETY: as in `send`.
    unsafe { std::mem::transmute::<usize, WritevFn>(a)(fd, iov, n) }
}

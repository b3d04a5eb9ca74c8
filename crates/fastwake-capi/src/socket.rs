//! Connected stream sockets as a source of messages.

use crate::boundary::{bytes_arg, check_out, destroy, guard, notify_fd_of, obj, out, wait_for};
use crate::waiter::fw_waiter;
use fastwake::Fail;
use std::ffi::{c_int, c_void};
use std::os::fd::{BorrowedFd, OwnedFd};

pub struct fw_socket(pub(crate) fastwake::source::socket::SocketSource);

/// # Safety
/// `fd` is an open connected stream socket of the caller (duplicated here,
/// not taken); `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_socket_create(
    fd: c_int,
    msg_size: usize,
    busy_poll_us: u32,
    out_s: *mut *mut fw_socket,
) -> c_int {
    guard(|| {
        check_out(out_s)?;
        if fd < 0 {
            return Err(Fail::new(libc::EBADF, format!("bad socket fd {fd}")));
        }
        // SAFETY: the caller promises fd is open for the duration of this
        // call; it is only duplicated, so the caller keeps ownership.
        let b = unsafe { BorrowedFd::borrow_raw(fd) };
        let own: OwnedFd = b.try_clone_to_owned().map_err(|e| {
            Fail::new(
                e.raw_os_error().unwrap_or(libc::EBADF),
                format!("dup socket fd {fd}: {e}"),
            )
        })?;
        let opts = fastwake::source::socket::SocketOptions {
            busy_poll_us: (busy_poll_us > 0).then_some(busy_poll_us),
        };
        let src = fastwake::source::socket::SocketSource::new(own, msg_size, opts)?;
        out(out_s, fw_socket(src))
    })
}

/// # Safety
/// `s` from this library; `data` readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_socket_send(
    s: *mut fw_socket,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(|| {
        let s = obj(s)?;
        // SAFETY: readable for len bytes per the header.
        let d = unsafe { bytes_arg(data, len) }?;
        s.0.send(d)
    })
}

/// # Safety
/// `w` and `s` from this library; `buf` NULL or writable for `buf_len`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_socket_wait(
    w: *mut fw_waiter,
    s: *mut fw_socket,
    timeout_ns: i64,
    buf: *mut c_void,
    buf_len: usize,
) -> c_int {
    guard(|| {
        let w = obj(w)?;
        let s = obj(s)?;
        wait_for(&mut w.0, &mut s.0, timeout_ns)?;
        let m = s.0.message();
        if !buf.is_null() {
            // SAFETY: writable for buf_len per the header; the copy is
            // bounded by it.
            unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), buf.cast(), m.len().min(buf_len)) };
        }
        Ok(())
    })
}

/// # Safety
/// `s` is NULL or from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_socket_fd(s: *const fw_socket) -> c_int {
    // SAFETY: NULL or a live socket source.
    notify_fd_of(unsafe { s.as_ref() }.map(|s| &s.0))
}

/// # Safety
/// `s` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_socket_destroy(s: *mut fw_socket) {
    destroy(s)
}

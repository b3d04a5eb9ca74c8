//! The boundary every entry point crosses: the thread's last error, the
//! panic guard, and the pointer and argument conversions of the header's
//! conventions.

use fastwake::{Fail, Source, Waiter};
use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// Run `f`, record a failure's cause, and never let a panic unwind into C.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_last(&e.to_string());
            e.errno()
        }
        Err(_) => {
            set_last("internal error (panic) in fastwake");
            libc::EIO
        }
    }
}

pub(crate) fn out<T>(p: *mut *mut T, v: T) -> Result<(), Fail> {
    if p.is_null() {
        return Err(Fail::invalid("output pointer is NULL"));
    }
    // SAFETY: p is non-null and, per the header, points to writable storage
    // for one pointer.
    unsafe { *p = Box::into_raw(Box::new(v)) };
    Ok(())
}

/// A required output pointer for one value: checked for NULL before the
/// call does its work (`{what} pointer is NULL`), written once after.
pub(crate) struct Out<T>(std::ptr::NonNull<T>);

pub(crate) fn out_value<T>(p: *mut T, what: &str) -> Result<Out<T>, Fail> {
    std::ptr::NonNull::new(p)
        .map(Out)
        .ok_or_else(|| Fail::invalid(format!("{what} pointer is NULL")))
}

impl<T> Out<T> {
    pub(crate) fn set(self, v: T) {
        // SAFETY: non-null (checked) and, per the header, writable for one
        // T; written, not read, so the storage may be uninitialised.
        unsafe { self.0.as_ptr().write(v) }
    }
}

pub(crate) fn check_out<T>(p: *mut *mut T) -> Result<(), Fail> {
    if p.is_null() {
        Err(Fail::invalid("output pointer is NULL"))
    } else {
        Ok(())
    }
}

pub(crate) fn obj<'a, T>(p: *mut T) -> Result<&'a mut T, Fail> {
    // SAFETY: non-null pointers come from Box::into_raw in this library and
    // are used by one thread at a time (the header's thread model).
    unsafe { p.as_mut() }.ok_or_else(|| Fail::invalid("object pointer is NULL"))
}

pub(crate) fn dup_fd(fd: c_int) -> Result<Option<OwnedFd>, Fail> {
    if fd < 0 {
        return Ok(None);
    }
    // SAFETY: the caller owns fd for the duration of the call; we only
    // borrow it to duplicate it.
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    Ok(Some(b.try_clone_to_owned().map_err(Fail::from)?))
}

/// One wait with the header's timeout convention: `timeout_ns < 0` waits
/// forever, otherwise ETIMEDOUT when nothing came in time.
pub(crate) fn wait_for<S: Source + ?Sized>(
    w: &mut Waiter,
    src: &mut S,
    timeout_ns: i64,
) -> Result<S::Completion, Fail> {
    if timeout_ns < 0 {
        w.wait(src)
    } else {
        w.wait_timeout(src, Duration::from_nanos(timeout_ns as u64))?
            .ok_or_else(Fail::timed_out)
    }
}

/// The notification fd of a source the C caller passed (NULL allowed), or
/// -1: what every `fw_*_fd` returns.
pub(crate) fn notify_fd_of<S: Source + ?Sized>(src: Option<&S>) -> c_int {
    src.and_then(|s| s.notify_fd())
        .map_or(-1, |f| f.as_raw_fd())
}

/// A `cpu` argument of the header: a CPU number, or -1 for the calling
/// thread's (`None`).
pub(crate) fn cpu_arg(cpu: c_int) -> Result<Option<u32>, Fail> {
    match cpu {
        -1 => Ok(None),
        c if c < 0 => Err(Fail::invalid(format!(
            "cpu {c}: a CPU number or -1 (the calling thread's)"
        ))),
        c => Ok(Some(c as u32)),
    }
}

/// A shared borrow, for the objects the header lets several threads use
/// at once (their methods take `&self`).
pub(crate) fn obj_ref<'a, T>(p: *const T) -> Result<&'a T, Fail> {
    // SAFETY: NULL or a live object from this library (the header's
    // contract); only shared access is made through it.
    unsafe { p.as_ref() }.ok_or_else(|| Fail::invalid("object pointer is NULL"))
}

/// `fw_*_stats`: `make` the C struct from the live object `p` and store
/// it at `out`.
pub(crate) fn stats_of<T, S>(
    p: *const T,
    out: *mut S,
    make: impl FnOnce(&T) -> S,
) -> Result<(), Fail> {
    let o = obj_ref(p)?;
    if out.is_null() {
        return Err(Fail::invalid("stats pointer is NULL"));
    }
    let s = make(o);
    // SAFETY: non-null and writable per the header.
    unsafe { *out = s };
    Ok(())
}

/// The `data`, `len` pair of a send: NULL allowed only with `len` 0.
///
/// # Safety
/// `data` NULL or readable for `len` bytes while the result lives.
pub(crate) unsafe fn bytes_arg<'a>(
    data: *const std::ffi::c_void,
    len: usize,
) -> Result<&'a [u8], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(Fail::invalid("data is NULL"));
    }
    // SAFETY: non-null and readable for len bytes per the caller.
    Ok(unsafe { std::slice::from_raw_parts(data.cast(), len) })
}

pub(crate) fn destroy<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: created by Box::into_raw here and destroyed once, per the
        // header's contract.
        drop(unsafe { Box::from_raw(p) });
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn fw_last_error() -> *const c_char {
    // The pointer stays valid until this thread's next failing call, as the
    // header promises: the CString lives in thread-local storage.
    LAST.with(|l| l.borrow().as_ptr())
}

/// A C string argument: `None` for NULL, one line naming `what` when it
/// is not UTF-8.
pub(crate) fn text<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Fail> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated per the header.
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    s.to_str()
        .map(Some)
        .map_err(|_| Fail::invalid(format!("{what} is not UTF-8")))
}

/// A config field: zero means its default.
pub(crate) fn or<T: PartialEq + Default>(v: T, default: T) -> T {
    if v == T::default() { default } else { v }
}

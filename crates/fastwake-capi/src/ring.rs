//! Completion rings the caller owns, and their producers' handles.

use crate::boundary::{check_out, destroy, guard, obj, out, set_last, wait_for};
use crate::waiter::fw_waiter;
use fastwake::Fail;
use std::ffi::c_int;

pub struct fw_ring(pub(crate) fastwake::source::ring::ExternalRing);
pub struct fw_ring_producer(pub(crate) fastwake::source::ring::RingProducer);

/// `fw_ring_create`'s kinds, as the header defines them.
pub const FW_RING_LEVEL: c_int = 0;
pub const FW_RING_EVENTFD: c_int = 1;
/// OR'ed into a kind: the ring's producer calls `fw_ring_published`.
pub const FW_RING_NOTICES: c_int = 0x100;

/// # Safety
/// `head`/`tail` point to the ring's counters and, with `fd`, outlive the
/// ring object (the header's contract); `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_ring_create(
    head: *const u32,
    tail: *const u32,
    fd: c_int,
    kind: c_int,
    out_r: *mut *mut fw_ring,
) -> c_int {
    use fastwake::source::ring::{ExternalRing, RingFd};
    guard(|| {
        check_out(out_r)?;
        let notices = kind & FW_RING_NOTICES != 0;
        let kind = match kind & !FW_RING_NOTICES {
            FW_RING_LEVEL => RingFd::Level,
            FW_RING_EVENTFD => RingFd::EventFd,
            k => return Err(Fail::invalid(format!("unknown ring kind {k}"))),
        };
        // SAFETY: the caller's promise above, passed on unchanged; the
        // constructors check null, alignment and the fd.
        let src = unsafe {
            if notices {
                ExternalRing::with_notices(head, tail, fd, kind)
            } else {
                ExternalRing::new(head, tail, fd, kind)
            }
        }?;
        out(out_r, fw_ring(src))
    })
}

/// # Safety
/// `w` and `r` from this library; `ready` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_ring_wait(
    w: *mut fw_waiter,
    r: *mut fw_ring,
    timeout_ns: i64,
    ready: *mut u32,
) -> c_int {
    guard(|| {
        let w = obj(w)?;
        let r = obj(r)?;
        let n = wait_for(&mut w.0, &mut r.0, timeout_ns)?;
        if !ready.is_null() {
            // SAFETY: writable per the header.
            unsafe { *ready = n };
        }
        Ok(())
    })
}

/// # Safety
/// `r` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_ring_destroy(r: *mut fw_ring) {
    destroy(r)
}

/// # Safety
/// `r` NULL or from this library (not in use by another thread); `out`
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_ring_producer_create(
    r: *const fw_ring,
    out_p: *mut *mut fw_ring_producer,
) -> c_int {
    guard(|| {
        check_out(out_p)?;
        // SAFETY: NULL or a live ring, per the header.
        let r = unsafe { r.as_ref() }.ok_or_else(|| Fail::invalid("ring pointer is NULL"))?;
        out(out_p, fw_ring_producer(r.0.producer()?))
    })
}

/// # Safety
/// `p` NULL or from this library; any thread, concurrently.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_ring_published(p: *const fw_ring_producer) -> c_int {
    // SAFETY: NULL or a live producer handle (Sync), per the header.
    match unsafe { p.as_ref() } {
        Some(p) => {
            p.0.published();
            0
        }
        None => {
            set_last("ring producer pointer is NULL");
            libc::EINVAL
        }
    }
}

/// # Safety
/// `p` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_ring_producer_destroy(p: *mut fw_ring_producer) {
    destroy(p)
}

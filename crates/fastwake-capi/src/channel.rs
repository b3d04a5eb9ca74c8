//! Channels (the header's first section): in-process and cross-process
//! channels, their senders and receivers.

use crate::boundary::{check_out, destroy, dup_fd, guard, notify_fd_of, obj, out};
use fastwake::source::channel::{self, Config, Doorbell, Receiver, Sender, SharedChannel};
use fastwake::{Fail, Source};
use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fw_channel_config {
    pub capacity: u32,
    pub slot_size: u32,
    pub doorbell: u32,
}

pub struct fw_shared(pub(crate) SharedChannel);
pub struct fw_sender(pub(crate) Sender);
pub struct fw_receiver(pub(crate) Receiver);

fn config(cfg: *const fw_channel_config) -> Result<Config, Fail> {
    if cfg.is_null() {
        return Ok(Config::default());
    }
    // SAFETY: the caller passes a valid pointer or NULL (checked above).
    let c = unsafe { *cfg };
    Ok(Config {
        capacity: c.capacity,
        slot_size: c.slot_size,
        doorbell: match c.doorbell {
            0 => Doorbell::Futex,
            1 => Doorbell::EventFd,
            d => return Err(Fail::invalid(format!("unknown doorbell {d}"))),
        },
    })
}

/// # Safety
/// `cfg` is NULL or valid; `tx` and `rx` point to writable pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_channel_create(
    cfg: *const fw_channel_config,
    tx: *mut *mut fw_sender,
    rx: *mut *mut fw_receiver,
) -> c_int {
    guard(|| {
        check_out(tx)?;
        check_out(rx)?;
        let (s, r) = channel::channel(config(cfg)?)?;
        out(tx, fw_sender(s))?;
        out(rx, fw_receiver(r))
    })
}

/// # Safety
/// `cfg` is NULL or valid; `sh` points to a writable pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_shared_create(
    cfg: *const fw_channel_config,
    sh: *mut *mut fw_shared,
) -> c_int {
    guard(|| {
        check_out(sh)?;
        out(sh, fw_shared(SharedChannel::create(config(cfg)?)?))
    })
}

/// # Safety
/// `sh` is NULL or from `fw_shared_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_shared_memory_fd(sh: *const fw_shared) -> c_int {
    // SAFETY: NULL or a live object from fw_shared_create.
    unsafe { sh.as_ref() }.map_or(-1, |s| s.0.memory_fd().as_raw_fd())
}

/// # Safety
/// `sh` is NULL or from `fw_shared_create`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_shared_doorbell_fd(sh: *const fw_shared) -> c_int {
    // SAFETY: NULL or a live object from fw_shared_create.
    unsafe { sh.as_ref() }
        .and_then(|s| s.0.doorbell_fd())
        .map_or(-1, |f| f.as_raw_fd())
}

/// # Safety
/// `sh` from `fw_shared_create`; `tx` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_shared_sender(sh: *mut fw_shared, tx: *mut *mut fw_sender) -> c_int {
    guard(|| {
        check_out(tx)?;
        let s = obj(sh)?.0.sender()?;
        out(tx, fw_sender(s))
    })
}

/// # Safety
/// `sh` from `fw_shared_create`; `rx` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_shared_receiver(
    sh: *mut fw_shared,
    rx: *mut *mut fw_receiver,
) -> c_int {
    guard(|| {
        check_out(rx)?;
        let r = obj(sh)?.0.receiver()?;
        out(rx, fw_receiver(r))
    })
}

/// # Safety
/// `sh` is NULL or from `fw_shared_create`, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_shared_destroy(sh: *mut fw_shared) {
    destroy(sh)
}

/// # Safety
/// `memory_fd` (and `doorbell_fd` unless -1) are open fds; `tx` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_sender_attach(
    memory_fd: c_int,
    doorbell_fd: c_int,
    tx: *mut *mut fw_sender,
) -> c_int {
    guard(|| {
        check_out(tx)?;
        let mem = dup_fd(memory_fd)?.ok_or_else(|| Fail::invalid("memory_fd is negative"))?;
        out(tx, fw_sender(Sender::attach(mem, dup_fd(doorbell_fd)?)?))
    })
}

/// # Safety
/// `memory_fd` (and `doorbell_fd` unless -1) are open fds; `rx` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_receiver_attach(
    memory_fd: c_int,
    doorbell_fd: c_int,
    rx: *mut *mut fw_receiver,
) -> c_int {
    guard(|| {
        check_out(rx)?;
        let mem = dup_fd(memory_fd)?.ok_or_else(|| Fail::invalid("memory_fd is negative"))?;
        out(
            rx,
            fw_receiver(Receiver::attach(mem, dup_fd(doorbell_fd)?)?),
        )
    })
}

fn payload<'a>(data: *const c_void, len: usize) -> Result<&'a [u8], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(Fail::invalid("data is NULL with a non-zero length"));
    }
    // SAFETY: the caller passes len readable bytes at data (header contract).
    Ok(unsafe { std::slice::from_raw_parts(data.cast(), len) })
}

/// # Safety
/// `tx` from this library; `data` has `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_send(
    tx: *mut fw_sender,
    tag: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(|| obj(tx)?.0.send(tag, payload(data, len)?))
}

/// # Safety
/// `tx` from this library; `data` has `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_try_send(
    tx: *mut fw_sender,
    tag: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(|| {
        if obj(tx)?.0.try_send(tag, payload(data, len)?)? {
            Ok(())
        } else {
            Err(Fail::new(libc::EAGAIN, "channel is full"))
        }
    })
}

/// # Safety
/// `tx` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_sender_destroy(tx: *mut fw_sender) {
    destroy(tx)
}

/// # Safety
/// `rx` is NULL or from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_receiver_ready(rx: *const fw_receiver) -> c_int {
    // SAFETY: NULL or a live receiver.
    unsafe { rx.as_ref() }.is_some_and(|r| r.0.ready()) as c_int
}

/// # Safety
/// `rx` is NULL or from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_receiver_fd(rx: *const fw_receiver) -> c_int {
    // SAFETY: NULL or a live receiver.
    notify_fd_of(unsafe { rx.as_ref() }.map(|r| &r.0))
}

/// # Safety
/// `rx` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_receiver_destroy(rx: *mut fw_receiver) {
    destroy(rx)
}

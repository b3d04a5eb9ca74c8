//! The C ABI of fastwake (`include/fastwake.h`).
//!
//! Demikernel's conventions: functions return 0 or a positive errno, objects
//! are opaque boxes, and a one-line cause is kept per thread for
//! `fw_last_error`. No panic may cross the boundary: every entry point runs
//! inside [`guard`], which turns a panic into `EIO`.

#![allow(non_camel_case_types)]
// the C names are the ABI
// The Rust side of a C ABI: its docs are for its maintainers (`cargo doc
// --document-private-items`), so they may link private items.
#![allow(rustdoc::private_intra_doc_links)]

use fastwake::source::channel::{self, Config, Doorbell, Receiver, Sender, SharedChannel};
use fastwake::source::demux::{Demux, Inbox};
use fastwake::source::verbs::{CqConfig, Route, SharedCq, Vector};
use fastwake::{Fail, Source, WaitMode, Waiter};
use fastwake_verbs_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_wc};
use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

/// ABI version; bump on any incompatible change to the header.
pub const FW_ABI_VERSION: u32 = 1;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fw_channel_config {
    pub capacity: u32,
    pub slot_size: u32,
    pub doorbell: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fw_wait_stats {
    pub completions: u64,
    pub without_sleep: u64,
    pub sleeps: u64,
    pub rechecks_hit: u64,
    pub spurious: u64,
    pub spin_skipped_same_cpu: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fw_dispatch_stats {
    pub handoffs: u64,
    pub rescued: u64,
    pub relayed: u64,
    pub idle_sleeps: u64,
    pub paused: u64,
    pub registered: u64,
    pub idle_after_ns: i64,
    pub state: u32,
    pub reserved: u32,
}

/// How a dispatcher's hand-offs through ready notices went (see the
/// header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fw_notice_stats {
    pub notices: u64,
    pub scan_found: u64,
    pub late_notices: u64,
    pub reserved: u64,
}

impl From<&fastwake::dispatch::DispatchStats> for fw_notice_stats {
    fn from(s: &fastwake::dispatch::DispatchStats) -> Self {
        fw_notice_stats {
            notices: s.notices,
            scan_found: s.scan_found,
            late_notices: s.late_notices,
            reserved: 0,
        }
    }
}

/// Pre-wake ("sleep, then poll") counters of an adaptive waiter or of a
/// How a waiter's dispatch-mode waits ended (see the header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fw_dispatch_wait_stats {
    pub handoffs: u64,
    pub relays: u64,
    pub fallbacks: u64,
    pub paused: u64,
    pub resumed: u64,
    pub reserved: [u64; 3],
}

/// dispatcher with a learned idle policy.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fw_prewake_stats {
    pub prewakes: u64,
    pub early: u64,
    pub caught: u64,
    pub late: u64,
    pub pauses: u64,
    pub margin_ns: u64,
    pub reserved: [u64; 2],
}

impl From<&fastwake::adaptive::AdaptiveStats> for fw_prewake_stats {
    fn from(s: &fastwake::adaptive::AdaptiveStats) -> Self {
        fw_prewake_stats {
            prewakes: s.prewakes,
            early: s.prewake_early,
            caught: s.prewake_caught,
            late: s.prewake_late,
            pauses: s.prewake_pauses,
            margin_ns: s.margin_ns,
            reserved: [0; 2],
        }
    }
}

impl From<&fastwake::dispatch::DispatchStats> for fw_prewake_stats {
    fn from(s: &fastwake::dispatch::DispatchStats) -> Self {
        fw_prewake_stats {
            prewakes: s.prewakes,
            early: s.prewake_early,
            caught: s.prewake_caught,
            late: s.prewake_late,
            pauses: s.prewake_pauses,
            margin_ns: s.margin_ns,
            reserved: [0; 2],
        }
    }
}

pub struct fw_shared(SharedChannel);
pub struct fw_sender(Sender);
pub struct fw_receiver(Receiver);
pub struct fw_waiter(Waiter);
pub struct fw_dispatcher(fastwake::dispatch::Dispatcher);
pub struct fw_socket(fastwake::source::socket::SocketSource);
pub struct fw_ring(fastwake::source::ring::ExternalRing);
pub struct fw_ring_producer(fastwake::source::ring::RingProducer);
pub struct fw_verbs_cq(fastwake::source::verbs::CallerCq);
pub struct fw_verbs_shared_cq(Demux<SharedCq>);
pub struct fw_verbs_inbox(Inbox<SharedCq>);

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct fw_verbs_stats {
    pub events: u64,
    pub acked: u64,
    pub ack_calls: u64,
    pub arms: u64,
    pub stashed: u64,
}

/// What a shared CQ did (see the header).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct fw_shared_cq_stats {
    pub routed: u64,
    pub unrouted: u64,
    pub pumps: u64,
    pub handed_over: u64,
    pub notices: u64,
    pub rings: u64,
    pub events: u64,
    pub arms: u64,
    pub acked: u64,
    pub reserved: [u64; 3],
}

/// `fw_verbs_shared_cq_create`'s routes, as the header defines them.
pub const FW_ROUTE_QP_NUM: c_int = 0;
pub const FW_ROUTE_WR_ID_HIGH: c_int = 1;

/// `fw_ring_create`'s kinds, as the header defines them.
pub const FW_RING_LEVEL: c_int = 0;
pub const FW_RING_EVENTFD: c_int = 1;
/// OR'ed into a kind: the ring's producer calls `fw_ring_published`.
pub const FW_RING_NOTICES: c_int = 0x100;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = c);
}

/// Run `f`, record a failure's cause, and never let a panic unwind into C.
fn guard(f: impl FnOnce() -> Result<(), Fail>) -> c_int {
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

fn out<T>(p: *mut *mut T, v: T) -> Result<(), Fail> {
    if p.is_null() {
        return Err(Fail::invalid("output pointer is NULL"));
    }
    // SAFETY: p is non-null and, per the header, points to writable storage
    // for one pointer.
    unsafe { *p = Box::into_raw(Box::new(v)) };
    Ok(())
}

fn check_out<T>(p: *mut *mut T) -> Result<(), Fail> {
    if p.is_null() {
        Err(Fail::invalid("output pointer is NULL"))
    } else {
        Ok(())
    }
}

fn obj<'a, T>(p: *mut T) -> Result<&'a mut T, Fail> {
    // SAFETY: non-null pointers come from Box::into_raw in this library and
    // are used by one thread at a time (the header's thread model).
    unsafe { p.as_mut() }.ok_or_else(|| Fail::invalid("object pointer is NULL"))
}

fn dup_fd(fd: c_int) -> Result<Option<OwnedFd>, Fail> {
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
fn wait_for<S: Source + ?Sized>(
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
fn notify_fd_of<S: Source + ?Sized>(src: Option<&S>) -> c_int {
    src.and_then(|s| s.notify_fd())
        .map_or(-1, |f| f.as_raw_fd())
}

/// A `cpu` argument of the header: a CPU number, or -1 for the calling
/// thread's (`None`).
fn cpu_arg(cpu: c_int) -> Result<Option<u32>, Fail> {
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
fn obj_ref<'a, T>(p: *const T) -> Result<&'a T, Fail> {
    // SAFETY: NULL or a live object from this library (the header's
    // contract); only shared access is made through it.
    unsafe { p.as_ref() }.ok_or_else(|| Fail::invalid("object pointer is NULL"))
}

/// `fw_*_stats`: `make` the C struct from the live object `p` and store
/// it at `out`.
fn stats_of<T, S>(p: *const T, out: *mut S, make: impl FnOnce(&T) -> S) -> Result<(), Fail> {
    let o = obj_ref(p)?;
    if out.is_null() {
        return Err(Fail::invalid("stats pointer is NULL"));
    }
    let s = make(o);
    // SAFETY: non-null and writable per the header.
    unsafe { *out = s };
    Ok(())
}

fn destroy<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: created by Box::into_raw here and destroyed once, per the
        // header's contract.
        drop(unsafe { Box::from_raw(p) });
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn fw_abi_version() -> u32 {
    FW_ABI_VERSION
}

#[unsafe(no_mangle)]
pub extern "C" fn fw_last_error() -> *const c_char {
    // The pointer stays valid until this thread's next failing call, as the
    // header promises: the CString lives in thread-local storage.
    LAST.with(|l| l.borrow().as_ptr())
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

/// # Safety
/// `w` is NULL or from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_set_interruptible(w: *mut fw_waiter, on: c_int) -> c_int {
    guard(|| {
        obj(w)?.0.set_interruptible(on != 0);
        Ok(())
    })
}

/// # Safety
/// `mode` is a NUL-terminated string; `w` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_create(mode: *const c_char, w: *mut *mut fw_waiter) -> c_int {
    guard(|| {
        check_out(w)?;
        if mode.is_null() {
            return Err(Fail::invalid("mode is NULL"));
        }
        // SAFETY: non-null, NUL-terminated per the header.
        let s = unsafe { CStr::from_ptr(mode) }
            .to_str()
            .map_err(|_| Fail::invalid("mode is not UTF-8"))?;
        let m: WaitMode = s.parse()?;
        out(w, fw_waiter(Waiter::new(m)))
    })
}

/// # Safety
/// `w` and `rx` from this library; `tag`/`len` NULL or writable; `buf` NULL
/// or `buf_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_wait(
    w: *mut fw_waiter,
    rx: *mut fw_receiver,
    timeout_ns: i64,
    tag: *mut u64,
    buf: *mut c_void,
    buf_len: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        let w = obj(w)?;
        let r = obj(rx)?;
        let m = wait_for(&mut w.0, &mut r.0, timeout_ns)?;
        let p = r.0.payload();
        // SAFETY: each output pointer is NULL or writable per the header;
        // the copy is bounded by buf_len.
        unsafe {
            if !tag.is_null() {
                *tag = m.tag;
            }
            if !len.is_null() {
                *len = p.len();
            }
            if !buf.is_null() {
                std::ptr::copy_nonoverlapping(p.as_ptr(), buf.cast(), p.len().min(buf_len));
            }
        }
        Ok(())
    })
}

/// # Safety
/// `w` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_stats(w: *const fw_waiter, out: *mut fw_wait_stats) -> c_int {
    guard(|| {
        stats_of(w, out, |w| {
            let s = w.0.stats();
            fw_wait_stats {
                completions: s.completions,
                without_sleep: s.without_sleep,
                sleeps: s.sleeps,
                rechecks_hit: s.rechecks_hit,
                spurious: s.spurious,
                spin_skipped_same_cpu: s.spin_skipped_same_cpu,
            }
        })
    })
}

/// # Safety
/// `w` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_prewake_stats(
    w: *const fw_waiter,
    out: *mut fw_prewake_stats,
) -> c_int {
    guard(|| {
        stats_of(w, out, |w| {
            w.0.adaptive_stats()
                .map_or_else(fw_prewake_stats::default, |s| (&s).into())
        })
    })
}

/// # Safety
/// `w` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_dispatch_stats(
    w: *const fw_waiter,
    out: *mut fw_dispatch_wait_stats,
) -> c_int {
    guard(|| {
        stats_of(w, out, |w| {
            let s = w.0.stats();
            fw_dispatch_wait_stats {
                handoffs: s.handoffs,
                relays: s.relays,
                fallbacks: s.dispatch_fallbacks,
                paused: s.dispatch_paused,
                resumed: s.dispatch_resumed,
                reserved: [0; 3],
            }
        })
    })
}

/// # Safety
/// `w` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_waiter_destroy(w: *mut fw_waiter) {
    destroy(w)
}

/// # Safety
/// `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_start(
    cpu: u32,
    idle_after_ns: i64,
    learn_idle: c_int,
    d: *mut *mut fw_dispatcher,
) -> c_int {
    guard(|| {
        check_out(d)?;
        let mut cfg = fastwake::dispatch::Config::new(cpu);
        cfg.idle_after = u64::try_from(idle_after_ns).ok().map(Duration::from_nanos);
        if learn_idle != 0 {
            cfg.learn_idle = Some(fastwake::adaptive::Config::default());
        }
        out(
            d,
            fw_dispatcher(fastwake::dispatch::Dispatcher::start(cfg)?),
        )
    })
}

/// # Safety
/// `d` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_stats(
    d: *const fw_dispatcher,
    out: *mut fw_dispatch_stats,
) -> c_int {
    guard(|| {
        stats_of(d, out, |d| {
            let s = d.0.stats();
            fw_dispatch_stats {
                handoffs: s.handoffs,
                rescued: s.rescued,
                relayed: s.relayed,
                idle_sleeps: s.idle_sleeps,
                paused: s.paused,
                registered: s.registered,
                idle_after_ns: s.idle_after.map_or(-1, |t| t.as_nanos() as i64),
                state: match s.state {
                    fastwake::dispatch::State::Polling => 0,
                    fastwake::dispatch::State::Sleeping => 1,
                    fastwake::dispatch::State::Dead => 2,
                },
                reserved: 0,
            }
        })
    })
}

/// # Safety
/// `d` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_prewake_stats(
    d: *const fw_dispatcher,
    out: *mut fw_prewake_stats,
) -> c_int {
    guard(|| stats_of(d, out, |d| (&d.0.stats()).into()))
}

/// # Safety
/// `d` NULL or from this library; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_notice_stats(
    d: *const fw_dispatcher,
    out: *mut fw_notice_stats,
) -> c_int {
    guard(|| stats_of(d, out, |d| (&d.0.stats()).into()))
}

/// # Safety
/// `d` is NULL or from this library, stopped once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_dispatcher_stop(d: *mut fw_dispatcher) {
    destroy(d)
}

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
        if data.is_null() && len > 0 {
            return Err(Fail::invalid("data is NULL"));
        }
        let d: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: non-null and readable for len bytes per the header.
            unsafe { std::slice::from_raw_parts(data.cast(), len) }
        };
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

/// The caller's `struct ibv_wc` array of `max` entries, or why not.
fn wc_out<'a>(wc: *mut ibv_wc, max: c_int) -> Result<&'a mut [ibv_wc], Fail> {
    if wc.is_null() {
        return Err(Fail::invalid("the work completion array is NULL"));
    }
    if max < 1 {
        return Err(Fail::invalid(format!(
            "max is {max}: room for at least one work completion is needed"
        )));
    }
    // SAFETY: per the header, wc points to max writable struct ibv_wc
    // (whose layout fastwake-verbs-sys checks against verbs.h).
    Ok(unsafe { std::slice::from_raw_parts_mut(wc, max as usize) })
}

fn store_count(n: *mut c_int, v: usize) {
    if !n.is_null() {
        // SAFETY: NULL or writable per the header.
        unsafe { *n = v as c_int };
    }
}

/// # Safety
/// `cq` is a live CQ and `channel` NULL or its channel, both outliving the
/// object (the header's contract); `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_create(
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    out_v: *mut *mut fw_verbs_cq,
) -> c_int {
    guard(|| {
        check_out(out_v)?;
        // SAFETY: the caller's promise above, passed on unchanged;
        // from_raw checks NULL, the channel against the CQ's and the ops.
        let src = unsafe { fastwake::source::verbs::CallerCq::from_raw(cq, channel) }?;
        out(out_v, fw_verbs_cq(src))
    })
}

/// # Safety
/// `w` and `v` from this library; `wc` writable for `max` entries; `n`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_wait(
    w: *mut fw_waiter,
    v: *mut fw_verbs_cq,
    timeout_ns: i64,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let w = obj(w)?;
        let v = obj(v)?;
        let out = wc_out(wc, max)?;
        if !v.0.has_channel() && w.0.mode() != WaitMode::Poll {
            return Err(Fail::invalid(format!(
                "the CQ has no completion channel: only a \"poll\" waiter can wait on it, not \"{}\"",
                w.0.mode()
            )));
        }
        out[0] = wait_for(&mut w.0, &mut v.0, timeout_ns)?;
        let more = v.0.poll(&mut out[1..])?;
        store_count(n, 1 + more);
        Ok(())
    })
}

/// # Safety
/// `v` from this library; `wc` writable for `max` entries; `n` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_poll(
    v: *mut fw_verbs_cq,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let v = obj(v)?;
        let got = v.0.poll(wc_out(wc, max)?)?;
        store_count(n, got);
        Ok(())
    })
}

/// # Safety
/// `v` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_stats(
    v: *const fw_verbs_cq,
    out: *mut fw_verbs_stats,
) -> c_int {
    guard(|| {
        stats_of(v, out, |v| {
            let s = v.0.stats();
            fw_verbs_stats {
                events: s.events,
                acked: s.acked,
                ack_calls: s.ack_calls,
                arms: s.arms,
                stashed: v.0.stashed() as u64,
            }
        })
    })
}

/// # Safety
/// `v` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_cq_destroy(v: *mut fw_verbs_cq) {
    destroy(v)
}

/// # Safety
/// `ctx` NULL or an open context; `vector` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_comp_vector_for_cpu(
    ctx: *mut ibv_context,
    cpu: c_int,
    vector: *mut c_int,
) -> c_int {
    guard(|| {
        if vector.is_null() {
            return Err(Fail::invalid("vector pointer is NULL"));
        }
        let cpu = cpu_arg(cpu)?;
        // SAFETY: ctx is NULL (refused there) or open, per the header.
        let p = unsafe { fastwake::source::verbs::vector_for_cpu(ctx, cpu) }?;
        // SAFETY: non-null (checked) and writable per the header.
        unsafe { *vector = p.vector as c_int };
        Ok(())
    })
}

/// # Safety
/// `ctx` NULL or an open context that stays open until the shared CQ and
/// all its inboxes are destroyed; `out_s` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_create(
    ctx: *mut ibv_context,
    entries: c_int,
    cpu: c_int,
    route: c_int,
    shift: c_int,
    out_s: *mut *mut fw_verbs_shared_cq,
) -> c_int {
    guard(|| {
        check_out(out_s)?;
        if entries < 1 {
            return Err(Fail::invalid(format!(
                "entries is {entries}: room for at least one completion is needed"
            )));
        }
        let cpu = cpu_arg(cpu)?;
        let route = match (route, shift) {
            (FW_ROUTE_QP_NUM, _) => Route::QpNum,
            (FW_ROUTE_WR_ID_HIGH, 0..=63) => Route::WrIdHigh(shift as u32),
            (FW_ROUTE_WR_ID_HIGH, s) => {
                return Err(Fail::invalid(format!(
                    "shift {s}: the owner's key is wr_id >> shift, 0..=63"
                )));
            }
            (r, _) => {
                return Err(Fail::invalid(format!(
                    "route {r}: FW_ROUTE_QP_NUM (0) or FW_ROUTE_WR_ID_HIGH (1)"
                )));
            }
        };
        let cfg = CqConfig {
            entries: entries as u32,
            vector: Vector::ForCpu(cpu),
            ..CqConfig::default()
        };
        // SAFETY: the caller's promise above, passed on unchanged;
        // on_context refuses NULL.
        let demux = unsafe { SharedCq::on_context(ctx, cfg, route) }?;
        out(out_s, fw_verbs_shared_cq(demux))
    })
}

/// # Safety
/// `s` NULL or from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_cq(s: *const fw_verbs_shared_cq) -> *mut ibv_cq {
    match obj_ref(s) {
        Ok(s) => s.0.queue().raw(),
        Err(_) => std::ptr::null_mut(),
    }
}

/// # Safety
/// `s` from this library; `out_i` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_inbox(
    s: *const fw_verbs_shared_cq,
    key: u64,
    out_i: *mut *mut fw_verbs_inbox,
) -> c_int {
    guard(|| {
        check_out(out_i)?;
        let inbox = obj_ref(s)?.0.inbox(key)?;
        out(out_i, fw_verbs_inbox(inbox))
    })
}

/// Copy completions `next` gives into `out` until it gives none or `out`
/// is full; how many.
fn fill_wc(
    out: &mut [ibv_wc],
    mut next: impl FnMut() -> Result<Option<ibv_wc>, Fail>,
) -> Result<usize, Fail> {
    let mut k = 0;
    while k < out.len() {
        match next()? {
            Some(wc) => out[k] = wc,
            None => break,
        }
        k += 1;
    }
    Ok(k)
}

/// # Safety
/// `w` and `i` from this library; `wc` writable for `max` entries; `n`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_inbox_wait(
    w: *mut fw_waiter,
    i: *mut fw_verbs_inbox,
    timeout_ns: i64,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let w = obj(w)?;
        let i = obj(i)?;
        let out = wc_out(wc, max)?;
        out[0] = wait_for(&mut w.0, &mut i.0, timeout_ns)?;
        let more = fill_wc(&mut out[1..], || i.0.try_take())?;
        store_count(n, 1 + more);
        Ok(())
    })
}

/// # Safety
/// `i` from this library; `wc` writable for `max` entries; `n` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_inbox_poll(
    i: *mut fw_verbs_inbox,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let i = obj(i)?;
        let got = fill_wc(wc_out(wc, max)?, || i.0.try_take())?;
        store_count(n, got);
        Ok(())
    })
}

/// # Safety
/// `s` from this library; `wc` writable for `max` entries; `n` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_take_unrouted(
    s: *const fw_verbs_shared_cq,
    wc: *mut ibv_wc,
    max: c_int,
    n: *mut c_int,
) -> c_int {
    store_count(n, 0);
    guard(|| {
        let s = obj_ref(s)?;
        let out = wc_out(wc, max)?;
        let kept = s.0.take_unrouted_at_most(out.len());
        out[..kept.len()].copy_from_slice(&kept);
        store_count(n, kept.len());
        Ok(())
    })
}

/// # Safety
/// `s` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_stats(
    s: *const fw_verbs_shared_cq,
    out: *mut fw_shared_cq_stats,
) -> c_int {
    guard(|| {
        stats_of(s, out, |s| {
            let d = s.0.stats();
            let q = s.0.queue().stats();
            fw_shared_cq_stats {
                routed: d.routed,
                unrouted: d.unrouted,
                pumps: d.pumps,
                handed_over: d.handed_over,
                notices: d.notices,
                rings: d.rings,
                events: q.events,
                arms: q.arms,
                acked: q.acked,
                reserved: [0; 3],
            }
        })
    })
}

/// # Safety
/// `i` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_inbox_destroy(i: *mut fw_verbs_inbox) {
    destroy(i)
}

/// # Safety
/// `s` is NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_verbs_shared_cq_destroy(s: *mut fw_verbs_shared_cq) {
    destroy(s)
}

#[cfg(test)]
mod abi_sizes {
    use super::*;

    /// The same numbers are `_Static_assert`ed by tests/abi.c against the
    /// header: a layout change must change both, and FW_ABI_VERSION.
    #[test]
    fn struct_layouts_match_the_header() {
        assert_eq!(std::mem::size_of::<fw_channel_config>(), 12);
        assert_eq!(std::mem::size_of::<fw_wait_stats>(), 48);
        assert_eq!(
            std::mem::offset_of!(fw_wait_stats, spin_skipped_same_cpu),
            40
        );
        assert_eq!(std::mem::size_of::<fw_dispatch_stats>(), 64);
        assert_eq!(std::mem::offset_of!(fw_dispatch_stats, idle_after_ns), 48);
        assert_eq!(std::mem::offset_of!(fw_dispatch_stats, state), 56);
        assert_eq!(std::mem::size_of::<fw_verbs_stats>(), 40);
        assert_eq!(std::mem::offset_of!(fw_verbs_stats, stashed), 32);
        assert_eq!(std::mem::size_of::<fw_dispatch_wait_stats>(), 64);
        assert_eq!(std::mem::offset_of!(fw_dispatch_wait_stats, reserved), 40);
        assert_eq!(std::mem::size_of::<fw_prewake_stats>(), 64);
        assert_eq!(std::mem::offset_of!(fw_prewake_stats, pauses), 32);
        assert_eq!(std::mem::offset_of!(fw_prewake_stats, margin_ns), 40);
        assert_eq!(std::mem::offset_of!(fw_prewake_stats, reserved), 48);
        assert_eq!(std::mem::size_of::<fw_notice_stats>(), 32);
        assert_eq!(std::mem::offset_of!(fw_notice_stats, late_notices), 16);
        assert_eq!(std::mem::size_of::<fw_shared_cq_stats>(), 96);
        assert_eq!(std::mem::offset_of!(fw_shared_cq_stats, events), 48);
        assert_eq!(std::mem::offset_of!(fw_shared_cq_stats, reserved), 72);
        // fw_verbs_cq_wait fills the caller's struct ibv_wc array.
        assert_eq!(std::mem::size_of::<ibv_wc>(), 48);
    }

    /// A bit pattern no counter has, to see that a call wrote every field.
    const JUNK: fw_prewake_stats = fw_prewake_stats {
        prewakes: u64::MAX,
        early: u64::MAX,
        caught: u64::MAX,
        late: u64::MAX,
        pauses: u64::MAX,
        margin_ns: u64::MAX,
        reserved: [u64::MAX; 2],
    };

    fn waiter(mode: &CStr) -> *mut fw_waiter {
        let mut w = std::ptr::null_mut();
        // SAFETY: a NUL-terminated mode and a writable out pointer.
        assert_eq!(unsafe { fw_waiter_create(mode.as_ptr(), &mut w) }, 0);
        w
    }

    #[test]
    fn waiter_prewake_stats_are_zero_outside_adaptive_and_refuse_null() {
        let mut out = JUNK;
        // SAFETY: a NULL waiter (refused) and a writable `out`.
        let rc = unsafe { fw_waiter_prewake_stats(std::ptr::null(), &mut out) };
        assert_eq!(rc, libc::EINVAL);
        assert_eq!(out, JUNK, "a failed call wrote the output");
        for mode in [
            c"interrupt",
            c"hybrid:20us",
            c"poll",
            c"dispatch",
            c"adaptive",
        ] {
            let w = waiter(mode);
            let mut out = JUNK;
            // SAFETY: a live waiter from fw_waiter_create and a writable `out`.
            let rc = unsafe { fw_waiter_prewake_stats(w, &mut out) };
            assert_eq!(rc, 0);
            assert_eq!(out, fw_prewake_stats::default(), "{mode:?}");
            // SAFETY: a live waiter and a NULL `out` (refused).
            let rc = unsafe { fw_waiter_prewake_stats(w, std::ptr::null_mut()) };
            assert_eq!(rc, libc::EINVAL);
            // SAFETY: from fw_waiter_create, destroyed once.
            unsafe { fw_waiter_destroy(w) };
        }
    }

    #[test]
    fn dispatcher_prewake_stats_are_zero_without_learn_idle_and_refuse_null() {
        let mut out = JUNK;
        // SAFETY: a NULL dispatcher (refused) and a writable `out`.
        let rc = unsafe { fw_dispatcher_prewake_stats(std::ptr::null(), &mut out) };
        assert_eq!(rc, libc::EINVAL);
        assert_eq!(out, JUNK, "a failed call wrote the output");
        let mut d = std::ptr::null_mut();
        // Idle at once (idle_after 0): it sleeps instead of polling CPU 0.
        // SAFETY: a writable out pointer.
        let rc = unsafe { fw_dispatcher_start(0, 0, 0, &mut d) };
        assert_eq!(rc, 0);
        // SAFETY: a live dispatcher from fw_dispatcher_start and a writable
        // `out`.
        let rc = unsafe { fw_dispatcher_prewake_stats(d, &mut out) };
        assert_eq!(rc, 0);
        assert_eq!(out, fw_prewake_stats::default());
        // SAFETY: a live dispatcher and a NULL `out` (refused).
        let rc = unsafe { fw_dispatcher_prewake_stats(d, std::ptr::null_mut()) };
        assert_eq!(rc, libc::EINVAL);
        // SAFETY: from fw_dispatcher_start, stopped once.
        unsafe { fw_dispatcher_stop(d) };
    }

    #[test]
    fn panics_become_eio_with_a_cause() {
        let rc = guard(|| panic!("boom"));
        assert_eq!(rc, libc::EIO);
        // SAFETY: fw_last_error returns a valid NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(fw_last_error()) };
        assert!(msg.to_str().unwrap().contains("panic"));
    }
}

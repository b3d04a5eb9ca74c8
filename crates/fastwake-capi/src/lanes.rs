//! Lanes: an endpoint of a latency lane and a bulk lane over TCP.

use crate::boundary::{
    bytes_arg, check_out, destroy, guard, obj_ref, or, out, out_value, stats_of, text,
};
use fastwake::Fail;
use fastwake::lanes::{Batch, Class, Config, Endpoint, Layout, Listener};
use std::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;
use std::time::Duration;

pub struct fw_lanes(Endpoint);
pub struct fw_lanes_listener(Listener);

/// `fw_lanes_config`: zero in a field means its default.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fw_lanes_config {
    pub layout: u32,
    pub no_batching: u32,
    pub threshold: u64,
    pub chunk: u64,
    pub polite_chunk: u64,
    pub max_message: u64,
    pub batch_messages: u32,
    pub batch_delay_ns: u32,
    pub batch_bytes: u64,
    pub latency_mode: *const c_char,
    pub bulk_mode: *const c_char,
}

/// `fw_lanes_stats`: one lane's counters.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct fw_lanes_stats {
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub sendmsgs: u64,
    pub more: u64,
    pub batched: u64,
    pub polite: u64,
    pub chunked: u64,
    pub queued: u64,
    pub room_polls: u64,
    pub queued_bytes: u64,
    pub received: u64,
    pub received_bytes: u64,
    pub turn_waits: u64,
    pub handed: u64,
}

const LAYOUT_LANES: u32 = 0;
const LAYOUT_SHARED: u32 = 1;
const LATENCY: c_int = 0;
const BULK: c_int = 1;
const BY_SIZE: c_int = 2;
const MORE: c_int = 0x100;

/// The Rust config of a C one (NULL: every default).
fn config(c: *const fw_lanes_config) -> Result<Config, Fail> {
    let d = Config::default();
    // SAFETY: NULL or a readable struct per the header.
    let Some(c) = (unsafe { c.as_ref() }) else {
        return Ok(d);
    };
    let layout = match c.layout {
        LAYOUT_LANES => Layout::Lanes,
        LAYOUT_SHARED => Layout::Shared,
        l => return Err(Fail::invalid(format!("lanes: unknown layout {l}"))),
    };
    let mode = |p, default| -> Result<fastwake::WaitMode, Fail> {
        match text(p, "a lane's wait mode")? {
            Some(m) => m.parse(),
            None => Ok(default),
        }
    };
    let i10 = Batch::I10;
    let batch = (c.no_batching == 0).then(|| Batch {
        messages: or(c.batch_messages as usize, i10.messages),
        bytes: or(c.batch_bytes as usize, i10.bytes),
        delay: if c.batch_delay_ns == 0 {
            i10.delay
        } else {
            Duration::from_nanos(c.batch_delay_ns.into())
        },
    });
    let config = Config {
        layout,
        threshold: or(c.threshold as usize, d.threshold),
        chunk: or(c.chunk as usize, d.chunk),
        polite_chunk: or(c.polite_chunk as usize, d.polite_chunk),
        batch,
        latency_mode: mode(c.latency_mode, d.latency_mode)?,
        bulk_mode: mode(c.bulk_mode, d.bulk_mode)?,
        max_message: or(c.max_message as usize, d.max_message),
    };
    config.validate()?;
    Ok(config)
}

fn addr(p: *const c_char) -> Result<SocketAddr, Fail> {
    let s = text(p, "address")?.ok_or_else(|| Fail::invalid("address is NULL"))?;
    s.parse()
        .map_err(|_| Fail::invalid(format!("'{s}' is not an IP:PORT address")))
}

fn class(lane: c_int) -> Result<Class, Fail> {
    match lane {
        LATENCY => Ok(Class::Latency),
        BULK => Ok(Class::Bulk),
        l => Err(Fail::invalid(format!(
            "lane {l}: FW_LANE_LATENCY (0) or FW_LANE_BULK (1)"
        ))),
    }
}

/// # Safety
/// `address` NUL-terminated; `c` NULL or readable; `out_l` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_listen(
    address: *const c_char,
    c: *const fw_lanes_config,
    out_l: *mut *mut fw_lanes_listener,
) -> c_int {
    guard(|| {
        check_out(out_l)?;
        let l = Listener::bind(addr(address)?, config(c)?)?;
        out(out_l, fw_lanes_listener(l))
    })
}

/// # Safety
/// `l` from this library; `port` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_listener_port(
    l: *const fw_lanes_listener,
    port: *mut u16,
) -> c_int {
    guard(|| {
        let l = obj_ref(l)?;
        let port = out_value(port, "port")?;
        port.set(l.0.local_addr()?.port());
        Ok(())
    })
}

/// # Safety
/// `l` from this library; `out_e` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_accept(
    l: *const fw_lanes_listener,
    out_e: *mut *mut fw_lanes,
) -> c_int {
    guard(|| {
        check_out(out_e)?;
        let e = obj_ref(l)?.0.accept()?;
        out(out_e, fw_lanes(e))
    })
}

/// # Safety
/// `l` NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_listener_destroy(l: *mut fw_lanes_listener) {
    destroy(l)
}

/// # Safety
/// `address` NUL-terminated; `c` NULL or readable; `out_e` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_connect(
    address: *const c_char,
    c: *const fw_lanes_config,
    out_e: *mut *mut fw_lanes,
) -> c_int {
    guard(|| {
        check_out(out_e)?;
        let e = fastwake::lanes::connect(addr(address)?, config(c)?)?;
        out(out_e, fw_lanes(e))
    })
}

/// # Safety
/// `e` from this library; `data` readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_send(
    e: *const fw_lanes,
    data: *const c_void,
    len: usize,
    lane: c_int,
) -> c_int {
    guard(|| {
        let e = obj_ref(e)?;
        // SAFETY: readable for len bytes per the header.
        let d = unsafe { bytes_arg(data, len) }?;
        let more = lane & MORE != 0;
        let lane = lane & !MORE;
        let class = if lane == BY_SIZE {
            e.0.class_of(len)
        } else {
            class(lane)?
        };
        if more {
            e.0.send_more_as(d, class).map(drop)
        } else {
            e.0.send_as(d, class).map(drop)
        }
    })
}

/// # Safety
/// `e` from this library; `buf` NULL or writable for `cap` bytes; `len`
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_recv(
    e: *const fw_lanes,
    lane: c_int,
    timeout_ns: i64,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        let e = obj_ref(e)?;
        let class = class(lane)?;
        let copy = |m: &[u8]| {
            if !buf.is_null() {
                // SAFETY: writable for cap bytes per the header; the copy
                // is bounded by it.
                unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), buf.cast(), m.len().min(cap)) };
            }
            if !len.is_null() {
                // SAFETY: non-null and writable per the header.
                unsafe { *len = m.len() };
            }
            m.len()
        };
        let whole = if timeout_ns < 0 {
            e.0.recv_with(class, copy)?
        } else {
            e.0.recv_timeout_with(class, Duration::from_nanos(timeout_ns as u64), copy)?
                .ok_or_else(Fail::timed_out)?
        };
        if whole > cap {
            return Err(Fail::new(
                libc::EMSGSIZE,
                format!("a {whole}-byte message did not fit the {cap}-byte buffer (truncated)"),
            ));
        }
        Ok(())
    })
}

/// # Safety
/// `e` from this library; `out` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_buffered(
    e: *const fw_lanes,
    lane: c_int,
    out: *mut c_int,
) -> c_int {
    guard(|| {
        let e = obj_ref(e)?;
        let class = class(lane)?;
        out_value(out, "out")?.set(c_int::from(e.0.buffered(class)));
        Ok(())
    })
}

/// # Safety
/// `e` from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_flush(e: *const fw_lanes) -> c_int {
    guard(|| obj_ref(e)?.0.flush())
}

/// # Safety
/// `e` from this library; `out_s` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_stats(
    e: *const fw_lanes,
    lane: c_int,
    out_s: *mut fw_lanes_stats,
) -> c_int {
    guard(|| {
        let class = class(lane)?;
        stats_of(e, out_s, |e| {
            let s = e.0.stats(class);
            fw_lanes_stats {
                messages_sent: s.send.messages,
                bytes_sent: s.send.bytes,
                sendmsgs: s.send.sendmsgs,
                more: s.send.more,
                batched: s.send.batched,
                polite: s.send.polite,
                chunked: s.send.chunked,
                queued: s.send.queued,
                room_polls: s.send.room_polls,
                queued_bytes: s.send.queued_bytes,
                received: s.received,
                received_bytes: s.received_bytes,
                turn_waits: s.send.turn_waits,
                handed: s.send.handed,
            }
        })
    })
}

/// # Safety
/// `e` NULL or from this library, destroyed once, by one thread while no
/// other uses it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_lanes_destroy(e: *mut fw_lanes) {
    destroy(e)
}

//! Fetch: a server's table of objects in RDMA-readable memory, and clients
//! that fetch by key by READ, READ-2 or RPC (in this process).

use crate::boundary::{
    bytes_arg, check_out, destroy, guard, obj, obj_ref, or, out, stats_of, text,
};
use fastwake::Fail;
use fastwake::fetch::{self, Client, ClientConfig, Path, Server, ServerConfig};
use fastwake::source::verbs::Device;
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

pub struct fw_fetch_server {
    server: Server,
    dev: Arc<Device>,
}
pub struct fw_fetch_client(Client);

/// `fw_fetch_config`: zero (or NULL) in a field means its default.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fw_fetch_config {
    pub device: *const c_char,
    pub server_mode: *const c_char,
    pub client_mode: *const c_char,
    pub path: *const c_char,
    pub buckets: u64,
    pub capacity: u64,
    pub max_object: u64,
    pub timeout_ns: u64,
    pub pin_server: u32,
    pub server_cpu: u32,
    pub retries: u32,
    pub cache: u32,
}

/// `fw_fetch_stats`: a client's counters.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct fw_fetch_stats {
    pub read: u64,
    pub read2: u64,
    pub rpc: u64,
    pub missing: u64,
    pub torn: u64,
    pub moved: u64,
    pub fallbacks: u64,
    pub timeouts: u64,
    pub late: u64,
    pub load_reads: u64,
    pub switches: u64,
    pub probes: u64,
}

/// The config (NULL: every default).
fn config(c: *const fw_fetch_config) -> Result<Option<fw_fetch_config>, Fail> {
    // SAFETY: NULL or a readable struct per the header.
    Ok(unsafe { c.as_ref() }.copied())
}

fn server_config(c: Option<fw_fetch_config>) -> Result<ServerConfig, Fail> {
    let d = ServerConfig::default();
    let Some(c) = c else { return Ok(d) };
    let cfg = ServerConfig {
        buckets: or(c.buckets as usize, d.buckets),
        capacity: or(c.capacity as usize, d.capacity),
        max_object: or(c.max_object as usize, d.max_object),
        mode: match text(c.server_mode, "fetch: server_mode")? {
            Some(m) => m.parse()?,
            None => d.mode,
        },
        cpu: (c.pin_server != 0).then_some(c.server_cpu),
    };
    cfg.validate()?;
    Ok(cfg)
}

fn client_config(c: Option<fw_fetch_config>) -> Result<ClientConfig, Fail> {
    let d = ClientConfig::default();
    let Some(c) = c else { return Ok(d) };
    let cfg = ClientConfig {
        policy: match text(c.path, "fetch: path")? {
            Some(p) => p.parse()?,
            None => d.policy,
        },
        mode: match text(c.client_mode, "fetch: client_mode")? {
            Some(m) => m.parse()?,
            None => d.mode,
        },
        timeout: if c.timeout_ns == 0 {
            d.timeout
        } else {
            Duration::from_nanos(c.timeout_ns)
        },
        retries: or(c.retries, d.retries),
        cache: or(c.cache as usize, d.cache),
    };
    cfg.validate()?;
    Ok(cfg)
}

/// # Safety
/// `c` NULL or readable; `out_s` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_fetch_server_create(
    c: *const fw_fetch_config,
    out_s: *mut *mut fw_fetch_server,
) -> c_int {
    guard(|| {
        check_out(out_s)?;
        let c = config(c)?;
        let scfg = server_config(c)?;
        let name = match c {
            Some(c) => text(c.device, "fetch: device")?,
            None => None,
        };
        let dev = Arc::new(Device::open(name, None)?);
        let server = Server::new(&dev, scfg)?;
        out(out_s, fw_fetch_server { server, dev })
    })
}

/// # Safety
/// `s` from this library; `data` readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_fetch_put(
    s: *const fw_fetch_server,
    key: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(|| {
        let s = obj_ref(s)?;
        // SAFETY: readable for len bytes per the header.
        let d = unsafe { bytes_arg(data, len) }?;
        s.server.put(key, d)
    })
}

/// # Safety
/// `s` from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_fetch_remove(s: *const fw_fetch_server, key: u64) -> c_int {
    guard(|| {
        if obj_ref(s)?.server.remove(key) {
            Ok(())
        } else {
            Err(Fail::new(libc::ENOENT, format!("fetch: no key {key}")))
        }
    })
}

/// # Safety
/// `s` from this library; `c` NULL or readable; `out_c` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_fetch_client_create(
    s: *const fw_fetch_server,
    c: *const fw_fetch_config,
    out_c: *mut *mut fw_fetch_client,
) -> c_int {
    guard(|| {
        check_out(out_c)?;
        let s = obj_ref(s)?;
        let cfg = client_config(config(c)?)?;
        let client = fetch::connect(&s.server, &s.dev, cfg)?;
        out(out_c, fw_fetch_client(client))
    })
}

const BY_POLICY: c_int = -1;

fn path_arg(p: c_int) -> Result<Option<Path>, Fail> {
    match p {
        BY_POLICY => Ok(None),
        0 => Ok(Some(Path::Read)),
        1 => Ok(Some(Path::Read2)),
        2 => Ok(Some(Path::Rpc)),
        _ => Err(Fail::invalid(format!(
            "fetch: path {p}: FW_FETCH_BY_POLICY (-1), FW_FETCH_READ (0), FW_FETCH_READ2 (1) or FW_FETCH_RPC (2)"
        ))),
    }
}

/// # Safety
/// `c` from this library, used by one thread at a time; `buf` NULL or
/// writable for `cap` bytes; `len` and `took` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_fetch_get(
    c: *mut fw_fetch_client,
    key: u64,
    path: c_int,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
    took: *mut c_int,
) -> c_int {
    guard(|| {
        let c = obj(c)?;
        let p = path_arg(path)?;
        let mut data = Vec::new();
        let (found, by) = c.0.fetch_by(key, p, &mut data)?;
        if !took.is_null() {
            // SAFETY: non-null and writable per the header.
            unsafe { *took = by as c_int };
        }
        if !found {
            return Err(Fail::new(libc::ENOENT, format!("fetch: no key {key}")));
        }
        if !buf.is_null() {
            // SAFETY: writable for cap bytes per the header; the copy is
            // bounded by it.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast(), data.len().min(cap))
            };
        }
        if !len.is_null() {
            // SAFETY: non-null and writable per the header.
            unsafe { *len = data.len() };
        }
        if data.len() > cap {
            return Err(Fail::new(
                libc::EMSGSIZE,
                format!(
                    "fetch: a {}-byte object did not fit the {cap}-byte buffer (truncated)",
                    data.len()
                ),
            ));
        }
        Ok(())
    })
}

/// # Safety
/// `c` from this library; `out_s` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_fetch_client_stats(
    c: *const fw_fetch_client,
    out_s: *mut fw_fetch_stats,
) -> c_int {
    guard(|| {
        stats_of(c, out_s, |c| {
            let s = c.0.stats();
            let ch = c.0.chooser();
            let (mut switches, mut probes) = (0, 0);
            for class in 0..fetch::chooser::CLASSES {
                let cs = ch.stats(class);
                switches += cs.switches;
                probes += cs.probes.iter().sum::<u64>();
            }
            fw_fetch_stats {
                read: s.fetches[0],
                read2: s.fetches[1],
                rpc: s.fetches[2],
                missing: s.missing,
                torn: s.torn,
                moved: s.moved,
                fallbacks: s.fallbacks,
                timeouts: s.timeouts,
                late: s.late,
                load_reads: s.load_reads,
                switches,
                probes,
            }
        })
    })
}

/// # Safety
/// `c` NULL or from this library, destroyed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_fetch_client_destroy(c: *mut fw_fetch_client) {
    destroy(c)
}

/// # Safety
/// `s` NULL or from this library, destroyed once (its clients' fetches
/// fail from then on).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_fetch_server_destroy(s: *mut fw_fetch_server) {
    destroy(s)
}

//! Control path: opening a device, its protection domain, port and GID.

use super::loader::{Verbs, verbs};
use super::sys::*;
use crate::{Fail, Result};
use std::ffi::CStr;

/// An opened verbs device with one protection domain, on one port (1
/// unless [`Device::open_port`] chose another).
pub struct Device {
    pub(crate) lib: &'static Verbs,
    pub(crate) ctx: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    name: String,
    port: u8,
    port_attr: ibv_port_attr,
    gid_index: u8,
    gid: ibv_gid,
}

// SAFETY: libibverbs contexts and PDs are thread-safe (the library and every
// provider lock internally); Device only hands out the raw pointers to its own
// verbs calls.
unsafe impl Send for Device {}
// SAFETY: as above; Device has no interior mutability of its own.
unsafe impl Sync for Device {}

/// Names of the verbs devices present (empty when none).
pub fn device_names() -> Result<Vec<String>> {
    let lib = verbs()?;
    let mut n = 0;
    // SAFETY: n is a valid out-pointer; the list is freed below.
    let list = unsafe { (lib.get_device_list)(&mut n) };
    if list.is_null() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: list holds n valid device pointers.
        let d = unsafe { *list.add(i) };
        // SAFETY: get_device_name returns a NUL-terminated name owned by d.
        let name = unsafe { CStr::from_ptr((lib.get_device_name)(d)) };
        out.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: list came from get_device_list and is freed once.
    unsafe { (lib.free_device_list)(list) };
    Ok(out)
}

impl Device {
    /// Open `name` (or the first device when `None`), port 1, and pick a GID:
    /// `gid_index`, or on RoCE the first IPv4-mapped one among 0..8 (RoCE v2
    /// on rxe and mlx5 with an IPv4 address).
    pub fn open(name: Option<&str>, gid_index: Option<u8>) -> Result<Device> {
        Device::open_port(name, 1, gid_index)
    }

    /// [`Device::open`] on port `port` (perftest's `-i`): an error line
    /// when the device has no such port, the port is not active, or
    /// `gid_index` is beyond the port's GID table or holds no GID.
    pub fn open_port(name: Option<&str>, port: u8, gid_index: Option<u8>) -> Result<Device> {
        let lib = verbs()?;
        if port == 0 {
            return Err(Fail::invalid("RDMA port numbers start at 1"));
        }
        let mut n = 0;
        // SAFETY: n is a valid out-pointer; the list is freed below.
        let list = unsafe { (lib.get_device_list)(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: list came from get_device_list.
                unsafe { (lib.free_device_list)(list) };
            }
            return Err(Fail::new(
                libc::ENODEV,
                "no RDMA device found (no /dev/infiniband/uverbs*: load a driver, e.g. rdma_rxe, and add a link)",
            ));
        }
        let mut chosen: *mut ibv_device = std::ptr::null_mut();
        let mut names = Vec::new();
        for i in 0..n as usize {
            // SAFETY: list holds n valid device pointers.
            let d = unsafe { *list.add(i) };
            // SAFETY: a NUL-terminated name owned by d.
            let dn = unsafe { CStr::from_ptr((lib.get_device_name)(d)) }
                .to_string_lossy()
                .into_owned();
            if chosen.is_null() && name.is_none_or(|w| w == dn) {
                chosen = d;
            }
            names.push(dn);
        }
        let r = if chosen.is_null() {
            Err(Fail::new(
                libc::ENODEV,
                format!(
                    "RDMA device '{}' not found (present: {})",
                    name.unwrap_or(""),
                    names.join(", ")
                ),
            ))
        } else {
            // SAFETY: chosen is a device from the live list.
            let ctx = unsafe { (lib.open_device)(chosen) };
            if ctx.is_null() {
                Err(Fail::new(
                    errno(),
                    format!("ibv_open_device: {}", std::io::Error::last_os_error()),
                ))
            } else {
                Ok(ctx)
            }
        };
        // SAFETY: freeing the list does not close opened devices.
        unsafe { (lib.free_device_list)(list) };
        let ctx = r?;
        let dev_name = match name {
            Some(s) => s.to_string(),
            None => names[0].clone(),
        };
        // SAFETY: ctx is an open context.
        let pd = unsafe { (lib.alloc_pd)(ctx) };
        if pd.is_null() {
            let e = Fail::new(errno(), "ibv_alloc_pd failed");
            // SAFETY: ctx is open and owns nothing yet.
            unsafe { (lib.close_device)(ctx) };
            return Err(e);
        }
        let mut dev = Device {
            lib,
            ctx,
            pd,
            name: dev_name,
            port,
            port_attr: ibv_port_attr::default(),
            gid_index: 0,
            gid: ibv_gid::default(),
        };
        // SAFETY: ctx is open; port_attr is a zeroed full-size struct, larger
        // than the compat prefix the exported ibv_query_port fills.
        let rc = unsafe { (lib.query_port)(ctx, dev.port, &mut dev.port_attr) };
        if rc != 0 {
            return Err(Fail::new(
                libc::EINVAL,
                format!(
                    "{} has no port {port} (ibv_query_port: {})",
                    dev.name,
                    std::io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        if dev.port_attr.state != IBV_PORT_ACTIVE {
            return Err(Fail::new(
                libc::ENETDOWN,
                format!(
                    "{} port {port} is not active (state {})",
                    dev.name, dev.port_attr.state
                ),
            ));
        }
        if let Some(g) = gid_index {
            let len = dev.port_attr.gid_tbl_len.max(0);
            let bad = |why: String| {
                Fail::new(
                    libc::EINVAL,
                    format!("GID index {g} of {} port {port}: {why}", dev.name),
                )
            };
            if i32::from(g) >= len {
                return Err(bad(format!("the port's GID table has {len} entries")));
            }
            let gid = dev
                .query_gid(g)
                .map_err(|_| bad("ibv_query_gid failed".into()))?;
            if gid.raw == [0; 16] {
                return Err(bad("no GID there (empty entry)".into()));
            }
        }
        let pick = match gid_index {
            Some(g) => Some(g),
            None if dev.is_roce() => (0..8u8).find(|&i| {
                dev.query_gid(i)
                    .is_ok_and(|g| g.raw[..10] == [0; 10] && g.raw[10..12] == [0xff, 0xff])
            }),
            None => Some(0),
        };
        let idx = pick.ok_or_else(|| {
            Fail::new(
                libc::EADDRNOTAVAIL,
                format!(
                    "{}: no IPv4 RoCE GID among indexes 0-7 (give one explicitly)",
                    dev.name
                ),
            )
        })?;
        dev.gid = dev.query_gid(idx)?;
        dev.gid_index = idx;
        Ok(dev)
    }

    fn query_gid(&self, idx: u8) -> Result<ibv_gid> {
        let mut g = ibv_gid::default();
        // SAFETY: ctx is open; g is a valid out-pointer.
        let rc = unsafe { (self.lib.query_gid)(self.ctx, self.port, idx as i32, &mut g) };
        if rc != 0 {
            return Err(Fail::new(
                libc::EINVAL,
                format!("ibv_query_gid({idx}) failed"),
            ));
        }
        Ok(g)
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Completion vectors the device has.
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: ctx is an open context; the field is set at open.
        unsafe { (*self.ctx).num_comp_vectors.max(0) as u32 }
    }

    /// True for RoCE (Ethernet link layer): addressing needs a GRH.
    pub fn is_roce(&self) -> bool {
        self.port_attr.link_layer == IBV_LINK_LAYER_ETHERNET
    }

    /// Attributes of the port used.
    pub fn port_attr(&self) -> &ibv_port_attr {
        &self.port_attr
    }

    /// The port number used.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The GID index and GID used for addressing.
    pub fn gid(&self) -> (u8, ibv_gid) {
        (self.gid_index, self.gid)
    }

    /// The raw context (for callers that need a verb fastwake does not wrap).
    pub fn context(&self) -> *mut ibv_context {
        self.ctx
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        super::monitor::forget_context(self.ctx as usize);
        // SAFETY: pd and ctx were created by this Device and every object on
        // them (CQs, QPs, MRs) holds an Arc<Device>, so they are gone.
        unsafe {
            (self.lib.dealloc_pd)(self.pd);
            (self.lib.close_device)(self.ctx);
        }
    }
}

pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

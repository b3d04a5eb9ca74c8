//! The real libibverbs entry points, by symbol version.
//!
//! A program built against rdma-core binds `ibv_*@IBVERBS_1.1`; the shim's
//! unversioned definitions interpose those, and forward to exactly that
//! version with `dlvsym(RTLD_NEXT, name, "IBVERBS_1.1")` (the `@IBVERBS_1.0`
//! twins take pre-2016 struct layouts and are never what the shim wants).

use fastwake_verbs_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_device};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

pub type OpenDeviceFn = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
pub type CloseDeviceFn = unsafe extern "C" fn(*mut ibv_context) -> c_int;
pub type GetDeviceNameFn = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
pub type CreateCqFn = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
pub type DestroyCqFn = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
pub type GetCqEventFn =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
pub type AckCqEventsFn = unsafe extern "C" fn(*mut ibv_cq, u32);
pub type CreateCompChannelFn = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
pub type DestroyCompChannelFn = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
pub type Mlx5dvInitObjFn = unsafe extern "C" fn(*mut c_void, u64) -> c_int;

/// One versioned symbol, resolved once.
pub struct VSym {
    name: &'static CStr,
    version: Option<&'static CStr>,
    /// The library that defines it, for programs that load it locally.
    lib: &'static CStr,
    addr: AtomicUsize,
}

const LIBIBVERBS: &CStr = c"libibverbs.so.1";

impl VSym {
    pub const fn new(name: &'static CStr, version: Option<&'static CStr>) -> VSym {
        VSym::in_lib(name, version, LIBIBVERBS)
    }

    const fn in_lib(
        name: &'static CStr,
        version: Option<&'static CStr>,
        lib: &'static CStr,
    ) -> VSym {
        VSym {
            name,
            version,
            lib,
            addr: AtomicUsize::new(0),
        }
    }

    /// The address, or 0 when no later object defines it.
    pub fn get(&self) -> usize {
        let a = self.addr.load(Ordering::Relaxed);
        if a != 0 {
            return a;
        }
        let mut p = self.lookup(libc::RTLD_NEXT);
        if p == 0 {
            // A library that dlopens its verbs with RTLD_LOCAL (UCX's
            // libuct_ib module) binds to these hooks through the global
            // scope, but RTLD_NEXT does not see its libibverbs: look in the
            // already loaded library itself (never loading one). Without
            // this every verbs call of such a program failed with ENOSYS
            // under the shim: UCX found no RDMA device.
            // SAFETY: NUL-terminated names; RTLD_NOLOAD only returns an
            // already loaded object, whose reference is dropped at once
            // (it stays loaded: its loader holds it).
            let h = unsafe { libc::dlopen(self.lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
            if !h.is_null() {
                p = self.lookup(h);
                // SAFETY: the handle dlopen just returned.
                unsafe { libc::dlclose(h) };
            }
        }
        self.addr.store(p, Ordering::Relaxed);
        p
    }

    fn lookup(&self, handle: *mut std::ffi::c_void) -> usize {
        // SAFETY: a valid handle (RTLD_NEXT or a live dlopen handle) and
        // NUL-terminated names.
        (unsafe {
            match self.version {
                Some(v) => libc::dlvsym(handle, self.name.as_ptr(), v.as_ptr()),
                None => libc::dlsym(handle, self.name.as_ptr()),
            }
        }) as usize
    }
}

const V11: Option<&CStr> = Some(c"IBVERBS_1.1");
/// The completion-channel calls have no 1.1 twin: their only version.
const V10: Option<&CStr> = Some(c"IBVERBS_1.0");

pub static OPEN_DEVICE: VSym = VSym::new(c"ibv_open_device", V11);
pub static CLOSE_DEVICE: VSym = VSym::new(c"ibv_close_device", V11);
pub static GET_DEVICE_NAME: VSym = VSym::new(c"ibv_get_device_name", V11);
pub static CREATE_CQ: VSym = VSym::new(c"ibv_create_cq", V11);
pub static DESTROY_CQ: VSym = VSym::new(c"ibv_destroy_cq", V11);
pub static GET_CQ_EVENT: VSym = VSym::new(c"ibv_get_cq_event", V11);
pub static ACK_CQ_EVENTS: VSym = VSym::new(c"ibv_ack_cq_events", V11);
pub static CREATE_COMP_CHANNEL: VSym = VSym::new(c"ibv_create_comp_channel", V10);
pub static DESTROY_COMP_CHANNEL: VSym = VSym::new(c"ibv_destroy_comp_channel", V10);
pub static MLX5DV_INIT_OBJ: VSym = VSym::in_lib(c"mlx5dv_init_obj", None, c"libmlx5.so.1");

/// Resolve all (from the library constructor). libibverbs may not be
/// loaded at all: then every address stays 0 and the hooks are never
/// reached (nothing calls them) or fail like a missing symbol would.
pub fn resolve() {
    for s in [
        &OPEN_DEVICE,
        &CLOSE_DEVICE,
        &GET_DEVICE_NAME,
        &CREATE_CQ,
        &DESTROY_CQ,
        &GET_CQ_EVENT,
        &ACK_CQ_EVENTS,
        &MLX5DV_INIT_OBJ,
        &CREATE_COMP_CHANNEL,
        &DESTROY_COMP_CHANNEL,
    ] {
        s.get();
    }
}

macro_rules! typed {
    ($f:ident, $s:ident, $t:ty) => {
        /// The real function (None when libibverbs does not define it).
        pub fn $f() -> Option<$t> {
            let a = $s.get();
            // SAFETY: a non-zero address of the symbol with this name and
            // version, whose C signature is $t (verbs.h).
            (a != 0).then(|| unsafe { std::mem::transmute::<usize, $t>(a) })
        }
    };
}

typed!(open_device, OPEN_DEVICE, OpenDeviceFn);
typed!(close_device, CLOSE_DEVICE, CloseDeviceFn);
typed!(get_device_name, GET_DEVICE_NAME, GetDeviceNameFn);
typed!(create_cq, CREATE_CQ, CreateCqFn);
typed!(destroy_cq, DESTROY_CQ, DestroyCqFn);
typed!(get_cq_event, GET_CQ_EVENT, GetCqEventFn);
typed!(mlx5dv_init_obj, MLX5DV_INIT_OBJ, Mlx5dvInitObjFn);
typed!(
    create_comp_channel,
    CREATE_COMP_CHANNEL,
    CreateCompChannelFn
);
typed!(
    destroy_comp_channel,
    DESTROY_COMP_CHANNEL,
    DestroyCompChannelFn
);

/// The real `ibv_ack_cq_events`. Only called for CQs the shim manages,
/// which exist only if libibverbs is loaded.
pub fn ack_cq_events() -> AckCqEventsFn {
    let a = ACK_CQ_EVENTS.get();
    assert!(a != 0, "ibv_ack_cq_events resolved");
    // SAFETY: as in `typed!`.
    unsafe { std::mem::transmute::<usize, AckCqEventsFn>(a) }
}

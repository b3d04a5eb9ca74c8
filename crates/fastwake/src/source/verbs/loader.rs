//! Loading libibverbs at run time.
//!
//! fastwake links nothing from rdma-core: the library, the CLI and the tests
//! build and run on hosts without it. The first verbs call dlopens
//! `libibverbs.so.1` (into the global scope) and resolves each entry point
//! checking its symbol version (`dlvsym`), then binds it through the global
//! scope as the dynamic linker binds a C program built against rdma-core: an
//! `LD_PRELOAD` interposer such as `libfastwake_preload.so` applies to
//! fastwake's own calls as it does to any program's.
//! A missing library or symbol becomes one [`Fail`] line, never a loader
//! error.

use super::sys::*;
use crate::{Fail, Result};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// The libibverbs entry points fastwake uses (control path only: the data
/// path goes through `ibv_context_ops`, as verbs.h's inline wrappers do).
#[allow(missing_docs)]
pub struct Verbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, u32),
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
}

static VERBS: OnceLock<std::result::Result<Verbs, Fail>> = OnceLock::new();

/// The library name dlopen looks for (the SONAME every rdma-core since 2016
/// ships).
pub const LIBIBVERBS: &str = "libibverbs.so.1";

/// libibverbs, loaded on first use. Errors are one line.
pub fn verbs() -> Result<&'static Verbs> {
    VERBS.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn dlerror_line() -> String {
    // SAFETY: dlerror returns NULL or a thread-local C string valid until the
    // next dl* call on this thread; we copy it out immediately.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null dlerror result is a valid NUL-terminated string.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Reinterpret a non-null symbol address as the function pointer type `F`.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` type matching the symbol.
unsafe fn fn_ptr<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the caller guarantees the type.
    unsafe { std::mem::transmute_copy(&p) }
}

fn load() -> Result<Verbs> {
    let name = c"libibverbs.so.1";
    // SAFETY: dlopen with a valid C string. RTLD_GLOBAL, and lookups through
    // the global scope below, make fastwake bind exactly as a C program
    // linked with -libverbs does: an LD_PRELOADed interposer (fastwake's own
    // shim included) sees fastwake's calls too.
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        let why = dlerror_line();
        return Err(Fail::unsupported(format!(
            "no RDMA verbs: cannot load {LIBIBVERBS} ({}); install rdma-core's libibverbs1 and a provider (ibverbs-providers)",
            why.rsplit(": ").next().unwrap_or(&why)
        )));
    }
    let sym = |n: &CStr, v: &CStr| -> Result<*mut c_void> {
        // SAFETY: h is a live handle from dlopen; n and v are C strings.
        let p = unsafe { libc::dlvsym(h, n.as_ptr(), v.as_ptr()) };
        if p.is_null() {
            Err(Fail::unsupported(format!(
                "{LIBIBVERBS} lacks {}@{} (unsupported rdma-core version)",
                n.to_string_lossy(),
                v.to_string_lossy()
            )))
        } else {
            // Bind through the global scope, as the dynamic linker binds a
            // program's reference: an interposer's definition comes first.
            // (dlvsym there would insist on an exact version and skip an
            // interposer's unversioned definition; the unversioned lookup
            // finds libibverbs' default version, the same one as above.)
            // SAFETY: a C string; the library is in the global scope.
            let g = unsafe { libc::dlsym(libc::RTLD_DEFAULT, n.as_ptr()) };
            Ok(if g.is_null() { p } else { g })
        }
    };
    macro_rules! f {
        ($n:literal, $v:expr) => {{
            let p = sym($n, $v)?;
            // SAFETY: the symbol with this name and version has the C
            // signature of the field it fills in every rdma-core release that
            // exports it (verbs.h).
            unsafe { fn_ptr(p) }
        }};
    }
    Ok(Verbs {
        get_device_list: f!(c"ibv_get_device_list", V1_1),
        free_device_list: f!(c"ibv_free_device_list", V1_1),
        get_device_name: f!(c"ibv_get_device_name", V1_1),
        open_device: f!(c"ibv_open_device", V1_1),
        close_device: f!(c"ibv_close_device", V1_1),
        query_port: f!(c"ibv_query_port", V1_1),
        query_gid: f!(c"ibv_query_gid", V1_1),
        alloc_pd: f!(c"ibv_alloc_pd", V1_1),
        dealloc_pd: f!(c"ibv_dealloc_pd", V1_1),
        reg_mr: f!(c"ibv_reg_mr", V1_1),
        dereg_mr: f!(c"ibv_dereg_mr", V1_1),
        create_comp_channel: f!(c"ibv_create_comp_channel", V1_0),
        destroy_comp_channel: f!(c"ibv_destroy_comp_channel", V1_0),
        create_cq: f!(c"ibv_create_cq", V1_1),
        destroy_cq: f!(c"ibv_destroy_cq", V1_1),
        get_cq_event: f!(c"ibv_get_cq_event", V1_1),
        ack_cq_events: f!(c"ibv_ack_cq_events", V1_1),
        create_qp: f!(c"ibv_create_qp", V1_1),
        modify_qp: f!(c"ibv_modify_qp", V1_1),
        destroy_qp: f!(c"ibv_destroy_qp", V1_1),
    })
}

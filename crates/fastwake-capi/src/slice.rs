//! The calling thread's scheduler slice (`fastwake::slice`).

use crate::boundary::{guard, out_value};
use std::ffi::c_int;
use std::time::Duration;

/// Ask for a slice of `slice_ns` for the calling thread; 0: the kernel's
/// default again.
#[unsafe(no_mangle)]
pub extern "C" fn fw_slice_set(slice_ns: u64) -> c_int {
    guard(|| fastwake::slice::set_slice((slice_ns > 0).then(|| Duration::from_nanos(slice_ns))))
}

/// # Safety
/// `slice_ns` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fw_slice_get(slice_ns: *mut u64) -> c_int {
    guard(|| {
        let out = out_value(slice_ns, "output")?;
        let s = fastwake::slice::get_slice()?;
        out.set(s.map_or(0, |d| d.as_nanos() as u64));
        Ok(())
    })
}

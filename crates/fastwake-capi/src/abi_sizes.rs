//! The struct layouts the header promises, and the behaviour of a few
//! entry points at the boundary (NULLs, panics).

use crate::boundary::{fw_last_error, guard};
use crate::channel::fw_channel_config;
use crate::dispatcher::{
    fw_dispatch_stats, fw_dispatcher_prewake_stats, fw_dispatcher_start, fw_dispatcher_stop,
    fw_notice_stats,
};
use crate::shared_cq::fw_shared_cq_stats;
use crate::verbs::fw_verbs_stats;
use crate::waiter::{
    fw_dispatch_wait_stats, fw_prewake_stats, fw_wait_stats, fw_waiter, fw_waiter_create,
    fw_waiter_destroy, fw_waiter_prewake_stats,
};
use fastwake_verbs_sys::ibv_wc;
use std::ffi::CStr;

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
    assert_eq!(std::mem::size_of::<crate::lanes::fw_lanes_config>(), 72);
    assert_eq!(
        std::mem::offset_of!(crate::lanes::fw_lanes_config, batch_bytes),
        48
    );
    assert_eq!(
        std::mem::offset_of!(crate::lanes::fw_lanes_config, bulk_mode),
        64
    );
    assert_eq!(std::mem::size_of::<crate::lanes::fw_lanes_stats>(), 112);
    assert_eq!(
        std::mem::offset_of!(crate::lanes::fw_lanes_stats, handed),
        104
    );
    assert_eq!(
        std::mem::offset_of!(crate::lanes::fw_lanes_stats, received),
        80
    );
    assert_eq!(std::mem::size_of::<crate::fetch::fw_fetch_config>(), 80);
    assert_eq!(
        std::mem::offset_of!(crate::fetch::fw_fetch_config, buckets),
        32
    );
    assert_eq!(
        std::mem::offset_of!(crate::fetch::fw_fetch_config, pin_server),
        64
    );
    assert_eq!(std::mem::size_of::<crate::fetch::fw_fetch_stats>(), 96);
    assert_eq!(
        std::mem::offset_of!(crate::fetch::fw_fetch_stats, switches),
        80
    );
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

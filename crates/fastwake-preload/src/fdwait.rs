//! The fd hooks' wait (`epoll_wait`, `poll`, `select` and their forms):
//! [`crate::wait::wait`], except that a zero-timeout call may be a
//! busy-polling thread's poll, which [`crate::pollers`] may turn into a
//! sleep on what the thread polled (`FASTWAKE_POLLERS=sleep`).

use crate::pollset::{Key, Set};
use fastwake::preload_stats::{Call, Pass};
use std::ffi::c_int;

/// [`crate::wait::wait`] for an fd call, with `watch`: the call's key and
/// how to add its fds to the thread's polled set. `real` is called twice
/// when a zero-timeout call slept (the look, then the call made again).
pub fn wait(
    call: Call,
    watch: (Key, &dyn Fn(&mut Set)),
    timeout: Option<u64>,
    user_mask: *const u64,
    probe: impl FnMut(*const u64, u64) -> c_int,
    real: impl Fn(Option<u64>) -> c_int,
    ready_fd: impl FnOnce() -> Option<c_int>,
) -> c_int {
    if timeout == Some(0) && crate::pollers::on() {
        let n = real(None);
        let (key, add) = watch;
        let mut slept = false;
        let n = crate::pollers::after_fd_call(n, key, add, || {
            slept = true;
            real(None)
        });
        if slept {
            crate::stats::served(call);
        } else {
            crate::stats::passed(call, Pass::ZeroTimeout);
        }
        return n;
    }
    crate::wait::wait(call, timeout, user_mask, probe, real, ready_fd)
}

//! Which dispatcher serves which CPU: how a waiter finds its core's
//! [`Hub`]. Held across `fork` (`crate::fork`): a forked child finds it
//! free and empty, and its hubs from before the fork count as dead there.

use super::{Hub, lock};
use crate::{Fail, Result};
use std::sync::{Arc, Mutex, Weak};

/// Dispatchers by served CPU. Weak: a dispatcher's lifetime is its handle's.
static REGISTRY: Mutex<Vec<(u32, Weak<Hub>)>> = Mutex::new(Vec::new());

crate::fork::hold_across_fork!(hold_across_fork, REGISTRY, Vec<(u32, Weak<Hub>)>, |reg| reg
    .clear());

/// The live dispatcher serving `cpu`, if any.
pub(crate) fn lookup(cpu: u32) -> Option<Arc<Hub>> {
    let reg = lock(&REGISTRY);
    reg.iter()
        .filter(|(c, _)| *c == cpu)
        .filter_map(|(_, w)| w.upgrade())
        .find(|c| !c.is_dead())
}

/// Make `hub` the dispatcher of `cpu`; `EBUSY` if a live one serves it.
pub(super) fn insert(cpu: u32, hub: &Arc<Hub>) -> Result<()> {
    // Before the first dispatcher exists, no thread can hold the lock at
    // a fork.
    hold_across_fork();
    let mut reg = lock(&REGISTRY);
    reg.retain(|(_, w)| w.upgrade().is_some_and(|c| !c.is_dead()));
    if reg.iter().any(|(c, _)| *c == cpu) {
        return Err(Fail::new(
            libc::EBUSY,
            format!("CPU {cpu} already has a dispatcher"),
        ));
    }
    reg.push((cpu, Arc::downgrade(hub)));
    Ok(())
}

/// Forget `hub` (it died).
pub(super) fn remove(hub: &Hub) {
    lock(&REGISTRY).retain(|(_, w)| w.upgrade().is_some_and(|c| !std::ptr::eq(&*c, hub)));
}

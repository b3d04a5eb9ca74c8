//! A hook a producer calls without a lock while a dispatcher may replace
//! it at any time: the channel's summary flag and its notifier.
//!
//! The producer loads a pointer; every value ever attached stays boxed
//! until the owner drops, so the pointer never dangles while a new one is
//! attached. Re-attaching a value seen before (a dispatcher that attaches
//! at every idle period) reuses its box instead of growing the list.

use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, Ordering};

pub(crate) struct Attached<T> {
    current: AtomicPtr<T>,
    // Boxed so an attached value's address survives the Vec growing.
    #[allow(clippy::vec_box)]
    keep: Mutex<Vec<Box<T>>>,
}

impl<T> Default for Attached<T> {
    fn default() -> Self {
        Attached {
            current: AtomicPtr::new(std::ptr::null_mut()),
            keep: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Sync> Attached<T> {
    /// Make `value` current; `same` tells a value seen before.
    pub(crate) fn attach(&self, value: T, same: impl Fn(&T, &T) -> bool) {
        let mut keep = self.keep.lock().unwrap_or_else(|e| e.into_inner());
        let p: *mut T = match keep.iter_mut().find(|b| same(b, &value)) {
            Some(b) => &mut **b,
            None => {
                let mut b = Box::new(value);
                let p: *mut T = &mut *b;
                keep.push(b);
                p
            }
        };
        self.current.store(p, Ordering::Release);
    }

    /// Nothing current (a late user of the old value is harmless: both
    /// hooks are hints).
    pub(crate) fn detach(&self) {
        self.current.store(std::ptr::null_mut(), Ordering::Release);
    }

    /// The current value, if any.
    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: a non-null pointer points into a box in `keep`, which
        // is only ever appended to and lives as long as `self`; T is Sync.
        (!p.is_null()).then(|| unsafe { &*p })
    }
}

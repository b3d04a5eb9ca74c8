//! A readiness summary: one flag per source, raised by producers, drained
//! by the dispatcher that watches those sources.
//!
//! Without it a dispatcher reads every source on every pass, which is cheap
//! for a handful of sources but grows linearly with their number (a
//! different cache line per source, a virtual call each). With it, a pass
//! over an idle core reads one byte per 64 sources.
//!
//! Layout: a byte per source plus a byte per group of 64 sources. The
//! dispatcher takes flags with `swap`, which always reads
//! the newest value, so a flag raised while it drains is either seen now or
//! left raised for the next pass; it is never lost.
//!
//! # Sleeping on a summary
//!
//! A summary is also a conditional doorbell for *all* its sources at once,
//! the way the channel's `armed` flag is for one: a dispatcher that found
//! nothing for a while calls [`Summary::arm`], re-checks (drains and peeks),
//! and sleeps with [`Summary::sleep`]; a producer that raises a flag while
//! the summary is armed rings its futex. Same Dekker handshake as the
//! channel: the producer's group `swap` (a full barrier) precedes its read
//! of `sleeping`; the dispatcher's store of `sleeping` precedes its
//! re-check with a fence.

use crate::sync::{AtomicU8, AtomicU32, FutexWord, LineBytes, Ordering, fence};
use std::sync::Arc;
use std::time::Duration;

const GROUP: usize = 64;

/// Flags for up to `capacity` sources.
#[repr(align(64))]
pub struct Summary {
    // Lines of their own: producers on other CPUs write them.
    groups: LineBytes,
    flags: LineBytes,
    sleeping: AtomicU32,
    bell: FutexWord,
}

impl std::fmt::Debug for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Summary")
            .field("capacity", &self.flags.len())
            .finish()
    }
}

impl Summary {
    /// A summary with room for `capacity` sources, all flags lowered.
    pub fn new(capacity: usize) -> Arc<Summary> {
        let groups = capacity.div_ceil(GROUP).max(1);
        Arc::new(Summary {
            groups: LineBytes::new(groups, || AtomicU8::new(0)),
            flags: LineBytes::new(groups * GROUP, || AtomicU8::new(0)),
            sleeping: AtomicU32::new(0),
            bell: FutexWord::new(0),
        })
    }

    /// Announce that the watcher is about to sleep: the next raised flag
    /// rings. Returns the token for [`Summary::sleep`]. The caller must
    /// drain/peek once more after this and sleep only if that found nothing.
    pub fn arm(&self) -> u32 {
        let seq = self.bell.load();
        self.sleeping.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        seq
    }

    /// Withdraw an [`Summary::arm`] (the re-check found work, or after
    /// waking).
    pub fn disarm(&self) {
        self.sleeping.store(0, Ordering::Relaxed);
    }

    /// Sleep until a producer rings after [`Summary::arm`], `timeout`
    /// passes, or spuriously.
    pub fn sleep(&self, token: u32, timeout: Option<Duration>) {
        self.bell.wait_private(token, timeout);
    }

    /// Number of flags.
    pub fn capacity(&self) -> usize {
        self.flags.len()
    }

    /// The flag of source `index`, to hand to [`super::Peek::attach_summary`].
    /// Panics if `index` is out of range (a dispatcher bug).
    pub fn flag(self: &Arc<Self>, index: usize) -> Flag {
        assert!(index < self.flags.len(), "summary index out of range");
        Flag {
            summary: self.clone(),
            index,
        }
    }

    /// Lower and visit every raised flag among the first `groups` groups of
    /// 64. Visit order is by index.
    pub fn drain(&self, groups: usize, mut visit: impl FnMut(usize)) {
        for g in 0..groups.min(self.groups.len()) {
            let group = self.groups.get(g);
            // Plain load first: on an idle core the line stays shared and
            // the pass costs no write.
            if group.load(Ordering::Relaxed) == 0 || group.swap(0, Ordering::SeqCst) == 0 {
                continue;
            }
            for i in g * GROUP..(g + 1) * GROUP {
                let f = self.flags.get(i);
                if f.load(Ordering::Relaxed) != 0 && f.swap(0, Ordering::SeqCst) != 0 {
                    visit(i);
                }
            }
        }
    }
}

/// One source's flag in a [`Summary`]; cheap to clone, safe to raise from
/// any thread.
#[derive(Clone, Debug)]
pub struct Flag {
    summary: Arc<Summary>,
    index: usize,
}

impl Flag {
    /// Raise the flag. Call after the completion is visible to peeks (after
    /// the release store that publishes it).
    #[inline]
    pub fn raise(&self) {
        // The flag before the group: a drain that sees the group raised
        // (with the swap's acquire) also sees this flag.
        let s = &*self.summary;
        s.flags.get(self.index).store(1, Ordering::Release);
        // A swap, not a store: it is a full barrier, ordering the flags
        // before the read of `sleeping` (Dekker with `Summary::arm`).
        s.groups.get(self.index / GROUP).swap(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) != 0 && s.sleeping.swap(0, Ordering::SeqCst) != 0 {
            s.bell.bump_and_wake_private();
        }
    }

    /// Is this the same flag as `other`?
    pub fn same_as(&self, other: &Flag) -> bool {
        Arc::ptr_eq(&self.summary, &other.summary) && self.index == other.index
    }

    /// The flag's index in its summary.
    pub fn index(&self) -> usize {
        self.index
    }
}

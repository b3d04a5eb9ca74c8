//! The channel's shared memory: its layout (constants, colour pad, hot
//! lines, slots; see the parent module's docs) and the mapping both ends
//! share.

use super::Config;
use super::Doorbell;
use crate::source::attached::Attached;
use crate::source::notice::Notifier;
use crate::source::summary::Flag;
use crate::sync::{AtomicU32, AtomicU64, FutexWord, Ordering};
use crate::{Fail, Result};
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::Arc;

// "fastwak2": the publish word gained the notice bit (head << 2).
const MAGIC: u64 = 0x6661_7374_7761_6b32;
pub(super) const LINE: usize = 64;
pub(super) const SLOT_HEAD: usize = 16;
use super::NO_CPU;
/// Distinct colour pads: `LINE + COLOURS * HOT` must fit in one page, so
/// the constants and the hot lines share the first page.
const COLOURS: usize = 21;
const HOT: usize = std::mem::size_of::<Hot>();
const PAGE: usize = 4096;

/// The colour of the next channel created in this process.
static NEXT_COLOUR: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[repr(C, align(64))]
pub(super) struct Line<T>(pub(super) T);

#[repr(C)]
struct Consts {
    pub(super) magic: u64,
    pub(super) capacity: u32,
    pub(super) slot_size: u32,
    pub(super) doorbell: u32,
    pub(super) header_bytes: u32,
}

#[repr(C)]
pub(super) struct ProducerLine {
    /// `head << 2 | notice << 1 | armed`; see the module docs.
    pub(super) head_armed: AtomicU64,
    pub(super) producer_cpu: AtomicU32,
    pub(super) producer_closed: AtomicU32,
    pub(super) producer_attached: AtomicU32,
}

#[repr(C)]
pub(super) struct ConsumerLine {
    pub(super) tail: AtomicU64,
    pub(super) consumer_closed: AtomicU32,
    pub(super) consumer_attached: AtomicU32,
}

#[repr(C)]
pub(super) struct ArmLine {
    pub(super) bell: FutexWord,
    /// When the producer last rang ([`crate::cpu::monotonic_ns`]; 0:
    /// never). Written only on the ring path, which makes a syscall
    /// anyway, so dating it costs a polling consumer nothing.
    pub(super) rung_at: AtomicU64,
}

/// The lines both ends write, placed after the colour pad.
#[repr(C)]
pub(super) struct Hot {
    pub(super) prod: Line<ProducerLine>,
    pub(super) cons: Line<ConsumerLine>,
    pub(super) arm: Line<ArmLine>,
}

/// Header size (constants + pad + hot lines) for `colour`.
fn header_bytes(colour: usize) -> usize {
    LINE + colour * HOT + HOT
}

/// The colour a header size was made with, if it is one of ours.
fn colour_of(header_bytes: usize) -> Option<usize> {
    let pad = header_bytes.checked_sub(LINE + HOT)?;
    (pad % HOT == 0 && pad / HOT < COLOURS).then_some(pad / HOT)
}

/// The mapping both ends share. Dropping it unmaps.
///
/// Line aligned (so the `Arc` allocation owns whole lines): both ends read
/// these fields on every operation, and a neighbouring heap object written
/// by one end would otherwise turn each of those reads into a line
/// transfer (see [`PayloadBuf`](super::PayloadBuf)).
#[repr(align(64))]
pub(super) struct Region {
    pub(super) base: NonNull<u8>,
    pub(super) len: usize,
    /// Offset of the hot lines, and of slot 0 (the header's size).
    pub(super) hot_off: usize,
    pub(super) slots_off: usize,
    pub(super) cfg: Config,
    pub(super) mem: OwnedFd,
    pub(super) efd: Option<OwnedFd>,
    /// Both ends live in this process (made by [`channel`](super::channel)), so a
    /// process-local summary flag can be raised by the producer.
    pub(super) local: bool,
    /// The dispatcher's notifier, pushed by `Sender::flush` when the
    /// consumer asked for a notice.
    pub(super) notifier: Attached<Notifier>,
    /// The dispatcher's summary flag, raised by `Sender::flush`.
    pub(super) summary: Attached<Flag>,
}

// SAFETY: the region is plain shared memory; all cross-thread access to it
// goes through atomics in the header or through slots whose ownership the
// SPSC head/tail protocol hands over with acquire/release.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping we created and nobody else
        // unmaps; the Arc guarantees no end still uses it.
        unsafe {
            let _ = rustix::mm::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

impl Region {
    pub(super) fn header(&self) -> &Hot {
        // SAFETY: `hot_off` is where `create` wrote the hot lines (or where
        // `attach` validated the creator put them), line aligned, inside the
        // mapping, which lives as long as self.
        unsafe { &*self.base.as_ptr().add(self.hot_off).cast::<Hot>() }
    }

    pub(super) fn slot(&self, index: u64) -> *mut u8 {
        let i = (index & (self.cfg.capacity as u64 - 1)) as usize;
        // SAFETY: i < capacity, so the offset stays inside the mapping.
        unsafe {
            self.base
                .as_ptr()
                .add(self.slots_off + i * self.cfg.stride())
        }
    }

    fn map(mem: &OwnedFd, len: usize) -> Result<NonNull<u8>> {
        // SAFETY: a fresh shared mapping of an fd we hold; no existing Rust
        // object aliases it.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                mem,
                0,
            )
        }
        .map_err(|e| Fail::os("mmap channel", e))?;
        NonNull::new(p.cast()).ok_or_else(|| Fail::invalid("mmap returned null"))
    }

    pub(super) fn create(cfg: Config, local: bool) -> Result<Arc<Region>> {
        cfg.validate()?;
        let colour = NEXT_COLOUR.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % COLOURS;
        let hb = header_bytes(colour);
        let len = cfg.bytes(hb);
        // Not CLOEXEC-free: processes that share a channel pass the fd on
        // purpose (see `SharedChannel`).
        let mem = rustix::fs::memfd_create("fastwake-channel", rustix::fs::MemfdFlags::CLOEXEC)
            .map_err(|e| Fail::os("memfd_create", e))?;
        rustix::fs::ftruncate(&mem, len as u64).map_err(|e| Fail::os("ftruncate channel", e))?;
        let base = Self::map(&mem, len)?;
        let consts = Line(Consts {
            magic: MAGIC,
            capacity: cfg.capacity,
            slot_size: cfg.slot_size,
            doorbell: cfg.doorbell as u32,
            header_bytes: hb as u32,
        });
        let hot = Hot {
            prod: Line(ProducerLine {
                head_armed: AtomicU64::new(0),
                producer_cpu: AtomicU32::new(NO_CPU),
                producer_closed: AtomicU32::new(0),
                producer_attached: AtomicU32::new(0),
            }),
            cons: Line(ConsumerLine {
                tail: AtomicU64::new(0),
                consumer_closed: AtomicU32::new(0),
                consumer_attached: AtomicU32::new(0),
            }),
            arm: Line(ArmLine {
                bell: FutexWord::new(0),
                rung_at: AtomicU64::new(0),
            }),
        };
        // SAFETY: the mapping is at least `hb` bytes, page aligned (so both
        // offsets are line aligned), and not yet visible to anyone else.
        unsafe {
            base.as_ptr().cast::<Line<Consts>>().write(consts);
            base.as_ptr().add(hb - HOT).cast::<Hot>().write(hot);
        }
        let efd = match cfg.doorbell {
            Doorbell::Futex => None,
            Doorbell::EventFd => Some(
                rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
                    .map_err(|e| Fail::os("eventfd", e))?,
            ),
        };
        Ok(Arc::new(Region {
            base,
            len,
            hot_off: hb - HOT,
            slots_off: hb,
            cfg,
            mem,
            efd,
            local,
            notifier: Attached::default(),
            summary: Attached::default(),
        }))
    }

    pub(super) fn attach(mem: OwnedFd, efd: Option<OwnedFd>) -> Result<Arc<Region>> {
        let st = rustix::fs::fstat(&mem).map_err(|e| Fail::os("fstat channel fd", e))?;
        let size = st.st_size as usize;
        if size < PAGE.min(LINE + HOT) {
            return Err(Fail::invalid("fd is not a fastwake channel (too small)"));
        }
        let base = Self::map(&mem, size)?;
        // SAFETY: at least the constants line is mapped; the fields read
        // here are plain integers written once at creation.
        let c = unsafe { &(*base.as_ptr().cast::<Line<Consts>>()).0 };
        let hb = c.header_bytes as usize;
        let cfg = Config {
            capacity: c.capacity,
            slot_size: c.slot_size,
            doorbell: if c.doorbell == 1 {
                Doorbell::EventFd
            } else {
                Doorbell::Futex
            },
        };
        let bad = c.magic != MAGIC
            || colour_of(hb).is_none()
            || cfg.validate().is_err()
            || cfg.bytes(hb) != size;
        let region = Region {
            base,
            len: size,
            hot_off: hb.saturating_sub(HOT),
            slots_off: hb,
            cfg,
            mem,
            efd,
            local: false,
            notifier: Attached::default(),
            summary: Attached::default(),
        };
        if bad {
            return Err(Fail::invalid(
                "fd is not a fastwake channel of this version",
            ));
        }
        if cfg.doorbell == Doorbell::EventFd && region.efd.is_none() {
            return Err(Fail::invalid(
                "channel uses an eventfd doorbell but none was passed",
            ));
        }
        Ok(Arc::new(region))
    }

    /// Tell an attached dispatcher that the published head moved (or the
    /// producer closed).
    #[inline]
    pub(super) fn raise_summary(&self) {
        if let Some(f) = self.summary.get() {
            // The publish must be ordered before the flag for a waiter's
            // store→load re-check (dispatch::waiter) to pair with it.
            // (crate::sync's fence: the one loom models see.)
            crate::sync::fence(Ordering::SeqCst);
            f.raise();
        }
    }

    /// The consumer asked for a notice and a publish (or the close)
    /// answered it: push the notice, if a dispatcher attached a notifier.
    ///
    /// No fence: the publish that saw the request is a read-modify-write
    /// of the publish word, and so is the attach's (`attach_notices`), so
    /// one of the two comes second and sees the other.
    pub(super) fn notify(&self) {
        if let Some(n) = self.notifier.get() {
            n.notify();
        }
    }

    pub(super) fn ring(&self) {
        match &self.efd {
            // A failed write means the counter is saturated, i.e. a wake-up
            // is already pending: nothing is lost.
            Some(efd) => {
                let _ = rustix::io::write(efd, &1u64.to_ne_bytes());
            }
            None => self.header().arm.0.bell.bump_and_wake(),
        }
    }
}

//! Replies for synchronous readers sharing one connection, taken by the
//! readers themselves (no I/O thread): NVMe/TCP's "complete in the
//! polling application's context".
//!
//! A reader whose reply has not come leads: it receives from the
//! connection and hands each reply to its reader (a flag and an unpark)
//! until its own comes, then passes the lead to a reader still waiting.
//! On a connection of its own a reader always leads, so every arrangement
//! runs the same code.
//!
//! The replies also say when requests can batch: a reader handed its
//! reply sends its next request at once, so while other readers have
//! been handed theirs and not yet sent, more requests are about to
//! follow, and this one may wait for them in the lane's batch (the
//! NVMe/TCP host's `MSG_MORE` while more is queued). The last of them
//! sends plainly, which pushes the batch in the same `sendmsg`.
//!
//! A reader counts itself out before it sends, so one preempted between
//! the two can queue its request after the last plain send. The lane's
//! 50 µs timer pushes it then: that plain send's reply wakes the leading
//! reader, whose receive finds the bytes queued. Counting out after the
//! send, with the last out pushing the lane, closes that window, but on a
//! shared connection the push also sends the writer's queued bulk bytes
//! from the readers' CPU, and it cost the shared arrangement a quarter of
//! its reads in alternating runs; the lanes arrangement gained nothing
//! measurable.

use fastwake::Result;
use fastwake::lanes::{Class, Endpoint};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::thread::Thread;

const WAITING: u32 = 0;
const ARRIVED: u32 = 1;
const LEAD: u32 = 2;

struct Slot {
    word: AtomicU32,
}

#[derive(Default)]
struct Lead {
    active: bool,
    /// Readers parked for their reply (none of them has it yet), with
    /// the thread to unpark (readers may be other threads every turn).
    waiting: Vec<(usize, Thread)>,
}

/// The readers of one connection.
pub struct Replies {
    slots: Vec<Slot>,
    lead: Mutex<Lead>,
    /// Readers handed their reply that have not yet sent again.
    handed: AtomicUsize,
}

/// The reader a reply (or request) is for: its first four bytes.
pub fn reader_of(m: &[u8]) -> usize {
    u32::from_le_bytes([m[0], m[1], m[2], m[3]]) as usize
}

impl Replies {
    pub fn new(readers: usize) -> Replies {
        Replies {
            slots: (0..readers)
                .map(|_| Slot {
                    word: AtomicU32::new(WAITING),
                })
                .collect(),
            lead: Mutex::new(Lead::default()),
            handed: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lead> {
        self.lead.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reader that was handed its reply is about to send its next
    /// request: do other readers' requests follow at once (readers handed
    /// their reply that have not sent yet)? Call once after every
    /// [`Replies::wait`], whether a request follows or not.
    pub fn more_follow(&self) -> bool {
        self.handed.fetch_sub(1, Ordering::AcqRel) > 1
    }

    /// Reader `me` (its index on this connection) waits for the reply to
    /// its one outstanding request on `ep`'s latency lane.
    pub fn wait(&self, ep: &Endpoint, me: usize) -> Result<()> {
        let slot = &self.slots[me];
        {
            let mut lead = self.lock();
            if slot.word.swap(WAITING, Ordering::Acquire) == ARRIVED {
                return Ok(());
            }
            if lead.active {
                lead.waiting.push((me, std::thread::current()));
            } else {
                lead.active = true;
                drop(lead);
                return self.lead(ep, me);
            }
        }
        loop {
            std::thread::park();
            match slot.word.swap(WAITING, Ordering::Acquire) {
                ARRIVED => return Ok(()),
                LEAD => return self.lead(ep, me),
                _ => {}
            }
        }
    }

    fn lead(&self, ep: &Endpoint, me: usize) -> Result<()> {
        loop {
            let id = match ep.recv_with(Class::Latency, reader_of) {
                Ok(id) => id,
                Err(e) => {
                    // Let the others see the failure too, rather than
                    // park for ever.
                    self.hand_on();
                    return Err(e);
                }
            };
            self.handed.fetch_add(1, Ordering::AcqRel);
            if id == me {
                self.hand_on();
                return Ok(());
            }
            let mut lead = self.lock();
            self.slots[id].word.store(ARRIVED, Ordering::Release);
            let parked = lead
                .waiting
                .iter()
                .position(|w| w.0 == id)
                .map(|p| lead.waiting.swap_remove(p).1);
            // Unpark outside the lock: the woken reader may take the CPU
            // at once, and must not leave the others queued on the lock.
            drop(lead);
            if let Some(t) = parked {
                t.unpark();
            }
        }
    }

    /// The leader is done: pass the lead to a waiting reader, if any.
    fn hand_on(&self) {
        let mut lead = self.lock();
        let next = lead.waiting.pop();
        match &next {
            Some((w, _)) => self.slots[*w].word.store(LEAD, Ordering::Release),
            None => lead.active = false,
        }
        drop(lead);
        if let Some((_, thread)) = next {
            thread.unpark();
        }
    }
}

//! The server's table in registered memory, and the checks a client makes
//! on what it READs of it.
//!
//! Layout (little-endian, every field 8-byte aligned):
//!
//! ```text
//! header   0  load word (the RPC thread's busy share, queue depth)
//!          8  magic "fwfetch1"   16  buckets   24  window
//! buckets at 64, buckets + WINDOW - 1 of BUCKET bytes:
//!          0 ver | 8 key | 16 object offset | 24 len u32, state u32 | 32 ver2
//! objects after the buckets, one slot per key:
//!          0 ver | 8 key | 16 len u32, flags u32 | 24 sum | 32 data, padded to 8 | ver2
//! ```
//!
//! A key's buckets are the [`WINDOW`] from `hash(key) % buckets`: a READ-2
//! READs all of them in one READ (320 bytes) and the object in a second.
//!
//! **Torn reads.** A bucket and an object are each written seqlock-style,
//! with a version at the start (`ver`) and a copy at the end (`ver2`): the
//! writer makes both odd (`ver` first, then `ver2`), writes the fields,
//! then makes `ver2` and then `ver` the next even number. A reader accepts
//! only `ver == ver2`, even. A READ that reads front to back (what rxe
//! and, within one READ, NICs do) and overlaps a write in any way sees
//! `ver` odd, or `ver2` odd, or `ver` older than `ver2`: if it read `ver`
//! before the write began and `ver2` after `ver2` turned odd, they differ;
//! if it read `ver2` before that, every byte between was read before the
//! write began. An object also carries a 64-bit checksum of its key, length
//! and bytes, which catches a NIC that reads out of order. A key's object
//! keeps its length and its slot; a different length is a new slot (the old
//! one is marked removed, so a client's cached address sees it).

use crate::source::verbs::Mr;
use crate::{Fail, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering, fence};

/// Buckets a key may live in (from its hash on): one READ of the index.
pub const WINDOW: usize = 8;
/// Bytes per bucket.
pub const BUCKET: usize = 40;
/// Bytes of a key's window of buckets (one READ).
pub const WINDOW_BYTES: usize = WINDOW * BUCKET;
/// Bytes of the header.
pub const HEADER: usize = 64;
/// Bytes of an object slot before its data.
pub const OBJ_HEAD: usize = 32;
const MAGIC: u64 = u64::from_le_bytes(*b"fwfetch1");
/// Bucket states.
const EMPTY: u32 = 0;
const LIVE: u32 = 1;
/// Object flag: removed (the slot is not the key's any more).
const REMOVED: u32 = 1;

/// Bytes of a key's object slot for `len` bytes of data.
pub fn slot_bytes(len: usize) -> usize {
    OBJ_HEAD + len.div_ceil(8) * 8 + 8
}

/// Where a key's buckets start.
pub fn home(key: u64, buckets: usize) -> usize {
    // SplitMix64's finaliser: consecutive keys spread over the buckets.
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) % buckets as u64) as usize
}

/// Offset of bucket `i`.
pub fn bucket_at(i: usize) -> usize {
    HEADER + i * BUCKET
}

/// The object checksum: key, length and bytes.
pub fn checksum(key: u64, data: &[u8]) -> u64 {
    let mut h = key ^ (data.len() as u64).rotate_left(32) ^ 0x243f_6a88_85a3_08d3;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ (h >> 32)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// What a READ of a key's buckets says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The key's object: its offset in the table and its length.
    Found { off: u64, len: usize },
    /// No bucket of the window holds the key (and none was being written).
    Missing,
    /// A bucket was being written: READ again.
    Torn,
}

/// Read the key's bucket out of a READ of its window.
pub fn lookup(window: &[u8], key: u64) -> Lookup {
    let mut torn = false;
    for b in window.chunks_exact(BUCKET) {
        let (ver, ver2) = (u64_at(b, 0), u64_at(b, 32));
        if ver != ver2 || ver & 1 == 1 {
            torn = true;
            continue;
        }
        if u32_at(b, 28) == LIVE && u64_at(b, 8) == key {
            return Lookup::Found {
                off: u64_at(b, 16),
                len: u32_at(b, 24) as usize,
            };
        }
    }
    if torn { Lookup::Torn } else { Lookup::Missing }
}

/// What a READ of an object slot says.
#[derive(Debug, PartialEq, Eq)]
pub enum Object<'a> {
    /// The bytes, whole, with their version.
    Whole(&'a [u8], u64),
    /// The slot is not this key's object of this length any more (removed,
    /// or another length): look the key up again.
    Moved,
    /// Being written while read: READ again.
    Torn,
}

/// Check a READ of `slot_bytes(len)` bytes of `key`'s object slot.
pub fn object(slot: &[u8], key: u64, len: usize) -> Object<'_> {
    let end = slot_bytes(len) - 8;
    if slot.len() < end + 8 {
        return Object::Torn;
    }
    let (ver, ver2) = (u64_at(slot, 0), u64_at(slot, end));
    if ver != ver2 || ver & 1 == 1 {
        return Object::Torn;
    }
    if u64_at(slot, 8) != key || u32_at(slot, 16) as usize != len || u32_at(slot, 20) & REMOVED != 0
    {
        return Object::Moved;
    }
    let data = &slot[OBJ_HEAD..OBJ_HEAD + len];
    if checksum(key, data) != u64_at(slot, 24) {
        return Object::Torn;
    }
    Object::Whole(data, ver)
}

/// The server's table over its registered memory (writers hold the
/// server's lock; the NIC reads it at any time).
pub struct Table {
    mr: Mr,
    buckets: usize,
    objects: usize,
    next: usize,
    /// key → (slot offset, length, bucket index).
    slots: HashMap<u64, (usize, usize, usize)>,
    /// Removed slots by length, for reuse.
    free: HashMap<usize, Vec<usize>>,
}

impl Table {
    /// Bytes of a table of `buckets` buckets and `capacity` bytes of slots.
    pub fn bytes(buckets: usize, capacity: usize) -> usize {
        HEADER + (buckets + WINDOW - 1) * BUCKET + capacity
    }

    /// A table over `mr` (zeroed, [`Table::bytes`] long).
    pub fn new(mr: Mr, buckets: usize) -> Result<Table> {
        if !mr.addr(0).is_multiple_of(8) {
            // The versions are 8-byte words stored atomically.
            return Err(Fail::unsupported(
                "fetch: the table's memory is not 8-byte aligned",
            ));
        }
        let objects = bucket_at(buckets + WINDOW - 1);
        let mut t = Table {
            mr,
            buckets,
            objects,
            next: objects,
            slots: HashMap::new(),
            free: HashMap::new(),
        };
        t.store(8, MAGIC);
        t.store(16, buckets as u64);
        t.store(24, WINDOW as u64);
        Ok(t)
    }

    /// The memory (its address and remote key go to clients).
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// Buckets.
    pub fn buckets(&self) -> usize {
        self.buckets
    }

    /// Keys in the table.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No keys.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn ptr(&mut self, off: usize) -> *mut u8 {
        self.mr.bytes_mut()[off..].as_mut_ptr()
    }

    /// One 8-byte word, atomically (the NIC may read it now).
    fn store(&mut self, off: usize, v: u64) {
        debug_assert_eq!(off % 8, 0);
        let p = self.ptr(off).cast::<u64>();
        // SAFETY: `off` is 8-aligned inside the buffer (every field is) and
        // the buffer is 8-aligned (a heap allocation of at least 8 bytes);
        // only this table writes it, under `&mut self`.
        unsafe { AtomicU64::from_ptr(p) }.store(v, Ordering::Release);
    }

    fn load(&self, off: usize) -> u64 {
        u64_at(self.mr.bytes(), off)
    }

    /// Write `bytes` at `off` between two release fences, so the version
    /// stores around them are not reordered past them.
    fn write(&mut self, off: usize, bytes: &[u8]) {
        fence(Ordering::Release);
        self.mr.bytes_mut()[off..off + bytes.len()].copy_from_slice(bytes);
        fence(Ordering::Release);
    }

    /// Publish the load word.
    pub fn set_load(&mut self, w: u64) {
        self.store(0, w);
    }

    /// Seqlock-write `[at, at+len)` whose versions are at `at` and
    /// `at + end`: both odd, then `fill`, then `ver2`, then `ver` even.
    fn seq_write(&mut self, at: usize, end: usize, fill: impl FnOnce(&mut Table)) {
        let v = self.load(at) | 1;
        self.store(at, v);
        self.store(at + end, v);
        fill(self);
        self.store(at + end, v + 1);
        self.store(at, v + 1);
    }

    fn set_bucket(&mut self, i: usize, key: u64, off: usize, len: usize, state: u32) {
        let at = bucket_at(i);
        self.seq_write(at, 32, |t| {
            let mut f = [0u8; 24];
            f[..8].copy_from_slice(&key.to_le_bytes());
            f[8..16].copy_from_slice(&(off as u64).to_le_bytes());
            f[16..20].copy_from_slice(&(len as u32).to_le_bytes());
            f[20..24].copy_from_slice(&state.to_le_bytes());
            t.write(at + 8, &f);
        });
    }

    fn set_object(&mut self, off: usize, key: u64, data: &[u8], flags: u32) {
        let end = slot_bytes(data.len()) - 8;
        self.seq_write(off, end, |t| {
            let mut h = [0u8; 24];
            h[..8].copy_from_slice(&key.to_le_bytes());
            h[8..12].copy_from_slice(&(data.len() as u32).to_le_bytes());
            h[12..16].copy_from_slice(&flags.to_le_bytes());
            h[16..24].copy_from_slice(&checksum(key, data).to_le_bytes());
            t.write(off + 8, &h);
            t.write(off + OBJ_HEAD, data);
        });
    }

    /// Insert or rewrite `key`'s object. A rewrite of the same length
    /// writes in place; another length takes a new slot.
    pub fn put(&mut self, key: u64, data: &[u8]) -> Result<()> {
        if data.len() > u32::MAX as usize / 2 {
            return Err(Fail::invalid("fetch: an object over 2 GiB"));
        }
        match self.slots.get(&key).copied() {
            Some((off, len, _)) if len == data.len() => {
                self.set_object(off, key, data, 0);
                return Ok(());
            }
            Some(_) => {
                self.remove(key);
            }
            None => {}
        }
        let h = home(key, self.buckets);
        let Some(b) = (h..h + WINDOW).find(|&i| self.bucket_free(i)) else {
            return Err(Fail::new(
                libc::ENOSPC,
                format!(
                    "fetch: the {WINDOW} buckets of key {key} are full: give the table more buckets"
                ),
            ));
        };
        let need = slot_bytes(data.len());
        let off = match self.free.get_mut(&data.len()).and_then(Vec::pop) {
            Some(off) => off,
            None => {
                if self.next + need > self.mr.bytes().len() {
                    return Err(Fail::new(
                        libc::ENOSPC,
                        format!(
                            "fetch: no room for a {}-byte object ({} of {} bytes of slots used)",
                            data.len(),
                            self.next - self.objects,
                            self.mr.bytes().len() - self.objects
                        ),
                    ));
                }
                self.next += need;
                self.next - need
            }
        };
        self.set_object(off, key, data, 0);
        self.set_bucket(b, key, off, data.len(), LIVE);
        self.slots.insert(key, (off, data.len(), b));
        Ok(())
    }

    fn bucket_free(&self, i: usize) -> bool {
        let at = bucket_at(i);
        u32_at(self.mr.bytes(), at + 28) == EMPTY
    }

    /// Remove `key`; false when it was not there.
    pub fn remove(&mut self, key: u64) -> bool {
        let Some((off, len, b)) = self.slots.remove(&key) else {
            return false;
        };
        // The bucket first: a READ-2 that finds the bucket then reads a
        // removed object looks the key up again and finds it missing.
        self.set_bucket(b, 0, 0, 0, EMPTY);
        let data = self.mr.bytes()[off + OBJ_HEAD..off + OBJ_HEAD + len].to_vec();
        self.set_object(off, key, &data, REMOVED);
        self.free.entry(len).or_default().push(off);
        true
    }

    /// `key`'s object: its offset, bytes and version (under the lock: whole).
    pub fn get(&self, key: u64) -> Option<(usize, &[u8], u64)> {
        let &(off, len, _) = self.slots.get(&key)?;
        Some((
            off,
            &self.mr.bytes()[off + OBJ_HEAD..off + OBJ_HEAD + len],
            self.load(off),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot image as `set_object` leaves it, built without a device.
    fn image(key: u64, data: &[u8], ver: u64, flags: u32) -> Vec<u8> {
        let mut s = vec![0u8; slot_bytes(data.len())];
        let end = s.len() - 8;
        s[..8].copy_from_slice(&ver.to_le_bytes());
        s[8..16].copy_from_slice(&key.to_le_bytes());
        s[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
        s[20..24].copy_from_slice(&flags.to_le_bytes());
        s[24..32].copy_from_slice(&checksum(key, data).to_le_bytes());
        s[OBJ_HEAD..OBJ_HEAD + data.len()].copy_from_slice(data);
        s[end..].copy_from_slice(&ver.to_le_bytes());
        s
    }

    #[test]
    fn a_whole_object_passes_and_a_wrong_one_does_not() {
        let d = b"hello, fetch".to_vec();
        let s = image(7, &d, 4, 0);
        assert_eq!(object(&s, 7, d.len()), Object::Whole(&d, 4));
        assert_eq!(object(&s, 8, d.len()), Object::Moved);
        assert_eq!(object(&image(7, &d, 4, REMOVED), 7, d.len()), Object::Moved);
        assert_eq!(object(&image(7, &d, 5, 0), 7, d.len()), Object::Torn);
        let mut bad = s.clone();
        bad[OBJ_HEAD + 3] ^= 1;
        assert_eq!(object(&bad, 7, d.len()), Object::Torn);
    }

    /// Every front-to-back READ that overlaps a rewrite, at every point of
    /// the writer's steps and the reader's position, is rejected or whole.
    #[test]
    fn every_interleaving_of_a_rewrite_and_a_read_is_caught() {
        let (old, new) = (vec![0xaau8; 40], vec![0x55u8; 40]);
        let key = 3;
        let before = image(key, &old, 2, 0);
        let end = before.len() - 8;
        // The writer's steps as images after each step.
        let mut steps = vec![before.clone()];
        let mut cur = before.clone();
        cur[..8].copy_from_slice(&3u64.to_le_bytes());
        steps.push(cur.clone());
        cur[end..].copy_from_slice(&3u64.to_le_bytes());
        steps.push(cur.clone());
        // Fields and data byte by byte.
        let after = image(key, &new, 4, 0);
        for i in 8..end {
            cur[i] = after[i];
            steps.push(cur.clone());
        }
        cur[end..].copy_from_slice(&4u64.to_le_bytes());
        steps.push(cur.clone());
        cur[..8].copy_from_slice(&4u64.to_le_bytes());
        steps.push(cur.clone());
        assert_eq!(cur, after);
        // A reader reads byte j at writer step s(j), s non-decreasing.
        let n = steps.len();
        for a in 0..n {
            for b in a..n {
                // Bytes before `cut` at step a, the rest at step b.
                for cut in (0..before.len()).step_by(4) {
                    let mut seen = steps[b].clone();
                    seen[..cut].copy_from_slice(&steps[a][..cut]);
                    match object(&seen, key, 40) {
                        Object::Whole(d, _) => assert!(d == old.as_slice() || d == new.as_slice()),
                        Object::Torn | Object::Moved => {}
                    }
                }
            }
        }
    }

    #[test]
    fn buckets_say_found_missing_or_torn() {
        let mut w = vec![0u8; WINDOW * BUCKET];
        let b = &mut w[2 * BUCKET..3 * BUCKET];
        b[..8].copy_from_slice(&2u64.to_le_bytes());
        b[8..16].copy_from_slice(&99u64.to_le_bytes());
        b[16..24].copy_from_slice(&4096u64.to_le_bytes());
        b[24..28].copy_from_slice(&100u32.to_le_bytes());
        b[28..32].copy_from_slice(&LIVE.to_le_bytes());
        b[32..40].copy_from_slice(&2u64.to_le_bytes());
        assert_eq!(
            lookup(&w, 99),
            Lookup::Found {
                off: 4096,
                len: 100
            }
        );
        assert_eq!(lookup(&w, 98), Lookup::Missing);
        w[5 * BUCKET] = 1;
        assert_eq!(lookup(&w, 98), Lookup::Torn);
        assert_eq!(
            lookup(&w, 99),
            Lookup::Found {
                off: 4096,
                len: 100
            }
        );
    }

    #[test]
    fn homes_spread_and_slots_are_aligned() {
        let mut seen = std::collections::HashSet::new();
        for k in 0..1000u64 {
            seen.insert(home(k, 4096));
        }
        assert!(seen.len() > 800, "{}", seen.len());
        for len in [0, 1, 7, 8, 9, 65536] {
            assert_eq!(slot_bytes(len) % 8, 0);
        }
    }
}

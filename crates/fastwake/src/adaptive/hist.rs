//! A decaying log-linear histogram of wait times.
//!
//! Four buckets per octave from 64 ns to ~134 ms (85 buckets) keep the
//! relative error of a bucket under 25 % at every scale, which is all the
//! budget decision needs: the cost model compares budgets that differ by
//! factors, not by nanoseconds. Weights decay by *event count*, not time, so
//! recording costs no clock read and no syscall, and a steady stream has a
//! fixed memory of about [`HALF_LIFE`] waits.

/// Buckets per octave.
const SUB: u32 = 4;
/// Values below 2^MIN_SHIFT ns share bucket 0.
const MIN_SHIFT: u32 = 6;
/// Number of buckets: bucket 0 plus 21 octaves of `SUB`.
pub const BUCKETS: usize = 1 + 21 * SUB as usize;
/// Weight of an observation halves after this many newer ones.
pub const HALF_LIFE: u32 = 128;
/// Decay is applied in batches of this many observations (cheaper than a
/// multiply over every bucket per observation).
const DECAY_EVERY: u32 = 16;

/// Bucket index of `ns`.
#[inline]
pub fn index(ns: u64) -> usize {
    if ns < (1 << MIN_SHIFT) {
        return 0;
    }
    let o = 63 - ns.leading_zeros();
    let s = ((ns >> (o - 2)) & 3) as usize;
    (1 + (o - MIN_SHIFT) as usize * SUB as usize + s).min(BUCKETS - 1)
}

/// Smallest value that falls *above* bucket `i` (its exclusive upper edge).
pub fn upper(i: usize) -> u64 {
    if i == 0 {
        return 1 << MIN_SHIFT;
    }
    let o = MIN_SHIFT + (i as u32 - 1) / SUB;
    let s = (i as u64 - 1) % SUB as u64;
    (5 + s) << (o - 2)
}

/// Smallest value in bucket `i`.
pub fn lower(i: usize) -> u64 {
    if i == 0 { 0 } else { upper(i - 1) }
}

/// A value representing bucket `i` (its midpoint).
pub fn mid(i: usize) -> u64 {
    (lower(i) + upper(i)) / 2
}

/// The histogram itself.
#[derive(Debug, Clone)]
pub struct Hist {
    w: [f32; BUCKETS],
    total: f32,
    pending: u32,
}

impl Default for Hist {
    fn default() -> Self {
        Hist::new()
    }
}

impl Hist {
    /// Empty (a `const fn`: the preload shim keeps one per thread in a
    /// const-initialised thread-local).
    pub const fn new() -> Hist {
        Hist {
            w: [0.0; BUCKETS],
            total: 0.0,
            pending: 0,
        }
    }

    /// Record one wait of `ns`.
    #[inline]
    pub fn add(&mut self, ns: u64) {
        self.w[index(ns)] += 1.0;
        self.total += 1.0;
        self.pending += 1;
        if self.pending >= DECAY_EVERY {
            self.decay();
        }
    }

    fn decay(&mut self) {
        let f = 0.5f32.powf(self.pending as f32 / HALF_LIFE as f32);
        self.pending = 0;
        let mut t = 0.0;
        for w in &mut self.w {
            *w *= f;
            t += *w;
        }
        self.total = t;
    }

    /// Total (decayed) weight: roughly how many recent waits it describes.
    pub fn total(&self) -> f32 {
        self.total
    }

    /// Weight of bucket `i`.
    pub fn weight(&self, i: usize) -> f32 {
        self.w[i]
    }

    /// The upper edge of the bucket holding the `q` quantile (0..=1): a
    /// budget that catches at least that share of the recorded waits; 0
    /// when empty.
    pub fn quantile_upper(&self, q: f32) -> u64 {
        self.quantile_bucket(q).map_or(0, upper)
    }

    /// The `q` quantile (0..=1), as a bucket midpoint; 0 when empty.
    pub fn quantile(&self, q: f32) -> u64 {
        self.quantile_bucket(q).map_or(0, mid)
    }

    fn quantile_bucket(&self, q: f32) -> Option<usize> {
        if self.total <= 0.0 {
            return None;
        }
        let target = q.clamp(0.0, 1.0) * self.total;
        let mut acc = 0.0;
        for (i, w) in self.w.iter().enumerate() {
            acc += w;
            if acc >= target && *w > 0.0 {
                return Some(i);
            }
        }
        Some(BUCKETS - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_range() {
        assert_eq!(lower(0), 0);
        for i in 0..BUCKETS - 1 {
            assert_eq!(upper(i), lower(i + 1));
            assert!(upper(i) > lower(i));
            assert_eq!(index(lower(i)), i, "lower edge of {i}");
            assert_eq!(index(upper(i) - 1), i, "last value of {i}");
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn old_weight_halves_after_half_life() {
        let mut h = Hist::default();
        for _ in 0..HALF_LIFE {
            h.add(1000);
        }
        let before = h.weight(index(1000));
        for _ in 0..HALF_LIFE {
            h.add(1_000_000);
        }
        let after = h.weight(index(1000));
        assert!((after / before - 0.5).abs() < 0.05, "{before} -> {after}");
    }
}

//! A fixed, allocation-free latency histogram: 4 buckets per power of two
//! of nanoseconds (so a bucket is at most 25 % wide), from 256 ns to 2^36 ns
//! (≈ 69 s), with one bucket below and one above. 114 `u32` counts (456
//! bytes): small enough to keep one per QP and opcode in a static table,
//! which is what the stall monitor needs (hdrhistogram allocates).

/// Octaves covered: 2^8 .. 2^36 ns.
const LO_SHIFT: u32 = 8;
const HI_SHIFT: u32 = 36;
const SUB: usize = 4;
/// Buckets: under, 4 per octave, over.
pub const BUCKETS: usize = 2 + (HI_SHIFT - LO_SHIFT) as usize * SUB;

#[derive(Clone, Copy)]
pub struct LogHist {
    counts: [u32; BUCKETS],
    n: u64,
    max: u64,
}

impl Default for LogHist {
    fn default() -> Self {
        Self::NEW
    }
}

fn bucket(ns: u64) -> usize {
    if ns < 1 << LO_SHIFT {
        return 0;
    }
    if ns >= 1 << HI_SHIFT {
        return BUCKETS - 1;
    }
    let e = 63 - ns.leading_zeros(); // floor(log2), in LO_SHIFT..HI_SHIFT
    let sub = ((ns >> (e - 2)) & 3) as usize; // the two bits after the top one
    1 + (e - LO_SHIFT) as usize * SUB + sub
}

/// The upper edge of bucket `b` (ns): what a percentile reports.
fn upper(b: usize) -> u64 {
    if b == 0 {
        return 1 << LO_SHIFT;
    }
    if b >= BUCKETS - 1 {
        return u64::MAX;
    }
    let e = LO_SHIFT as u64 + ((b - 1) / SUB) as u64;
    let sub = ((b - 1) % SUB) as u64;
    (1u64 << e) + ((sub + 1) << (e - 2))
}

impl LogHist {
    pub const NEW: LogHist = LogHist {
        counts: [0; BUCKETS],
        n: 0,
        max: 0,
    };

    #[inline]
    pub fn record(&mut self, ns: u64) {
        let b = bucket(ns);
        self.counts[b] = self.counts[b].saturating_add(1);
        self.n += 1;
        self.max = self.max.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.n
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value below which `q` (0..=1) of the samples lie, as the upper
    /// edge of its bucket (never above the maximum seen). 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let want = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c as u64;
            if seen >= want {
                return upper(b).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_narrow() {
        let mut last = 0;
        for ns in (0..40u32).flat_map(|e| [1u64 << e, (1u64 << e) * 5 / 4, (1u64 << e) * 7 / 4]) {
            let b = bucket(ns);
            assert!(b >= last, "{ns}");
            last = b;
            if (1 << LO_SHIFT..1 << HI_SHIFT).contains(&ns) {
                // the bucket's upper edge is above ns and within 25 %
                assert!(
                    upper(b) > ns && upper(b) as f64 <= ns as f64 * 1.25 + 1.0,
                    "{ns}"
                );
            }
        }
    }

    #[test]
    fn quantiles() {
        let mut h = LogHist::NEW;
        assert_eq!(h.quantile(0.5), 0);
        for _ in 0..99 {
            h.record(10_000);
        }
        h.record(80_000_000);
        assert_eq!(h.count(), 100);
        let p50 = h.quantile(0.5);
        assert!((10_000..=12_500).contains(&p50), "{p50}");
        assert_eq!(h.quantile(1.0), 80_000_000);
        assert_eq!(h.max(), 80_000_000);
    }
}

//! The completion-latency monitor for verbs: date each posted send-queue
//! work request, match its completion by QP and `wr_id`, keep per-QP
//! latency histograms by opcode, and flag a completion later than a
//! threshold as a **stall**, grouped into episodes (one report each) and
//! explained by [`cause`].
//!
//! This module is the data structure and the judgement only (no FFI, no
//! allocation, fixed static-friendly tables): the preload shim feeds it
//! from its wrapped `post_send` / `poll_cq` ops, and gathers the facts a
//! cause is named from (QP attributes, port counters, ODP registrations).
//!
//! What is monitored, and why only that: send-queue work requests (SEND,
//! RDMA WRITE/READ, atomics), whose completion time is the network's and
//! the peer NIC's doing. A receive completes when the peer decides to send,
//! which says nothing about a stall.
//!
//! "Late" is measured from the post to the poll that returned the
//! completion. A program that stops looking at its CQ (it computes, or
//! waits for something else) would make any completion look late, so a
//! late completion counts as a stall only if the program looked at that CQ
//! (polled it, or got an event for it) within the threshold before it was
//! returned; otherwise it is counted as `unobserved` and not reported.

pub mod cause;
pub mod hist;
pub mod ports;
pub mod qp;

use qp::{Done, Posted, QpMon, ReadsChange};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Default stall threshold: tens of ms, far above any healthy completion
/// (µs) and below the retransmission timeouts the ODP study met (≥ 500 ms
/// in firmware; 67 ms for QP timeout 14, the usual setting).
pub const DEFAULT_THRESHOLD_MS: u64 = 50;

/// QPs the monitor tracks (more are simply not monitored).
pub const MAX_QP: usize = 128;
/// CQs whose last look is kept.
pub const MAX_CQ: usize = 256;

/// Work-request classes, by `ibv_wr_opcode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Send = 0,
    Write = 1,
    Read = 2,
    Atomic = 3,
    Other = 4,
}

impl Op {
    pub const COUNT: usize = 5;
    pub const ALL: [Op; 5] = [Op::Send, Op::Write, Op::Read, Op::Atomic, Op::Other];

    /// From `ibv_wr_opcode` (verbs.h: WRITE 0, WRITE_WITH_IMM 1, SEND 2,
    /// SEND_WITH_IMM 3, READ 4, CAS 5, FETCH_ADD 6, ..., SEND_WITH_INV 8).
    #[inline]
    pub fn from_wr_opcode(op: u32) -> Op {
        match op {
            0 | 1 => Op::Write,
            2 | 3 | 8 => Op::Send,
            4 => Op::Read,
            5 | 6 => Op::Atomic,
            _ => Op::Other,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "SEND",
            Op::Write => "RDMA_WRITE",
            Op::Read => "RDMA_READ",
            Op::Atomic => "ATOMIC",
            Op::Other => "OTHER",
        }
    }
}

/// A stall threshold as a user writes it (`FASTWAKE_STALL_MS`, `fastwake
/// bench pingpong --stall-ms`): milliseconds, at most an hour, or
/// `off`/`0` (`None`). `Err`: why not, one line.
pub fn threshold_ms(s: &str) -> Result<Option<u64>, String> {
    match s.trim() {
        "off" | "0" => Ok(None),
        t => match t.parse::<u64>() {
            Ok(ms) if ms <= 3_600_000 => Ok(Some(ms)),
            _ => Err(format!(
                "'{t}': expected a number of milliseconds or off (at most an hour)"
            )),
        },
    }
}

/// Parse `FASTWAKE_STALL_MS` ([`threshold_ms`]; unset or empty: the
/// default). `Err`: one line; the caller keeps the default.
pub fn parse_threshold_ms(v: Option<&str>) -> Result<Option<u64>, String> {
    match v.map(str::trim) {
        None | Some("") => Ok(Some(DEFAULT_THRESHOLD_MS)),
        Some(s) => threshold_ms(s)
            .map_err(|e| format!("FASTWAKE_STALL_MS={e}; using {DEFAULT_THRESHOLD_MS}")),
    }
}

/// What a matched completion was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Under the threshold (ends the QP's episode, if one was open).
    OnTime,
    /// Late, but the program had not looked at the CQ for longer than the
    /// threshold: it may simply not have asked. Not a stall.
    Unobserved,
    /// Late while the program was looking. `first`: it opens an episode
    /// (report it); later stalls of the same episode are only counted.
    Stall { first: bool },
}

/// Does the monitor judge this completion (`ibv_wc` status and opcode)?
/// A send-queue one (opcodes below `IBV_WC_RECV`, 128), or a failed one,
/// whose opcode is undefined. A receive completes when the peer decides
/// to send: not monitored.
#[inline]
pub fn judged(status: u32, opcode: u32) -> bool {
    status != 0 || opcode < 1 << 7
}

/// The QP's episode state decides what a late completion is.
pub fn judge(q: &mut QpMon, d: &Done, threshold_ns: u64, unlooked_ns: u64) -> Verdict {
    if d.latency_ns < threshold_ns {
        q.in_episode = false;
        return Verdict::OnTime;
    }
    if unlooked_ns > threshold_ns {
        return Verdict::Unobserved;
    }
    q.stalls += 1;
    let first = !q.in_episode;
    if first {
        q.in_episode = true;
        q.episodes += 1;
    }
    Verdict::Stall { first }
}

/// A QP's identity: its context (as an address: QP numbers are per device)
/// and number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpKey {
    pub ctx: usize,
    pub qpn: u32,
}

struct QpSlot {
    /// 0 = free, usize::MAX = being claimed.
    ctx: AtomicUsize,
    qpn: AtomicU32,
    mon: Mutex<QpMon>,
}

struct LookSlot {
    cq: AtomicUsize,
    /// CLOCK_MONOTONIC ns of the program's last look at this CQ.
    at: AtomicU64,
}

/// The monitor's tables: per-QP state and per-CQ last look. `const`
/// constructible, so the shim keeps one in a static (no allocation).
pub struct Monitor {
    qps: [QpSlot; MAX_QP],
    looks: [LookSlot; MAX_CQ],
    /// QPs with outstanding READs on ODP memory: 1 is the damming pattern's
    /// shape, more the flood's.
    odp_read_qps: AtomicU32,
}

fn home(k: usize, n: usize) -> usize {
    (k >> 4).wrapping_mul(0x9E37_79B9) % n
}

impl Default for Monitor {
    fn default() -> Self {
        Self::new()
    }
}

impl Monitor {
    pub const fn new() -> Monitor {
        Monitor {
            qps: [const {
                QpSlot {
                    ctx: AtomicUsize::new(0),
                    qpn: AtomicU32::new(0),
                    mon: Mutex::new(QpMon::NEW),
                }
            }; MAX_QP],
            looks: [const {
                LookSlot {
                    cq: AtomicUsize::new(0),
                    at: AtomicU64::new(0),
                }
            }; MAX_CQ],
            odp_read_qps: AtomicU32::new(0),
        }
    }

    fn find(&self, k: QpKey) -> Option<&QpSlot> {
        let h = home(k.ctx ^ (k.qpn as usize).wrapping_mul(0x85EB_CA6B), MAX_QP);
        (0..MAX_QP).map(|i| &self.qps[(h + i) % MAX_QP]).find(|s| {
            s.ctx.load(Ordering::Acquire) == k.ctx && s.qpn.load(Ordering::Relaxed) == k.qpn
        })
    }

    /// The QP's state, locked; claimed on first use when `claim`. `None`
    /// when the table is full (or the QP is unknown and `claim` is false).
    #[inline]
    pub fn qp(&self, k: QpKey, claim: bool) -> Option<MutexGuard<'_, QpMon>> {
        if let Some(s) = self.find(k) {
            return Some(lock(&s.mon));
        }
        if !claim || k.ctx == 0 || k.ctx == usize::MAX {
            return None;
        }
        let h = home(k.ctx ^ (k.qpn as usize).wrapping_mul(0x85EB_CA6B), MAX_QP);
        for i in 0..MAX_QP {
            let s = &self.qps[(h + i) % MAX_QP];
            if s.ctx
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                lock(&s.mon).reset();
                s.qpn.store(k.qpn, Ordering::Relaxed);
                s.ctx.store(k.ctx, Ordering::Release);
                return Some(lock(&s.mon));
            }
        }
        None
    }

    /// Forget a QP (destroyed: its number may be reused).
    pub fn forget(&self, k: QpKey) {
        if let Some(s) = self.find(k) {
            let mut m = lock(&s.mon);
            if m.odp_reads() > 0 {
                self.odp_read_qps.fetch_sub(1, Ordering::Relaxed);
            }
            m.reset();
            s.ctx.store(0, Ordering::Release);
        }
    }

    /// Keep the count of QPs with outstanding ODP READs.
    #[inline]
    pub fn reads(&self, c: ReadsChange) {
        match c {
            ReadsChange::None => {}
            ReadsChange::Started => {
                self.odp_read_qps.fetch_add(1, Ordering::Relaxed);
            }
            ReadsChange::Ended => {
                self.odp_read_qps.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    pub fn odp_read_qps(&self) -> u32 {
        self.odp_read_qps.load(Ordering::Relaxed)
    }

    /// The program looked at `cq` at `now`; returns its previous look
    /// (`now` when this is the first, or the table is full: then nothing
    /// is ever unobserved on that CQ).
    #[inline]
    pub fn look(&self, cq: usize, now: u64) -> u64 {
        let h = home(cq, MAX_CQ);
        for i in 0..MAX_CQ {
            let s = &self.looks[(h + i) % MAX_CQ];
            let k = s.cq.load(Ordering::Acquire);
            if k == cq {
                return s.at.swap(now, Ordering::Relaxed);
            }
            if k == 0
                && s.cq
                    .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                s.at.store(now, Ordering::Relaxed);
                s.cq.store(cq, Ordering::Release);
                return now;
            }
        }
        now
    }

    /// Forget a CQ's look (destroyed).
    pub fn forget_cq(&self, cq: usize) {
        if let Some(s) = self
            .looks
            .iter()
            .find(|s| s.cq.load(Ordering::Acquire) == cq)
        {
            s.cq.store(0, Ordering::Release);
        }
    }

    /// Every tracked QP (key and a `try_lock`ed state: a slot another
    /// thread holds is skipped, so this is safe from an exit path).
    pub fn for_each(&self, mut f: impl FnMut(QpKey, &QpMon)) {
        for s in &self.qps {
            let ctx = s.ctx.load(Ordering::Acquire);
            if ctx == 0 || ctx == usize::MAX {
                continue;
            }
            let k = QpKey {
                ctx,
                qpn: s.qpn.load(Ordering::Relaxed),
            };
            let g = match s.mon.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            };
            f(k, &g);
        }
    }

    /// Record posts (before the provider sees them, so a completion cannot
    /// overtake its own record).
    #[inline]
    pub fn posted(&self, q: &mut QpMon, p: Posted) {
        self.reads(q.post(p));
    }

    /// Match the completion of `wr_id` on QP `key` and judge it (the QP's
    /// lock taken and let go): the match, the verdict and the QP's
    /// attributes, for naming a first stall's cause. `None`: a QP not
    /// tracked, or a `wr_id` not posted.
    #[inline]
    pub fn complete_on(
        &self,
        key: QpKey,
        wr_id: u64,
        now: u64,
        threshold_ns: u64,
        unlooked_ns: u64,
    ) -> Option<(Done, Verdict, Option<cause::QpAttrs>)> {
        let mut q = self.qp(key, false)?;
        let (d, v) = self.completed(&mut q, wr_id, now, threshold_ns, unlooked_ns)?;
        Some((d, v, q.attrs))
    }

    /// Match a completion and judge it.
    #[inline]
    pub fn completed(
        &self,
        q: &mut QpMon,
        wr_id: u64,
        now: u64,
        threshold_ns: u64,
        unlooked_ns: u64,
    ) -> Option<(Done, Verdict)> {
        let (d, c) = q.complete(wr_id, now)?;
        self.reads(c);
        Some((d, judge(q, &d, threshold_ns, unlooked_ns)))
    }
}

fn lock(m: &Mutex<QpMon>) -> MutexGuard<'_, QpMon> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn post(m: &Monitor, k: QpKey, wr_id: u64, t: u64, op: Op, odp: bool) {
        let mut q = m.qp(k, true).unwrap();
        m.posted(
            &mut q,
            Posted {
                wr_id,
                t_ns: t,
                op,
                odp,
            },
        );
    }

    fn done(m: &Monitor, k: QpKey, wr_id: u64, now: u64, unlooked: u64) -> Option<Verdict> {
        let mut q = m.qp(k, false)?;
        m.completed(&mut q, wr_id, now, 50 * MS, unlooked)
            .map(|(_, v)| v)
    }

    #[test]
    fn receives_are_not_judged_failures_are() {
        use fastwake_verbs_sys::{IBV_WC_RECV, IBV_WC_SEND};
        // verbs.h: IBV_WC_RDMA_READ is 2.
        assert!(judged(0, IBV_WC_SEND) && judged(0, 2));
        assert!(!judged(0, IBV_WC_RECV));
        assert!(
            judged(5, IBV_WC_RECV),
            "a failed completion's opcode is undefined"
        );
    }

    #[test]
    fn threshold_variable() {
        assert_eq!(parse_threshold_ms(None), Ok(Some(50)));
        assert_eq!(parse_threshold_ms(Some("200")), Ok(Some(200)));
        assert_eq!(parse_threshold_ms(Some("off")), Ok(None));
        let e = parse_threshold_ms(Some("bogus")).unwrap_err();
        assert!(e.contains("FASTWAKE_STALL_MS") && !e.contains('\n'));
    }

    #[test]
    fn episodes_open_once_and_close_on_time() {
        // A static: the tables (≈ 1 MB) do not fit a test thread's stack.
        static M: Monitor = Monitor::new();
        let m = &M;
        let k = QpKey {
            ctx: 0x1000,
            qpn: 17,
        };
        let mut t = 0;
        let mut verdicts = Vec::new();
        // on time, late, late, on time, late: two episodes, three stalls.
        for lat in [10_000, 70 * MS, 90 * MS, 20_000, 60 * MS] {
            post(m, k, 2, t, Op::Send, false);
            t += lat;
            verdicts.push(done(m, k, 2, t, 1_000).unwrap());
        }
        assert_eq!(
            verdicts,
            [
                Verdict::OnTime,
                Verdict::Stall { first: true },
                Verdict::Stall { first: false },
                Verdict::OnTime,
                Verdict::Stall { first: true }
            ]
        );
        let q = m.qp(k, false).unwrap();
        assert_eq!((q.stalls, q.episodes), (3, 2));
        assert_eq!(q.hist[Op::Send as usize].count(), 5);
    }

    #[test]
    fn a_program_that_did_not_look_is_not_stalled() {
        // A static: the tables (≈ 1 MB) do not fit a test thread's stack.
        static M: Monitor = Monitor::new();
        let m = &M;
        let k = QpKey {
            ctx: 0x2000,
            qpn: 5,
        };
        post(m, k, 9, 0, Op::Read, false);
        // 80 ms late, but the program had not looked for 70 ms.
        assert_eq!(done(m, k, 9, 80 * MS, 70 * MS), Some(Verdict::Unobserved));
        assert_eq!(m.qp(k, false).unwrap().stalls, 0);
    }

    #[test]
    fn qps_are_per_context_and_forgotten() {
        // A static: the tables (≈ 1 MB) do not fit a test thread's stack.
        static M: Monitor = Monitor::new();
        let m = &M;
        let a = QpKey {
            ctx: 0x1000,
            qpn: 17,
        };
        let b = QpKey {
            ctx: 0x3000,
            qpn: 17,
        };
        post(m, a, 1, 0, Op::Send, false);
        assert!(done(m, b, 1, 10, 0).is_none(), "other device, same number");
        m.forget(a);
        assert!(m.qp(a, false).is_none());
    }

    #[test]
    fn looks() {
        // A static: the tables (≈ 1 MB) do not fit a test thread's stack.
        static M: Monitor = Monitor::new();
        let m = &M;
        assert_eq!(m.look(0x5000, 10), 10);
        assert_eq!(m.look(0x5000, 25), 10);
        m.forget_cq(0x5000);
        assert_eq!(m.look(0x5000, 40), 40);
    }

    #[test]
    fn odp_read_qps_counts_flood_shape() {
        // A static: the tables (≈ 1 MB) do not fit a test thread's stack.
        static M: Monitor = Monitor::new();
        let m = &M;
        for qpn in 1..=4 {
            post(m, QpKey { ctx: 0x1000, qpn }, 1, 0, Op::Read, true);
        }
        assert_eq!(m.odp_read_qps(), 4);
        done(
            m,
            QpKey {
                ctx: 0x1000,
                qpn: 1,
            },
            1,
            10,
            0,
        );
        assert_eq!(m.odp_read_qps(), 3);
        m.forget(QpKey {
            ctx: 0x1000,
            qpn: 2,
        });
        assert_eq!(m.odp_read_qps(), 2);
    }
}

//! Which verb fetches the next object: the chooser.
//!
//! Pure, like [`crate::wait::Governor`] is for waiting: the caller passes
//! what each fetch cost (latency and the client's CPU, in ns) and the
//! server's load word it saw; the chooser keeps, per size class, a
//! decaying estimate of every path and answers with the path for the next
//! fetch and why. No clock, no thread, no NIC: its rules are unit-tested on
//! synthetic cost tables.
//!
//! The rules, and why:
//!
//! - **Estimates per size class.** The crossover between two dependent
//!   READs and an RPC moves with the object's size (the RoCE study: READ-2
//!   wins up to 64 B on a ConnectX-3, RPC above), so every power-of-two
//!   size class from 8 B to 64 KiB learns on its own. An estimate is an
//!   exponentially decaying mean (weight [`ALPHA`] per sample) of the
//!   path's latency and of the client's CPU per fetch; a sample counts as
//!   at most [`CLIP`] estimates (see there), its deviation as at most
//!   [`DEV_CLIP`] in the estimate's noise.
//! - **The server's load is part of the RPC's cost.** An RPC's latency
//!   depends on the server's RPC thread, READs do not: the RPC estimate is
//!   kept apart for an idle and a busy server (as the load word says), so
//!   when the word turns busy the chooser weighs RPC by what RPC cost the
//!   last time the server was busy, and when it turns idle again, by the
//!   idle figure, at once. A load class without samples borrows the other
//!   one's estimate and is probed first.
//! - **Probes.** One fetch in [`Policy::probe_every`] (default 32, about
//!   3 %) takes the allowed path other than the current one whose
//!   estimate is oldest, so estimates of paths not taken stay fresh; one
//!   in a quarter of that, a path that may be cheaper than the current
//!   one (its estimate less twice its noise is below); a
//!   probe's sample counts with weight [`PROBE_ALPHA`], since probes are
//!   rare and a change must show within a few of them, and no more, since
//!   a probe of a noisy path must not swing its estimate alone. The first
//!   sample of an estimate older than [`STALE`] decisions weighs
//!   [`STALE_ALPHA`]. When the word turns idle after busy, the next
//!   [`REPROBE`] fetches probe the RPC and its samples weigh
//!   [`STALE_ALPHA`]: the word lags the server, and the idle estimate may
//!   hold a hog's first RPCs.
//! - **Hysteresis.** The current path changes only when another is
//!   cheaper by [`Policy::margin`] (10 %) plus the two estimates' own
//!   noise (from the decaying mean deviation of their samples) on
//!   [`Policy::confirm`] decisions in a row (8). RFP switches a client
//!   from READs to server replies after repeated failed retries; here
//!   every fetch is a vote, and a gap must stand out of the noise for
//!   eight votes in a row to move the path; a path at under half the
//!   current one's cost beyond the noise ([`SWITCH_NOW`]) takes over at
//!   once.
//! - **The CPU cap** (`cap=N%`, the grammar of `adaptive`): a path whose
//!   client CPU per fetch is more than N % of its latency is not chosen
//!   while some allowed path is under the cap; when none is, the one with
//!   the least CPU share is.
//!
//! Bounds (asserted by the tests below on synthetic tables): after
//! convergence the mean cost is within 1.15× the best fixed path's; on a
//! steady table at most [`STEADY_SWITCHES`] switches per 10,000 fetches;
//! a change of the costs announced by the load word is followed within
//! [`FOLLOW_ANNOUNCED`] fetches of its class, one seen only by the costs
//! within [`FOLLOW_SILENT`].

use std::fmt::Write as _;

/// How a fetch reaches the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Path {
    /// One READ of the object at its cached address, checked by its version.
    Read = 0,
    /// READ the key's buckets, then READ the object.
    Read2 = 1,
    /// SEND the key; the server answers with the object.
    Rpc = 2,
}

/// Every path, in order.
pub const PATHS: [Path; 3] = [Path::Read, Path::Read2, Path::Rpc];

impl Path {
    /// Its name in options and reports.
    pub fn name(self) -> &'static str {
        match self {
            Path::Read => "read",
            Path::Read2 => "read2",
            Path::Rpc => "rpc",
        }
    }

    /// Parse `read`, `read2` (or `read-2`) or `rpc`.
    pub fn parse(s: &str) -> Option<Path> {
        match s.trim() {
            "read" => Some(Path::Read),
            "read2" | "read-2" => Some(Path::Read2),
            "rpc" => Some(Path::Rpc),
            _ => None,
        }
    }
}

/// Weight of a sample of the path in use.
pub const ALPHA: f64 = 1.0 / 8.0;
/// A sample counts as at most this many estimates (its path's own for the
/// path in use, the class's cheapest for a probe): one stall (a
/// descheduled vCPU, a timer tick) on a rarely probed path moves its
/// estimate by a bounded amount instead of holding the chooser off that
/// path for hundreds of fetches, while the path in use, if it stalls in
/// more than one fetch in `CLIP` (an RPC thread sharing its core with a
/// hog), shows it without bound.
pub const CLIP: f64 = 8.0;
/// A sample's deviation counts as at most this many times its path's
/// estimate in the noise.
pub const DEV_CLIP: f64 = 2.0;
/// Weight of a probe's sample.
pub const PROBE_ALPHA: f64 = 1.0 / 4.0;
/// An estimate not sampled for this many decisions of its class is stale.
pub const STALE: u64 = 256;
/// Weight of the first sample of a stale estimate: what the estimate says
/// is older than the noise the sample would be smoothed against.
pub const STALE_ALPHA: f64 = 1.0 / 2.0;
/// RPC probes in a row when the word turns idle after busy, each weighing
/// [`STALE_ALPHA`]. The word lags the server by up to a window, so the
/// RPCs of a hog's first fetches cost what they cost busy while the word
/// still said idle, and the idle estimate took them in (3.4× what RPCs
/// cost once the hog had gone, in the guest); at one probe in 8 those
/// samples took 80 fetches to wash out. Eight samples at weight 1/2 leave
/// a 256th of the error and of its deviation, whose noise would otherwise
/// hold the switch back (with four, the unit test came back after 27
/// fetches, past [`FOLLOW_ANNOUNCED`]'s 16).
pub const REPROBE: u32 = 8;
/// How many standard errors of the two estimates a gap must exceed.
pub const NOISE_K: f64 = 2.0;
/// A path cheaper than this share of the current one's cost (beyond the
/// noise) takes over without waiting for [`Policy::confirm`] votes.
pub const SWITCH_NOW: f64 = 0.5;
/// Size classes: 8 B, 16 B, … 64 KiB (14), larger, and not yet known.
pub const CLASSES: usize = 16;
/// The class of a fetch whose object size the client does not know yet.
pub const UNKNOWN_SIZE: usize = CLASSES - 1;
/// Samples of each allowed path before the first choice.
pub const WARMUP: u32 = 2;
/// Switches per 10,000 fetches of a class on a steady cost table at most.
pub const STEADY_SWITCHES: u64 = 4;
/// Fetches of a class within which a cost change announced by the load
/// word moves the path.
pub const FOLLOW_ANNOUNCED: u64 = 16;
/// Fetches of a class within which a cost change the load word does not
/// announce moves the path.
pub const FOLLOW_SILENT: u64 = 512;

/// The size class of an object of `len` bytes.
pub fn class_of(len: usize) -> usize {
    let bits = usize::BITS - len.max(1).saturating_sub(1).leading_zeros();
    (bits.clamp(3, 17) - 3) as usize
}

/// The smallest size of class `c` (for reports).
pub fn class_floor(c: usize) -> usize {
    if c == 0 { 1 } else { (4usize << c) + 1 }
}

/// A class's label: its largest size (`8B` … `64KiB`, `>64KiB`, `?`).
pub fn class_label(c: usize) -> String {
    match c {
        UNKNOWN_SIZE => "?".into(),
        14 => ">64KiB".into(),
        _ => {
            let top = 8usize << c;
            if top >= 1024 {
                format!("{}KiB", top / 1024)
            } else {
                format!("{top}B")
            }
        }
    }
}

/// What the server's load word says, decoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// The RPC thread's busy share of the last window, ‰: serving
    /// requests, or wanting its CPU and not getting it.
    pub busy: u16,
    /// Of that, ‰ spent waiting for its CPU (run-queue delay).
    pub delayed: u16,
    /// Requests it found queued at its last look.
    pub depth: u16,
}

/// Busy share (‰) from which the server counts as busy.
pub const BUSY_PERMILLE: u16 = 500;
/// Share of the time (‰) the RPC thread waited for its CPU from which
/// the server counts as busy: a hog on its core (a VM's vCPU waking from
/// halt makes a few %).
pub const DELAYED_PERMILLE: u16 = 200;
/// Queue depth from which the server counts as busy.
pub const BUSY_DEPTH: u16 = 4;

impl Load {
    /// Pack into the 64-bit word the server publishes (the top 16 bits
    /// are the server's sequence: they change with every update).
    pub fn pack(self, seq: u16) -> u64 {
        u64::from(self.busy)
            | u64::from(self.delayed) << 16
            | u64::from(self.depth) << 32
            | u64::from(seq) << 48
    }

    /// Decode a published word.
    pub fn unpack(w: u64) -> Load {
        Load {
            busy: w as u16,
            delayed: (w >> 16) as u16,
            depth: (w >> 32) as u16,
        }
    }

    /// 0 = idle, 1 = busy: which RPC estimate applies.
    pub fn class(self) -> usize {
        usize::from(
            self.busy >= BUSY_PERMILLE
                || self.delayed >= DELAYED_PERMILLE
                || self.depth >= BUSY_DEPTH,
        )
    }
}

/// How the client picks a path: one fixed path, or adaptive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// `Some`: always this path (READ falls back to READ-2 for a key whose
    /// address is not cached).
    pub fixed: Option<Path>,
    /// Paths adaptive may take (bit per [`Path`]).
    pub allowed: u8,
    /// Largest client CPU per fetch as a share of its latency.
    pub cap: Option<f64>,
    /// One fetch in this many is a probe of another path (0: none).
    pub probe_every: u32,
    /// How much cheaper (fraction) another path must be to take over.
    pub margin: f64,
    /// Decisions in a row another path must win by the margin.
    pub confirm: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            fixed: None,
            allowed: 0b111,
            cap: None,
            probe_every: 32,
            margin: 0.10,
            confirm: 8,
        }
    }
}

impl Policy {
    /// `path` only.
    pub fn fixed(path: Path) -> Policy {
        Policy {
            fixed: Some(path),
            ..Policy::default()
        }
    }

    /// May adaptive take `p`?
    pub fn allows(&self, p: Path) -> bool {
        self.allowed & (1 << p as u8) != 0
    }

    /// Its spelling in reports (parses back).
    pub fn name(&self) -> String {
        if let Some(p) = self.fixed {
            return p.name().into();
        }
        let d = Policy::default();
        let mut opts = Vec::new();
        if self.allowed != d.allowed {
            let ps: Vec<&str> = PATHS
                .iter()
                .filter(|p| self.allows(**p))
                .map(|p| p.name())
                .collect();
            opts.push(format!("paths={}", ps.join("+")));
        }
        if let Some(c) = self.cap {
            opts.push(format!("cap={}%", c * 100.0));
        }
        if self.probe_every != d.probe_every {
            opts.push(format!("probe={}", self.probe_every));
        }
        if opts.is_empty() {
            "adaptive".into()
        } else {
            format!("adaptive:{}", opts.join(","))
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = crate::Fail;

    /// `read`, `read2`, `rpc`, or `adaptive[:cap=N%,paths=read+read2+rpc,
    /// probe=N,margin=N%,confirm=N]` (shares in the grammar of
    /// `adaptive`'s `cap`).
    fn from_str(s: &str) -> crate::Result<Policy> {
        let t = s.trim();
        if let Some(p) = Path::parse(t) {
            return Ok(Policy::fixed(p));
        }
        let bad = |why: String| {
            crate::Fail::invalid(format!(
                "bad fetch path '{s}': {why}; expected read, read2, rpc or adaptive[:cap=N%,paths=read+read2+rpc,probe=N,margin=N%,confirm=N]"
            ))
        };
        let opts = match t.split_once(':') {
            Some(("adaptive", o)) => o,
            None if t == "adaptive" => "",
            _ => return Err(bad("unknown path".into())),
        };
        let mut p = Policy::default();
        for kv in opts.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("'{kv}' is not key=value")))?;
            let num = || v.trim().parse::<u32>().map_err(|_| bad(format!("bad {k}")));
            match k.trim() {
                "cap" => p.cap = Some(crate::grammar::share(v).map_err(|e| bad(e.cause().into()))?),
                "margin" => {
                    p.margin = crate::grammar::share(v).map_err(|e| bad(e.cause().into()))?;
                    if p.margin >= 1.0 {
                        return Err(bad("margin must be under 100%".into()));
                    }
                }
                "probe" => p.probe_every = num()?,
                "confirm" => p.confirm = num()?.max(1),
                "paths" => {
                    p.allowed = 0;
                    for n in v.split('+') {
                        let q = Path::parse(n).ok_or_else(|| bad(format!("unknown path '{n}'")))?;
                        p.allowed |= 1 << q as u8;
                    }
                    if p.allowed & !(1 << Path::Read as u8) == 0 {
                        return Err(bad(
                            "paths needs read2 or rpc (READ needs a cached address)".into(),
                        ));
                    }
                }
                _ => return Err(bad(format!("unknown option '{k}'"))),
            }
        }
        Ok(p)
    }
}

/// Why a fetch took its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The policy is one fixed path.
    Fixed,
    /// Learning: every allowed path gets [`WARMUP`] samples first.
    Warmup,
    /// The current path: the cheapest by the estimates.
    Cheapest,
    /// A probe of a path not in use.
    Probe,
    /// The cheapest path is over the CPU cap; this one is under it.
    Cap,
    /// The current path is READ, and this key's address is not cached.
    Uncached,
}

/// Counters of one size class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Fetches per path.
    pub fetches: [u64; 3],
    /// Of those, probes.
    pub probes: [u64; 3],
    /// Times the current path changed.
    pub switches: u64,
    /// Fetches that took a path other than the cheapest because of the cap.
    pub capped: u64,
    /// Fetches whose current path was READ without a cached address.
    pub uncached: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Est {
    lat: f64,
    cpu: f64,
    /// Decaying mean absolute deviation of the latency samples.
    dev: f64,
    n: u32,
    /// The class's decision count at the last sample.
    at: u64,
}

impl Est {
    /// Add a sample, counted as at most [`CLIP`] times `unit`.
    fn add(&mut self, lat: f64, cpu: f64, alpha: f64, at: u64, unit: f64) {
        let clipped = lat.min(CLIP * unit);
        // The CPU in proportion, so a clipped sample keeps its CPU share
        // (what the cap weighs).
        let cpu = if lat > 0.0 { cpu * clipped / lat } else { cpu };
        let lat = clipped;
        if self.n == 0 {
            (self.lat, self.cpu) = (lat, cpu);
        } else {
            // A deviation counts as at most DEV_CLIP estimates: the noise
            // says how far typical fetches stray, and a stall (already
            // clipped) must not make every gap look like noise for long.
            let d = (lat - self.lat).abs().min(DEV_CLIP * self.lat);
            self.dev += alpha * (d - self.dev);
            self.lat += alpha * (lat - self.lat);
            self.cpu += alpha * (cpu - self.cpu);
        }
        self.n = self.n.saturating_add(1);
        self.at = at;
    }

    /// The estimate's own noise (its standard error, roughly): a decaying
    /// mean of weight `alpha` over samples of deviation `dev` varies by
    /// `dev·√(α/(2−α))`.
    fn noise(&self, alpha: f64) -> f64 {
        self.dev * (alpha / (2.0 - alpha)).sqrt()
    }
}

#[derive(Debug, Clone, Default)]
struct Class {
    /// [path][load class]; READ paths use load class 0 only.
    est: [[Est; 2]; 3],
    current: Option<Path>,
    /// The path that has beaten the current one, and for how many decisions.
    challenger: Option<(Path, u32)>,
    decisions: u64,
    /// The load class of the last decision (0 idle, 1 busy).
    last_load: usize,
    /// RPC probes still to take after the word turned idle ([`REPROBE`]).
    reprobe: u32,
    /// RPC samples under an idle word still to weigh [`STALE_ALPHA`].
    fresh: u32,
    stats: ClassStats,
}

/// The decision engine (see the module docs).
#[derive(Debug, Clone)]
pub struct Chooser {
    policy: Policy,
    classes: Vec<Class>,
}

impl Chooser {
    /// A chooser under `policy`.
    pub fn new(policy: Policy) -> Chooser {
        Chooser {
            policy,
            classes: vec![Class::default(); CLASSES],
        }
    }

    /// Its policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn slot(p: Path, load: Load) -> usize {
        if p == Path::Rpc { load.class() } else { 0 }
    }

    /// The estimate of `p` in `class` under `load`: (latency ns, CPU ns,
    /// samples); a load class without samples borrows the other's.
    pub fn estimate(&self, class: usize, p: Path, load: Load) -> Option<(f64, f64, u32)> {
        let c = &self.classes[class.min(CLASSES - 1)];
        let row = &c.est[p as usize];
        let s = Self::slot(p, load);
        let e = if row[s].n > 0 { row[s] } else { row[1 - s] };
        (e.n > 0).then_some((e.lat, e.cpu, row[s].n))
    }

    /// The path for the next fetch in size class `class`; `cached`: the
    /// client holds the object's address (READ is possible).
    pub fn choose(&mut self, class: usize, cached: bool, load: Load) -> (Path, Why) {
        let class = class.min(CLASSES - 1);
        let policy = self.policy;
        if let Some(p) = policy.fixed {
            let p = if p == Path::Read && !cached {
                Path::Read2
            } else {
                p
            };
            return (p, Why::Fixed);
        }
        let c = &mut self.classes[class];
        c.decisions += 1;
        if c.last_load == 1 && load.class() == 0 {
            (c.reprobe, c.fresh) = (REPROBE, REPROBE);
        }
        c.last_load = load.class();
        let usable = |p: Path| policy.allows(p) && (p != Path::Read || cached);
        let candidates: Vec<Path> = PATHS.iter().copied().filter(|&p| usable(p)).collect();
        let candidates = if candidates.is_empty() {
            // Only READ is allowed and this key is not cached.
            vec![Path::Read2]
        } else {
            candidates
        };
        // Warm-up: every usable path WARMUP samples (the RPC under this load).
        let samples = |p: Path| c.est[p as usize][0].n + c.est[p as usize][1].n;
        if let Some(&p) = candidates.iter().find(|&&p| samples(p) < WARMUP) {
            return (p, Why::Warmup);
        }
        // The estimates under this load (a copy: the class changes below).
        let table: [Est; 3] = PATHS.map(|p| {
            let row = &c.est[p as usize];
            let s = Self::slot(p, load);
            if row[s].n > 0 { row[s] } else { row[1 - s] }
        });
        let last_sample: [u64; 3] = PATHS.map(|p| c.est[p as usize][Self::slot(p, load)].at);
        let est = |p: Path| table[p as usize];
        let share = |p: Path| {
            let e = est(p);
            if e.lat > 0.0 { e.cpu / e.lat } else { 0.0 }
        };
        let under: Vec<Path> = match policy.cap {
            Some(cap) => candidates
                .iter()
                .copied()
                .filter(|&p| share(p) <= cap)
                .collect(),
            None => candidates.clone(),
        };
        let by_lat = |a: &&Path, b: &&Path| est(**a).lat.total_cmp(&est(**b).lat);
        let best = if under.is_empty() {
            // Nothing under the cap: the least CPU share.
            *candidates
                .iter()
                .min_by(|a, b| share(**a).total_cmp(&share(**b)))
                .expect("a candidate")
        } else {
            *under.iter().min_by(&by_lat).expect("a candidate")
        };
        let cheapest = *candidates.iter().min_by(&by_lat).expect("a candidate");
        // An RPC estimate for this load that was never measured: probe it now.
        let rpc_unmeasured =
            candidates.contains(&Path::Rpc) && c.est[Path::Rpc as usize][load.class()].n == 0;
        // Hysteresis on the current path.
        let cur = match c.current {
            Some(cur) if usable(cur) && (under.is_empty() || under.contains(&cur)) => {
                let (b, k) = (est(best), est(cur));
                // The gap must beat the margin and the estimates' noise.
                let noise =
                    NOISE_K * (b.noise(PROBE_ALPHA).powi(2) + k.noise(ALPHA).powi(2)).sqrt();
                if best != cur && b.lat + noise < k.lat * (1.0 - policy.margin) {
                    let n = match c.challenger {
                        Some((p, n)) if p == best => n + 1,
                        _ => 1,
                    };
                    // A path at under half the current one's cost, beyond
                    // the noise, takes over at once: the votes are for
                    // gaps the noise could make, and waiting them out
                    // costs eight fetches at the old price (under a hog,
                    // eight RPCs a time slice each).
                    let clear = b.lat + noise < k.lat * SWITCH_NOW;
                    if n >= policy.confirm || clear {
                        c.challenger = None;
                        c.stats.switches += 1;
                        c.current = Some(best);
                        best
                    } else {
                        c.challenger = Some((best, n));
                        cur
                    }
                } else {
                    c.challenger = None;
                    cur
                }
            }
            Some(cur) if usable(cur) => {
                // Over the cap now: leave at once (the cap is a bound).
                c.challenger = None;
                c.stats.switches += 1;
                c.current = Some(best);
                best
            }
            Some(Path::Read) => {
                // READ is current but this key is not cached: the best
                // other path for this fetch, the current path kept.
                c.stats.uncached += 1;
                return (best, Why::Uncached);
            }
            _ => {
                c.current = Some(best);
                best
            }
        };
        // Probes: the RPC under a load it was never measured in, at once
        // (the word announced a change); else one in probe_every.
        if rpc_unmeasured && cur != Path::Rpc {
            return (Path::Rpc, Why::Probe);
        }
        // The word turned idle: what the idle RPC estimate last took in may
        // have been a hog the word had not announced yet (see REPROBE).
        if c.reprobe > 0 && cur != Path::Rpc && candidates.contains(&Path::Rpc) {
            c.reprobe -= 1;
            return (Path::Rpc, Why::Probe);
        }
        // A path that may be cheaper (its estimate less its noise is under
        // the current one's) is probed four times as often: its samples
        // can change the decision, and a mean of few samples of a
        // heavy-tailed latency (one stall of a descheduled vCPU among
        // them) needs more samples to settle.
        let k = est(cur);
        let promising = |p: Path| est(p).lat - est(p).noise(PROBE_ALPHA) * 2.0 < k.lat;
        let every = u64::from(policy.probe_every);
        let oldest = |only_promising: bool| {
            candidates
                .iter()
                .copied()
                .filter(|&p| p != cur && (!only_promising || promising(p)))
                .min_by_key(|&p| last_sample[p as usize])
        };
        let probe = if every == 0 {
            None
        } else if c.decisions.is_multiple_of(every) {
            oldest(false)
        } else if c.decisions.is_multiple_of((every / 4).max(1)) {
            oldest(true)
        } else {
            None
        };
        if let Some(p) = probe {
            return (p, Why::Probe);
        }
        let why = if cur != cheapest && policy.cap.is_some() {
            Why::Cap
        } else {
            Why::Cheapest
        };
        (cur, why)
    }

    /// What a fetch in `class` by `p` cost: `lat_ns` from post to answer,
    /// `cpu_ns` of the client's CPU; `why` as [`Chooser::choose`] said;
    /// `load` the word seen with it.
    pub fn record(
        &mut self,
        class: usize,
        p: Path,
        why: Why,
        load: Load,
        lat_ns: f64,
        cpu_ns: f64,
    ) {
        let c = &mut self.classes[class.min(CLASSES - 1)];
        let at = c.decisions;
        let floor = c
            .est
            .iter()
            .flatten()
            .filter(|e| e.n > 0)
            .map(|e| e.lat)
            .fold(f64::INFINITY, f64::min);
        let fresh = p == Path::Rpc && load.class() == 0 && c.fresh > 0;
        if fresh {
            c.fresh -= 1;
        }
        let e = &mut c.est[p as usize][Self::slot(p, load)];
        let alpha = if fresh || (e.n > 0 && at.saturating_sub(e.at) > STALE) {
            STALE_ALPHA
        } else if why == Why::Probe {
            PROBE_ALPHA
        } else {
            ALPHA
        };
        // The clip's unit: for the path in use, its own estimate (it gets
        // every sample, so stalls in more than one fetch in CLIP raise it
        // without bound); for a probe, the lesser of its own and the
        // class's cheapest estimate (a probed path has few samples, and
        // its own estimate, once inflated, would let the next stall count
        // in full).
        let unit = match (why == Why::Probe, e.n) {
            (_, 0) => floor,
            (true, _) => floor.min(e.lat),
            (false, _) => e.lat,
        };
        e.add(lat_ns, cpu_ns, alpha, at, unit);
        c.stats.fetches[p as usize] += 1;
        if why == Why::Probe {
            c.stats.probes[p as usize] += 1;
        }
        if why == Why::Cap {
            c.stats.capped += 1;
        }
    }

    /// Counters of size class `class`.
    pub fn stats(&self, class: usize) -> ClassStats {
        self.classes[class.min(CLASSES - 1)].stats
    }

    /// The current path of `class` (None before its first choice).
    pub fn current(&self, class: usize) -> Option<Path> {
        self.classes[class.min(CLASSES - 1)].current
    }

    /// One line per size class that has fetched: the path in use, the
    /// fetches per path, the switches, and the estimates that decide.
    pub fn explain(&self) -> String {
        let mut out = format!("fetch {}:", self.policy.name());
        for (i, c) in self.classes.iter().enumerate() {
            let s = &c.stats;
            if s.fetches.iter().sum::<u64>() == 0 {
                continue;
            }
            let _ = write!(
                out,
                "\n  {:>7}: {} ; fetches read {} read2 {} rpc {} (probes {}), switches {}, capped {}, uncached {}; est",
                class_label(i),
                c.current.map_or("-", Path::name),
                s.fetches[0],
                s.fetches[1],
                s.fetches[2],
                s.probes.iter().sum::<u64>(),
                s.switches,
                s.capped,
                s.uncached,
            );
            for p in PATHS {
                for (l, e) in c.est[p as usize].iter().enumerate() {
                    if e.n == 0 {
                        continue;
                    }
                    let tag = match (p, l) {
                        (Path::Rpc, 0) => "rpc/idle",
                        (Path::Rpc, _) => "rpc/busy",
                        _ => p.name(),
                    };
                    // The estimate's noise, as the hysteresis weighs it.
                    let alpha = if c.current == Some(p) {
                        ALPHA
                    } else {
                        PROBE_ALPHA
                    };
                    let _ = write!(
                        out,
                        " {tag} {:.1}±{:.1}us cpu {:.1}us",
                        e.lat / 1e3,
                        e.noise(alpha) / 1e3,
                        e.cpu / 1e3
                    );
                }
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "chooser_tests.rs"]
mod tests;

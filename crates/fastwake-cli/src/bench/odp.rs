//! `fastwake bench odp`: the ODP study's two microbenchmarks
//! (docs/design/stall-monitor.md), on one device in one process (the READs go from client
//! QPs to server QPs on the same device).
//!
//! - **damming**: two 100-byte RDMA READs on one QP, the second posted an
//!   interval after the first (sweep); the time from the first post to the
//!   second completion. The study saw hundreds of ms for intervals of
//!   0.5–4.5 ms with ODP on both sides.
//! - **flood**: `--ops` 100-byte READs posted at once, round-robin over N
//!   QPs (sweep); the time until all completed. The study saw hundreds of
//!   ms to tens of s with client-side ODP on many QPs.
//!
//! Memory: `pinned` (an ordinary registration: the baseline and what
//! `FASTWAKE_ODP=pin` gives), `odp` (both buffers ON_DEMAND, every READ on
//! a page not touched before, so it faults), `odp-prefetch` (ODP, the
//! buffers faulted in with `ibv_advise_mr` first: `FASTWAKE_ODP=prefetch`).
//! On a device without ODP the ODP rows cannot run: one line says so and
//! only the pinned baseline runs.

use fastwake::source::verbs::odp::OdpCaps;
use fastwake::source::verbs::qp::IBV_ACCESS_REMOTE_READ;
use fastwake::source::verbs::{CqConfig, Device, Mr, RcQp, VerbsCq};
use fastwake::{Fail, Result, Source};
use fastwake_verbs_sys::odp::IBV_ACCESS_ON_DEMAND;
use fastwake_verbs_sys::{IBV_ACCESS_LOCAL_WRITE, IBV_WC_SUCCESS};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// RDMA device (default: the first).
    #[arg(long)]
    pub dev: Option<String>,
    /// Damming: intervals between the two READs, in µs (comma separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,100,500,1000,2000,4500,10000"
    )]
    pub interval_us: Vec<u64>,
    /// Damming: repetitions per interval.
    #[arg(long, default_value_t = 10)]
    pub reps: u32,
    /// Flood: QP counts (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub qps: Vec<u32>,
    /// Flood: READs per run.
    #[arg(long, default_value_t = 8192)]
    pub ops: u32,
    /// Bytes per READ.
    #[arg(short = 's', long, default_value_t = 100)]
    pub size: usize,
    /// Memory kinds: pinned, odp, odp-prefetch (default: all supported)
    ///
    /// Memory kinds: pinned, odp, odp-prefetch (default: all the device
    /// supports).
    #[arg(long, value_delimiter = ',')]
    pub memory: Vec<String>,
    /// Give up on a run after this many seconds (a flood can take long).
    #[arg(long, default_value_t = 60)]
    pub timeout_s: u64,
}

const PAGE: usize = 4096;
/// Outstanding READs per QP (the QP's send queue depth).
const DEPTH: u32 = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Memory {
    Pinned,
    Odp,
    OdpPrefetch,
}

impl Memory {
    fn name(self) -> &'static str {
        match self {
            Memory::Pinned => "pinned",
            Memory::Odp => "odp",
            Memory::OdpPrefetch => "odp-prefetch",
        }
    }
    fn parse(s: &str) -> std::result::Result<Memory, String> {
        match s.trim() {
            "pinned" => Ok(Memory::Pinned),
            "odp" => Ok(Memory::Odp),
            "odp-prefetch" => Ok(Memory::OdpPrefetch),
            o => Err(format!(
                "--memory '{o}': expected pinned, odp or odp-prefetch"
            )),
        }
    }
    fn odp(self) -> bool {
        self != Memory::Pinned
    }
}

/// Client and server QPs (connected pairwise) and their CQs.
struct Rig {
    // Drop order: QPs before their CQs.
    client: Vec<RcQp>,
    /// Kept alive: the READs' responders.
    _server: Vec<RcQp>,
    ccq: VerbsCq,
    _scq: VerbsCq,
}

fn rig(dev: &Arc<Device>, n: u32) -> Result<Rig> {
    // Room for every READ in flight on every QP: an overflowing CQ loses
    // completions (and breaks the QPs).
    let ccq = VerbsCq::new(
        dev,
        CqConfig {
            entries: n * DEPTH + 16,
            ..CqConfig::default()
        },
    )?;
    let scq = VerbsCq::new(dev, CqConfig::default())?;
    let mut client = Vec::new();
    let mut server = Vec::new();
    for _ in 0..n {
        let c = RcQp::new(&ccq, &ccq, DEPTH, 0)?;
        let s = RcQp::new(&scq, &scq, DEPTH, 0)?;
        c.connect(&s.endpoint())?;
        s.connect(&c.endpoint())?;
        s.allow_remote(IBV_ACCESS_REMOTE_READ)?;
        client.push(c);
        server.push(s);
    }
    Ok(Rig {
        client,
        _server: server,
        ccq,
        _scq: scq,
    })
}

/// The READ destination (client) and source (server) buffers, `pages`
/// pages each, registered for `mem`.
fn buffers(dev: &Arc<Device>, mem: Memory, pages: usize) -> Result<(Mr, Mr)> {
    let mut access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    if mem.odp() {
        access |= IBV_ACCESS_ON_DEMAND as i32;
    }
    let len = pages * PAGE;
    let dst = Mr::with_access(dev, len, access)?;
    let src = Mr::with_access(dev, len, access)?;
    if mem == Memory::OdpPrefetch {
        dst.prefetch(0, len)?;
        src.prefetch(0, len)?;
    }
    Ok((dst, src))
}

fn wait_completions(r: &mut Rig, mut n: u32, deadline: Instant) -> Result<()> {
    while n > 0 {
        match r.ccq.try_take()? {
            Some(wc) if wc.status != IBV_WC_SUCCESS => {
                return Err(Fail::new(
                    libc::EIO,
                    format!("READ completion status {}", wc.status),
                ));
            }
            Some(_) => n -= 1,
            None if Instant::now() > deadline => {
                return Err(Fail::new(
                    libc::ETIMEDOUT,
                    format!("{n} READ(s) not completed before the --timeout-s deadline"),
                ));
            }
            None => std::hint::spin_loop(),
        }
    }
    Ok(())
}

fn spin_until(t: Instant) {
    while Instant::now() < t {
        std::hint::spin_loop();
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Damming: per interval, `reps` runs of READ, wait interval, READ, each
/// on pages not read before.
fn damming(dev: &Arc<Device>, a: &Args, mem: Memory) -> Result<()> {
    let mut r = rig(dev, 1)?;
    let runs = a.interval_us.len() * a.reps as usize;
    let (dst, src) = buffers(dev, mem, 2 * runs + 1)?;
    let mut page = 0usize;
    for &iv in &a.interval_us {
        let mut times = Vec::new();
        for _ in 0..a.reps {
            let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
            let t0 = Instant::now();
            for k in 0..2 {
                if k == 1 {
                    spin_until(t0 + Duration::from_micros(iv));
                }
                let off = page * PAGE;
                r.client[0].post_read(page as u64, &dst, off, a.size, src.addr(off), src.rkey())?;
                page += 1;
            }
            wait_completions(&mut r, 2, deadline)?;
            times.push(t0.elapsed());
        }
        let mean = times.iter().map(|d| us(*d)).sum::<f64>() / times.len() as f64;
        let max = times.iter().map(|d| us(*d)).fold(0.0, f64::max);
        println!(
            "damming  {:<13} interval {:>6} us  reps {:>3}  mean {:>11.1} us  max {:>11.1} us",
            mem.name(),
            iv,
            a.reps,
            mean,
            max
        );
    }
    Ok(())
}

/// Flood: `ops` READs round-robin over n QPs, as many in flight as the
/// queues take, each on its own page region.
fn flood(dev: &Arc<Device>, a: &Args, mem: Memory, n: u32) -> Result<()> {
    let mut r = rig(dev, n)?;
    let pages = (a.ops as usize * a.size).div_ceil(PAGE) + 1;
    let (dst, src) = buffers(dev, mem, pages)?;
    let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
    let t0 = Instant::now();
    let mut posted = 0u32;
    let mut done = 0u32;
    let mut inflight = vec![0u32; n as usize];
    while done < a.ops {
        while posted < a.ops {
            let q = (posted % n) as usize;
            if inflight[q] >= DEPTH {
                break;
            }
            let off = posted as usize * a.size;
            r.client[q].post_read(posted as u64, &dst, off, a.size, src.addr(off), src.rkey())?;
            inflight[q] += 1;
            posted += 1;
        }
        match r.ccq.try_take()? {
            Some(wc) if wc.status != IBV_WC_SUCCESS => {
                return Err(Fail::new(
                    libc::EIO,
                    format!("READ completion status {}", wc.status),
                ));
            }
            Some(wc) => {
                inflight[(wc.wr_id % n as u64) as usize] -= 1;
                done += 1;
            }
            None if Instant::now() > deadline => {
                return Err(Fail::new(
                    libc::ETIMEDOUT,
                    format!(
                        "flood: {} of {} READs done before the --timeout-s deadline",
                        done, a.ops
                    ),
                ));
            }
            None => std::hint::spin_loop(),
        }
    }
    let t = t0.elapsed();
    println!(
        "flood    {:<13} qps {:>4}  ops {:>6}  total {:>11.1} us  per op {:>8.2} us",
        mem.name(),
        n,
        a.ops,
        us(t),
        us(t) / a.ops as f64
    );
    Ok(())
}

pub fn run(a: Args) -> Result<()> {
    if a.size == 0 || a.size > PAGE {
        return Err(Fail::invalid(format!(
            "--size {}: expected 1..={PAGE} bytes",
            a.size
        )));
    }
    if a.qps.contains(&0) || a.reps == 0 || a.ops == 0 {
        return Err(Fail::invalid("--qps, --reps and --ops must be > 0"));
    }
    let mut mems: Vec<Memory> = if a.memory.is_empty() {
        vec![Memory::Pinned, Memory::Odp, Memory::OdpPrefetch]
    } else {
        a.memory
            .iter()
            .map(|m| Memory::parse(m))
            .collect::<std::result::Result<_, _>>()
            .map_err(Fail::invalid)?
    };
    let dev = Arc::new(Device::open(a.dev.as_deref(), None)?);
    let caps: Option<OdpCaps> = dev.odp_caps();
    let odp_ok = caps.is_some_and(|c| c.supported());
    if !odp_ok && mems.iter().any(|m| m.odp()) {
        println!(
            "{}: {}: the ODP rows cannot run here; running the pinned baseline only",
            dev.name(),
            caps.map_or(
                "ODP capabilities unknown (no ibv_query_device_ex)".into(),
                |c| c.describe()
            )
        );
        mems.retain(|m| !m.odp());
        if mems.is_empty() {
            mems.push(Memory::Pinned);
        }
    } else if let Some(c) = caps {
        println!("{}: {}", dev.name(), c.describe());
    }
    println!(
        "# times are wall clock from the first post to the last completion; {} bytes per READ",
        a.size
    );
    for &m in &mems {
        damming(&dev, &a, m)?;
    }
    for &m in &mems {
        for &n in &a.qps {
            flood(&dev, &a, m, n)?;
        }
    }
    Ok(())
}

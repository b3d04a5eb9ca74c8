//! `fastwake bench pingpong`: one source, several wait modes, one run.

use super::harness::{Case, End, Placement};
use super::{Common, measure, sources, stats};
use fastwake::source::channel::Doorbell;
use fastwake::{Fail, Result, WaitMode};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Wait modes to compare, comma separated: poll, interrupt,
    /// hybrid[:<N>us], adaptive[:<opts>] (e.g. adaptive:cap=20%), dispatch
    /// (no dispatcher runs in this benchmark, so its waits fall back to
    /// interrupt mode; bench share and bench load start one).
    #[arg(long, value_delimiter = ',', default_value = "poll,interrupt,hybrid")]
    pub mode: Vec<String>,
    /// Completion source: channel (shared memory), verbs (RDMA RC
    /// send/recv), tcp (socket source) or uring (io_uring receives).
    #[arg(long, default_value = "channel")]
    pub source: String,
    /// `--source channel`: doorbell, futex or eventfd.
    #[arg(long, default_value = "futex")]
    pub doorbell: String,
    /// RDMA device for `--source verbs` (default: the first one).
    #[arg(long)]
    pub dev: Option<String>,
    /// `--source verbs`: when a waiter runs on another CPU than its CQ's
    /// completion signal: report, thread (move the thread) or irq (move the
    /// IRQ; root only).
    #[arg(long, default_value = "report")]
    pub replace: String,
    #[command(flatten)]
    pub net: NetArgs,
}

/// Options of the network sources (tcp, uring).
#[derive(clap::Args, Debug, Clone)]
pub struct NetArgs {
    /// Path for tcp/uring: loopback, or veth (a veth pair between two
    /// network namespaces the benchmark creates and removes itself).
    #[arg(long, default_value = "loopback")]
    pub net: String,
    /// tcp: set SO_BUSY_POLL to this many µs (reported where it cannot
    /// work: traffic without a NAPI id).
    #[arg(long)]
    pub busy_poll: Option<u32>,
    /// uring: how interrupt mode sleeps: enter (blocking io_uring_enter) or
    /// eventfd (registered eventfd).
    #[arg(long, default_value = "enter")]
    pub uring_wake: String,
}

fn parse_doorbell(s: &str) -> Result<Doorbell> {
    match s {
        "futex" => Ok(Doorbell::Futex),
        "eventfd" => Ok(Doorbell::EventFd),
        _ => Err(Fail::invalid(format!(
            "unknown doorbell '{s}': expected futex or eventfd"
        ))),
    }
}

fn ends(
    a: &Args,
    mode: WaitMode,
    size: usize,
    doorbell: Doorbell,
) -> Result<(Box<dyn End>, Box<dyn End>)> {
    match a.source.as_str() {
        "channel" => {
            let (a, b) = sources::channel::pair(mode, size, doorbell)?;
            Ok((Box::new(a), Box::new(b)))
        }
        "verbs" => {
            let policy = a.replace.parse()?;
            let (p, q) = sources::verbs::pair(a.dev.as_deref(), mode, size, a.common.cpus, policy)?;
            Ok((Box::new(p), Box::new(q)))
        }
        "tcp" => {
            let (p, q, busy) = sources::tcp::pair(mode, size, a.net.net.parse()?, a.net.busy_poll)?;
            if a.net.busy_poll.is_some() {
                eprintln!("tcp ({mode}): kernel busy polling: {busy}");
            }
            Ok((Box::new(p), Box::new(q)))
        }
        "uring" => {
            let (p, q) =
                sources::uring::pair(mode, size, a.net.net.parse()?, a.net.uring_wake.parse()?)?;
            Ok((Box::new(p), Box::new(q)))
        }
        other => Err(Fail::invalid(format!(
            "unknown source '{other}': this build supports: channel, verbs, tcp, uring"
        ))),
    }
}

pub fn run(a: Args) -> Result<()> {
    a.common.validate()?;
    let doorbell = parse_doorbell(&a.doorbell)?;
    let modes = a
        .mode
        .iter()
        .map(|m| m.parse::<WaitMode>())
        .collect::<Result<Vec<_>>>()?;
    let placement = Placement {
        ping_cpu: a.common.cpus.0,
        pong_cpu: a.common.cpus.1,
    };
    let mut cases = Vec::new();
    for m in &modes {
        let (ping, pong) = ends(&a, *m, a.common.size, doorbell)?;
        cases.push(Case {
            source: a.source.clone(),
            mode: m.to_string(),
            placement,
            size: a.common.size,
            ping,
            pong,
        });
    }
    let rows = measure(cases, &a.common)?;
    if a.common.json {
        stats::print_json(&rows);
    } else {
        stats::print_table(
            &format!(
                "fastwake bench pingpong — source {}{} — {}",
                a.source,
                match a.source.as_str() {
                    "tcp" | "uring" => format!(" over {}", a.net.net),
                    _ => String::new(),
                },
                a.common.placement_note()
            ),
            &rows,
        );
    }
    Ok(())
}

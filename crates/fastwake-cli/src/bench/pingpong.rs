//! `fastwake bench pingpong`: one source, several wait modes, one run.

use super::harness::{Case, End, Placement};
use super::{Common, measure, sources, stats};
use fastwake::source::channel::Doorbell;
use fastwake::{Fail, Result, WaitMode};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// Wait modes to compare, comma separated
    ///
    /// Wait modes to compare, comma separated, in the one grammar
    /// (docs/reference/grammar.md): poll, interrupt, hybrid[:DURATION] (e.g.
    /// hybrid:20us), adaptive[:OPTIONS] (e.g. adaptive:cap=20%), dispatch (the
    /// run then starts a dispatcher on each end's CPU, counts their CPU in
    /// dispatch's cpu/op and prints each end's hand-offs; adaptive waits in
    /// the same run may use them too).
    #[arg(long, default_value = "poll,interrupt,hybrid", value_parser = super::parse_modes)]
    pub mode: super::ModeList,
    /// Interrupt mode only (perftest's -e)
    ///
    /// Interrupt mode only, as perftest's -e (use completion events): the same
    /// as --mode interrupt.
    #[arg(short = 'e', long, conflicts_with = "mode")]
    pub events: bool,
    /// verbs: the server to run the client end against
    ///
    /// `--source verbs`: run the client end of a two-process run against the
    /// server on HOST (a `fastwake bench pingpong --source verbs` without HOST,
    /// or perftest's `ib_send_lat`). Without HOST and without --local, this
    /// process is the server: it waits for one client.
    #[arg(value_name = "HOST")]
    pub host: Option<String>,
    /// verbs: both ends in this process
    ///
    /// `--source verbs`: both ends in this process (the quick check; no peer,
    /// no TCP exchange).
    #[arg(long, conflicts_with = "host")]
    pub local: bool,
    /// verbs: the device's port (perftest's -i)
    ///
    /// `--source verbs`: the device's port (perftest's -i).
    #[arg(short = 'i', long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    pub ib_port: u8,
    /// verbs: GID index (perftest's -x)
    ///
    /// `--source verbs`: GID index (perftest's -x; default: on RoCE the first
    /// IPv4-mapped GID among 0-7, on InfiniBand none, as perftest).
    #[arg(short = 'x', long)]
    pub gid_index: Option<u8>,
    /// verbs: TCP port of the exchange (perftest's -p)
    ///
    /// Two-process `--source verbs`: the TCP port of the exchange (perftest's
    /// -p; the server listens on it).
    #[arg(short = 'p', long, default_value_t = super::remote::wire::DEFAULT_PORT)]
    pub port: u16,
    /// verbs: every size from 2 bytes to 8 MiB (perftest's -a)
    ///
    /// Two-process `--source verbs`: every size 2, 4, ... 8388608 bytes
    /// (perftest's -a), one row each.
    #[arg(short = 'a', long, conflicts_with = "size")]
    pub all: bool,
    /// Accepted for perftest's -F; no effect
    ///
    /// Accepted for perftest's command lines (its -F: no warning when the CPU
    /// frequency may change); fastwake bench prints no such warning (`fastwake
    /// doctor` reports the frequency governor).
    #[arg(short = 'F', long = "cpu-freq", alias = "CPU-freq")]
    pub cpu_freq: bool,
    /// Also write the rows and the run's setup to FILE as JSON
    ///
    /// Also writes the rows to FILE as one JSON object: `run` (fastwake
    /// version, host, date, command, and for verbs the device, port, GID and
    /// the peer) and `rows` (the objects --json prints). perftest's spelling
    /// --out_json is accepted.
    #[arg(long, value_name = "FILE", alias = "out_json")]
    pub out_json: Option<std::path::PathBuf>,
    /// Completion source
    ///
    /// Completion source: channel (shared memory), verbs (RDMA RC send/recv),
    /// tcp (socket source) or uring (io_uring receives).
    #[arg(long, default_value = "channel", value_parser = ["channel", "verbs", "tcp", "uring"])]
    pub source: String,
    /// channel: how a sleeping receiver is woken
    ///
    /// `--source channel`: how a sleeping receiver is woken, a futex or an
    /// eventfd.
    #[arg(long, default_value = "futex", value_parser = ["futex", "eventfd"])]
    pub doorbell: String,
    /// verbs: RDMA device (perftest's -d)
    ///
    /// RDMA device for `--source verbs` (default: the first one; perftest's
    /// -d).
    #[arg(short = 'd', long)]
    pub dev: Option<String>,
    /// verbs: what to do when a waiter is off its CQ's vector
    ///
    /// `--source verbs`: when a waiter runs on another CPU than its CQ's
    /// completion signal: report, thread (move the thread) or irq (move the
    /// IRQ; root only).
    #[arg(long, default_value = "report", value_parser = ["report", "thread", "irq"])]
    pub replace: String,
    /// verbs: stall monitor threshold in ms, or off
    ///
    /// `--source verbs`: the stall monitor's threshold in ms, or off (default
    /// 50): a SEND that completes later while its end looked is named at the
    /// end of the run (docs/design/stall-monitor.md).
    #[arg(long, value_name = "MS|off", value_parser = parse_stall_ms)]
    pub stall_ms: Option<StallMs>,
    #[command(flatten)]
    pub net: NetArgs,
}

/// `--stall-ms`: a threshold, or `None` for off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallMs(pub Option<u64>);

fn parse_stall_ms(s: &str) -> std::result::Result<StallMs, String> {
    // The grammar of FASTWAKE_STALL_MS, the shim's.
    fastwake::stall::threshold_ms(s).map(StallMs)
}

/// Options of the network sources (tcp, uring).
#[derive(clap::Args, Debug, Clone)]
pub struct NetArgs {
    /// tcp/uring: loopback or veth
    ///
    /// Path for tcp/uring: loopback, or veth (a veth pair between two network
    /// namespaces the benchmark creates and removes itself).
    #[arg(long, default_value = "loopback", value_parser = ["loopback", "veth"])]
    pub net: String,
    /// tcp: SO_BUSY_POLL in µs
    ///
    /// tcp: set SO_BUSY_POLL to this many µs (reported where it cannot work:
    /// traffic without a NAPI id).
    #[arg(long)]
    pub busy_poll: Option<u32>,
    /// uring: how interrupt mode sleeps
    ///
    /// uring: how interrupt mode sleeps: enter (blocking io_uring_enter) or
    /// eventfd (registered eventfd).
    #[arg(long, default_value = "enter", value_parser = ["enter", "eventfd"])]
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
            let (p, q) = sources::verbs::pair(
                a.dev.as_deref(),
                a.ib_port,
                a.gid_index,
                mode,
                size,
                a.common.cpus,
                policy,
            )?;
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

/// Warn about each option given for a source it does not apply to.
fn warn_unused_options(a: &Args) {
    let src = a.source.as_str();
    let warn = |opt: &str, applies: &str| super::warn_unused(opt, applies, src);
    if src != "channel" && a.doorbell != "futex" {
        warn("--doorbell", "--source channel");
    }
    if src != "verbs" {
        if a.dev.is_some() {
            warn("--dev", "--source verbs");
        }
        if a.replace != "report" {
            warn("--replace", "--source verbs");
        }
        if a.ib_port != 1 {
            warn("--ib-port", "--source verbs");
        }
        if a.gid_index.is_some() {
            warn("--gid-index", "--source verbs");
        }
        if a.local {
            warn("--local", "--source verbs");
        }
        if a.stall_ms.is_some() {
            warn("--stall-ms", "--source verbs");
        }
    }
    if (src != "verbs" || a.local) && a.port != super::remote::wire::DEFAULT_PORT {
        warn("--port", "two-process --source verbs");
    }
    if (src != "verbs" || a.local) && a.all {
        warn("--all", "two-process --source verbs");
    }
    if !matches!(src, "tcp" | "uring") && a.net.net != "loopback" {
        warn("--net", "--source tcp and uring");
    }
    if src != "tcp" && a.net.busy_poll.is_some() {
        warn("--busy-poll", "--source tcp");
    }
    if src != "uring" && a.net.uring_wake != "enter" {
        warn("--uring-wake", "--source uring");
    }
}

pub fn run(a: Args) -> Result<()> {
    if a.host.is_some() && a.source != "verbs" {
        return Err(Fail::invalid(format!(
            "a HOST (the client of a two-process run) needs --source verbs, not --source {}",
            a.source
        )));
    }
    if a.source == "verbs"
        && let Some(StallMs(ms)) = a.stall_ms
    {
        fastwake::source::verbs::set_stall_threshold(ms.map(std::time::Duration::from_millis));
    }
    if a.source == "verbs" && !a.local {
        warn_unused_options(&a);
        return super::remote::run(&super::remote::Opts {
            common: &a.common,
            modes: if a.events {
                vec!["interrupt".into()]
            } else {
                a.mode.0.clone()
            },
            all: a.all,
            dev: a.dev.as_deref(),
            ib_port: a.ib_port,
            gid_index: a.gid_index,
            port: a.port,
            host: a.host.as_deref(),
            replace: &a.replace,
            out_json: a.out_json.as_deref(),
        });
    }
    a.common.validate()?;
    warn_unused_options(&a);
    let doorbell = parse_doorbell(&a.doorbell)?;
    let names: &[String] = if a.events {
        &["interrupt".to_string()]
    } else {
        &a.mode
    };
    let modes = names
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
    let dispatchers = super::pingpong_dispatch::Dispatchers::start(&modes, a.common.cpus)?;
    let measured = measure(cases, &a.common);
    let dispatched = dispatchers.stop();
    let mut rows = measured?;
    dispatched.charge(&mut rows);
    if let Some(path) = &a.out_json {
        let mut run = serde_json::to_value(crate::meta::RunMeta::now()).expect("meta serialises");
        if a.source == "verbs" {
            let first = fastwake::source::verbs::device_names()
                .ok()
                .and_then(|v| v.into_iter().next());
            run["device"] = a.dev.clone().or(first).into();
            run["ib_port"] = a.ib_port.into();
            run["gid_index"] = a.gid_index.into();
            run["role"] = "local".into();
        }
        super::remote::write_out_json(path, run, &rows)?;
    }
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
        dispatched.print(&rows);
    }
    Ok(())
}

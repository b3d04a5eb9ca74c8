//! The measurement loop: every mode's slices, interleaved, folded into one
//! row per mode.

use super::client::{ClientEnd, Slice, drive_all};
use super::conn::Wire;
use super::layout::Layout;
use super::mode::{Load, Mode};
use super::servers::{Counts, start};
use crate::bench::rounds::Rounds;
use crate::bench::stats::{Row, Sample};
use fastwake::Result;
use std::time::Duration;

/// One run's parameters, as `run` validated them.
#[derive(Clone, Copy)]
pub(super) struct Plan {
    pub(super) load: Load,
    pub(super) conns: usize,
    pub(super) iters: u64,
    pub(super) warmup: u64,
    pub(super) rounds: u64,
    pub(super) size: usize,
    pub(super) idle_after: Option<Duration>,
    /// Latency load: connections the request rotates over (None: all).
    pub(super) rotate: Option<usize>,
}

/// Measure `modes` interleaved over connections `wire` makes; one row
/// each.
pub(super) fn measure<W: Wire>(
    wire: &W,
    modes: &[Mode],
    plan: &Plan,
    layout: &Layout,
) -> Result<Vec<Row>> {
    fastwake::cpu::pin(layout.client_cpu())?;
    let payload = vec![0x5au8; plan.size];
    let mut samples: Vec<Sample> = modes.iter().map(|_| Sample::new()).collect();
    let mut totals: Vec<Slice> = modes.iter().map(|_| Slice::default()).collect();
    let mut counts: Vec<Counts> = modes.iter().map(|_| Counts::default()).collect();
    // Each round's p50 per mode: modes run side by side within a round,
    // so per-round ratios show how steady a ratio is on a host whose
    // speed drifts between minutes.
    let mut round_p50: Vec<Vec<f64>> = modes.iter().map(|_| Vec::new()).collect();
    // A mode whose servers cannot start (a policy the host refuses, say)
    // is reported and left out; the others go on.
    let mut refused: Vec<Option<fastwake::Fail>> = modes.iter().map(|_| None).collect();
    for turn in Rounds::new(modes.len(), plan.rounds, plan.iters).turns() {
        let (i, n, mode) = (turn.case, turn.amount, modes[turn.case]);
        if refused[i].is_some() {
            continue;
        }
        let conns = if mode == Mode::Reference {
            1
        } else {
            plan.conns
        };
        let (mut clients, ends): (Vec<_>, Vec<_>) = wire
            .connect(conns)?
            .into_iter()
            .map(|(c, s)| (ClientEnd::new(c), s))
            .unzip();
        let active = plan.rotate.unwrap_or(conns).min(conns);
        let idle = clients.split_off(active);
        let servers = match start(mode, ends, layout, plan.idle_after, active) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "fastwake: bench share: {} left out: {e}; the other modes go on",
                    mode.label()
                );
                refused[i] = Some(e);
                continue;
            }
        };
        let mut this_round = Sample::new();
        let r = drive_all(
            plan.load,
            clients,
            &layout.client_cpus,
            &servers,
            &payload,
            plan.warmup,
            n,
            &mut this_round,
        );
        samples[i].merge(&this_round);
        round_p50[i].push(this_round.p50_us());
        // Closing the client ends stops the servers (the driven ones were
        // dropped with `r` if it failed).
        let r = r.map(|(s, clients)| {
            drop(clients);
            s
        });
        drop(idle);
        let fin = servers.finish();
        let s = r?;
        counts[i].add(fin?);
        let t = &mut totals[i];
        t.client_cpu += s.client_cpu;
        t.server_cpu += s.server_cpu;
        t.wall += s.wall;
        t.n += s.n;
    }
    if let Some(e) = refused.iter().flatten().next()
        && refused.iter().all(Option::is_some)
    {
        return Err(e.clone());
    }
    Ok(modes
        .iter()
        .zip(samples.iter().zip(totals))
        .zip(counts)
        .zip(round_p50)
        .zip(refused)
        .filter(|(_, refused)| refused.is_none())
        .map(|((((m, (s, t)), c), rp), _)| {
            let conns = if *m == Mode::Reference { 1 } else { plan.conns };
            let mut row = Row::from_sample(
                wire.name(),
                &m.label(),
                "cross",
                plan.size,
                s,
                t.client_cpu,
                t.server_cpu,
            );
            let rate = if t.wall.is_zero() {
                0.0
            } else {
                t.n as f64 / t.wall.as_secs_f64()
            };
            row.extra.insert("conns".into(), conns.into());
            row.extra
                .insert("cores".into(), layout.server_cpus.len().into());
            row.extra.insert("load".into(), plan.load.name().into());
            row.extra.insert("handoffs".into(), c.handoffs.into());
            row.extra.insert("relays".into(), c.relays.into());
            row.extra.insert("notices".into(), c.notices.into());
            row.extra.insert("scan_found".into(), c.scan_found.into());
            row.extra.insert("fair_yields".into(), c.fair_yields.into());
            row.extra
                .insert("late_notices".into(), c.late_notices.into());
            row.extra.insert("round_p50".into(), rp.into());
            row.extra
                .insert("dispatch_fallbacks".into(), c.fallbacks.into());
            row.extra.insert(
                "rtt_per_s".into(),
                serde_json::Number::from_f64(rate.round())
                    .map(serde_json::Value::Number)
                    .unwrap_or(serde_json::Value::Null),
            );
            if wire.name() != "channel" {
                // The kernel ready list (sockets): what the dispatchers or
                // runtimes and the relays asked the kernel.
                let k = c.kernel;
                for (key, v) in [
                    ("epoll_waits", k.waits),
                    ("kernel_found", k.found),
                    ("peeks", k.peeks),
                    ("relay_epoll_waits", k.relay_waits),
                    ("relay_found", k.relay_found),
                    ("relay_peeks", k.relay_peeks),
                    ("stale", k.stale),
                ] {
                    row.extra.insert(key.into(), v.into());
                }
            }
            row
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::share::conn::Channels;
    use fastwake::WaitMode;
    use fastwake::source::channel::{Config as ChanConfig, Doorbell};

    /// Two client threads share the connections out and every round trip
    /// is counted once, under both loads. (On a 2-CPU host both clients
    /// run on CPU 0, the server ends on CPU 1: slow, but the bookkeeping
    /// is what is tested.)
    #[test]
    fn two_clients_drive_every_connection_and_count_each_round_trip() {
        if fastwake::cpu::online() < 2 {
            eprintln!(
                "SKIPPED two_clients_drive_every_connection_and_count_each_round_trip: needs 2 CPUs"
            );
            return;
        }
        let wire = Channels(ChanConfig {
            capacity: 8,
            slot_size: 8,
            doorbell: Doorbell::Futex,
        });
        let layout = Layout {
            client_cpus: vec![0, 0],
            server_cpus: vec![1],
        };
        for load in [Load::Latency, Load::Throughput] {
            let plan = Plan {
                load,
                conns: 5,
                iters: 301,
                warmup: 7,
                rounds: 2,
                size: 8,
                idle_after: None,
                rotate: None,
            };
            let rows = measure(
                &wire,
                &[Mode::PerThread(WaitMode::Interrupt)],
                &plan,
                &layout,
            )
            .expect("measure with two clients");
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].iters, 301, "{:?}", load.name());
            assert!(rows[0].t_min > 0.0 && rows[0].t_min <= rows[0].t_max);
        }
    }
}

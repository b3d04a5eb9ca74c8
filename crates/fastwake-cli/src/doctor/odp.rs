//! RDMA stall checks: each device's On-Demand-Paging
//! capabilities, the ports' retransmission and RNR counters, and the RC QP
//! timeout advice of the ODP study (docs/design/stall-monitor.md).

use super::finding::*;
use fastwake::source::verbs::odp::OdpCaps;
use fastwake::stall::cause;

/// Each device's ODP capabilities (`Err`: why they could not be read).
pub(super) fn odp_caps(devs: &[String]) -> Vec<(String, Result<OdpCaps, String>)> {
    devs.iter()
        .map(|d| {
            let caps = fastwake::source::verbs::Device::open(Some(d), None)
                .map_err(|e| e.to_string())
                .and_then(|dev| {
                    dev.odp_caps()
                        .ok_or_else(|| "the provider has no ibv_query_device_ex".to_string())
                });
            (d.clone(), caps)
        })
        .collect()
}

pub(super) fn judge_odp(devs: &[(String, Result<OdpCaps, String>)]) -> Finding {
    let f = |level, d: String| check::ODP.found(level, d);
    if devs.is_empty() {
        return f(Level::Info, "no RDMA devices".into());
    }
    let parts: Vec<String> = devs
        .iter()
        .map(|(d, c)| match c {
            Ok(c) if c.supported() => format!(
                "{d}: {} (ODP buffers can stall for a retransmission timeout on a NIC page fault: FASTWAKE_ODP=prefetch or pin)",
                c.describe()
            ),
            Ok(c) => format!(
                "{d}: {} (a program that asks for ODP fails here; FASTWAKE_ODP=pin registers its buffers pinned instead)",
                c.describe()
            ),
            Err(e) => format!("{d}: ODP capabilities unknown ({e})"),
        })
        .collect();
    f(Level::Info, parts.join("; "))
}

/// A port's counters: (device, port, (name, value) sorted by name).
pub(super) type PortCounters = (String, u8, Vec<(String, u64)>);

/// The counters of every port with `hw_counters`.
pub(super) fn port_counters(devs: &[String]) -> Vec<PortCounters> {
    let mut v = Vec::new();
    for d in devs {
        for port in 1..=4u8 {
            let dir = format!("/sys/class/infiniband/{d}/ports/{port}/hw_counters");
            let Ok(rd) = std::fs::read_dir(&dir) else {
                break;
            };
            let mut c: Vec<(String, u64)> = rd
                .filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    let val = std::fs::read_to_string(e.path())
                        .ok()?
                        .trim()
                        .parse()
                        .ok()?;
                    Some((n, val))
                })
                .collect();
            c.sort();
            v.push((d.clone(), port, c));
        }
    }
    v
}

/// Counters that say packets were lost or receivers were not ready.
pub(super) fn judge_port_counters(ports: &[PortCounters]) -> Finding {
    let f = |level, d: String| check::PORT_ERROR_COUNTERS.found(level, d);
    if ports.is_empty() {
        return f(
            Level::Info,
            "no RDMA port with hw_counters (/sys/class/infiniband/*/ports/*/hw_counters)".into(),
        );
    }
    let mut bad = Vec::new();
    for (d, p, c) in ports {
        let moved = cause::moved(&[], c);
        let hits: Vec<String> = moved
            .iter()
            .filter(|(n, _)| cause::is_retry_counter(n))
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        if !hits.is_empty() {
            bad.push(format!("{d} port {p}: {}", hits.join(", ")));
        }
    }
    if bad.is_empty() {
        return f(
            Level::Ok,
            format!(
                "{} port(s): no retransmission or RNR retry counted since the counters were reset",
                ports.len()
            ),
        );
    }
    f(
        Level::Warn,
        format!(
            "{} (each one a lost packet or a receiver not ready: a completion that waited out a timeout)",
            bad.join("; ")
        ),
    )
    .advice(
        "run the program under `fastwake run` (the stall monitor, FASTWAKE_STALL_MS) to see which QP and operation stalled and why; check the fabric for loss and the QP timeout below",
    )
}

/// The study's timeout advice, with the numbers of the common settings.
pub(super) fn qp_timeout_advice(rdma: bool) -> Finding {
    let ms = |t: u8| cause::ack_timeout_ns(t).unwrap_or(0) as f64 / 1e6;
    check::QP_TIMEOUT.found(
        Level::Info,
        if rdma {
            format!(
                "a lost packet on an RC QP costs its local ACK timeout, 4.096 us x 2^timeout ({:.1} ms at 14, what ibv_rc_pingpong and perftest set; {:.0} ms at 17; {:.2} s at 20); the ODP study measured a retransmission-timeout floor of ~500 ms, set in firmware, on most NIC models it tried, whatever the QP asked: use the lowest timeout the fabric tolerates, keep ODP buffers prefetched or pinned, and watch for stalls with the monitor",
                ms(14),
                ms(17),
                ms(20) / 1e3
            )
        } else {
            "no RDMA devices".into()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: &str, v: u64) -> (String, u64) {
        (n.into(), v)
    }

    #[test]
    fn odp_finding_names_each_device() {
        let none = OdpCaps::default();
        let f = judge_odp(&[
            ("rxe0".into(), Ok(none)),
            ("mlx5_0".into(), Err("cannot open".into())),
        ]);
        assert_eq!(f.level, Level::Info);
        assert!(
            f.detail.contains("rxe0: no ODP") && f.detail.contains("FASTWAKE_ODP=pin"),
            "{}",
            f.detail
        );
        assert!(
            f.detail
                .contains("mlx5_0: ODP capabilities unknown (cannot open)")
        );
    }

    #[test]
    fn retry_counters_warn_traffic_does_not() {
        let quiet = [(
            "rxe0".into(),
            1,
            vec![c("sent_pkts", 100), c("completer_retry_err", 0)],
        )];
        assert_eq!(judge_port_counters(&quiet).level, Level::Ok);
        let lossy = [(
            "rxe0".into(),
            1,
            vec![c("sent_pkts", 100), c("completer_retry_err", 3)],
        )];
        let f = judge_port_counters(&lossy);
        assert_eq!(f.level, Level::Warn);
        assert!(f.detail.contains("rxe0 port 1: completer_retry_err 3") && f.advice.is_some());
        assert_eq!(judge_port_counters(&[]).level, Level::Info);
    }

    #[test]
    fn timeout_advice_numbers() {
        let f = qp_timeout_advice(true);
        assert!(
            f.detail.contains("67.1 ms at 14") && f.detail.contains("500 ms"),
            "{}",
            f.detail
        );
    }
}

//! Naming a stall's likely cause from what is known at the time: whether
//! the work request touched ODP memory (and how many QPs had READs on ODP
//! memory outstanding: the ODP study's damming vs flood), the QP's
//! retransmission attributes (`ibv_query_qp`), and which of the port's
//! `hw_counters` moved. Pure text from facts; the shim gathers the facts.

use super::Op;
use std::fmt::Write as _;

/// The QP attributes that decide how long a lost packet costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttrs {
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout; 0 = none.
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub port: u8,
}

/// The local ACK timeout in ns (`None` for timeout 0: no retransmission
/// timer at all, a lost packet waits for other traffic or forever).
pub fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    (timeout > 0).then(|| 4096u64 << timeout.min(31))
}

/// Counters that move with traffic, not with trouble: left out of "moved".
const TRAFFIC: &[&str] = &[
    "lifespan",
    "sent_pkts",
    "rcvd_pkts",
    "rdma_sends",
    "rdma_recvs",
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "ack_deferred",
];

/// Counters that move when packets are retransmitted (rxe and mlx5 names).
const RETRANSMIT: &[&str] = &[
    "completer_retry_err",
    "retry_exceeded_err",
    "rcvd_seq_err",
    "out_of_seq_request",
    "duplicate_request",
    "local_ack_timeout_err",
    "packet_seq_err",
    "out_of_sequence",
    "implied_nak_seq_err",
    "req_transport_retries_exceeded",
    "roce_slow_restart",
];

/// Counters of receiver-not-ready retries.
const RNR: &[&str] = &[
    "rnr_nak_retry_err",
    "rcvd_rnr_err",
    "send_rnr_err",
    "retry_rnr_exceeded_err",
    "req_rnr_retries_exceeded",
];

/// Is this a retransmission or RNR retry counter (rxe or mlx5 name)?
pub fn is_retry_counter(name: &str) -> bool {
    RETRANSMIT.contains(&name) || RNR.contains(&name)
}

/// The counters that moved between two snapshots (name, increase), traffic
/// counters left out, in the order of `after`.
pub fn moved(before: &[(String, u64)], after: &[(String, u64)]) -> Vec<(String, u64)> {
    after
        .iter()
        .filter(|(n, _)| !TRAFFIC.contains(&n.as_str()))
        .filter_map(|(n, v)| {
            let b = before.iter().find(|(m, _)| m == n).map_or(0, |(_, b)| *b);
            (*v > b).then(|| (n.clone(), v - b))
        })
        .collect()
}

/// Everything a stall report says.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub waited_ns: u64,
    pub op: Option<Op>,
    pub odp: bool,
    /// QPs with READs on ODP memory outstanding when the stall was seen.
    pub odp_read_qps: u32,
    pub attrs: Option<QpAttrs>,
    /// Counters that moved since the previous report (or since the device
    /// was opened).
    pub moved: Vec<(String, u64)>,
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// The likely cause, one clause (no newline).
pub fn name(f: &Facts) -> String {
    let mut why = Vec::new();
    if f.odp {
        why.push(if f.odp_read_qps > 1 {
            format!(
                "ODP memory, flood pattern ({} QPs with READs on ODP memory outstanding keep faulting and retransmitting): try FASTWAKE_ODP=prefetch or pin",
                f.odp_read_qps
            )
        } else if f.op == Some(Op::Read) || f.odp_read_qps == 1 {
            "ODP memory, damming pattern (a READ on ODP memory and a following request: a page fault loses a packet and the QP waits out a retransmission timeout): try FASTWAKE_ODP=prefetch or pin".to_string()
        } else {
            "ODP memory (a page fault on the NIC): try FASTWAKE_ODP=prefetch or pin".to_string()
        });
    }
    let retrans: Vec<&str> = f
        .moved
        .iter()
        .filter(|(n, _)| RETRANSMIT.contains(&n.as_str()))
        .map(|(n, _)| n.as_str())
        .collect();
    let rnr = f.moved.iter().any(|(n, _)| RNR.contains(&n.as_str()));
    let ack = f.attrs.and_then(|a| ack_timeout_ns(a.timeout));
    let waited_acks = ack.map(|a| f.waited_ns as f64 / a as f64);
    if !retrans.is_empty() || waited_acks.is_some_and(|k| k >= 0.8) {
        let mut s = "retransmission timeout".to_string();
        if let (Some(a), Some(k)) = (ack, waited_acks) {
            let _ = write!(s, " (waited {k:.1} x the ACK timeout of {})", ms(a));
        }
        if !retrans.is_empty() {
            let _ = write!(s, " ({} moved)", retrans.join(", "));
        }
        why.push(s);
    } else if f.attrs.is_some_and(|a| a.timeout == 0) {
        why.push("a lost packet on a QP with timeout 0 (no retransmission timer) waits for other traffic".into());
    }
    if rnr {
        why.push("receiver not ready (RNR NAK retries)".into());
    }
    if why.is_empty() {
        why.push(match ack {
            Some(a) => format!(
                "unknown (no retry counter moved, waited less than the ACK timeout of {}): a slow peer or host",
                ms(a)
            ),
            None => "unknown (no retry counter moved): a slow peer or host".into(),
        });
    }
    why.join("; ")
}

/// The report line (without the shim's prefix).
pub fn line(where_: &str, wr_id: u64, threshold_ns: u64, outstanding: usize, f: &Facts) -> String {
    let mut s = format!(
        "stall: {where_} {} wr_id {wr_id:#x} waited {} (threshold {}, {outstanding} more outstanding on the QP)",
        f.op.map_or("?", Op::name),
        ms(f.waited_ns),
        ms(threshold_ns),
    );
    if let Some(a) = f.attrs {
        let _ = write!(
            s,
            "; qp timeout {} ({}) retry_cnt {} rnr_retry {}",
            a.timeout,
            ack_timeout_ns(a.timeout)
                .map_or("no timer".into(), |n| format!("ACK timeout {}", ms(n))),
            a.retry_cnt,
            a.rnr_retry
        );
    }
    if f.moved.is_empty() {
        s.push_str("; no error counter moved");
    } else {
        s.push_str("; counters moved:");
        for (n, d) in &f.moved {
            let _ = write!(s, " {n} +{d}");
        }
    }
    let _ = write!(s, "; likely cause: {}", name(f));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: &str, v: u64) -> (String, u64) {
        (n.into(), v)
    }

    #[test]
    fn ack_timeouts() {
        assert_eq!(ack_timeout_ns(0), None);
        assert_eq!(ack_timeout_ns(14), Some(67_108_864));
    }

    #[test]
    fn moved_counters_skip_traffic() {
        let b = [c("sent_pkts", 5), c("completer_retry_err", 1)];
        let a = [
            c("sent_pkts", 9),
            c("completer_retry_err", 4),
            c("rcvd_seq_err", 2),
        ];
        assert_eq!(
            moved(&b, &a),
            [c("completer_retry_err", 3), c("rcvd_seq_err", 2)]
        );
    }

    #[test]
    fn retransmission_is_named_from_counters_and_attrs() {
        let f = Facts {
            waited_ns: 70_000_000,
            op: Some(Op::Send),
            attrs: Some(QpAttrs {
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                port: 1,
            }),
            moved: vec![c("completer_retry_err", 1)],
            ..Facts::default()
        };
        let n = name(&f);
        assert!(n.starts_with("retransmission timeout (waited 1.0 x"), "{n}");
        assert!(n.contains("completer_retry_err"), "{n}");
        assert!(!n.contains("ODP"), "{n}");
        let l = line("rxa qp 0x11", 2, 50_000_000, 0, &f);
        assert!(
            l.contains("SEND wr_id 0x2 waited 70.0 ms") && l.contains("timeout 14"),
            "{l}"
        );
        assert!(!l.contains('\n'));
    }

    #[test]
    fn odp_patterns() {
        let mut f = Facts {
            waited_ns: 600_000_000,
            op: Some(Op::Read),
            odp: true,
            odp_read_qps: 1,
            ..Facts::default()
        };
        assert!(name(&f).contains("damming"));
        f.odp_read_qps = 8;
        assert!(name(&f).contains("flood pattern (8 QPs"));
    }

    #[test]
    fn nothing_known_says_unknown() {
        let f = Facts {
            waited_ns: 60_000_000,
            op: Some(Op::Write),
            attrs: Some(QpAttrs {
                timeout: 20,
                ..QpAttrs::default()
            }),
            ..Facts::default()
        };
        assert!(name(&f).starts_with("unknown"), "{}", name(&f));
    }
}

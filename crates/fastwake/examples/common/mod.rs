//! The client side shared by the examples with many connections: one
//! request at a time, round-robin, busy-polling for each reply.

use fastwake::source::channel::{Receiver, Sender};
use fastwake::{Fail, Source};
use std::time::{Duration, Instant};

/// Send `n` requests round-robin over `conns` (request sender, reply
/// receiver), each after the previous reply; the sorted round-trip times.
pub fn round_robin(conns: &mut [(Sender, Receiver)], n: u64) -> fastwake::Result<Vec<Duration>> {
    let mut rtt = Vec::with_capacity(n as usize);
    for i in 0..n {
        let (tx, rx) = &mut conns[i as usize % conns.len()];
        let t0 = Instant::now();
        tx.send(i, b"request")?;
        let m = loop {
            if let Some(m) = rx.try_take()? {
                break m;
            }
            std::hint::spin_loop();
        };
        rtt.push(t0.elapsed());
        if m.tag != i {
            return Err(Fail::invalid(format!("request {i}: reply {}", m.tag)));
        }
    }
    rtt.sort_unstable();
    Ok(rtt)
}

/// One-way p50 in µs (RTT / 2) of sorted round trips.
pub fn one_way_p50_us(rtt: &[Duration]) -> f64 {
    rtt[(rtt.len() - 1) / 2].as_secs_f64() * 1e6 / 2.0
}

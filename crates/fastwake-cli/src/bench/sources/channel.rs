//! Ping-pong over two fastwake channels (one per direction).

use crate::bench::harness::End;
use fastwake::source::channel::{self, Config, Doorbell, Receiver, Sender};
use fastwake::{Fail, Result, WaitMode, Waiter};

/// One end: sends on its own channel, waits on the other's.
pub struct ChannelEnd {
    tx: Sender,
    rx: Receiver,
    waiter: Waiter,
    payload: Vec<u8>,
    sent: u64,
    received: u64,
}

impl End for ChannelEnd {
    fn wait_stats(&self) -> Option<fastwake::wait::WaitStats> {
        Some(self.waiter.stats())
    }

    fn send(&mut self) -> Result<()> {
        self.tx.send(self.sent, &self.payload)?;
        self.sent += 1;
        Ok(())
    }

    fn recv(&mut self) -> Result<()> {
        let m = self.waiter.wait(&mut self.rx)?;
        // The benchmark also checks delivery: a lost, duplicated or
        // reordered message fails the run instead of skewing a figure.
        if m.tag != self.received || m.len as usize != self.payload.len() {
            return Err(Fail::new(
                libc::EPROTO,
                format!(
                    "channel delivered tag {} len {}, expected tag {} len {}",
                    m.tag,
                    m.len,
                    self.received,
                    self.payload.len()
                ),
            ));
        }
        self.received += 1;
        Ok(())
    }
}

/// A connected pair of ends waiting in `mode`.
pub fn pair(mode: WaitMode, size: usize, doorbell: Doorbell) -> Result<(ChannelEnd, ChannelEnd)> {
    let cfg = Config {
        capacity: 64,
        slot_size: size.max(1) as u32,
        doorbell,
    };
    let (tx_ab, rx_ab) = channel::channel(cfg)?;
    let (tx_ba, rx_ba) = channel::channel(cfg)?;
    let mk = |tx, rx| ChannelEnd {
        tx,
        rx,
        waiter: Waiter::new(mode),
        payload: vec![0x5a; size],
        sent: 0,
        received: 0,
    };
    Ok((mk(tx_ab, rx_ba), mk(tx_ba, rx_ab)))
}

//! `--idle-probe`: what an idle dispatcher and an idle task runtime cost.

use super::layout::Layout;
use super::servers::{Counts, closed_ok, spawn_server};
use crate::bench::thread_clock::ThreadClock;
use fastwake::dispatch::{self, Dispatcher, Runtime, TaskConfig};
use fastwake::source::channel::{self, Config as ChanConfig, Receiver, Sender};
use fastwake::{Fail, Result, WaitMode, Waiter};
use std::sync::mpsc;
use std::time::Duration;

/// CPU used over `window` by an idle dispatcher serving `conns` waiting
/// threads, and by an idle runtime of `conns` tasks, after `idle_after`.
pub(super) fn idle_probe(
    layout: &Layout,
    conns: usize,
    idle_after: Option<Duration>,
    window: Duration,
) -> Result<String> {
    let cpu = layout.server_cpus[0];
    let cfg = ChanConfig::default();
    let settle = idle_after.unwrap_or_default() + Duration::from_millis(50);
    // Threads.
    let mut dcfg = dispatch::Config::new(cpu);
    dcfg.idle_after = idle_after;
    let d = Dispatcher::start(dcfg)?;
    let (txs, rxs) = channels(conns, cfg)?;
    let (ctx, _crx) = mpsc::channel();
    let mut threads = Vec::new();
    for (j, mut rx) in rxs.into_iter().enumerate() {
        threads.push(spawn_server(format!("fw-idle{j}"), cpu, &ctx, move || {
            let mut w = Waiter::new(WaitMode::Dispatch);
            closed_ok(w.wait(&mut rx).map(|_| ()))?;
            Ok(Counts::of(&w.stats()))
        })?);
    }
    std::thread::sleep(settle);
    let state_d = d.state();
    let c0 = d.cpu_time().unwrap_or_default();
    std::thread::sleep(window);
    let used_d = d.cpu_time().unwrap_or_default().saturating_sub(c0);
    drop(txs);
    for t in threads {
        let _ = t.join();
    }
    drop(d);
    // Tasks.
    let (clk_tx, clk_rx) = mpsc::channel();
    let (txs, rxs) = channels(conns, cfg)?;
    let rt_thread = std::thread::spawn(move || -> Result<()> {
        fastwake::cpu::pin(cpu)?;
        let mut rt = Runtime::new(TaskConfig {
            idle_after,
            ..TaskConfig::default()
        })?;
        for mut rx in rxs {
            rt.spawn(move |cx| closed_ok(cx.wait(&mut rx).map(|_| ())))?;
        }
        let _ = clk_tx.send((ThreadClock::of_current_thread(), rt.state()));
        rt.run()?;
        Ok(())
    });
    let (clk, st) = clk_rx
        .recv()
        .map_err(|_| Fail::new(libc::EIO, "task runtime failed to start"))?;
    std::thread::sleep(settle);
    let state_t = st.get();
    let c0 = clk.cpu_time();
    std::thread::sleep(window);
    let used_t = clk.cpu_time().saturating_sub(c0);
    drop(txs);
    let _ = rt_thread.join();
    Ok(format!(
        "idle probe ({conns} waiters, no traffic, idle threshold {}): dispatcher for threads {:?}, {:.1} µs CPU in {:?}; task runtime {:?}, {:.1} µs CPU in {:?}",
        idle_after.map_or("off".to_string(), |d| format!("{} µs", d.as_micros())),
        state_d,
        used_d.as_nanos() as f64 / 1000.0,
        window,
        state_t,
        used_t.as_nanos() as f64 / 1000.0,
        window
    ))
}

/// `n` channels, their senders and receivers apart: the waiters take the
/// receivers, the probe keeps the senders silent and drops them to end it.
fn channels(n: usize, cfg: ChanConfig) -> Result<(Vec<Sender>, Vec<Receiver>)> {
    Ok((0..n)
        .map(|_| channel::channel(cfg))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip())
}

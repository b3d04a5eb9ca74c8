//! The server side: one arrangement of the server ends (a thread per
//! connection, tasks on a runtime per core, an event loop per core),
//! started for one slice and torn down after it.

use super::conn::ServerEnd;
use super::layout::Layout;
use super::mode::Mode;
use crate::bench::thread_clock::ThreadClock;
use fastwake::dispatch::{self, Dispatcher, KernelListStats, Runtime, TaskConfig};
use fastwake::source::Source;
use fastwake::{Fail, Result, WaitMode, Waiter};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How the server side's waits went (dispatch modes), for the report.
#[derive(Default, Clone, Copy)]
pub(super) struct Counts {
    pub(super) handoffs: u64,
    pub(super) relays: u64,
    pub(super) fallbacks: u64,
    /// Hand-offs found through a ready notice (dispatcher or runtime).
    pub(super) notices: u64,
    /// Waits the notices' safety net found ready without a notice
    /// (expected 0).
    pub(super) scan_found: u64,
    /// Of those, notices that came late rather than never.
    pub(super) late_notices: u64,
    /// Fair turns that gave the core to a woken thread (threads modes).
    pub(super) fair_yields: u64,
    /// The dispatchers' or runtimes' kernel ready lists (sockets), as
    /// last published.
    pub(super) kernel: KernelListStats,
}

impl Counts {
    pub(super) fn of(s: &fastwake::wait::WaitStats) -> Counts {
        Counts {
            handoffs: s.handoffs,
            relays: s.relays,
            fallbacks: s.dispatch_fallbacks,
            ..Counts::default()
        }
    }

    pub(super) fn add(&mut self, o: Counts) {
        self.handoffs += o.handoffs;
        self.relays += o.relays;
        self.fallbacks += o.fallbacks;
        self.notices += o.notices;
        self.scan_found += o.scan_found;
        self.late_notices += o.late_notices;
        self.fair_yields += o.fair_yields;
        self.kernel += o.kernel;
    }
}

/// A running server arrangement for one slice.
pub(super) struct Servers {
    threads: Vec<JoinHandle<Result<Counts>>>,
    clocks: Vec<ThreadClock>,
    dispatchers: Vec<Dispatcher>,
}

impl Servers {
    pub(super) fn cpu_time(&self) -> Duration {
        let mut t: Duration = self.clocks.iter().map(|c| c.cpu_time()).sum();
        for d in &self.dispatchers {
            t += d.cpu_time().unwrap_or_default();
        }
        t
    }

    /// Wait for the server threads to finish (the client closed its ends).
    pub(super) fn finish(self) -> Result<Counts> {
        let mut first = Ok(());
        let mut c = Counts::default();
        for t in self.threads {
            match t
                .join()
                .map_err(|_| Fail::new(libc::EIO, "server thread panicked"))
                .and_then(|r| r)
            {
                Ok(n) => c.add(n),
                Err(e) => {
                    if first.is_ok() {
                        first = Err(e);
                    }
                }
            }
        }
        for d in self.dispatchers {
            // Final counters: a late notice still in the ring is counted.
            let s = d.stop();
            c.notices += s.notices;
            c.scan_found += s.scan_found;
            c.late_notices += s.late_notices;
            c.fair_yields += s.fair_yields;
            c.kernel += s.kernel_list;
        }
        first.map(|_| c)
    }
}

/// A peer close ends a server loop normally.
pub(super) fn closed_ok(r: Result<()>) -> Result<()> {
    match r {
        Err(e) if e.is_closed() => Ok(()),
        r => r,
    }
}

pub(super) fn spawn_server(
    name: String,
    cpu: u32,
    clocks: &mpsc::Sender<ThreadClock>,
    f: impl FnOnce() -> Result<Counts> + Send + 'static,
) -> Result<JoinHandle<Result<Counts>>> {
    let clocks = clocks.clone();
    std::thread::Builder::new()
        .name(name)
        .stack_size(256 * 1024)
        .spawn(move || {
            fastwake::cpu::pin(cpu)?;
            let _ = clocks.send(ThreadClock::of_current_thread());
            drop(clocks);
            f()
        })
        .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn server thread: {e}")))
}

/// Start the servers of `mode` for `ends` (server side of each connection),
/// of which the client uses the first `active`.
pub(super) fn start<E: ServerEnd>(
    mode: Mode,
    ends: Vec<E>,
    layout: &Layout,
    idle_after: Option<Duration>,
    active: usize,
) -> Result<Servers> {
    let (ctx, crx) = mpsc::channel();
    let k = layout.server_cpus.len();
    let mut threads = Vec::new();
    let mut dispatchers = Vec::new();
    match mode {
        Mode::PerThread(_) | Mode::Threads { .. } | Mode::Reference => {
            let wm = match mode {
                Mode::PerThread(m) => m,
                Mode::Reference => WaitMode::Poll,
                Mode::Threads { adaptive: true, .. } => {
                    WaitMode::Adaptive(fastwake::adaptive::Config::DEFAULT)
                }
                _ => WaitMode::Dispatch,
            };
            if let Mode::Threads {
                policy,
                cross,
                relay,
                notices,
                ..
            } = mode
            {
                for &cpu in &layout.server_cpus {
                    let mut cfg = dispatch::Config::new(cpu);
                    cfg.policy = policy;
                    cfg.notices = notices;
                    // `:scan` peeks every source: sockets too.
                    cfg.kernel_list = notices;
                    if !relay {
                        cfg.relay = None;
                    }
                    cfg.idle_after = idle_after;
                    if cross {
                        cfg.run_on = Some(layout.client_cpu());
                    }
                    dispatchers.push(Dispatcher::start(cfg)?);
                }
            }
            for (j, mut e) in ends.into_iter().enumerate() {
                let cpu = layout.server_cpus[j % k];
                threads.push(spawn_server(format!("fw-srv{j}"), cpu, &ctx, move || {
                    let mut w = Waiter::new(wm);
                    closed_ok((|| loop {
                        let m = w.wait(e.source())?;
                        e.echo(m)?;
                    })())?;
                    Ok(Counts::of(&w.stats()))
                })?);
            }
        }
        Mode::EventLoop => {
            let mut per_core: Vec<Vec<E>> = (0..k).map(|_| Vec::new()).collect();
            for (j, e) in ends.into_iter().enumerate() {
                per_core[j % k].push(e);
            }
            for (c, ends) in per_core.into_iter().enumerate() {
                let cpu = layout.server_cpus[c];
                threads.push(spawn_server(format!("fw-ev{c}"), cpu, &ctx, move || {
                    E::event_loop(ends)?;
                    Ok(Counts::default())
                })?);
            }
        }
        Mode::Oracle => {
            let mut per_core: Vec<Vec<E>> = (0..k).map(|_| Vec::new()).collect();
            for (j, e) in ends.into_iter().enumerate() {
                // Idle connections stay open (their client ends do) but
                // are never waited on: that is what the oracle knows.
                if j < active {
                    per_core[j % k].push(e);
                }
            }
            for (c, mut ends) in per_core.into_iter().enumerate() {
                let cpu = layout.server_cpus[c];
                threads.push(spawn_server(format!("fw-or{c}"), cpu, &ctx, move || {
                    // The latency client sends to connection j, j+1, ...
                    // and waits for each reply, and a core's connections
                    // are every k-th: this core's next request is always
                    // on its next connection.
                    let mut next = 0usize;
                    let mut spins: u32 = 0;
                    while !ends.is_empty() {
                        let e = &mut ends[next];
                        spins = spins.wrapping_add(1);
                        // A close shows only through try_take.
                        if !e.source().ready() && !spins.is_multiple_of(1024) {
                            std::hint::spin_loop();
                            continue;
                        }
                        match e.source().try_take() {
                            Ok(Some(m)) => {
                                e.echo(m)?;
                                next = (next + 1) % ends.len();
                            }
                            Ok(None) => {}
                            // The client closes every connection at once
                            // when the slice ends.
                            Err(e) if e.is_closed() => break,
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(Counts::default())
                })?);
            }
        }
        Mode::Tasks { prefetch, notices } => {
            let mut per_core: Vec<Vec<E>> = (0..k).map(|_| Vec::new()).collect();
            for (j, e) in ends.into_iter().enumerate() {
                per_core[j % k].push(e);
            }
            for (c, ends) in per_core.into_iter().enumerate() {
                let cpu = layout.server_cpus[c];
                threads.push(spawn_server(format!("fw-rt{c}"), cpu, &ctx, move || {
                    let mut rt = Runtime::new(TaskConfig {
                        idle_after,
                        prefetch,
                        notices,
                        // `:scan` peeks every source: sockets too.
                        kernel_list: notices,
                        ..TaskConfig::default()
                    })?;
                    for mut e in ends {
                        rt.spawn(move |cx| {
                            closed_ok((|| loop {
                                let m = cx.wait(e.source())?;
                                e.echo(m)?;
                            })())
                        })?;
                    }
                    let st = rt.run()?;
                    match rt.take_errors().into_iter().next() {
                        Some((i, e)) => Err(Fail::new(e.errno(), format!("task {i}: {e}"))),
                        None => Ok(Counts {
                            handoffs: st.handoffs,
                            notices: st.notices,
                            scan_found: st.scan_found,
                            late_notices: st.late_notices,
                            kernel: st.kernel_list,
                            ..Counts::default()
                        }),
                    }
                })?);
            }
        }
    }
    drop(ctx);
    let clocks: Vec<_> = crx.iter().take(threads.len()).collect();
    Ok(Servers {
        threads,
        clocks,
        dispatchers,
    })
}

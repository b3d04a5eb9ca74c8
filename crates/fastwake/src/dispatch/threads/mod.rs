//! The dispatcher thread for ordinary kernel threads (FastWake approach 1
//! without kernel changes).
//!
//! Application threads on a core register their source's [`Peek`](crate::source::Peek) handle
//! and sleep on a per-thread futex (`dispatch::slot`). One dispatcher thread
//! on the same core peeks every waiting source; when one is ready it rings
//! that thread's futex. The wake-up is a same-core one (~1 µs here, against
//! ~4 µs for the cross-core wake the producer would otherwise cause), and
//! with the default [`SchedPolicy::Idle`] the dispatcher runs only when the core
//! has nothing else to do, so the woken thread preempts it at once and
//! runnable application threads never lose CPU to it.
//!
//! Idle policy: after `idle_after` without a hand-off the dispatcher hands
//! every waiting thread back to interrupt mode (state `PAUSED`: each arms
//! its own source and sleeps on it, the ordinary arm → re-check → sleep) and
//! sleeps itself; the first thread that gets a completion, or starts a new
//! wait, wakes it and polling resumes.
//!
//! Death: if the dispatcher thread exits for any reason (stopped, panicked)
//! a guard marks it dead and rings every waiting thread with `DEAD`; they
//! and all later waits fall back to interrupt mode.
//!
//! Layout: [`Config`] (`config`); `Hub`, the state the waiters, the
//! dispatcher thread and the watchdog share (`hub`); the dispatcher's loop
//! (`run`) and its idle threshold (`idle`); the relaying waiters' scan
//! (`relay`); the watchdog (`watchdog`); which dispatcher serves which CPU
//! (`registry`); fault injection for tests, behind the
//! `fault-injection` feature (`faults`); and here the
//! [`Dispatcher`] handle that starts and stops the threads.

mod config;
mod faults;
mod hub;
mod idle;
mod registry;
mod relay;
mod run;
mod watchdog;

pub use config::{Config, DEFAULT_RELAY};
pub(crate) use hub::Hub;
pub(crate) use registry::lookup;
#[cfg(all(loom, test))]
pub(in crate::dispatch) use watchdog::Look;

use super::{DispatchStats, SchedPolicy, State};
use crate::{Fail, Result};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Locks whose data stays consistent across a panic.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain data that is still
    // consistent (a Vec push/pop), so poisoning is ignored.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // As for `lock`: the guarded data stays consistent across a panic.
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// The dispatcher thread's entry in the pressure sampler's list of
/// idle-class threads, removed when the thread leaves `run` (or unwinds).
struct IdleClass(i32);

impl IdleClass {
    fn declare(cpu: u32) -> IdleClass {
        IdleClass(crate::adaptive::pressure::declare_idle_thread(cpu))
    }
}

impl Drop for IdleClass {
    fn drop(&mut self) {
        crate::adaptive::pressure::forget_idle_thread(self.0);
    }
}

struct DeathGuard(Arc<Hub>);

impl Drop for DeathGuard {
    fn drop(&mut self) {
        // Runs on return and on panic alike.
        bury(&self.0);
    }
}

/// Mark the dispatcher dead (releasing its waiters) and forget it.
fn bury(hub: &Hub) {
    hub.die();
    registry::remove(hub);
}

/// A running dispatcher; dropping it stops the thread (its waiters fall
/// back to interrupt mode).
pub struct Dispatcher {
    hub: Arc<Hub>,
    thread: Option<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("config", &self.hub.cfg)
            .field("state", &self.hub.state())
            .finish()
    }
}

impl Dispatcher {
    /// Start a dispatcher for `cfg.cpu`. Fails if the CPU does not exist,
    /// already has a live dispatcher, or the policy cannot be set.
    pub fn start(cfg: Config) -> Result<Dispatcher> {
        // Not cpu::online(): that counts the CPUs the *caller* may use,
        // which is one when the caller is pinned.
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u32;
        let run_on = cfg.run_on.unwrap_or(cfg.cpu);
        if cfg.cpu >= n || run_on >= n {
            return Err(Fail::invalid(format!(
                "dispatcher CPU {} does not exist (this host has {n})",
                cfg.cpu.max(run_on)
            )));
        }
        if cfg.capacity == 0 || cfg.capacity > 1 << 16 {
            return Err(Fail::invalid("dispatcher capacity must be in 1..=65536"));
        }
        let hub = Arc::new(Hub::new(cfg));
        registry::insert(cfg.cpu, &hub)?;
        let (tx, rx) = std::sync::mpsc::channel::<Result<()>>();
        let c2 = hub.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fw-dispatch{}", cfg.cpu))
            .spawn(move || {
                let guard = DeathGuard(c2);
                let setup = crate::cpu::pin(run_on).and_then(|_| cfg.policy.apply());
                let ok = setup.is_ok();
                *lock(&guard.0.clock) = thread_clock();
                let _ = tx.send(setup);
                if ok {
                    // Adaptive waiters must not count a SCHED_IDLE
                    // dispatcher as a thread competing for their CPU.
                    let _idle =
                        (cfg.policy == SchedPolicy::Idle).then(|| IdleClass::declare(run_on));
                    guard.0.run();
                }
            })
            .map_err(|e| Fail::new(libc::EAGAIN, format!("spawn dispatcher thread: {e}")));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                bury(&hub);
                return Err(e);
            }
        };
        let c3 = hub.clone();
        let watchdog = std::thread::Builder::new()
            .name(format!("fw-watchdog{}", cfg.cpu))
            .spawn(move || watchdog::watchdog(&c3))
            .ok();
        let d = Dispatcher {
            hub,
            thread: Some(thread),
            watchdog,
        };
        match rx.recv() {
            Ok(Ok(())) => Ok(d),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Fail::new(libc::EIO, "dispatcher thread died at start")),
        }
    }

    /// Running, sleeping (idle policy) or dead.
    pub fn state(&self) -> State {
        self.hub.state()
    }

    /// Counters so far.
    pub fn stats(&self) -> DispatchStats {
        self.hub.stats()
    }

    /// Stop the dispatcher and return its final counters, read after it
    /// drained its notice ring: a notice still in it (a late one, say) is
    /// counted. Dropping a dispatcher stops it too.
    pub fn stop(mut self) -> DispatchStats {
        if !self.hub.made_before_fork() {
            self.hub.request_exit();
            self.join_threads();
        }
        self.hub.stats()
    }

    /// The configuration it runs with.
    pub fn config(&self) -> Config {
        self.hub.cfg
    }

    /// CPU time the dispatcher thread and its watchdog have used (`None`
    /// once they exited).
    pub fn cpu_time(&self) -> Option<Duration> {
        if self.hub.is_dead() {
            return None;
        }
        let read = |clock: libc::clockid_t| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: ts is a valid out-pointer; a stale clock id fails
            // with EINVAL, which we report as None.
            let r = unsafe { libc::clock_gettime(clock, &mut ts) };
            (r == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
        };
        let d = read((*lock(&self.hub.clock))?)?;
        let w = (*lock(&self.hub.wclock)).and_then(read).unwrap_or_default();
        Some(d + w)
    }

    /// Wait for the dispatcher thread and the watchdog to exit.
    fn join_threads(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.watchdog.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        if self.hub.made_before_fork() {
            // A forked child has none of the threads to stop or join.
            std::mem::forget(self.thread.take());
            std::mem::forget(self.watchdog.take());
            return;
        }
        self.hub.request_exit();
        self.join_threads();
    }
}

fn thread_clock() -> Option<libc::clockid_t> {
    let mut id: libc::clockid_t = 0;
    // SAFETY: pthread_self is always valid for the calling thread; id is a
    // valid out-pointer.
    let r = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
    (r == 0).then_some(id)
}

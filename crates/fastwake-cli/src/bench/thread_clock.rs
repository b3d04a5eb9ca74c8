//! Another thread's CPU time: the one clock `fastwake::cpu::thread_cpu_time`
//! cannot read.
//!
//! Every other benchmark has each thread read its own CPU clock around its
//! own loop, with `fastwake::cpu::thread_cpu_time()`. `bench share` cannot:
//! its client thread decides where a measured window starts and ends (after
//! the warm-up, after the last reply), and the server threads, asleep or
//! busy serving, cannot read their clocks at those instants. So each server
//! thread hands its clock over (`pthread_getcpuclockid`) and the client
//! reads it at the window's edges.

use std::time::Duration;

/// The CPU-time clock of one thread, readable from any thread of the
/// process while that thread lives.
#[derive(Debug, Clone, Copy)]
pub struct ThreadClock(Option<libc::clockid_t>);

impl ThreadClock {
    /// The calling thread's clock.
    pub fn of_current_thread() -> ThreadClock {
        let mut id: libc::clockid_t = 0;
        // SAFETY: pthread_self is the calling thread, alive during the
        // call; id is a valid out-pointer.
        let r = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
        // No CLOCK_THREAD_CPUTIME_ID fallback: read by another thread,
        // that is the reader's own clock, and would pass for this one's.
        ThreadClock((r == 0).then_some(id))
    }

    /// CPU time the thread has used; zero once it has ended, or if its
    /// clock could not be had.
    pub fn cpu_time(self) -> Duration {
        let Some(id) = self.0 else {
            return Duration::ZERO;
        };
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid out-pointer; the id of an ended thread only
        // makes the call fail.
        if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
            return Duration::ZERO;
        }
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_another_threads_clock_not_the_readers() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let spinner = std::thread::spawn(move || {
            let clock = ThreadClock::of_current_thread();
            // Spin until this thread has used 10 ms of CPU (not 10 ms of
            // wall time: on a loaded host a wall-time spin may get little
            // CPU), bounded so a starved test still ends.
            let t0 = std::time::Instant::now();
            while fastwake::cpu::thread_cpu_time() < Duration::from_millis(10)
                && t0.elapsed() < Duration::from_secs(5)
            {
                std::hint::spin_loop();
            }
            tx.send(clock).unwrap();
            // Stay alive until the reader has read.
            let _ = done_rx.recv();
        });
        let clock = rx.recv().unwrap();
        let theirs = clock.cpu_time();
        let mine = fastwake::cpu::thread_cpu_time();
        done_tx.send(()).unwrap();
        spinner.join().unwrap();
        // The spinner used 10 ms; this thread, asleep in recv, far less.
        assert!(theirs >= Duration::from_millis(5), "{theirs:?}");
        assert!(theirs > mine, "{theirs:?} vs reader {mine:?}");
    }
}

//! The kernel's floor for waking threads on one core, for the report.

use fastwake::{Fail, Result};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Median time of one hand-off in a ring of `n` threads pinned to `cpu`,
/// each waking the next through a futex and then sleeping on its own: the
/// kernel path a dispatch-mode hand-off cannot avoid.
pub(super) fn futex_ring(n: usize, cpu: u32, hops: u64) -> Result<Duration> {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    fn wait(w: &AtomicU32, seen: u32) {
        // SAFETY: w is a live, aligned u32 for the duration of the call;
        // the kernel only reads it.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                seen,
                std::ptr::null::<libc::timespec>(),
            )
        };
    }
    fn wake(w: &AtomicU32) {
        w.fetch_add(1, Ordering::SeqCst);
        // SAFETY: as in `wait`; FUTEX_WAKE does not touch the word.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                1,
            )
        };
    }
    let mut runs = Vec::new();
    for _ in 0..3 {
        let words: std::sync::Arc<Vec<AtomicU32>> =
            std::sync::Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
        let count = std::sync::Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel::<()>();
        let mut hs = Vec::new();
        for i in 0..n {
            let (words, count, tx) = (words.clone(), count.clone(), tx.clone());
            hs.push(std::thread::spawn(move || -> Result<()> {
                fastwake::cpu::pin(cpu)?;
                let mut seen = 0;
                let _ = tx.send(());
                drop(tx);
                loop {
                    let w = &words[i];
                    while w.load(Ordering::SeqCst) == seen {
                        wait(w, seen);
                    }
                    seen = w.load(Ordering::SeqCst);
                    if count.fetch_add(1, Ordering::SeqCst) >= hops {
                        words.iter().for_each(wake);
                        return Ok(());
                    }
                    wake(&words[(i + 1) % n]);
                }
            }));
        }
        drop(tx);
        for _ in 0..n {
            let _ = rx.recv();
        }
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        wake(&words[0]);
        for h in hs {
            h.join()
                .map_err(|_| Fail::new(libc::EIO, "ring thread panicked"))??;
        }
        runs.push(t0.elapsed() / hops as u32);
    }
    runs.sort();
    Ok(runs[1])
}

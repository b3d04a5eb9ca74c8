//! Benchmark ends for each completion source. One file per source; each
//! exposes `pair(mode, size, ..) -> (ping, pong)` so `bench pingpong
//! --source X` works the same way for every source.

pub mod channel;
pub mod net;
pub mod tcp;
pub mod uring;
pub mod verbs;

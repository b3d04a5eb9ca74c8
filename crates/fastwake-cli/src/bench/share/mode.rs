//! The grammar of `--load` and `--mode`: what one row of `bench share`
//! measures.

use fastwake::dispatch::SchedPolicy;
use fastwake::{Fail, Result, WaitMode};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Load {
    Latency,
    Throughput,
}

impl Load {
    pub(super) fn name(self) -> &'static str {
        match self {
            Load::Latency => "latency",
            Load::Throughput => "throughput",
        }
    }
}

/// How the server ends are arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// A thread per connection, `WaitMode` given.
    PerThread(WaitMode),
    /// A thread per connection in dispatch mode, a dispatcher per core.
    Threads {
        policy: SchedPolicy,
        cross: bool,
        relay: bool,
        /// The threads wait in `adaptive` mode instead of `dispatch`: the
        /// controller decides per wait whether to use the dispatcher.
        adaptive: bool,
        /// As `dispatch::Config::notices` (`threads:scan`: off).
        notices: bool,
    },
    /// A task per connection on a runtime per core; `prefetch` as
    /// [`TaskConfig::prefetch`](fastwake::dispatch::TaskConfig::prefetch) (`tasks:noprefetch` measures what it
    /// saves), `notices` as [`TaskConfig::notices`](fastwake::dispatch::TaskConfig::notices) (`tasks:scan`: off,
    /// every source peeked every pass, as before ready notices).
    Tasks { prefetch: bool, notices: bool },
    /// One connection, both ends busy-polling: the floor.
    Reference,
    /// One thread per core busy-polling all its connections in a loop (a
    /// hand-written event loop): the floor for N connections on a core.
    EventLoop,
    /// One thread per core that waits on its connections in the order the
    /// latency client rotates over them, the next one only: no server
    /// that must find which connection is ready can do better, so this is
    /// the floor for N rotating connections on a core, and what it costs
    /// above `reference` is the rotation's own (client and server both
    /// touch N connections' lines), not any dispatcher's.
    Oracle,
}

impl Mode {
    pub(super) fn parse(s: &str) -> Result<Mode> {
        let bad = || {
            Fail::invalid(format!(
                "unknown mode '{s}': expected interrupt, poll, hybrid[:BUDGET], adaptive[:OPTS], tasks[:noprefetch][:scan], threads[:idle|fifo|yield|normal|cross][:norelay][:adaptive][:scan], reference, evloop or oracle"
            ))
        };
        Ok(match s {
            "interrupt" => Mode::PerThread(WaitMode::Interrupt),
            "poll" => Mode::PerThread(WaitMode::Poll),
            "reference" => Mode::Reference,
            "evloop" => Mode::EventLoop,
            "oracle" => Mode::Oracle,
            // Thread per connection in the library's spinning modes: what
            // spinning does when many waiters share a core.
            s if s.starts_with("hybrid") || s.starts_with("adaptive") => {
                Mode::PerThread(s.parse::<WaitMode>()?)
            }
            s if s.split(':').next() == Some("tasks") => {
                let (mut prefetch, mut notices) = (true, true);
                for p in s.split(':').skip(1) {
                    match p {
                        "noprefetch" => prefetch = false,
                        "scan" => notices = false,
                        _ => return Err(bad()),
                    }
                }
                Mode::Tasks { prefetch, notices }
            }
            _ => {
                let mut parts = s.split(':');
                if parts.next() != Some("threads") {
                    return Err(bad());
                }
                let (mut policy, mut cross, mut relay, mut adaptive, mut notices) =
                    (SchedPolicy::Idle, false, true, false, true);
                for p in parts {
                    match p {
                        "norelay" => relay = false,
                        "scan" => notices = false,
                        "adaptive" => adaptive = true,
                        // SCHED_OTHER: on the client's core a SCHED_IDLE
                        // dispatcher would never run next to the
                        // busy-polling client.
                        "cross" => {
                            cross = true;
                            policy = SchedPolicy::Normal;
                        }
                        p => policy = SchedPolicy::parse(p).map_err(|_| bad())?,
                    }
                }
                Mode::Threads {
                    policy,
                    cross,
                    relay,
                    adaptive,
                    notices,
                }
            }
        })
    }

    pub(super) fn label(&self) -> String {
        match self {
            Mode::PerThread(m) => m.name().to_string(),
            Mode::Threads {
                policy,
                cross,
                relay,
                adaptive,
                notices,
            } => {
                let mut l = String::from("threads");
                if *adaptive {
                    l.push_str(":adaptive");
                }
                if *cross {
                    l.push_str(":cross");
                } else if *policy != SchedPolicy::Idle {
                    l.push(':');
                    l.push_str(policy.name());
                }
                if !relay {
                    l.push_str(":norelay");
                }
                if !notices {
                    l.push_str(":scan");
                }
                l
            }
            Mode::Tasks { prefetch, notices } => {
                let mut l = String::from("tasks");
                if !prefetch {
                    l.push_str(":noprefetch");
                }
                if !notices {
                    l.push_str(":scan");
                }
                l
            }
            Mode::Reference => "reference".into(),
            Mode::EventLoop => "evloop".into(),
            Mode::Oracle => "oracle".into(),
        }
    }
}

//! What a check finds: levels, areas, the findings themselves, the table
//! of checks, the guide's anchors and the thresholds of the judgements.

use super::GUIDE;
use serde::Serialize;

/// The anchors of docs/guide/tuning.md's sections, one per topic. A test checks
/// that each is a heading of the guide.
pub mod anchor {
    pub const CPUS: &str = "cpus-and-virtualisation";
    pub const PRESSURE: &str = "cpu-pressure";
    pub const IRQ: &str = "irq-affinity-and-irqbalance";
    pub const ISOLATED: &str = "isolated-cpus";
    pub const IDLE: &str = "idle-states-and-guest-halt-polling";
    pub const GOVERNOR: &str = "frequency-governor";
    pub const WAKE_UP: &str = "wake-up-latency";
    pub const TIMED_SLEEP: &str = "timed-sleeps-and-pre-wakes";
    pub const RDMA: &str = "rdma-devices-and-libibverbs";
    pub const MEMLOCK: &str = "memlock-limits-for-rdma";
    pub const VECTORS: &str = "completion-vectors";
    pub const BUSY_POLL: &str = "busy-polling-sysctls";
    pub const RFS_XPS: &str = "rfs-and-xps-for-sockets";
    pub const IO_URING: &str = "io_uring";
    pub const ODP: &str = "on-demand-paging-and-rdma-stalls";
    /// All of them.
    #[cfg(test)]
    pub const ALL: [&str; 15] = [
        CPUS,
        PRESSURE,
        IRQ,
        ISOLATED,
        IDLE,
        GOVERNOR,
        WAKE_UP,
        TIMED_SLEEP,
        RDMA,
        MEMLOCK,
        VECTORS,
        BUSY_POLL,
        RFS_XPS,
        IO_URING,
        ODP,
    ];
}

/// PSI cpu `some avg10` (%) above which CPU pressure is a warning: more
/// than a tenth of the last 10 s some runnable thread waited for a CPU.
/// Spinning then takes time those threads wait for, and a woken waiter
/// queues behind them.
pub const PSI_WARN_SOME_AVG10: f64 = 10.0;
/// Idle states whose exit latency is above this (µs) are a warning when
/// enabled: a few µs is what fastwake's wake-ups are about.
pub const IDLE_WARN_EXIT_US: u64 = 10;
/// guest_halt_poll_ns at or above this (ns) is ok: an idle vCPU still polls
/// after the gaps of a request/response exchange (tens of µs). Below it
/// (but not 0) is info; 0 is a warning.
pub const HALT_POLL_OK_NS: u64 = 100_000;
/// RLIMIT_MEMLOCK below this (bytes) is a warning on a host with RDMA
/// devices: memory regions and provider queues are pinned against it.
pub const MEMLOCK_WARN_BYTES: u64 = 64 << 20;

/// How a finding is judged.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// What fastwake wants.
    Ok,
    /// A fact; no action needed by itself.
    Info,
    /// Costs latency or CPU: see the advice.
    Warn,
    /// Part of fastwake cannot work here as configured.
    Bad,
}

impl Level {
    pub(super) fn word(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Bad => "bad",
        }
    }
}

/// The report's sections, in the order they are printed.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Area {
    Cpu,
    Rdma,
    Network,
}

impl Area {
    pub(super) const ALL: [Area; 3] = [Area::Cpu, Area::Rdma, Area::Network];
    pub(super) fn heading(self) -> &'static str {
        match self {
            Area::Cpu => "cpu and scheduler:",
            Area::Rdma => "rdma:",
            Area::Network => "network and io_uring:",
        }
    }
}

/// One check's result.
#[derive(Serialize, Debug, Clone)]
pub struct Finding {
    /// Stable identifier (`cpu_pressure`).
    pub id: &'static str,
    pub area: Area,
    /// What the text report calls it.
    pub name: &'static str,
    pub level: Level,
    /// What was measured or read.
    pub detail: String,
    /// What to do (always present for warn and bad).
    pub advice: Option<String>,
    /// The section of docs/guide/tuning.md.
    pub anchor: &'static str,
    /// `docs/guide/tuning.md#<anchor>`.
    pub doc: String,
}

/// What a check is, before it has found anything.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub id: &'static str,
    pub area: Area,
    pub name: &'static str,
    pub anchor: &'static str,
}

impl Check {
    pub(super) const fn new(
        id: &'static str,
        area: Area,
        name: &'static str,
        anchor: &'static str,
    ) -> Self {
        Check {
            id,
            area,
            name,
            anchor,
        }
    }
    pub(super) fn found(self, level: Level, detail: impl Into<String>) -> Finding {
        Finding {
            id: self.id,
            area: self.area,
            name: self.name,
            level,
            detail: detail.into(),
            advice: None,
            anchor: self.anchor,
            doc: format!("{GUIDE}#{}", self.anchor),
        }
    }
}

/// The checks: each one's stable id, section of the report, name in the
/// text report and section of the guide.
pub(super) mod check {
    use super::{Area, Check, anchor};
    pub const CPUS: Check = Check::new("cpus", Area::Cpu, "cpus", anchor::CPUS);
    pub const VIRTUALISED: Check =
        Check::new("virtualised", Area::Cpu, "virtualised", anchor::CPUS);
    pub const CPU_PRESSURE: Check = Check::new(
        "cpu_pressure",
        Area::Cpu,
        "cpu pressure (PSI)",
        anchor::PRESSURE,
    );
    pub const CONTENTION_SAMPLER: Check = Check::new(
        "contention_sampler",
        Area::Cpu,
        "contention sampler",
        anchor::PRESSURE,
    );
    pub const WAITER_SLICE: Check =
        Check::new("waiter_slice", Area::Cpu, "waiter slice", anchor::PRESSURE);
    pub const ISOLATED_CPUS: Check = Check::new(
        "isolated_cpus",
        Area::Cpu,
        "isolated cpus",
        anchor::ISOLATED,
    );
    pub const IRQBALANCE: Check = Check::new("irqbalance", Area::Cpu, "irqbalance", anchor::IRQ);
    pub const IDLE_STATES: Check =
        Check::new("idle_states", Area::Cpu, "idle states", anchor::IDLE);
    pub const GUEST_HALT_POLLING: Check = Check::new(
        "guest_halt_polling",
        Area::Cpu,
        "guest halt polling",
        anchor::IDLE,
    );
    pub const USER_WAIT: Check = Check::new(
        "user_wait",
        Area::Cpu,
        "user-space wait instructions",
        anchor::IDLE,
    );
    pub const FREQUENCY_GOVERNOR: Check = Check::new(
        "frequency_governor",
        Area::Cpu,
        "frequency governor",
        anchor::GOVERNOR,
    );
    pub const RDMA_DEVICES: Check =
        Check::new("rdma_devices", Area::Rdma, "rdma devices", anchor::RDMA);
    pub const LIBIBVERBS: Check = Check::new("libibverbs", Area::Rdma, "libibverbs", anchor::RDMA);
    pub const MEMLOCK: Check = Check::new("memlock", Area::Rdma, "memlock limit", anchor::MEMLOCK);
    pub const COMPLETION_VECTORS: Check = Check::new(
        "completion_vectors",
        Area::Rdma,
        "completion vectors",
        anchor::VECTORS,
    );
    pub const ODP: Check = Check::new("odp", Area::Rdma, "on-demand paging", anchor::ODP);
    pub const PORT_ERROR_COUNTERS: Check = Check::new(
        "port_error_counters",
        Area::Rdma,
        "port error counters",
        anchor::ODP,
    );
    pub const QP_TIMEOUT: Check =
        Check::new("qp_timeout", Area::Rdma, "rc qp timeout", anchor::ODP);
    pub const QEMU_ACCELERATION: Check = Check::new(
        "qemu_acceleration",
        Area::Rdma,
        "qemu acceleration",
        anchor::RDMA,
    );
    pub const BUSY_POLLING: Check = Check::new(
        "busy_polling",
        Area::Network,
        "busy polling sysctls",
        anchor::BUSY_POLL,
    );
    pub const RFS: Check = Check::new("rfs", Area::Network, "rfs", anchor::RFS_XPS);
    pub const XPS: Check = Check::new("xps", Area::Network, "xps", anchor::RFS_XPS);
    pub const IO_URING: Check = Check::new("io_uring", Area::Network, "io_uring", anchor::IO_URING);
    pub const WAKE_UP_LATENCY: Check = Check::new(
        "wake_up_latency",
        Area::Cpu,
        "wake-up latency",
        anchor::WAKE_UP,
    );
    pub const TIMED_SLEEP: Check =
        Check::new("timed_sleep", Area::Cpu, "timed sleep", anchor::TIMED_SLEEP);
    pub const CPU_GAPS: Check = Check::new("cpu_gaps", Area::Cpu, "cpu gaps", anchor::CPUS);
}

impl Finding {
    pub(super) fn advice(mut self, a: impl Into<String>) -> Self {
        self.advice = Some(a.into());
        self
    }
}

//! Completion-vector affinity: the user-space half of FastWake's "wake the
//! thread where the interrupt lands".
//!
//! A CQ's completion vector picks which interrupt signals it. If that IRQ is
//! delivered to another CPU than the one the waiting thread sleeps on, every
//! wake-up is a cross-CPU wake-up (an IPI, ~4 µs here instead of ~1 µs). So:
//!
//! 1. **Choose** ([`choose_vector`]): create each CQ on the vector whose IRQ's
//!    *effective* affinity is the waiting thread's CPU. mlx5 names its IRQs
//!    `mlx5_comp<N>@pci:<BDF>` in `/proc/interrupts` ([`irq`]). Providers
//!    without IRQs (rxe, siw: completions are raised in softirq context of
//!    whichever CPU handled the packet) expose one vector per CPU, and the
//!    rule degenerates to vector = CPU.
//! 2. **Re-place lazily** ([`Replacer`]): at wait time (on the arm path, a
//!    cheap `sched_getcpu`), notice that the thread now runs elsewhere than
//!    its CQ's IRQ and, by [`ReplacePolicy`], move the thread back, or — only when
//!    explicitly enabled and the kernel permits — move the IRQ to the thread.
//!    No verb changes a CQ's vector after creation, so those are the only two
//!    levers.
//!
//! Every choice and re-placement is recorded as a [`Placement`] /
//! [`Replacement`] so benchmarks and the shim can report them.

pub mod irq;
mod replace;

pub use irq::{VectorInfo, VectorMap};
pub use replace::{ReplacePolicy, Replacement, Replacer};

/// Why a vector was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// The vector's IRQ is effectively delivered to the wanted CPU.
    IrqAffinity,
    /// The vector has IRQs but none lands on the wanted CPU: the best
    /// remaining choice (the first vector); lazy re-placement may fix it.
    IrqElsewhere,
    /// The provider has no IRQs (rxe, siw): vector = CPU modulo the vector
    /// count.
    VectorIsCpu,
    /// The caller fixed the vector.
    Fixed,
}

impl How {
    /// Short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            How::IrqAffinity => "irq-affinity",
            How::IrqElsewhere => "irq-elsewhere",
            How::VectorIsCpu => "vector=cpu",
            How::Fixed => "fixed",
        }
    }
}

/// Where a CQ was placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The completion vector passed to `ibv_create_cq`.
    pub vector: u32,
    /// The IRQ behind the vector, if the provider has one.
    pub irq: Option<u32>,
    /// The CPU the completion signal is expected on (the IRQ's effective CPU,
    /// or the nominal CPU for IRQ-less providers); the waiter belongs there.
    pub cpu: Option<u32>,
    /// The CPU the waiting thread was expected on.
    pub wanted_cpu: Option<u32>,
    /// Why.
    pub how: How,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "vector {} ({})", self.vector, self.how.name())?;
        if let Some(i) = self.irq {
            write!(f, " irq {i}")?;
        }
        if let Some(c) = self.cpu {
            write!(f, " signal cpu {c}")?;
        }
        if let Some(w) = self.wanted_cpu {
            write!(f, " waiter cpu {w}")?;
        }
        Ok(())
    }
}

/// Choose the completion vector for a CQ whose waiter will run on
/// `wanted_cpu` (`None`: the calling thread's current CPU).
pub fn choose_vector(map: &VectorMap, wanted_cpu: Option<u32>) -> Placement {
    let wanted = wanted_cpu.or_else(crate::cpu::current);
    let n = map.vectors.len().max(1) as u32;
    if !map.has_irqs() {
        let v = wanted.unwrap_or(0) % n;
        return Placement {
            vector: v,
            irq: None,
            cpu: Some(v),
            wanted_cpu: wanted,
            how: How::VectorIsCpu,
        };
    }
    // Prefer a vector whose IRQ goes to exactly the wanted CPU, then one
    // whose effective mask merely includes it.
    let exact = map
        .vectors
        .iter()
        .find(|v| wanted.is_some() && v.effective_cpus == [wanted.unwrap_or(0)]);
    let incl = || {
        map.vectors
            .iter()
            .find(|v| wanted.is_some_and(|w| v.effective_cpus.contains(&w)))
    };
    if let Some(v) = exact.or_else(incl) {
        return Placement {
            vector: v.vector,
            irq: v.irq,
            cpu: wanted,
            wanted_cpu: wanted,
            how: How::IrqAffinity,
        };
    }
    let v = &map.vectors[0];
    Placement {
        vector: v.vector,
        irq: v.irq,
        cpu: v.effective_cpus.first().copied(),
        wanted_cpu: wanted,
        how: How::IrqElsewhere,
    }
}

/// A placement for a caller-fixed vector, with what the map says about it.
pub fn fixed_vector(map: &VectorMap, vector: u32) -> Placement {
    let info = map.vectors.iter().find(|v| v.vector == vector);
    let irq = info.and_then(|v| v.irq);
    let cpu = match info {
        Some(v) if v.irq.is_some() => v.effective_cpus.first().copied(),
        _ if !map.has_irqs() => Some(vector),
        _ => None,
    };
    Placement {
        vector,
        irq,
        cpu,
        wanted_cpu: None,
        how: How::Fixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(irqs: &[(u32, &[u32])]) -> VectorMap {
        VectorMap {
            device: "mlx5_0".into(),
            vectors: irqs
                .iter()
                .enumerate()
                .map(|(i, (irq, cpus))| VectorInfo {
                    vector: i as u32,
                    irq: Some(*irq),
                    effective_cpus: cpus.to_vec(),
                })
                .collect(),
        }
    }

    #[test]
    fn irq_affinity_picks_vector_delivered_to_cpu() {
        let m = map(&[(90, &[1]), (91, &[0]), (92, &[0, 1])]);
        let p = choose_vector(&m, Some(0));
        assert_eq!((p.vector, p.irq, p.how), (1, Some(91), How::IrqAffinity));
        let p = choose_vector(&m, Some(1));
        assert_eq!((p.vector, p.irq), (0, Some(90)));
    }

    #[test]
    fn irq_elsewhere_falls_back_and_says_so() {
        let m = map(&[(90, &[3])]);
        let p = choose_vector(&m, Some(0));
        assert_eq!((p.vector, p.cpu, p.how), (0, Some(3), How::IrqElsewhere));
    }

    #[test]
    fn no_irqs_means_vector_is_cpu() {
        let m = VectorMap::without_irqs("rxe0", 2);
        assert_eq!(choose_vector(&m, Some(1)).vector, 1);
        assert_eq!(choose_vector(&m, Some(5)).vector, 1);
        assert_eq!(choose_vector(&m, Some(0)).how, How::VectorIsCpu);
        assert_eq!(fixed_vector(&m, 1).cpu, Some(1));
    }
}

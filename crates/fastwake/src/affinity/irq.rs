//! Which IRQ serves which completion vector, and where it is delivered.
//!
//! mlx5 requests one MSI-X vector per completion vector and names it
//! `mlx5_comp<N>@pci:<BDF>` (N = completion vector, BDF = the device's PCI
//! address, the basename of `/sys/class/infiniband/<dev>/device`). The CPU an
//! IRQ actually lands on is its *effective* affinity
//! (`/proc/irq/<irq>/effective_affinity_list`; `smp_affinity_list` is only
//! the allowed set). Parsing is split from reading so it is unit-tested on
//! sample text.

use std::path::Path;

/// One completion vector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorInfo {
    /// The completion vector number.
    pub vector: u32,
    /// Its IRQ, if the provider has one.
    pub irq: Option<u32>,
    /// CPUs the IRQ is effectively delivered to (empty without an IRQ).
    pub effective_cpus: Vec<u32>,
}

/// All completion vectors of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VectorMap {
    /// The verbs device name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// One entry per completion vector, in order.
    pub vectors: Vec<VectorInfo>,
}

impl VectorMap {
    /// A device whose vectors have no IRQs (rxe, siw).
    pub fn without_irqs(device: &str, n: u32) -> Self {
        VectorMap {
            device: device.into(),
            vectors: (0..n)
                .map(|v| VectorInfo {
                    vector: v,
                    irq: None,
                    effective_cpus: Vec::new(),
                })
                .collect(),
        }
    }

    /// True if any vector has an IRQ.
    pub fn has_irqs(&self) -> bool {
        self.vectors.iter().any(|v| v.irq.is_some())
    }

    /// Read the map of `device` (which has `num_vectors` completion vectors)
    /// from sysfs and procfs. Anything unreadable degrades to "no IRQs".
    pub fn read(device: &str, num_vectors: u32) -> Self {
        let bdf = std::fs::read_link(format!("/sys/class/infiniband/{device}/device"))
            .ok()
            .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()));
        let text = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
        let irqs = match &bdf {
            Some(b) => comp_irqs(&text, b),
            None => Vec::new(),
        };
        let mut map = VectorMap::without_irqs(device, num_vectors);
        for (vector, irq) in irqs {
            if let Some(v) = map.vectors.get_mut(vector as usize) {
                v.irq = Some(irq);
                v.effective_cpus = effective_cpus(irq);
            }
        }
        map
    }
}

/// `(vector, irq)` pairs for the mlx5 completion IRQs of PCI device `bdf`,
/// parsed from the text of `/proc/interrupts`.
pub fn comp_irqs(proc_interrupts: &str, bdf: &str) -> Vec<(u32, u32)> {
    let want = format!("@pci:{bdf}");
    let mut out = Vec::new();
    for line in proc_interrupts.lines() {
        let Some((num, rest)) = line.trim_start().split_once(':') else {
            continue;
        };
        let Ok(irq) = num.trim().parse::<u32>() else {
            continue;
        };
        let Some(name) = rest.split_whitespace().last() else {
            continue;
        };
        let Some(tail) = name.strip_prefix("mlx5_comp") else {
            continue;
        };
        let Some((vec, at)) = tail.split_once('@') else {
            continue;
        };
        if format!("@{at}") != want {
            continue;
        }
        if let Ok(v) = vec.parse::<u32>() {
            out.push((v, irq));
        }
    }
    out.sort_unstable();
    out
}

/// Parse a kernel CPU list (`0-3,8,10-11`).
pub fn parse_cpu_list(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
                    out.extend(a..=b.min(a.saturating_add(4096)));
                }
            }
            None => {
                if let Ok(c) = part.trim().parse() {
                    out.push(c);
                }
            }
        }
    }
    out
}

/// CPUs IRQ `irq` is effectively delivered to.
pub fn effective_cpus(irq: u32) -> Vec<u32> {
    let dir = format!("/proc/irq/{irq}");
    for f in ["effective_affinity_list", "smp_affinity_list"] {
        if let Ok(s) = std::fs::read_to_string(Path::new(&dir).join(f)) {
            let l = parse_cpu_list(&s);
            if !l.is_empty() {
                return l;
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
            CPU0       CPU1
  24:          0          0  IR-PCI-MSI 524288-edge      mlx5_async0@pci:0000:3b:00.0
  25:       1523          0  IR-PCI-MSI 524289-edge      mlx5_comp0@pci:0000:3b:00.0
  26:          0       8842  IR-PCI-MSI 524290-edge      mlx5_comp1@pci:0000:3b:00.0
  27:          0          3  IR-PCI-MSI 526337-edge      mlx5_comp0@pci:0000:3b:00.1
 NMI:          0          0   Non-maskable interrupts
";

    #[test]
    fn finds_comp_irqs_of_one_function() {
        assert_eq!(comp_irqs(SAMPLE, "0000:3b:00.0"), vec![(0, 25), (1, 26)]);
        assert_eq!(comp_irqs(SAMPLE, "0000:3b:00.1"), vec![(0, 27)]);
        assert!(comp_irqs(SAMPLE, "0000:00:00.0").is_empty());
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-2,5\n"), vec![0, 1, 2, 5]);
        assert_eq!(parse_cpu_list("1"), vec![1]);
        assert!(parse_cpu_list("").is_empty());
    }
}

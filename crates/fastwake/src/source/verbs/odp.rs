//! On-Demand Paging: what a device offers (`ibv_query_device_ex`'s
//! `odp_caps`) and the guard's policy, `FASTWAKE_ODP=keep|prefetch|pin`
//! (applied to unmodified programs by the preload shim; `fastwake doctor`
//! and `fastwake bench odp` report the capabilities).
//!
//! Why it matters (the ODP study, `docs/design/stall-monitor.md`): a work request that
//! meets a page fault on the NIC can lose a packet and wait out the QP's
//! retransmission timeout (hundreds of ms in firmware) instead of µs.

use super::device::Device;
use fastwake_verbs_sys::odp::*;

/// A device's ODP capabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OdpCaps {
    pub general: u64,
    pub rc: u32,
    pub uc: u32,
    pub ud: u32,
}

fn ops(caps: u32) -> String {
    let names = [
        (IBV_ODP_SUPPORT_SEND, "send"),
        (IBV_ODP_SUPPORT_RECV, "recv"),
        (IBV_ODP_SUPPORT_WRITE, "write"),
        (IBV_ODP_SUPPORT_READ, "read"),
        (IBV_ODP_SUPPORT_ATOMIC, "atomic"),
        (IBV_ODP_SUPPORT_SRQ_RECV, "srq_recv"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(b, _)| caps & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(",")
    }
}

impl OdpCaps {
    /// Parse the `odp_caps` of an `ibv_device_attr_ex` buffer.
    pub fn from_attr_ex(attr: &[u8]) -> Option<OdpCaps> {
        let o = DEVICE_ATTR_EX_ODP_CAPS;
        let b = attr.get(o..o + 20)?;
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
        Some(OdpCaps {
            general: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
            rc: u32_at(8),
            uc: u32_at(12),
            ud: u32_at(16),
        })
    }

    pub fn supported(&self) -> bool {
        self.general & IBV_ODP_SUPPORT != 0
    }

    /// One line: `ODP yes (implicit no); RC send,recv,...; UD ...`, or `no ODP`.
    pub fn describe(&self) -> String {
        if !self.supported() {
            return "no ODP".into();
        }
        format!(
            "ODP yes (implicit {}); RC {}; UC {}; UD {}",
            if self.general & IBV_ODP_SUPPORT_IMPLICIT != 0 {
                "yes"
            } else {
                "no"
            },
            ops(self.rc),
            ops(self.uc),
            ops(self.ud)
        )
    }
}

impl Device {
    /// The device's ODP capabilities, `None` when the provider has no
    /// `query_device_ex` (then it has no ODP either) or the query failed.
    pub fn odp_caps(&self) -> Option<OdpCaps> {
        // SAFETY: an open rdma-core context (a verbs_context).
        let slot = unsafe { ctx_slot(self.ctx, VERBS_CTX_QUERY_DEVICE_EX) }?;
        // SAFETY: a slot inside the verbs_context.
        let f = unsafe { *slot };
        if f == 0 {
            return None;
        }
        // SAFETY: the provider's query_device_ex, of verbs.h's signature.
        let f = unsafe { std::mem::transmute::<usize, QueryDeviceExFn>(f) };
        let mut buf = [0u8; DEVICE_ATTR_EX_SIZE];
        // SAFETY: a live context; a zeroed buffer of the size we pass.
        let rc = unsafe { f(self.ctx, std::ptr::null(), buf.as_mut_ptr(), buf.len()) };
        if rc != 0 {
            return None;
        }
        OdpCaps::from_attr_ex(&buf)
    }
}

/// The guard's policy for ODP registrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OdpPolicy {
    /// Register as asked.
    #[default]
    Keep,
    /// Register as asked, then fault the buffer in (`ibv_advise_mr`).
    Prefetch,
    /// Register pinned (without ON_DEMAND) when the memlock limit allows.
    Pin,
}

impl std::str::FromStr for OdpPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<OdpPolicy, String> {
        match s.trim() {
            "" | "keep" => Ok(OdpPolicy::Keep),
            "prefetch" => Ok(OdpPolicy::Prefetch),
            "pin" => Ok(OdpPolicy::Pin),
            o => Err(format!(
                "FASTWAKE_ODP='{o}' is not keep, prefetch or pin; keeping ODP registrations as they are"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_parse_and_describe() {
        let mut b = [0u8; DEVICE_ATTR_EX_SIZE];
        assert_eq!(OdpCaps::from_attr_ex(&b).unwrap().describe(), "no ODP");
        let o = DEVICE_ATTR_EX_ODP_CAPS;
        b[o..o + 8].copy_from_slice(&(IBV_ODP_SUPPORT).to_ne_bytes());
        b[o + 8..o + 12]
            .copy_from_slice(&(IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_READ).to_ne_bytes());
        let c = OdpCaps::from_attr_ex(&b).unwrap();
        assert!(c.supported());
        assert_eq!(
            c.describe(),
            "ODP yes (implicit no); RC send,read; UC none; UD none"
        );
        assert_eq!(OdpCaps::from_attr_ex(&b[..100]), None);
    }

    #[test]
    fn policy() {
        assert_eq!("pin".parse(), Ok(OdpPolicy::Pin));
        assert_eq!("".parse(), Ok(OdpPolicy::Keep));
        assert!(
            "bogus"
                .parse::<OdpPolicy>()
                .unwrap_err()
                .contains("FASTWAKE_ODP='bogus'")
        );
    }
}

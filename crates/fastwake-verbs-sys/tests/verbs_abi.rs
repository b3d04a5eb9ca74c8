//! The hand-written verbs structs must match rdma-core's header byte for byte.
//!
//! Compiles a C probe against the installed `<infiniband/verbs.h>` and compares
//! every size, field offset and constant fastwake relies on. Needs a C compiler
//! and libibverbs-dev; without them it prints SKIPPED (the structs are still
//! used against the real library in the Soft-RoCE guest, scripts/rxe-test).
//!
//! Cross targets (scripts/arm64-test) say how to build and run the probe for
//! the target, since the layout to compare is the target's, not the host's:
//!
//! - `FASTWAKE_VERBS_HEADER`: the verbs.h to include, by path; its
//!   `<infiniband/...>` siblings are searched after the compiler's own
//!   headers, so libc's types (the pthread mutex) are the target's.
//! - `FASTWAKE_VERBS_CC` (else `CC`, else `cc`): the compiler for the probe.
//! - `FASTWAKE_VERBS_RUNNER`: a command (split on spaces) the probe runs
//!   under, e.g. `qemu-aarch64 -L /`.
//!
//! With none set (scripts/test), it is the native check it always was. A
//! header, compiler or runner named explicitly that cannot be used fails the
//! test instead of skipping it.

use fastwake_verbs_sys::*;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_HEADER: &str = "/usr/include/infiniband/verbs.h";

/// Where the probe's header and tools come from (see the module doc).
struct Probe {
    /// The header compared against, as named in the result line.
    header: PathBuf,
    /// Set when the header was named: included by path, this directory
    /// (the header's grandparent) added with `-idirafter`.
    include_root: Option<PathBuf>,
    cc: String,
    /// Whether the compiler was named by `FASTWAKE_VERBS_CC`.
    cc_named: bool,
    runner: Vec<String>,
}

impl Probe {
    fn from_env() -> Probe {
        let named = std::env::var_os("FASTWAKE_VERBS_HEADER").map(PathBuf::from);
        let include_root = named.as_ref().map(|h| {
            let dir = h.parent().filter(|d| d.ends_with("infiniband"));
            dir.and_then(Path::parent)
                .unwrap_or_else(|| {
                    panic!(
                        "FASTWAKE_VERBS_HEADER={} is not .../infiniband/verbs.h",
                        h.display()
                    )
                })
                .to_path_buf()
        });
        let (cc, cc_named) = match std::env::var("FASTWAKE_VERBS_CC") {
            Ok(cc) => (cc, true),
            Err(_) => (std::env::var("CC").unwrap_or_else(|_| "cc".into()), false),
        };
        let runner = std::env::var("FASTWAKE_VERBS_RUNNER")
            .map(|r| r.split_whitespace().map(String::from).collect())
            .unwrap_or_default();
        Probe {
            header: named.unwrap_or_else(|| DEFAULT_HEADER.into()),
            include_root,
            cc,
            cc_named,
            runner,
        }
    }

    /// How the probe's source includes the header.
    fn include_line(&self) -> String {
        match self.include_root {
            Some(_) => format!("#include \"{}\"\n", self.header.display()),
            None => "#include <infiniband/verbs.h>\n".into(),
        }
    }
}

fn rust_layout() -> Vec<(String, usize)> {
    let mut v: Vec<(String, usize)> = Vec::new();
    macro_rules! size {
        ($t:ident) => {
            v.push((format!("sizeof {}", stringify!($t)), size_of::<$t>()));
        };
    }
    macro_rules! off {
        ($t:ident, $f:ident) => {
            v.push((
                format!("offsetof {} {}", stringify!($t), stringify!($f)),
                offset_of!($t, $f),
            ));
        };
    }
    size!(ibv_context_ops);
    size!(ibv_context);
    size!(ibv_comp_channel);
    size!(ibv_cq);
    size!(ibv_wc);
    size!(ibv_mr);
    size!(ibv_qp);
    size!(ibv_qp_cap);
    size!(ibv_qp_init_attr);
    size!(ibv_gid);
    size!(ibv_global_route);
    size!(ibv_ah_attr);
    size!(ibv_qp_attr);
    size!(ibv_port_attr);
    size!(ibv_sge);
    size!(ibv_recv_wr);
    size!(ibv_send_wr);
    off!(ibv_context_ops, poll_cq);
    off!(ibv_context_ops, req_notify_cq);
    off!(ibv_context_ops, post_send);
    off!(ibv_context_ops, post_recv);
    off!(ibv_context, ops);
    off!(ibv_context, cmd_fd);
    off!(ibv_context, num_comp_vectors);
    off!(ibv_context, abi_compat);
    off!(ibv_comp_channel, fd);
    off!(ibv_cq, context);
    off!(ibv_cq, channel);
    off!(ibv_cq, cq_context);
    off!(ibv_cq, comp_events_completed);
    size!(ibv_cq_init_attr_ex);
    off!(ibv_cq_init_attr_ex, channel);
    off!(ibv_cq_init_attr_ex, wc_flags);
    off!(ibv_cq_init_attr_ex, flags);
    off!(ibv_cq_init_attr_ex, parent_domain);
    size!(ibv_poll_cq_attr);
    size!(ibv_wc_tm_info);
    size!(ibv_cq_ex);
    off!(ibv_cq_ex, comp_events_completed);
    off!(ibv_cq_ex, status);
    off!(ibv_cq_ex, wr_id);
    off!(ibv_cq_ex, start_poll);
    off!(ibv_cq_ex, next_poll);
    off!(ibv_cq_ex, end_poll);
    off!(ibv_cq_ex, read_opcode);
    off!(ibv_cq_ex, read_vendor_err);
    off!(ibv_cq_ex, read_byte_len);
    off!(ibv_cq_ex, read_imm_data);
    off!(ibv_cq_ex, read_qp_num);
    off!(ibv_cq_ex, read_src_qp);
    off!(ibv_cq_ex, read_wc_flags);
    off!(ibv_cq_ex, read_slid);
    off!(ibv_cq_ex, read_sl);
    off!(ibv_cq_ex, read_dlid_path_bits);
    off!(ibv_cq_ex, read_completion_ts);
    off!(ibv_cq_ex, read_cvlan);
    off!(ibv_cq_ex, read_flow_tag);
    off!(ibv_cq_ex, read_tm_info);
    off!(ibv_cq_ex, read_completion_wallclock_ns);
    off!(ibv_wc, status);
    off!(ibv_wc, opcode);
    off!(ibv_wc, byte_len);
    off!(ibv_wc, imm_data);
    off!(ibv_wc, qp_num);
    off!(ibv_wc, wc_flags);
    off!(ibv_mr, lkey);
    off!(ibv_qp, qp_num);
    off!(ibv_qp, events_completed);
    off!(ibv_qp_init_attr, cap);
    off!(ibv_qp_init_attr, qp_type);
    off!(ibv_qp_init_attr, sq_sig_all);
    off!(ibv_global_route, sgid_index);
    off!(ibv_ah_attr, dlid);
    off!(ibv_ah_attr, is_global);
    off!(ibv_ah_attr, port_num);
    off!(ibv_qp_attr, dest_qp_num);
    off!(ibv_qp_attr, ah_attr);
    off!(ibv_qp_attr, pkey_index);
    off!(ibv_qp_attr, max_dest_rd_atomic);
    off!(ibv_qp_attr, min_rnr_timer);
    off!(ibv_qp_attr, port_num);
    off!(ibv_qp_attr, timeout);
    off!(ibv_qp_attr, rnr_retry);
    off!(ibv_qp_attr, rate_limit);
    off!(ibv_port_attr, active_mtu);
    off!(ibv_port_attr, lid);
    off!(ibv_port_attr, link_layer);
    off!(ibv_port_attr, port_cap_flags2);
    off!(ibv_recv_wr, num_sge);
    off!(ibv_send_wr, opcode);
    off!(ibv_send_wr, send_flags);
    off!(ibv_send_wr, imm_data);
    v
}

fn consts() -> Vec<(&'static str, i64)> {
    vec![
        ("IBV_QPT_RC", IBV_QPT_RC as i64),
        (
            "FW_CREATE_CQ_EX_BACK",
            VERBS_CONTEXT_CREATE_CQ_EX_BACK as i64,
        ),
        ("FW_CREATE_CQ_EX_SZ", VERBS_CONTEXT_CREATE_CQ_EX_SZ as i64),
        ("IBV_QPS_INIT", IBV_QPS_INIT as i64),
        ("IBV_QPS_RTR", IBV_QPS_RTR as i64),
        ("IBV_QPS_RTS", IBV_QPS_RTS as i64),
        ("IBV_QP_STATE", IBV_QP_STATE as i64),
        ("IBV_QP_ACCESS_FLAGS", IBV_QP_ACCESS_FLAGS as i64),
        ("IBV_QP_PKEY_INDEX", IBV_QP_PKEY_INDEX as i64),
        ("IBV_QP_PORT", IBV_QP_PORT as i64),
        ("IBV_QP_AV", IBV_QP_AV as i64),
        ("IBV_QP_PATH_MTU", IBV_QP_PATH_MTU as i64),
        ("IBV_QP_TIMEOUT", IBV_QP_TIMEOUT as i64),
        ("IBV_QP_RETRY_CNT", IBV_QP_RETRY_CNT as i64),
        ("IBV_QP_RNR_RETRY", IBV_QP_RNR_RETRY as i64),
        ("IBV_QP_RQ_PSN", IBV_QP_RQ_PSN as i64),
        ("IBV_QP_MAX_QP_RD_ATOMIC", IBV_QP_MAX_QP_RD_ATOMIC as i64),
        ("IBV_QP_MIN_RNR_TIMER", IBV_QP_MIN_RNR_TIMER as i64),
        ("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN as i64),
        (
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            IBV_QP_MAX_DEST_RD_ATOMIC as i64,
        ),
        ("IBV_QP_DEST_QPN", IBV_QP_DEST_QPN as i64),
        ("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE as i64),
        ("IBV_WR_SEND", IBV_WR_SEND as i64),
        ("IBV_WR_SEND_WITH_IMM", IBV_WR_SEND_WITH_IMM as i64),
        ("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED as i64),
        ("IBV_SEND_INLINE", IBV_SEND_INLINE as i64),
        ("IBV_WC_SUCCESS", IBV_WC_SUCCESS as i64),
        ("IBV_WC_SEND", IBV_WC_SEND as i64),
        ("IBV_WC_RECV", IBV_WC_RECV as i64),
        ("IBV_WC_WITH_IMM", IBV_WC_WITH_IMM as i64),
        ("IBV_WC_EX_WITH_BYTE_LEN", IBV_WC_EX_WITH_BYTE_LEN as i64),
        ("IBV_WC_EX_WITH_IMM", IBV_WC_EX_WITH_IMM as i64),
        ("IBV_WC_EX_WITH_QP_NUM", IBV_WC_EX_WITH_QP_NUM as i64),
        ("IBV_WC_EX_WITH_SRC_QP", IBV_WC_EX_WITH_SRC_QP as i64),
        ("IBV_WC_EX_WITH_SLID", IBV_WC_EX_WITH_SLID as i64),
        ("IBV_WC_EX_WITH_SL", IBV_WC_EX_WITH_SL as i64),
        (
            "IBV_WC_EX_WITH_DLID_PATH_BITS",
            IBV_WC_EX_WITH_DLID_PATH_BITS as i64,
        ),
        ("IBV_WC_STANDARD_FLAGS", IBV_WC_STANDARD_FLAGS as i64),
        ("IBV_MTU_1024", IBV_MTU_1024 as i64),
        ("IBV_PORT_ACTIVE", IBV_PORT_ACTIVE as i64),
        ("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET as i64),
    ]
}

fn c_probe(probe: &Probe, layout: &[(String, usize)]) -> String {
    let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n");
    c.push_str(&probe.include_line());
    // Where `ibv_create_cq_ex` finds its slot: bytes before the context,
    // and the `sz` that slot needs (verbs_get_ctx_op's test).
    c.push_str("#define FW_CREATE_CQ_EX_BACK (offsetof(struct verbs_context, context) - offsetof(struct verbs_context, create_cq_ex))\n");
    c.push_str("#define FW_CREATE_CQ_EX_SZ (sizeof(struct verbs_context) - offsetof(struct verbs_context, create_cq_ex))\n");
    c.push_str("int main(void){\n");
    for (k, _) in layout {
        let parts: Vec<&str> = k.split(' ').collect();
        let expr = match parts.as_slice() {
            ["sizeof", t] => format!("sizeof(struct {t})"),
            ["offsetof", t, f] => format!("offsetof(struct {t}, {f})"),
            _ => unreachable!(),
        };
        let expr = expr.replace("struct ibv_gid", "union ibv_gid");
        c.push_str(&format!("printf(\"{k} %zu\\n\", (size_t){expr});\n"));
    }
    for (k, _) in consts() {
        c.push_str(&format!("printf(\"const {k} %lld\\n\", (long long){k});\n"));
    }
    c.push_str("return 0;}\n");
    c
}

#[test]
fn verbs_structs_match_rdma_core_header() {
    let probe = Probe::from_env();
    let header = probe.header.display().to_string();
    if !probe.header.exists() {
        assert!(
            probe.include_root.is_none(),
            "FASTWAKE_VERBS_HEADER={header} does not exist"
        );
        eprintln!(
            "SKIPPED verbs_structs_match_rdma_core_header: {header} not installed (apt-get install libibverbs-dev)"
        );
        return;
    }
    let layout = rust_layout();
    let dir = std::env::temp_dir().join(format!("fw-verbs-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&src, c_probe(&probe, &layout)).unwrap();
    let cc = &probe.cc;
    let mut compile = Command::new(cc);
    compile.arg(&src).arg("-o").arg(&exe);
    if let Some(root) = &probe.include_root {
        compile.arg("-idirafter").arg(root);
    }
    let built = match compile.output() {
        Ok(o) => o,
        Err(e) => {
            assert!(!probe.cc_named, "FASTWAKE_VERBS_CC={cc} cannot be run: {e}");
            eprintln!("SKIPPED verbs_structs_match_rdma_core_header: no C compiler '{cc}': {e}");
            return;
        }
    };
    assert!(
        built.status.success(),
        "C probe failed to compile:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut run = match probe.runner.split_first() {
        Some((prog, args)) => {
            let mut c = Command::new(prog);
            c.args(args).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let out = run
        .output()
        .unwrap_or_else(|e| panic!("cannot run the probe {:?}: {e}", run));
    assert!(
        out.status.success(),
        "the probe {:?} failed ({}):\n{}",
        run,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let mut checked = 0;
    let mut bad = Vec::new();
    for line in text.lines() {
        let (k, v) = line.rsplit_once(' ').unwrap();
        let v: i64 = v.parse().unwrap();
        let mine = if let Some(name) = k.strip_prefix("const ") {
            consts().iter().find(|(n, _)| *n == name).unwrap().1
        } else {
            layout.iter().find(|(n, _)| n == k).unwrap().1 as i64
        };
        checked += 1;
        if mine != v {
            bad.push(format!("{k}: header {v}, fastwake {mine}"));
        }
    }
    assert_eq!(checked, layout.len() + consts().len());
    assert!(
        bad.is_empty(),
        "ABI mismatches against {header} ({cc}):\n{}",
        bad.join("\n")
    );
    // Native runs print the line they always did; a cross run says how.
    let how = match (probe.cc_named, probe.runner.join(" ")) {
        (false, r) if r.is_empty() => String::new(),
        (_, r) if r.is_empty() => format!(" (probe built by {cc})"),
        (_, r) => format!(" (probe built by {cc}, run by {r})"),
    };
    eprintln!("verbs ABI: {checked} sizes, offsets and constants match {header}{how}");
}

//! The ODP offsets and constants (`fastwake_verbs_sys::odp`) against the
//! installed `<infiniband/verbs.h>`: a small C probe, like verbs_abi.rs
//! (SKIPPED without the header or a C compiler).

use fastwake_verbs_sys::odp::*;
use std::process::Command;

#[test]
fn odp_offsets_match_rdma_core_header() {
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() {
        eprintln!(
            "SKIPPED odp_offsets_match_rdma_core_header: {} not installed (apt-get install libibverbs-dev)",
            header.display()
        );
        return;
    }
    let want: &[(&str, i64)] = &[
        (
            "offsetof(struct verbs_context, context) - offsetof(struct verbs_context, query_device_ex)",
            VERBS_CTX_QUERY_DEVICE_EX as i64,
        ),
        (
            "offsetof(struct verbs_context, context) - offsetof(struct verbs_context, advise_mr)",
            VERBS_CTX_ADVISE_MR as i64,
        ),
        (
            "offsetof(struct ibv_device_attr_ex, odp_caps)",
            DEVICE_ATTR_EX_ODP_CAPS as i64,
        ),
        (
            "offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.rc_odp_caps)",
            DEVICE_ATTR_EX_ODP_CAPS as i64 + 8,
        ),
        (
            "offsetof(struct ibv_device_attr_ex, odp_caps.per_transport_caps.ud_odp_caps)",
            DEVICE_ATTR_EX_ODP_CAPS as i64 + 16,
        ),
        (
            "sizeof(struct ibv_device_attr_ex)",
            DEVICE_ATTR_EX_SIZE as i64,
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
            SEND_WR_RDMA_RKEY as i64,
        ),
        ("IBV_ACCESS_ON_DEMAND", IBV_ACCESS_ON_DEMAND as i64),
        ("IBV_ODP_SUPPORT", IBV_ODP_SUPPORT as i64),
        ("IBV_ODP_SUPPORT_IMPLICIT", IBV_ODP_SUPPORT_IMPLICIT as i64),
        ("IBV_ODP_SUPPORT_SEND", IBV_ODP_SUPPORT_SEND as i64),
        ("IBV_ODP_SUPPORT_RECV", IBV_ODP_SUPPORT_RECV as i64),
        ("IBV_ODP_SUPPORT_WRITE", IBV_ODP_SUPPORT_WRITE as i64),
        ("IBV_ODP_SUPPORT_READ", IBV_ODP_SUPPORT_READ as i64),
        ("IBV_ODP_SUPPORT_ATOMIC", IBV_ODP_SUPPORT_ATOMIC as i64),
        ("IBV_ODP_SUPPORT_SRQ_RECV", IBV_ODP_SUPPORT_SRQ_RECV as i64),
        (
            "IBV_ADVISE_MR_ADVICE_PREFETCH",
            IBV_ADVISE_MR_ADVICE_PREFETCH as i64,
        ),
        (
            "IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE",
            IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE as i64,
        ),
        (
            "IB_UVERBS_ADVISE_MR_FLAG_FLUSH",
            IB_UVERBS_ADVISE_MR_FLAG_FLUSH as i64,
        ),
        ("IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE as i64),
        ("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ as i64),
    ];
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void){\n",
    );
    for (i, (expr, _)) in want.iter().enumerate() {
        c.push_str(&format!("printf(\"{i} %lld\\n\", (long long)({expr}));\n"));
    }
    c.push_str("return 0;}\n");
    let dir = std::env::temp_dir().join(format!("fw-odp-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("probe.c"), dir.join("probe"));
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc).arg(&src).arg("-o").arg(&exe).output() {
        Err(e) => {
            eprintln!("SKIPPED odp_offsets_match_rdma_core_header: no C compiler '{cc}' ({e})");
            return;
        }
        Ok(o) => assert!(
            o.status.success(),
            "probe did not compile: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
    }
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8(out.stdout).unwrap();
    let mut n = 0;
    for line in text.lines() {
        let (i, v) = line.split_once(' ').unwrap();
        let (expr, rust) = want[i.parse::<usize>().unwrap()];
        assert_eq!(v.parse::<i64>().unwrap(), rust, "{expr}");
        n += 1;
    }
    assert_eq!(n, want.len());
    eprintln!(
        "odp_abi: {n} offsets and constants match {}",
        header.display()
    );
}

//! The judgements, on inputs written down here rather than read off this
//! host.

use super::cpu::*;
use super::finding::*;
use super::host::*;
use super::rdma::*;
use super::*;

#[test]
fn psi_above_the_threshold_is_a_warning() {
    let busy = "some avg10=47.10 avg60=30.02 avg300=12.00 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0";
    let f = judge_psi(Some(busy));
    assert_eq!(f.level, Level::Warn, "{f:?}");
    assert!(f.detail.contains("47.1"), "{}", f.detail);
    assert!(f.advice.as_deref().unwrap().contains("spinning"));
    let idle = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0";
    assert_eq!(judge_psi(Some(idle)).level, Level::Ok);
    // The threshold itself is still ok ("above" warns).
    assert_eq!(
        judge_psi(Some("some avg10=10.00 avg60=0 avg300=0 total=0")).level,
        Level::Ok
    );
    assert_eq!(
        judge_psi(Some("some avg10=10.01 avg60=0 avg300=0 total=0")).level,
        Level::Warn
    );
    assert_eq!(judge_psi(None).level, Level::Info);
    assert_eq!(judge_psi(Some("garbage")).level, Level::Info);
}

#[test]
fn cpu_lists_are_compressed() {
    assert_eq!(cpu_list(&[3, 0, 1, 2, 8, 10, 11]), "0-3,8,10-11");
    assert_eq!(cpu_list(&[5]), "5");
    assert_eq!(cpu_list(&[]), "");
}

fn state(cpu: u32, name: &str, exit_us: u64, disabled: bool) -> IdleState {
    IdleState {
        cpu,
        name: name.into(),
        exit_us,
        disabled,
    }
}

#[test]
fn deep_idle_states_warn_unless_disabled() {
    let mut s = vec![
        state(0, "POLL", 0, false),
        state(0, "C1", 2, false),
        state(0, "C6", 133, false),
        state(1, "POLL", 0, false),
        state(1, "C1", 2, false),
        state(1, "C6", 133, true),
    ];
    let f = judge_idle(Some("intel_idle"), &s);
    assert_eq!(f.level, Level::Warn, "{f:?}");
    assert!(
        f.detail.contains("C6 133 µs enabled on cpu 0"),
        "{}",
        f.detail
    );
    s[2].disabled = true;
    assert_eq!(judge_idle(Some("intel_idle"), &s).level, Level::Ok);
    // In a guest the declared latencies are not the cost: info.
    let hp = [
        state(0, "POLL", 0, false),
        state(0, "haltpoll idle", 1, false),
    ];
    assert_eq!(judge_idle(Some("haltpoll"), &hp).level, Level::Info);
    assert_eq!(judge_idle(None, &[]).level, Level::Info);
}

#[test]
fn halt_polling_judgements() {
    assert_eq!(
        judge_halt_poll(Some("haltpoll"), true, Some(0)).level,
        Level::Warn
    );
    assert_eq!(
        judge_halt_poll(Some("haltpoll"), true, Some(50_000)).level,
        Level::Info
    );
    assert_eq!(
        judge_halt_poll(Some("haltpoll"), true, Some(200_000)).level,
        Level::Ok
    );
    assert_eq!(
        judge_halt_poll(Some("intel_idle"), false, None).level,
        Level::Info
    );
}

#[test]
fn governors_other_than_performance_warn() {
    let p = |c: u32, g: &str| (c, g.to_string());
    assert_eq!(judge_governors(&[]).level, Level::Info);
    assert_eq!(
        judge_governors(&[p(0, "performance"), p(1, "performance")]).level,
        Level::Ok
    );
    let f = judge_governors(&[p(0, "performance"), p(1, "schedutil"), p(2, "schedutil")]);
    assert_eq!(f.level, Level::Warn);
    assert!(f.detail.contains("schedutil on cpu 1-2"), "{}", f.detail);
}

#[test]
fn memlock_matters_only_with_rdma_devices() {
    let small = Some(8 << 20);
    assert_eq!(judge_memlock(small, small, false, false).level, Level::Info);
    let f = judge_memlock(small, small, true, false);
    assert_eq!(f.level, Level::Warn);
    assert!(f.detail.contains("8 MiB"), "{}", f.detail);
    assert_eq!(judge_memlock(small, small, true, true).level, Level::Ok);
    assert_eq!(judge_memlock(None, None, true, false).level, Level::Ok);
    assert_eq!(
        judge_memlock(Some(MEMLOCK_WARN_BYTES), None, true, false).level,
        Level::Ok
    );
}

#[test]
fn irqbalance_warns_only_with_completion_irqs() {
    assert_eq!(judge_irqbalance(false, true).level, Level::Ok);
    assert_eq!(judge_irqbalance(true, false).level, Level::Info);
    assert_eq!(judge_irqbalance(true, true).level, Level::Warn);
}

#[test]
fn isolation_is_read_from_sysfs() {
    assert_eq!(
        judge_isolated(Some(""), Some("(null)"), Some("quiet")).level,
        Level::Info
    );
    let f = judge_isolated(Some("2-3"), Some("2-3"), Some("isolcpus=2-3 nohz_full=2-3"));
    assert_eq!(f.level, Level::Ok);
    assert!(
        f.detail.contains("isolated 2-3, nohz_full 2-3"),
        "{}",
        f.detail
    );
}

#[test]
fn vectors_cover_cpus_or_say_which_do_not() {
    let dev = |v: Vectors| vec![("mlx5_0".to_string(), v)];
    let full = dev(vec![(0, 25, vec![0]), (1, 26, vec![1])]);
    assert_eq!(judge_vectors(&full, &[0, 1]).level, Level::Ok);
    let part = dev(vec![(0, 25, vec![0]), (1, 26, vec![0])]);
    let f = judge_vectors(&part, &[0, 1]);
    assert_eq!(f.level, Level::Info);
    assert!(f.detail.contains("cpu 1 alone"), "{}", f.detail);
    assert_eq!(judge_vectors(&dev(vec![]), &[0, 1]).level, Level::Info);
    assert_eq!(judge_vectors(&[], &[0, 1]).level, Level::Info);
}

#[test]
fn warn_lines_carry_advice_and_a_guide_section() {
    let mut r = Report::new("Linux x".into());
    r.push(judge_psi(Some("some avg10=47.10 avg60=0 avg300=0 total=0")));
    r.push(judge_psi(Some("some avg10=0.00 avg60=0 avg300=0 total=0")));
    assert_eq!(r.warnings, 1);
    let t = render_text(&r);
    let lines: Vec<&str> = t.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.trim_start().starts_with("warn"))
        .unwrap();
    assert!(lines[i + 1].trim_start().starts_with("-> "), "{t}");
    assert_eq!(
        lines[i + 2].trim(),
        format!("see {GUIDE}#{}", anchor::PRESSURE),
        "{t}"
    );
    // ok lines stand alone.
    let j = lines
        .iter()
        .position(|l| l.trim_start().starts_with("ok"))
        .unwrap();
    assert!(!lines[j + 1].contains("see "), "{t}");
    assert!(t.contains("1 warning(s), 0 bad."), "{t}");
}

/// Every anchor doctor can print is a heading of docs/guide/tuning.md.
#[test]
fn every_anchor_is_a_section_of_the_guide() {
    let guide = include_str!("../../../../docs/guide/tuning.md");
    let anchors = super::anchors::github_anchors(guide);
    for a in anchor::ALL {
        assert!(
            anchors.iter().any(|h| h == a),
            "no heading for #{a} in docs/guide/tuning.md: {anchors:?}"
        );
    }
}

#[test]
fn the_waiter_slice_is_ok_where_the_kernel_keeps_it_and_info_where_not() {
    let ok = judge_waiter_slice(Ok(Some(std::time::Duration::from_micros(100))));
    assert_eq!(ok.level, Level::Ok);
    let old = judge_waiter_slice(Err((
        libc::EOPNOTSUPP,
        "this kernel does not keep a thread's own slice".into(),
    )));
    assert_eq!(old.level, Level::Info);
    assert!(old.detail.contains("does not keep"), "{}", old.detail);
    // On this host: whichever it is, one line and never a warning.
    let here = waiter_slice();
    assert!(matches!(here.level, Level::Ok | Level::Info), "{here:?}");
    assert!(!here.detail.contains('\n'));
}

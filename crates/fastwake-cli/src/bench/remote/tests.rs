//! The exchange without RDMA: fastwake against fastwake and against a
//! peer that speaks perftest's bytes, over loopback TCP.

use super::wire::{self, Conn, Dest, Peer};
use super::{Params, Run, disagreement};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    for x in [&c, &s] {
        x.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    }
    (c, s)
}

fn dest(qpn: u32) -> Dest {
    Dest {
        lid: 0,
        out_reads: 1,
        qpn,
        psn: 0x123456,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 2, 15],
        ..Dest::default()
    }
}

fn run(modes: &str, size: usize, iters: u64) -> Run {
    Run {
        sizes: vec![size],
        all: false,
        iters,
        warmup: 100,
        rounds: 10,
        modes: modes.split(',').map(String::from).collect(),
    }
}

/// The steps of `remote::run` up to the data phase, for one QP.
fn fastwake_steps<S: Read + Write>(c: &mut Conn<S>, qpn: u32) -> fastwake::Result<(Peer, Dest)> {
    let peer = c.versions()?;
    c.sys_data()?;
    let mtu = c.mtu(3)?;
    assert_eq!(mtu, 3);
    let theirs = c.keys(&dest(qpn), true, "keys")?;
    c.keys(&dest(qpn), true, "sync")?;
    c.keys(&dest(qpn), true, "sync of QP 0")?;
    c.keys(&dest(qpn), true, "sync before size")?;
    c.close(&dest(qpn), true)?;
    Ok((peer, theirs))
}

/// perftest's send_lat (TCP, RoCE, one QP, one size) as bytes: the client
/// writes first, the server reads first (ctx_xchg_data, ctx_hand_shake).
fn perftest_steps(mut s: TcpStream, client: bool, my_keys: &[u8]) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut step = |s: &mut TcpStream, mine: &[u8], n: usize| {
        let mut b = vec![0u8; n];
        if client {
            s.write_all(mine).unwrap();
            s.read_exact(&mut b).unwrap();
        } else {
            s.read_exact(&mut b).unwrap();
            s.write_all(mine).unwrap();
        }
        got.push(b);
    };
    let mut version = [0u8; 16];
    version[..4].copy_from_slice(b"6.06");
    step(&mut s, &version, 16);
    step(&mut s, &4096i32.to_be_bytes(), 4);
    step(&mut s, &64i32.to_be_bytes(), 4);
    step(&mut s, b"5\0", 2); // IBV_MTU_4096: the fastwake end keeps its 1024
    for _ in 0..5 {
        step(&mut s, my_keys, wire::KEY_LEN_GID);
    }
    s.write_all(b"done\0").unwrap();
    got
}

fn perftest_keys() -> Vec<u8> {
    // What perftest's sprintf(KEY_PRINT_FMT_GID) makes of QPN 0x12, PSN
    // 0xabcdef, GID ::ffff:10.0.2.15, and its NUL.
    let mut k = b"0000:0000:000012:abcdef:00000000:0000000000000000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:02:0f:00000000:".to_vec();
    k.push(0);
    assert_eq!(k.len(), wire::KEY_LEN_GID);
    k
}

#[test]
fn a_fastwake_client_speaks_to_perftests_server() {
    let (c, s) = pair();
    let fake = std::thread::spawn(move || perftest_steps(s, false, &perftest_keys()));
    let mut conn = Conn::from_stream(c, true, "perftest");
    let (peer, theirs) = fastwake_steps(&mut conn, 0x44).unwrap();
    assert_eq!(peer, Peer::Perftest("6.06".into()));
    assert_eq!((theirs.qpn, theirs.psn), (0x12, 0xabcdef));
    assert!(theirs.v4_mapped());
    let got = fake.join().unwrap();
    // perftest's atof reads "6.06" of our version message.
    assert_eq!(&got[0][..5], b"6.06\0");
    assert_eq!(got[3], b"3\0");
    let keys = std::str::from_utf8(&got[4][..107]).unwrap();
    assert!(keys.starts_with("0000:0001:000044:123456:"), "{keys}");
    assert!(keys.ends_with(":ff:ff:0a:00:02:0f:00000000:"), "{keys}");
}

#[test]
fn a_fastwake_server_speaks_to_perftests_client() {
    let (c, s) = pair();
    let fake = std::thread::spawn(move || perftest_steps(c, true, &perftest_keys()));
    let mut conn = Conn::from_stream(s, false, "perftest");
    let (peer, theirs) = fastwake_steps(&mut conn, 0x45).unwrap();
    assert_eq!(peer, Peer::Perftest("6.06".into()));
    assert_eq!(theirs.qpn, 0x12);
    fake.join().unwrap();
}

#[test]
fn two_fastwake_ends_know_each_other_and_refuse_other_parameters() {
    let (c, s) = pair();
    let server = std::thread::spawn(move || {
        let mut conn = Conn::from_stream(s, false, "client");
        let peer = conn.versions().unwrap();
        let theirs = conn
            .blob(
                Params {
                    run: run("poll,interrupt", 8, 1000),
                    version: "0".into(),
                    host: "b".into(),
                    device: "rxe0".into(),
                }
                .encode()
                .as_bytes(),
                "parameters",
            )
            .unwrap();
        (
            peer,
            Params::decode(&String::from_utf8(theirs).unwrap()).unwrap(),
        )
    });
    let mut conn = Conn::from_stream(c, true, "server");
    assert_eq!(
        conn.versions().unwrap(),
        Peer::Fastwake(wire::FASTWAKE_PROTO)
    );
    let mine = Params {
        run: run("poll", 64, 1000),
        version: "0".into(),
        host: "a".into(),
        device: "rxe1".into(),
    };
    let theirs = conn.blob(mine.encode().as_bytes(), "parameters").unwrap();
    let theirs = Params::decode(&String::from_utf8(theirs).unwrap()).unwrap();
    let (speer, sgot) = server.join().unwrap();
    assert_eq!(speer, Peer::Fastwake(wire::FASTWAKE_PROTO));
    assert_eq!(sgot, mine);
    // Both ends see the same difference, each from its side.
    assert_eq!(
        disagreement(&mine.run, &theirs.run).unwrap(),
        "size: -s 8 there, -s 64 here; --mode: poll,interrupt there, poll here"
    );
    assert_eq!(
        disagreement(&theirs.run, &mine.run).unwrap(),
        "size: -s 64 there, -s 8 here; --mode: poll there, poll,interrupt here"
    );
    assert_eq!(disagreement(&mine.run, &mine.run), None);
    let mut all = mine.run.clone();
    all.all = true;
    all.iters = 5;
    assert_eq!(
        disagreement(&mine.run, &all).unwrap(),
        "size: -a there, -s 64 here; -n: 5 there, 1000 here"
    );
}

#[test]
fn a_peer_of_another_protocol_is_one_line() {
    let (c, mut s) = pair();
    let t = std::thread::spawn(move || {
        s.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian\r\n").unwrap();
        let mut b = [0u8; 16];
        let _ = s.read(&mut b);
    });
    let mut conn = Conn::from_stream(c, true, "10.0.0.1:22");
    let e = conn.versions().unwrap_err().to_string();
    assert!(
        e.contains("10.0.0.1:22") && e.contains("speaks neither") && e.contains("SSH-2.0-OpenSSH"),
        "{e}"
    );
    assert!(!e.contains('\n'));
    t.join().unwrap();
}

#[test]
fn a_silent_or_vanishing_peer_is_one_line() {
    let (c, s) = pair();
    c.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut conn = Conn::from_stream(c, true, "silent");
    let e = conn.versions().unwrap_err().to_string();
    assert!(e.contains("no answer"), "{e}");
    drop(s);
    let (c, s) = pair();
    drop(s);
    let mut conn = Conn::from_stream(c, true, "gone");
    let e = conn.versions().unwrap_err().to_string();
    assert!(
        e.contains("closed the connection") || e.contains("reset"),
        "{e}"
    );
}

#[test]
fn old_perftest_and_other_fastwake_protocols_are_refused() {
    for (bytes, want) in [
        (&b"5.60\0\0\0\0\0\0\0\0\0\0\0\0"[..], "older than 5.70"),
        (&b"6.06\0fastwake 9\0"[..], "fastwake protocol 9"),
    ] {
        let (c, mut s) = pair();
        let b = bytes.to_vec();
        let t = std::thread::spawn(move || {
            let mut m = [0u8; 16];
            s.read_exact(&mut m).unwrap();
            s.write_all(&b).unwrap();
        });
        let mut conn = Conn::from_stream(c, true, "peer");
        let e = conn.versions().unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
        t.join().unwrap();
    }
}

#[test]
fn the_connect_to_nothing_is_one_line() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let e = Conn::connect("127.0.0.1", port).err().unwrap().to_string();
    assert!(
        e.contains(&format!("cannot connect to 127.0.0.1:{port}")),
        "{e}"
    );
    let e = Conn::connect("no-such-host.invalid", 1)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("cannot resolve no-such-host.invalid"), "{e}");
}

#[test]
fn params_round_trip() {
    let p = Params {
        run: Run {
            sizes: vec![2, 4, 8],
            all: true,
            iters: 7,
            warmup: 0,
            rounds: 1,
            modes: vec!["adaptive:cap=20%,worth=9".into(), "hybrid:20us".into()],
        },
        version: "0.1.0".into(),
        host: "h".into(),
        device: "mlx5_0".into(),
    };
    assert_eq!(Params::decode(&p.encode()).unwrap(), p);
    assert!(
        Params::decode("sizes=1\n")
            .unwrap_err()
            .contains("no 'all'")
    );
}

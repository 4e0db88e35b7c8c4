//! A peer that is not ferroce, over softroce: a rank that loaded NCCL's own transport or
//! another net plugin. ferroce is driven through its exported `ncclNetPlugin_v6` table, as NCCL
//! drives it; the other rank is the harness's mock plugin (`libnccl-net-mock.so`, a second NCCL
//! net plugin over TCP on 127.0.0.1, dlopened into the same process) or a raw TCP peer. Every
//! case must fail the connection within the setup timeout (never hang) with one WARN that names
//! the peer where its address is known and says every node must load the same plugin.
//!
//! Each case runs in a child process (`softroce_common::run_child`: its own configuration,
//! FERROCE_CONNECT_TIMEOUT_SEC=2, and its stderr, where the plugin WARNs without NCCL's logger).
//! Softroce-backed (ignored unless asked for, failing without `make build`: softroce's
//! libibverbs and the harness's mock plugin); addresses 127.0.47.x.

use nccl_net_ferroce::abi::ncclNetPlugin_v6 as FERROCE;
mod softroce_common;

use nccl_net_ferroce::abi::types::NcclNetV6;
use nccl_net_ferroce::transport::proto::handshake::{HandleRepr, ListenAddr};
use nccl_net_ferroce::transport::setup::foreign::SAME_PLUGIN;
use softroce_common::{child, run_child};
use std::ffi::{c_void, CString};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// The setup timeout the children run with, and how long past it a failure may come.
const TIMEOUT: Duration = Duration::from_secs(2);
const SLACK: Duration = Duration::from_secs(3);
/// `FERROCE_PTR_HOST`.
const PTR_HOST: i32 = 1;
/// The mock's handle: its magic (`MOCK_MAGIC` in nccl-tests-harness/mock_net.c), then the
/// port of its listener on 127.0.0.1 (u16, host order).
const MOCK_MAGIC: u64 = 0x6d6f_636b_6e65_7431;

/// The child's environment on top of [`run_child`]'s: a short setup timeout (the cases wait it
/// out), no hang report, and where the harness's mock plugin is.
fn env() -> Vec<(&'static str, String)> {
    let mock = format!(
        "{}/target/release/harness/libnccl-net-mock.so",
        env!("CARGO_MANIFEST_DIR")
    );
    assert!(std::path::Path::new(&mock).exists(), "{mock} missing: run make build");
    vec![
        ("FERROCE_CONNECT_TIMEOUT_SEC", TIMEOUT.as_secs().to_string()),
        ("FERROCE_HANG_WARN_SEC", "0".to_string()),
        ("FOREIGN_MOCK", mock),
    ]
}

/// Run `body` in the child, or the child from the parent (on softroce address `addr`) and
/// check its WARN lines with `check`.
fn case(name: &str, addr: &str, body: fn(), check: fn(&[String])) {
    let in_child = child(name, || {
        // SAFETY: ferroce's own init; no logger: WARNs go to stderr.
        assert_eq!(
            unsafe { (FERROCE.init.unwrap())(None) },
            0,
            "ferroce init over softroce"
        );
        body();
    });
    if in_child {
        return;
    }
    let env = env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let text = run_child(name, addr, &env);
    let warns: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("NET/ferroce"))
        .map(str::to_string)
        .collect();
    check(&warns);
}

/// The mock plugin's table, from the library the parent named (dlopened once per process).
fn mock() -> &'static NcclNetV6 {
    let path = CString::new(std::env::var("FOREIGN_MOCK").expect("FOREIGN_MOCK")).expect("path");
    // SAFETY: a NUL-terminated path; the library stays loaded for the life of the process.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen of the mock plugin failed");
    // SAFETY: a live handle, a NUL-terminated name.
    let t = unsafe { libc::dlsym(h, c"ncclNetPlugin_v6".as_ptr()) };
    assert!(!t.is_null(), "the mock plugin has no ncclNetPlugin_v6");
    // SAFETY: the mock exports an ncclNet_v6 table (include/ferroce/nccl_net.h), which
    // NcclNetV6 declares with the same layout; it lives as long as the library.
    let m = unsafe { &*(t as *const NcclNetV6) };
    // SAFETY: the mock's init ignores its logger.
    assert_eq!(unsafe { (m.init.unwrap())(None) }, 0);
    m
}

/// `listen` of `net` on device 0: the handle and the listen comm.
fn listen(net: &NcclNetV6) -> ([u8; 128], *mut c_void) {
    let mut handle = [0u8; 128];
    let mut comm = null_mut();
    // SAFETY: a 128-byte handle and a writable out-pointer, as NCCL passes them.
    let rc = unsafe { (net.listen.unwrap())(0, handle.as_mut_ptr().cast(), &mut comm) };
    assert_eq!(rc, 0, "listen");
    (handle, comm)
}

/// ferroce's connect to `handle`, re-entered as NCCL does, until it fails: its result code and
/// how long it took. Connecting, or still pending after the timeout and the slack, fails.
fn ferroce_connect_fails(handle: &mut [u8; 128], mut meanwhile: impl FnMut()) -> (i32, Duration) {
    let t0 = Instant::now();
    loop {
        let mut comm = null_mut();
        // SAFETY: the same handle buffer on every call, a writable out-pointer.
        let rc = unsafe { (FERROCE.connect.unwrap())(0, handle.as_mut_ptr().cast(), &mut comm) };
        if rc != 0 {
            return (rc, t0.elapsed());
        }
        assert!(comm.is_null(), "ferroce connected to a peer that is not ferroce");
        assert!(t0.elapsed() < TIMEOUT + SLACK, "ferroce's connect hung");
        meanwhile();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// ferroce's accept on `listen`, re-entered as NCCL does, until it fails (as
/// [`ferroce_connect_fails`]).
fn ferroce_accept_fails(listen: *mut c_void, mut meanwhile: impl FnMut()) -> (i32, Duration) {
    let t0 = Instant::now();
    loop {
        let mut comm = null_mut();
        // SAFETY: a live listen comm of ferroce's, a writable out-pointer.
        let rc = unsafe { (FERROCE.accept.unwrap())(listen, &mut comm) };
        if rc != 0 {
            return (rc, t0.elapsed());
        }
        assert!(comm.is_null(), "ferroce accepted a peer that is not ferroce");
        assert!(t0.elapsed() < TIMEOUT + SLACK, "ferroce's accept hung");
        meanwhile();
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn close_listen(net: &NcclNetV6, comm: *mut c_void) {
    // SAFETY: a live listen comm of `net`, closed once.
    assert_eq!(unsafe { (net.close_listen.unwrap())(comm) }, 0);
}

/// A ferroce handle for a listener at 127.0.0.1:`port` (the layout of one of ferroce's own,
/// with no process id so the connect dials instead of sharing a link).
fn ferroce_handle_to(port: u16) -> [u8; 128] {
    let (own, comm) = listen(&FERROCE);
    close_listen(&FERROCE, comm);
    let mut h = HandleRepr::parse(&own).expect("ferroce's own handle");
    h.addr = ListenAddr::V4 {
        ip: [127, 0, 0, 1],
        port,
    };
    h.process = 0;
    let mut out = [0u8; 128];
    h.emit(&mut out);
    out
}

/// The address of ferroce's listener in its handle (127.0.0.1 with NCCL_SOCKET_IFNAME=lo).
fn ferroce_listener_port(handle: &[u8; 128]) -> u16 {
    match HandleRepr::parse(handle).expect("ferroce's handle").addr {
        ListenAddr::V4 { ip, port } => {
            assert_eq!(
                ip,
                [127, 0, 0, 1],
                "ferroce's listener is not on 127.0.0.1, where the mock dials"
            );
            port
        }
        other => panic!("ferroce's listener is on {other:?}, not 127.0.0.1"),
    }
}

/// The WARNs that contain `what`: exactly `n` of them, each ending with the same-plugin hint.
fn assert_warns(warns: &[String], what: &str, n: usize) -> Vec<String> {
    let got: Vec<String> = warns.iter().filter(|w| w.contains(what)).cloned().collect();
    assert_eq!(got.len(), n, "want {n} WARN(s) with {what:?}; WARNs: {warns:#?}");
    for w in &got {
        assert!(w.contains(SAME_PLUGIN), "{w}");
    }
    got
}

/// Handles that are not ferroce's: zeroed, random, the mock plugin's, and one that begins with
/// a socket address as NCCL's own transports' do. Each connect fails at its first call, with
/// one WARN each (the socket address named).
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn foreign_handles_fail_the_connect_at_once() {
    case(
        "foreign_handles_fail_the_connect_at_once",
        "127.0.47.1",
        || {
            let mut random = [0u8; 128];
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for b in random.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let (mock_handle, mock_listen) = listen(mock());
            let mut socket_like = [0u8; 128];
            socket_like[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            socket_like[2..4].copy_from_slice(&43210u16.to_be_bytes());
            socket_like[4..8].copy_from_slice(&[127, 0, 47, 200]);
            for (what, mut h) in [
                ("zeroed", [0u8; 128]),
                ("random", random),
                ("mock", mock_handle),
                ("socket-like", socket_like),
            ] {
                let (rc, took) = ferroce_connect_fails(&mut h, || {});
                assert_eq!(rc, 3, "{what}: ncclInternalError");
                assert!(took < Duration::from_secs(1), "{what}: failed after {took:?}");
                eprintln!("case {what}: failed after {took:?}");
            }
            close_listen(mock(), mock_listen);
        },
        |warns| {
            let w = assert_warns(warns, "connect: the peer's handle is not a ferroce listen handle", 4);
            assert_eq!(
                w.iter()
                    .filter(|l| l.contains("it names no address ferroce can read"))
                    .count(),
                3,
                "{w:#?}"
            );
            assert!(w[3].contains("it names a listener at 127.0.47.200:43210"), "{}", w[3]);
        },
    );
}

/// ferroce listens; the other rank loaded the mock plugin. The mock refuses ferroce's handle
/// (and never dials), or is handed its own handle naming ferroce's port and dials it, then
/// sends its own bytes, or nothing. ferroce's accept fails within the setup timeout each time;
/// the connections that came are rejected with a WARN naming them.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_ferroce_listener_against_a_mock_plugin_rank() {
    case(
        "a_ferroce_listener_against_a_mock_plugin_rank",
        "127.0.47.2",
        || {
            let m = mock();
            // 1. The mock gets ferroce's handle: it refuses it and never dials.
            let (mut handle, l) = listen(&FERROCE);
            let mut sc = null_mut();
            // SAFETY: a 128-byte handle, a writable out-pointer.
            let rc = unsafe { (m.connect.unwrap())(0, handle.as_mut_ptr().cast(), &mut sc) };
            assert_ne!(rc, 0, "the mock plugin took ferroce's handle");
            let (rc, took) = ferroce_accept_fails(l, || {});
            assert_eq!(rc, 6, "ncclRemoteError");
            assert!(took >= TIMEOUT - Duration::from_millis(100), "gave up after {took:?}");
            close_listen(&FERROCE, l);

            // 2. and 3. The mock dials ferroce's listener (a mock handle with its port) and
            // sends a message of its own protocol, or nothing.
            for speaks in [true, false] {
                let (handle, l) = listen(&FERROCE);
                let mut mh = [0u8; 128];
                mh[0..8].copy_from_slice(&MOCK_MAGIC.to_ne_bytes());
                mh[8..10].copy_from_slice(&ferroce_listener_port(&handle).to_ne_bytes());
                let mut sc = null_mut();
                // SAFETY: as above.
                let rc = unsafe { (m.connect.unwrap())(0, mh.as_mut_ptr().cast(), &mut sc) };
                assert_eq!(rc, 0, "the mock could not dial ferroce's listener");
                let mut data = vec![0x5au8; 64];
                let mut req: *mut c_void = null_mut();
                let mut mr = null_mut();
                if speaks {
                    // SAFETY: the mock's comm, a live buffer, writable out-pointers.
                    unsafe {
                        assert_eq!(
                            (m.reg_mr.unwrap())(sc, data.as_mut_ptr().cast(), 64, PTR_HOST, &mut mr),
                            0
                        );
                        assert_eq!((m.isend.unwrap())(sc, data.as_mut_ptr().cast(), 64, 0, mr, &mut req), 0);
                    }
                    assert!(!req.is_null(), "the mock did not take the send");
                }
                let mut sent = !speaks;
                let (rc, took) = ferroce_accept_fails(l, || {
                    if !sent {
                        let (mut done, mut size) = (0, 0);
                        // SAFETY: the mock's live request.
                        assert_eq!(unsafe { (m.test.unwrap())(req, &mut done, &mut size) }, 0);
                        sent = done != 0;
                    }
                });
                assert!(sent, "the mock's message did not go out");
                assert_eq!(rc, 6, "ncclRemoteError");
                assert!(took >= TIMEOUT - Duration::from_millis(100), "gave up after {took:?}");
                // SAFETY: the mock's comm and registration, released once.
                unsafe {
                    if !mr.is_null() {
                        (m.dereg_mr.unwrap())(sc, mr);
                    }
                    (m.close_send.unwrap())(sc);
                }
                close_listen(&FERROCE, l);
            }
        },
        |warns| {
            let accept = assert_warns(warns, "accept: no peer completed a connection to this listener", 3);
            assert!(accept[0].contains("does it run ferroce"), "{}", accept[0]);
            let foreign = assert_warns(warns, "listener: rejected a connection from 127.0.0.1:", 1);
            assert!(
                foreign[0].contains("(not a ferroce peer): the connecting rank is not ferroce"),
                "{}",
                foreign[0]
            );
            assert_warns(warns, "listener: 127.0.0.1:", 1)
                .iter()
                .for_each(|w| assert!(w.contains("connected but sent no complete connection request"), "{w}"));
        },
    );
}

/// ferroce connects; the listener is the mock plugin's (a ferroce handle naming its port: it
/// takes the connection and never answers ferroce's protocol), or a raw TCP peer that answers
/// with bytes of another protocol. The connect fails within the setup timeout, or at once on
/// the foreign bytes, with one WARN naming the listener.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_ferroce_connect_against_a_foreign_listener() {
    case(
        "a_ferroce_connect_against_a_foreign_listener",
        "127.0.47.3",
        || {
            let m = mock();
            // The mock plugin's listener: it accepts, reads ferroce's request as a message of
            // its own (and refuses its size), and answers nothing.
            let (mh, ml) = listen(m);
            let port = u16::from_ne_bytes([mh[8], mh[9]]);
            let mut handle = ferroce_handle_to(port);
            let mut rc_comm: *mut c_void = null_mut();
            let (rc, took) = ferroce_connect_fails(&mut handle, || {
                if rc_comm.is_null() {
                    // SAFETY: the mock's live listen comm, a writable out-pointer.
                    unsafe { (m.accept.unwrap())(ml, &mut rc_comm) };
                }
            });
            assert!(!rc_comm.is_null(), "the mock never accepted ferroce's connection");
            assert_eq!(rc, 6, "ncclRemoteError");
            assert!(took >= TIMEOUT - Duration::from_millis(100), "gave up after {took:?}");
            eprintln!("mock listener: failed after {took:?} (port {port})");
            close_listen(m, ml);

            // A raw peer that answers a protocol of its own: the mock's (an 8-byte size, then
            // the bytes), then an SSH banner.
            let mut mock_bytes = 24u64.to_ne_bytes().to_vec();
            mock_bytes.extend_from_slice(&[0x5a; 24]);
            for answer in [mock_bytes, b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n".to_vec()] {
                let tl = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
                tl.set_nonblocking(true).expect("nonblocking");
                let port = tl.local_addr().expect("addr").port();
                let mut handle = ferroce_handle_to(port);
                let mut peer: Option<TcpStream> = None;
                let (rc, took) = ferroce_connect_fails(&mut handle, || {
                    if peer.is_none() {
                        if let Ok((mut s, _)) = tl.accept() {
                            s.write_all(&answer).expect("answer");
                            peer = Some(s);
                        }
                    }
                });
                assert_eq!(rc, 6, "ncclRemoteError");
                assert!(took < TIMEOUT, "the foreign answer was not refused at once: {took:?}");
                // ferroce closed its end: the peer reads its request, then the end (or a reset,
                // as the foreign bytes it did not read were still queued).
                let mut s = peer.expect("ferroce dialed the raw peer");
                s.set_nonblocking(false).expect("blocking");
                s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
                let mut sink = Vec::new();
                match s.read_to_end(&mut sink) {
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                    Err(e) => panic!("ferroce kept the connection open: {e}"),
                }
                eprintln!("raw listener on {port}: failed after {took:?}");
            }
        },
        |warns| {
            let silent = assert_warns(warns, "did not finish within", 1);
            assert!(
                silent[0].contains("connect: connection setup with 127.0.0.1:") && silent[0].contains("never answered"),
                "{}",
                silent[0]
            );
            let foreign = assert_warns(warns, "the listener is not ferroce", 2);
            for w in &foreign {
                assert!(
                    w.contains("connect: connection setup with 127.0.0.1:")
                        && w.contains("failed: it answered bad magic"),
                    "{w}"
                );
            }
        },
    );
}

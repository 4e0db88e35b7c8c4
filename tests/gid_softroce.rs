//! The GID the plugin picks and keeps, over softroce: each test runs a child process (its own
//! softroce devices, both ends of a connection in it) with FERROCE_TEST_SOFTROCE=1 after
//! `make build`:
//!
//! * a sparse GID table (`SOFTROCE_GID_HOLES`: empty entries ahead of the port's own, as a
//!   container sees its NIC): auto-selection skips the holes, still picks the IPv4-mapped RoCE v2
//!   entry, and a connection over it moves bytes;
//! * subnet-aware routing (`NCCL_IB_SUBNET_AWARE_ROUTING`): two devices in two /24s, a listener
//!   on the second, a connect asked for on the first: the connection runs from the device in the
//!   listener's subnet — unless the routing is off or the prefix (/8) puts both in it;
//! * a GID change (`softroce-ctl gid-change`: the IPv4 GIDs go, then come back two entries
//!   higher): while they are gone a new connection fails saying so; once back, a new connection
//!   and the recovery of an old one (after a port flap) use the new index.
//!
//! Addresses 127.0.36.x and 127.0.37.x (ci/tests/lib/softroce.sh has the table), one pair per
//! test.

mod softroce_common;

use nccl_net_ferroce::api::{self, SendHandle};
use nccl_net_ferroce::device::NetDevice;
use softroce_common::{child, ctl, pair, run_child, stream, transfer};
use std::ffi::c_void;
use std::time::Duration;
use std::time::Instant;

/// The child of [`a_sparse_gid_table_still_gives_the_ipv4_rocev2_gid`].
fn sparse_child() {
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    // SAFETY: s is a live SendHandle.
    let dev = unsafe { api::comm_device(&*s as *const SendHandle as *mut c_void) };
    let m = &dev.members[0];
    // Five holes, then link-local v1/v2 at 5 and 6, then the IPv4-mapped v1/v2 at 7 and 8.
    assert_eq!(m.gid_index, 8, "the IPv4-mapped RoCE v2 GID past the holes");
    let want: std::net::Ipv4Addr = "127.0.36.1".parse().expect("address");
    assert_eq!(m.gid[12..], want.octets(), "the port's own address");
    transfer(
        &s,
        &r,
        1 << 20,
        0x5a,
        (std::ptr::null_mut(), std::ptr::null_mut()),
        Duration::from_secs(20),
    )
    .expect("a transfer over the selected GID");
    println!("sparse table: GID index {}", m.gid_index);
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build"]
fn a_sparse_gid_table_still_gives_the_ipv4_rocev2_gid() {
    if child("a_sparse_gid_table_still_gives_the_ipv4_rocev2_gid", sparse_child) {
        return;
    }
    let text = run_child(
        "a_sparse_gid_table_still_gives_the_ipv4_rocev2_gid",
        "127.0.36.1",
        &[("SOFTROCE_GID_HOLES", "5"), ("SOFTROCE_LINK_LAYER", "roce")],
    );
    assert!(text.contains("sparse table: GID index 8"), "{text}");
}

/// The child of [`a_connect_runs_from_the_device_in_the_listeners_subnet`]: listens on device 1,
/// connects asking for device 0, and checks the device the send comm runs on (`WANT_DEVICE`).
fn subnet_child() {
    let want = std::env::var("WANT_DEVICE").expect("WANT_DEVICE");
    let ctx = api::init(None, -1, false).expect("init");
    let mut handle = [0u8; 128];
    let mut l = api::listen(&ctx, 1, &mut handle).expect("listen");
    let (mut s, mut r) = (None, None);
    let end = Instant::now() + Duration::from_secs(30);
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = api::connect(&ctx, 0, &mut handle).expect("connect");
        }
        if r.is_none() {
            r = api::accept(&mut l).expect("accept");
        }
        assert!(Instant::now() < end, "connection setup did not finish");
    }
    let (s, r) = (s.expect("connected"), r.expect("accepted"));
    // SAFETY: s is a live SendHandle.
    let dev = unsafe { api::comm_device(&*s as *const SendHandle as *mut c_void) };
    assert_eq!(dev.name, want, "the device the connection runs from");
    transfer(
        &s,
        &r,
        1 << 16,
        0xa5,
        (std::ptr::null_mut(), std::ptr::null_mut()),
        Duration::from_secs(20),
    )
    .expect("a transfer");
    println!("subnet routing: connected from {}", dev.name);
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build"]
fn a_connect_runs_from_the_device_in_the_listeners_subnet() {
    const NAME: &str = "a_connect_runs_from_the_device_in_the_listeners_subnet";
    if child(NAME, subnet_child) {
        return;
    }
    let cases: [(&[(&str, &str)], &str); 4] = [
        (&[("NCCL_IB_SUBNET_AWARE_ROUTING", "1")], "softroce1"),
        (
            &[
                ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
                ("NCCL_IB_SUBNET_PREFIX_LEN", "8"),
            ],
            "softroce0",
        ),
        (&[("NCCL_IB_SUBNET_AWARE_ROUTING", "0")], "softroce0"),
        (&[], "softroce0"),
    ];
    for (vars, want) in cases {
        let mut env = vec![
            ("SOFTROCE_DEVICES", "2"),
            ("SOFTROCE_LINK_LAYER", "roce"),
            ("WANT_DEVICE", want),
        ];
        env.extend_from_slice(vars);
        let text = run_child(NAME, "127.0.36.10,127.0.37.10", &env);
        assert!(
            text.contains(&format!("subnet routing: connected from {want}")),
            "{vars:?}: {text}"
        );
    }
}

/// Polls `dev.gid_now()` until `done` says yes (the event thread saw the change), for 5 s.
fn wait_gid(dev: &NetDevice, what: &str, done: impl Fn(&Result<(i32, [u8; 16]), String>) -> bool) {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let now = dev.gid_now().map_err(|e| e.message);
        if done(&now) {
            return;
        }
        assert!(Instant::now() < end, "{what}: still {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The child of [`a_gid_change_is_seen_by_new_connections_and_recoveries`].
fn gid_change_child() {
    let addr = std::env::var("SOFTROCE_ADDR").expect("SOFTROCE_ADDR");
    let ctx = api::init(None, -1, false).expect("init");
    let (s1, r1) = pair(&ctx, 0);
    let none = (std::ptr::null_mut(), std::ptr::null_mut());
    transfer(&s1, &r1, 4096, 1, none, Duration::from_secs(20)).expect("before the change");
    // SAFETY: s1 is a live SendHandle.
    let dev = unsafe { api::comm_device(&*s1 as *const SendHandle as *mut c_void) }.members[0].clone();
    assert_eq!(dev.gid_now().expect("a GID").0, 3);
    ctl(&addr, &["gid-change"]);
    wait_gid(&dev, "IPv4 GIDs removed", |g| g.is_err());
    let err = dev.gid_now().expect_err("no routable GID");
    assert!(err.message.contains("the GID table changed"), "{}", err.message);
    let mut handle = [0u8; 128];
    let mut l = api::listen(&ctx, 0, &mut handle).expect("listen");
    let end = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        match api::connect(&ctx, 0, &mut handle) {
            Err(e) => break e,
            Ok(c) => assert!(c.is_none(), "connected with no usable GID"),
        }
        let _ = api::accept(&mut l);
        assert!(Instant::now() < end, "the connect neither failed nor finished");
    };
    assert!(refused.message.contains("the GID table changed"), "{}", refused.message);
    drop(l);
    ctl(&addr, &["gid-change"]);
    wait_gid(&dev, "IPv4 GIDs back at 4 and 5", |g| {
        g.as_ref().is_ok_and(|g| g.0 == 5)
    });
    let (s2, r2) = pair(&ctx, 0);
    transfer(&s2, &r2, 1 << 20, 2, none, Duration::from_secs(20)).expect("a new connection after the change");
    // The old connection's QPs were connected with GID 3: a port flap under traffic makes it
    // recover over new QPs, which must use GID 5 (messages are in flight when the port goes
    // down, as in tests/recovery_softroce.rs).
    let flap = || {
        ctl(&addr, &["port-down"]);
        std::thread::sleep(Duration::from_millis(500));
        ctl(&addr, &["port-up"]);
    };
    let sizes = [8, 4096, 1 << 20];
    stream(&s1, &r1, 2000, &sizes, 50, &mut { flap }, Duration::from_secs(60)).expect("the old connection, recovered");
    println!("gid change: new connection and recovery on GID 5");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build"]
fn a_gid_change_is_seen_by_new_connections_and_recoveries() {
    const NAME: &str = "a_gid_change_is_seen_by_new_connections_and_recoveries";
    if child(NAME, gid_change_child) {
        return;
    }
    let env = [
        ("SOFTROCE_DEVICES", "1"),
        ("SOFTROCE_LINK_LAYER", "roce"),
        ("NCCL_IB_TIMEOUT", "12"),
        ("NCCL_IB_RETRY_CNT", "3"),
    ];
    let text = run_child(NAME, "127.0.36.20", &env);
    assert!(
        text.contains("gid change: new connection and recovery on GID 5"),
        "{text}"
    );
}

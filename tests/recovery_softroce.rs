//! Recovery of a connection whose QPs fail, over softroce: each test runs a child
//! process (one softroce device, both ends of a connection on it, stderr captured) with
//! FERROCE_TEST_SOFTROCE=1 after `make build`:
//!
//! * the port goes down for a second while messages are in flight both ways of one comm
//!   pair: every message completes once with the right bytes and sizes, the log says the
//!   connection was lost and recovered;
//! * the port stays down past FERROCE_RECOVERY_TIMEOUT_SEC: a clear error within the bound
//!   (what was tried, how long), no hang;
//! * recovery turned off (NCCL_IB_RESILIENCY_PORT_RECOVERY=0): the first failure fails the
//!   comm, as before;
//! * the port flaps under a send while its receiver is never called (its receive was posted
//!   before, as NCCL leaves a comm it has nothing more for): the receiver answers the
//!   sender's recovery anyway (the waiting send steps the comms NCCL is not calling), and the
//!   send completes;
//! * the port flaps while the comm pair is idle (nothing posted), on both ends, the sender's
//!   only or the receiver's only (the pair runs between two devices), and the sender's isend
//!   is the first call after it: every later message arrives; a port that goes down while
//!   idle and stays down fails the next message with an error within the bound, no hang.
//!
//! Addresses 127.0.46.x (ci/tests/lib/softroce.sh has the table), one or two per child.

mod softroce_common;

use nccl_net_ferroce::api::{self, SendHandle};
use softroce_common::{child, ctl, is_child, pair, reg, run_child, stream};
use std::time::{Duration, Instant};

/// A child's environment on top of [`run_child`]'s: one softroce device, transport retries
/// that run out in 4 × 16.8 ms (the loss is noticed fast), and `extra`.
fn env(extra: (&'static str, &'static str)) -> [(&'static str, &'static str); 4] {
    [
        ("SOFTROCE_DEVICES", "1"),
        ("NCCL_IB_TIMEOUT", "12"),
        ("NCCL_IB_RETRY_CNT", "3"),
        extra,
    ]
}

/// `softroce-ctl` on this child's one device (its SOFTROCE_ADDR).
fn port(args: &[&str]) {
    ctl(&std::env::var("SOFTROCE_ADDR").expect("SOFTROCE_ADDR"), args);
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_port_down_for_a_second_costs_no_message() {
    if child("a_port_down_for_a_second_costs_no_message", port_flap_child) {
        return;
    }
    let text = run_child(
        "a_port_down_for_a_second_costs_no_message",
        "127.0.46.1",
        &env(("FERROCE_RECOVERY_TIMEOUT_SEC", "30")),
    );
    assert!(text.contains("recovering over new QPs"), "the loss is WARNed:\n{text}");
    assert!(
        text.contains("recovered over new QPs"),
        "the recovery is WARNed:\n{text}"
    );
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_port_that_stays_down_fails_the_comm_at_the_bound() {
    if child(
        "a_port_that_stays_down_fails_the_comm_at_the_bound",
        port_stays_down_child,
    ) {
        return;
    }
    let text = run_child(
        "a_port_that_stays_down_fails_the_comm_at_the_bound",
        "127.0.46.2",
        &env(("FERROCE_RECOVERY_TIMEOUT_SEC", "2")),
    );
    assert!(text.contains("could not be recovered within"), "{text}");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn recovery_off_fails_at_the_first_failure() {
    if child("recovery_off_fails_at_the_first_failure", recovery_off_child) {
        return;
    }
    let text = run_child(
        "recovery_off_fails_at_the_first_failure",
        "127.0.46.3",
        &env(("NCCL_IB_RESILIENCY_PORT_RECOVERY", "0")),
    );
    assert!(!text.contains("recovering over new QPs"), "{text}");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_receiver_nccl_does_not_call_answers_the_senders_recovery() {
    if child(
        "a_receiver_nccl_does_not_call_answers_the_senders_recovery",
        idle_receiver_child,
    ) {
        return;
    }
    let text = run_child(
        "a_receiver_nccl_does_not_call_answers_the_senders_recovery",
        "127.0.46.4",
        &env(("FERROCE_RECOVERY_TIMEOUT_SEC", "60")),
    );
    assert!(
        text.contains("recovered over new QPs"),
        "the recovery is WARNed:\n{text}"
    );
}

const SIZES: [usize; 5] = [8, 4096, 65536, 1 << 20, 300_000];

/// The child of [`a_port_down_for_a_second_costs_no_message`].
fn port_flap_child() {
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    let t0 = Instant::now();
    let flap = || {
        port(&["port-down"]);
        std::thread::sleep(Duration::from_secs(1));
        port(&["port-up"]);
    };
    // The flap runs on this thread while messages are in flight: the comms see it at their
    // next calls.
    let flapper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        flap();
    });
    let done =
        stream(&s, &r, 5000, &SIZES, 0, &mut || {}, Duration::from_secs(60)).expect("every message through the flap");
    assert!(
        flapper.is_finished(),
        "the flap was over before the last message: make the stream longer"
    );
    flapper.join().expect("flapper");
    assert_eq!(done, 5000);
    println!("port_flap_child: 5000 messages in {:?}", t0.elapsed());
    drop((s, r));
    api::finalize(ctx).expect("finalize");
}

/// A stream through which the port goes down for good after 20 messages: the comm fails, with
/// an error (no hang), within `bound`.
fn fails_after_port_down(bound: Duration) {
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    let t0 = Instant::now();
    let err = stream(
        &s,
        &r,
        1000,
        &SIZES,
        20,
        &mut || port(&["port-down"]),
        Duration::from_secs(30),
    )
    .expect_err("the comm fails");
    assert!(!err.message.contains("a hang"), "{}", err.message);
    assert!(t0.elapsed() < bound, "within {bound:?}: {:?}", t0.elapsed());
    drop((s, r));
    api::finalize(ctx).expect("finalize");
}

/// The child of [`a_port_that_stays_down_fails_the_comm_at_the_bound`].
fn port_stays_down_child() {
    // The 2 s bound and its last attempt.
    fails_after_port_down(Duration::from_secs(15));
}

/// The child of [`recovery_off_fails_at_the_first_failure`].
fn recovery_off_child() {
    fails_after_port_down(Duration::from_secs(15));
}

/// The child of [`a_receiver_nccl_does_not_call_answers_the_senders_recovery`].
fn idle_receiver_child() {
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    const SIZE: usize = 1 << 20;
    let src: Vec<u8> = (0..SIZE).map(|i| (i * 13 + 1) as u8).collect();
    let mut dst = vec![0u8; SIZE];
    let (smh, rmh) = (reg(&*s, &src), reg(&*r, &dst));
    // SAFETY: live handle; the buffer is registered and outlives the request (tested below).
    let recv = unsafe { api::irecv(&r, &[dst.as_mut_ptr() as usize], &[SIZE], &[3], &[&rmh], false) }
        .expect("irecv")
        .expect("a receive slot");
    // The CTS lands at the sender, then the port goes down under the send.
    std::thread::sleep(Duration::from_millis(200));
    port(&["port-down"]);
    let flapper = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(1));
        port(&["port-up"]);
    });
    let t0 = Instant::now();
    let send = loop {
        // SAFETY: as above.
        if let Some(q) = unsafe { api::isend(&s, src.as_ptr() as usize, SIZE, 3, &smh) }.expect("isend") {
            break q;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the CTS never reached the sender"
        );
    };
    // Only the sender is called from here on: NCCL has nothing more for the receiver.
    let mut size = [0i32];
    // SAFETY: in flight until test says done.
    while !unsafe { api::test(send, size.as_mut_ptr()) }.expect("the send recovers") {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the send did not complete: its receiver, not called, never answered the recovery"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    assert_eq!(size[0] as usize, SIZE);
    flapper.join().expect("flapper");
    // SAFETY: as above.
    while !unsafe { api::test(recv, size.as_mut_ptr()) }.expect("the receive") {}
    assert_eq!(size[0] as usize, SIZE);
    assert!(dst == src, "the bytes arrived");
    println!(
        "idle_receiver_child: the send completed in {:?} with its receiver idle",
        t0.elapsed()
    );
    api::dereg_mr(smh).expect("deregMr");
    api::dereg_mr(rmh).expect("deregMr");
    drop((s, r));
    api::finalize(ctx).expect("finalize");
}

/// The idle flaps' tests: which ports go down while the comm pair is idle, and whether they come
/// back. The pair runs between two devices (`SOFTROCE_DEVICES=2`), the sender on the first.
#[derive(Clone, Copy, Debug)]
enum IdleFlap {
    /// Both ends' ports go down for a second.
    Both,
    /// Only the sender's port.
    Sender,
    /// Only the receiver's port.
    Receiver,
    /// Both ends' ports go down and stay down: the next message fails within the bound.
    ForGood,
}

/// Runs `test`'s idle-flap child on the two addresses `addrs`, recovery bounded by `bound` s.
fn idle_flap_test(test: &str, addrs: &str, flap: IdleFlap, bound: &'static str) -> String {
    if child(test, || idle_flap_child(addrs, flap)) {
        return String::new();
    }
    run_child(
        test,
        addrs,
        &[
            ("SOFTROCE_DEVICES", "2"),
            ("NCCL_IB_TIMEOUT", "12"),
            ("NCCL_IB_RETRY_CNT", "3"),
            ("FERROCE_RECOVERY_TIMEOUT_SEC", bound),
        ],
    )
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_port_flap_while_idle_costs_no_later_message() {
    let test = "a_port_flap_while_idle_costs_no_later_message";
    let text = idle_flap_test(test, "127.0.46.5,127.0.46.6", IdleFlap::Both, "30");
    assert!(is_child(test) || text.contains("recovered over new QPs"), "{text}");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_senders_port_flap_while_idle_costs_no_message() {
    let test = "a_senders_port_flap_while_idle_costs_no_message";
    idle_flap_test(test, "127.0.46.7,127.0.46.8", IdleFlap::Sender, "30");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_receivers_port_flap_while_idle_costs_no_message() {
    let test = "a_receivers_port_flap_while_idle_costs_no_message";
    idle_flap_test(test, "127.0.46.9,127.0.46.10", IdleFlap::Receiver, "30");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_port_down_while_idle_fails_the_next_message() {
    let test = "a_port_down_while_idle_fails_the_next_message";
    let text = idle_flap_test(test, "127.0.46.11,127.0.46.12", IdleFlap::ForGood, "2");
    assert!(
        is_child(test) || text.contains("could not be recovered within"),
        "{text}"
    );
}

/// The child of the idle-flap tests: the pair (sender on the first of `addrs`, receiver on the
/// second) moves 20 messages, goes idle (nothing posted on either comm), `flap` happens, the
/// sender is called first ([`sender_calls_first`]), then every message of sizes [`SIZES`] one by one ([`softroce_common::transfer`], as the report
/// that found this did) and a stream of 200 must arrive with their bytes — or, the port down
/// for good, the next message must fail with an error, no hang.
fn idle_flap_child(addrs: &str, flap: IdleFlap) {
    let (a, b) = addrs.split_once(',').expect("two addresses");
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = softroce_common::pair_between(&ctx, 0, 1);
    let done = stream(&s, &r, 20, &SIZES, 0, &mut || {}, Duration::from_secs(30)).expect("before the flap");
    assert_eq!(done, 20);
    let down: &[&str] = match flap {
        IdleFlap::Both | IdleFlap::ForGood => &[a, b],
        IdleFlap::Sender => &[a],
        IdleFlap::Receiver => &[b],
    };
    for addr in down {
        ctl(addr, &["port-down"]);
    }
    let t0 = Instant::now();
    let none = (std::ptr::null_mut(), std::ptr::null_mut());
    if let IdleFlap::ForGood = flap {
        sender_calls_first(&s);
        let err =
            softroce_common::transfer(&s, &r, 4096, 1, none, Duration::from_secs(30)).expect_err("the comm fails");
        assert!(!err.message.contains("a hang"), "{}", err.message);
        println!("idle_flap_child: failed in {:?}: {}", t0.elapsed(), err.message);
    } else {
        std::thread::sleep(Duration::from_secs(1));
        for addr in down {
            ctl(addr, &["port-up"]);
        }
        sender_calls_first(&s);
        for (i, size) in SIZES.iter().enumerate() {
            softroce_common::transfer(&s, &r, *size, i as u8 + 1, none, Duration::from_secs(40))
                .unwrap_or_else(|e| panic!("message {i} ({size} B) after the idle flap: {}", e.message));
        }
        let done = stream(&s, &r, 200, &SIZES, 0, &mut || {}, Duration::from_secs(40)).expect("after the flap");
        assert_eq!(done, 200);
        println!("idle_flap_child: {flap:?}: through in {:?}", t0.elapsed());
    }
    drop((s, r));
    api::finalize(ctx).expect("finalize");
}

/// The first call after an idle flap is the sender's isend, before the receiver posted its
/// buffer (NCCL's proxies post the send and the receive in either order): it finds no CTS, so
/// it notices the port event and starts the recovery; the receiver joins it by the Hello only
/// if something steps it (NCCL does not call a receive comm with nothing posted, and
/// [`softroce_common::transfer`] calls only isend until that matches).
fn sender_calls_first(s: &SendHandle) {
    let buf = vec![0u8; 4096];
    let mh = reg(s, &buf);
    // SAFETY: live handle; the buffer is registered; the send is refused (no receive posted
    // yet, beyond the eager size), so nothing reads the buffer after this call.
    let q = unsafe { api::isend(s, buf.as_ptr() as usize, buf.len(), 9, &mh) }.expect("isend");
    assert!(q.is_none(), "a send with no receive posted is refused");
    api::dereg_mr(mh).expect("deregMr");
}

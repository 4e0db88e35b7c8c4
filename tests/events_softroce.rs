//! Asynchronous events attributed to exactly the comms they concern, with softroce's fault
//! control. Each test runs a child process (its own two
//! softroce devices, stderr captured) with FERROCE_TEST_SOFTROCE=1 after `make build`:
//!
//! * port down (softroce-ctl port-down): only the comm on that port fails;
//! * device fatal: every comm on the device fails, busy (transfers in flight, test() being
//!   called) or idle; the other device's comms go on;
//! * QP fatal / QP access error: only the comm owning the QP fails, busy or idle; another
//!   busy comm on the same device and the other device's comms go on;
//! * CQ overrun: only the comm whose CQ overran fails — busy ones too, although their
//!   completions keep coming (no WC error tells them) — and the others go on.
//!
//! Addresses 127.0.44.x (ci/tests/lib/softroce.sh has the table), two per child.

mod softroce_common;

use nccl_net_ferroce::api::{self, RecvHandle, SendHandle};
use nccl_net_ferroce::error::{code, Error};
use softroce_common::{child, ctl, pair, run_child, transfer};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The children's environment on top of [`run_child`]'s: two softroce devices, short retries.
const ENV: &[(&str, &str)] = &[
    ("SOFTROCE_DEVICES", "2"),
    ("NCCL_IB_TIMEOUT", "12"),
    ("NCCL_IB_RETRY_CNT", "2"),
    // Which comms an event fails, so without recovery (a port that goes down is recovered
    // from otherwise: tests/recovery_softroce.rs).
    ("FERROCE_RECOVERY_TIMEOUT_SEC", "0"),
];

/// The plugin's log lines (WARNs go to stderr with NCCL's prefix) that contain `words`.
fn warns<'a>(text: &'a str, words: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.starts_with("NET/ferroce") && l.contains(words))
        .collect()
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_port_down_fails_only_the_comms_on_that_port() {
    if child("a_port_down_fails_only_the_comms_on_that_port", port_down_child) {
        return;
    }
    let text = run_child(
        "a_port_down_fails_only_the_comms_on_that_port",
        "127.0.44.1,127.0.44.2",
        ENV,
    );
    let warns: Vec<&str> = text.lines().filter(|l| l.contains("the port went down")).collect();
    assert_eq!(warns.len(), 1, "one WARN for the one event: {warns:#?}\n{text}");
    assert!(
        warns[0].contains("device softroce0 port 1") && warns[0].contains("the device's other ports go on"),
        "{}",
        warns[0]
    );
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_device_fatal_event_fails_every_comm_on_the_device_busy_or_idle() {
    if child(
        "a_device_fatal_event_fails_every_comm_on_the_device_busy_or_idle",
        device_fatal_child,
    ) {
        return;
    }
    let text = run_child(
        "a_device_fatal_event_fails_every_comm_on_the_device_busy_or_idle",
        "127.0.44.3,127.0.44.4",
        ENV,
    );
    let w = warns(&text, "the NIC failed; every connection on it fails");
    assert_eq!(w.len(), 1, "one WARN for the one event: {w:#?}\n{text}");
    assert!(w[0].contains("device softroce0") && w[0].contains("fatal"), "{}", w[0]);
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn qp_fatal_and_access_errors_fail_only_the_comm_owning_the_qp() {
    if child(
        "qp_fatal_and_access_errors_fail_only_the_comm_owning_the_qp",
        qp_events_child,
    ) {
        return;
    }
    let text = run_child(
        "qp_fatal_and_access_errors_fail_only_the_comm_owning_the_qp",
        "127.0.44.5,127.0.44.6",
        ENV,
    );
    // One WARN for the injected QP fatal; access errors: the injected one, and possibly the
    // failed pair's receive QP answering writes that were in flight into a buffer the test
    // deregistered after the failure (as on hardware).
    let fatal = warns(&text, "catastrophic error' on QP");
    assert_eq!(fatal.len(), 1, "{fatal:#?}\n{text}");
    let access = warns(&text, "access violation work queue error' on QP");
    assert!(!access.is_empty(), "{text}");
    assert!(
        fatal.iter().chain(&access).all(|l| l.contains("device softroce0")),
        "{text}"
    );
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_cq_overrun_fails_only_the_comm_using_that_cq() {
    if child("a_cq_overrun_fails_only_the_comm_using_that_cq", cq_overrun_child) {
        return;
    }
    let text = run_child(
        "a_cq_overrun_fails_only_the_comm_using_that_cq",
        "127.0.44.7,127.0.44.8",
        ENV,
    );
    let w = warns(&text, "a completion queue overran");
    assert_eq!(w.len(), 2, "one WARN per overrun CQ: {w:#?}\n{text}");
    assert!(w.iter().all(|l| l.contains("device softroce0")), "{w:#?}");
}

/// No profiler handles.
const NONE: (*mut std::ffi::c_void, *mut std::ffi::c_void) = (std::ptr::null_mut(), std::ptr::null_mut());

/// The child of [`a_port_down_fails_only_the_comms_on_that_port`].
fn port_down_child() {
    let ctx = api::init(None, -1, false).expect("init");
    let (s0, r0) = pair(&ctx, 0);
    let (s1, r1) = pair(&ctx, 1);
    transfer(&s0, &r0, 64 * 1024, 7, NONE, Duration::from_secs(10)).expect("softroce0 before");
    transfer(&s1, &r1, 64 * 1024, 7, NONE, Duration::from_secs(10)).expect("softroce1 before");
    ctl("127.0.44.1", &["port-down"]);
    // The comm on the downed port fails (its liveness probe sees the port's event, or its
    // retries run out), within a bound, never a hang.
    let err =
        transfer(&s0, &r0, 64 * 1024, 7, NONE, Duration::from_secs(20)).expect_err("the comm on the downed port fails");
    assert!(!err.message.contains("a hang"), "{}", err.message);
    // The comm on the other device's port goes on.
    for _ in 0..5 {
        transfer(&s1, &r1, 64 * 1024, 7, NONE, Duration::from_secs(10))
            .expect("softroce1 after softroce0's port went down");
    }
    drop((s0, r0, s1, r1));
    api::finalize(ctx).expect("finalize");
}

/// A connected pair and its name (for messages).
struct Comm {
    name: &'static str,
    s: Box<SendHandle>,
    r: Box<RecvHandle>,
}

// SAFETY: a comm's data path runs on one thread at a time (NCCL's contract): a stream thread
// owns the comm while it runs and hands it back when it ends.
unsafe impl Send for Comm {}

impl Comm {
    /// The send end's local QP numbers.
    fn send_qpns(&self) -> Vec<u32> {
        // SAFETY: this thread runs the comm's data path, nothing else does now.
        unsafe { self.s.data_path() }.qp_numbers()
    }

    fn transfer(&self, fill: u8) -> Result<(), Error> {
        transfer(&self.s, &self.r, STREAM_BYTES, fill, NONE, Duration::from_secs(20))
    }
}

/// Message size of the busy comms' streams and the idle comms' checks.
const STREAM_BYTES: usize = 64 * 1024;
/// Messages each surviving comm must still complete, bytes checked, after the event.
const AFTER_EVENT: u32 = 8;

/// A busy comm: transfers back to back (test() called all the while) until `stop` or the first
/// error. `done` counts the messages that completed with the right bytes.
fn stream(c: Comm, stop: Arc<AtomicBool>, done: Arc<AtomicU32>) -> std::thread::JoinHandle<(Comm, Result<(), Error>)> {
    std::thread::spawn(move || {
        let mut k = 0u8;
        while !stop.load(Ordering::Acquire) {
            k = k.wrapping_add(1);
            if let Err(e) = c.transfer(k) {
                return (c, Err(e));
            }
            done.fetch_add(1, Ordering::AcqRel);
        }
        (c, Ok(()))
    })
}

/// What happens to a comm in an event scenario.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fate {
    Fails,
    GoesOn,
}

/// The scenario every event test runs: on the first device a busy comm ("busy0"), an idle one
/// ("idle0") and a second busy one ("other0"); on the second a busy and an idle one. Every comm
/// transfers once; the busy ones start streaming; `inject` (given a lookup of a comm's first
/// send QP number by name, as softroce-ctl takes it) raises the event; then every busy comm that must fail does, within a bound, with
/// ncclSystemError and an error naming the async event, while the others complete
/// [`AFTER_EVENT`] more messages; each idle comm's next transfer fails or succeeds as `fates`
/// (by name) says.
fn event_scenario(fates: &[(&str, Fate)], inject: impl FnOnce(&dyn Fn(&str) -> String)) {
    let ctx = api::init(None, -1, false).expect("init");
    let mk = |name, dev| {
        let (s, r) = pair(&ctx, dev);
        Comm { name, s, r }
    };
    let busy = vec![mk("busy0", 0), mk("other0", 0), mk("busy1", 1)];
    let idle = vec![mk("idle0", 0), mk("idle1", 1)];
    for c in busy.iter().chain(&idle) {
        c.transfer(1)
            .unwrap_or_else(|e| panic!("{} before the event: {}", c.name, e.message));
    }
    let fate = |name: &str| {
        fates
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, f)| f)
            .expect("a fate per comm")
    };
    let qpns: Vec<(&str, Vec<u32>)> = busy.iter().chain(&idle).map(|c| (c.name, c.send_qpns())).collect();
    let qpn_of = |name: &str| {
        let (_, q) = qpns.iter().find(|(n, _)| *n == name).expect("a comm of that name");
        format!("{:#x}", q[0])
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Vec<Arc<AtomicU32>> = busy.iter().map(|_| Arc::new(AtomicU32::new(0))).collect();
    let names: Vec<&str> = busy.iter().map(|c| c.name).collect();
    let threads: Vec<_> = busy
        .into_iter()
        .zip(&counts)
        .map(|(c, n)| stream(c, stop.clone(), n.clone()))
        .collect();
    // Every stream has messages behind it, so the event lands on comms in the middle of work.
    let end = Instant::now() + Duration::from_secs(20);
    while counts.iter().any(|n| n.load(Ordering::Acquire) < 3) {
        assert!(Instant::now() < end, "the streams did not get going");
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("send QP numbers: {qpns:?}");
    inject(&qpn_of);
    let at_event: Vec<u32> = counts.iter().map(|n| n.load(Ordering::Acquire)).collect();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let survivors_done = names
            .iter()
            .zip(&counts)
            .zip(&at_event)
            .all(|((name, n), at)| fate(name) == Fate::Fails || n.load(Ordering::Acquire) >= at + AFTER_EVENT);
        let failing_ended = names
            .iter()
            .zip(&threads)
            .all(|(name, t)| fate(name) == Fate::GoesOn || t.is_finished());
        let a_survivor_ended = names
            .iter()
            .zip(&threads)
            .any(|(name, t)| fate(name) == Fate::GoesOn && t.is_finished());
        if (survivors_done && failing_ended) || a_survivor_ended {
            break; // (a survivor that ended failed: check_fate says how)
        }
        assert!(
            Instant::now() < end,
            "busy comms neither failed nor went on within 30 s (a hang)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Release);
    let mut comms = Vec::new();
    for (name, t) in names.iter().zip(threads) {
        let (c, result) = t.join().expect("stream thread");
        check_fate(name, fate(name), result);
        comms.push(c);
    }
    for c in &idle {
        check_fate(c.name, fate(c.name), c.transfer(9));
    }
    drop((comms, idle));
    api::finalize(ctx).expect("finalize");
}

/// A comm that must fail failed with ncclSystemError naming the fatal async event; one that
/// must go on did.
fn check_fate(name: &str, fate: Fate, result: Result<(), Error>) {
    match (fate, result) {
        (Fate::GoesOn, Ok(())) => println!("{name}: went on"),
        (Fate::GoesOn, Err(e)) => panic!("{name} must go on, but failed: {}", e.message),
        (Fate::Fails, Ok(())) => panic!("{name} must fail, but went on"),
        (Fate::Fails, Err(e)) => {
            assert_eq!(e.result_code(), code::SYSTEM_ERROR, "{name}: {}", e.message);
            assert!(
                e.message.contains("reported a fatal asynchronous event"),
                "{name} failed, but not because of the event: {}",
                e.message
            );
            println!("{name}: failed: {}", e.message);
        }
    }
}

/// The child of [`a_device_fatal_event_fails_every_comm_on_the_device_busy_or_idle`].
fn device_fatal_child() {
    use Fate::*;
    let fates = [
        ("busy0", Fails),
        ("other0", Fails),
        ("idle0", Fails),
        ("busy1", GoesOn),
        ("idle1", GoesOn),
    ];
    event_scenario(&fates, |_| ctl("127.0.44.3", &["device-fatal"]));
}

/// The child of [`qp_fatal_and_access_errors_fail_only_the_comm_owning_the_qp`].
fn qp_events_child() {
    use Fate::*;
    let fates = [
        ("busy0", Fails),
        ("other0", GoesOn),
        ("idle0", Fails),
        ("busy1", GoesOn),
        ("idle1", GoesOn),
    ];
    event_scenario(&fates, |qpn_of| {
        ctl("127.0.44.5", &["qp-fatal", &qpn_of("busy0")]);
        ctl("127.0.44.5", &["qp-access-err", &qpn_of("idle0")]);
    });
}

/// The child of [`a_cq_overrun_fails_only_the_comm_using_that_cq`].
fn cq_overrun_child() {
    use Fate::*;
    let fates = [
        ("busy0", Fails),
        ("other0", GoesOn),
        ("idle0", Fails),
        ("busy1", GoesOn),
        ("idle1", GoesOn),
    ];
    event_scenario(&fates, |qpn_of| {
        ctl("127.0.44.7", &["cq-overrun", &qpn_of("busy0")]);
        ctl("127.0.44.7", &["cq-overrun", &qpn_of("idle0")]);
    });
}

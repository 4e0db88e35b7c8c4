//! Recovery of a connection whose QPs fail, in the two-endpoint simulation: both
//! ends' `proto::recovery` machines, their side channel (with duplicated and stale messages),
//! QPs replaced per epoch, and the exactly-once oracle of `sim_net::run` — every message
//! completes once with the right bytes and sizes, and nothing writes into a buffer after its
//! request completed (a message that had not completed may be written again: NCCL does not
//! look at it yet). Each case runs many seeds; a failing one prints its seed. For a soak,
//! `SIM_EXTRA_SEEDS=n cargo test --release --test sim_recovery` runs n more seeds per case.

mod sim_net;

use sim_net::run::{random_case, Run};
use sim_net::{Side, WC_REM_ACCESS_ERR, WC_RETRY_EXC_ERR};
use std::time::Duration;

/// What a case did, summed over its seeds.
#[derive(Default, Debug)]
struct Tally {
    recovered: u32,
    attempts: u32,
    replayed: usize,
    landed_unacked: usize,
    cts_rewritten: usize,
    failed: u32,
}

/// Run `seed`'s random case with recovery on (bound `timeout` of virtual time), calling
/// `inject` once after a random number of turns; returns the run when it ended (all done, or
/// both ends failed). Panics with the seed on a hang or a wrong result.
fn run_with(seed: u64, timeout: Duration, inject: &dyn Fn(&mut Run), hook: Option<fn(&mut Run, Side, u32)>) -> Run {
    run_scheduled(seed, timeout, &[(0, inject)], hook)
}

/// A fault a case injects: `(offset, inject)` runs `offset` turns after the random first turn.
type Injection<'a> = (u64, &'a dyn Fn(&mut Run));

/// [`run_with`] with several injections.
fn run_scheduled(
    seed: u64,
    timeout: Duration,
    schedule: &[Injection<'_>],
    hook: Option<fn(&mut Run, Side, u32)>,
) -> Run {
    let mut case = random_case(seed);
    case.groups.truncate(24);
    let mut r = Run::new(case);
    let dup = r.rng.below(30);
    r.enable_recovery(timeout, dup);
    if let Some(rc) = r.recovery.as_mut() {
        rc.on_rebuild = hook;
    }
    let fail_at = 20 + r.rng.below(600);
    let mut turns = 0u64;
    let mut idle = 0u32;
    loop {
        let failed = r.send.state.failed() || r.recv.state.failed();
        if r.finished() || failed {
            break;
        }
        turns += 1;
        assert!(turns < 3_000_000, "seed {seed}: no end: {}", r.progress());
        for (offset, inject) in schedule {
            if turns == fail_at + offset {
                inject(&mut r);
            }
        }
        match r.turn() {
            Ok(true) => idle = 0,
            Ok(false) if r.recovering_now() => r.now = r.now + Duration::from_millis(1),
            Ok(false) => {
                idle += 1;
                assert!(idle < 20_000, "seed {seed}: hang: {}", r.progress());
            }
            // The comm's error, returned by the call that met it.
            Err(_) if r.send.state.failed() || r.recv.state.failed() => break,
            Err(e) => panic!("seed {seed}: {e} in {}", r.progress()),
        }
    }
    r
}

fn tally(t: &mut Tally, r: &Run) {
    if let Some(rc) = &r.recovery {
        t.recovered += rc.ends.iter().map(|e| e.recovered).max().unwrap_or(0);
        t.attempts += rc.ends.iter().map(|e| e.attempts).max().unwrap_or(0);
        t.replayed += rc.replayed_chains;
        t.landed_unacked += rc.landed_unacked;
        t.cts_rewritten += rc.cts_rewritten;
    }
    t.failed += u32::from(r.send.state.failed() || r.recv.state.failed());
}

/// A case's seeds, with `SIM_EXTRA_SEEDS` more after them.
fn seeds(base: std::ops::Range<u64>) -> std::ops::Range<u64> {
    let extra = std::env::var("SIM_EXTRA_SEEDS").map_or(0, |s| s.parse::<u64>().expect("SIM_EXTRA_SEEDS is a number"));
    base.start..base.end + extra
}

/// Every seed ends with every request done and the oracle satisfied.
fn all_recover(base: std::ops::Range<u64>, inject: &dyn Fn(&mut Run), hook: Option<fn(&mut Run, Side, u32)>) -> Tally {
    let mut t = Tally::default();
    for seed in seeds(base) {
        let mut r = run_with(seed, Duration::from_secs(30), inject, hook);
        assert_recovered(seed, &mut r);
        tally(&mut t, &r);
    }
    t
}

/// Neither end failed, and nothing was left in flight.
fn assert_recovered(seed: u64, r: &mut Run) {
    assert!(
        !r.send.state.failed() && !r.recv.state.failed(),
        "seed {seed}: the comm failed: {:?} / {:?} in {}",
        r.send.state.check().err().map(|e| e.message),
        r.recv.state.check().err().map(|e| e.message),
        r.progress()
    );
    r.check_quiet();
}

fn fail_some_qp(r: &mut Run, side: Side, status: u32) {
    let q = r.rng.below(r.case.nqps() as u64) as usize;
    r.fab.fail_qp(side, q, status);
}

#[test]
fn the_loss_of_one_qp_mid_group_is_recovered_exactly_once() {
    let t = all_recover(0..150, &|r| fail_some_qp(r, Side::Sender, WC_RETRY_EXC_ERR), None);
    eprintln!("{t:?}");
    assert!(t.recovered >= 60, "most seeds hit the failure and recovered: {t:?}");
    assert!(
        t.replayed > 0 && t.cts_rewritten > 0,
        "chains were posted again and CTS entries written again: {t:?}"
    );
}

#[test]
fn the_loss_of_every_qp_on_both_sides_is_recovered() {
    let t = all_recover(
        200..320,
        &|r| {
            for q in 0..r.case.nqps() {
                r.fab.fail_qp(Side::Sender, q, WC_RETRY_EXC_ERR);
                r.fab.fail_qp(Side::Receiver, q, WC_RETRY_EXC_ERR);
            }
        },
        None,
    );
    eprintln!("{t:?}");
    assert!(t.recovered >= 50, "{t:?}");
}

/// Every QP of the sender's member device 0 fails (in a fused vNIC, one NIC's port).
fn fail_device_0(r: &mut Run) {
    for q in (0..r.case.nqps()).step_by(r.case.sender_devs) {
        r.fab.fail_qp(Side::Sender, q, WC_RETRY_EXC_ERR);
    }
}

#[test]
fn the_loss_of_a_member_device_is_recovered() {
    let t = all_recover(400..520, &fail_device_0, None);
    eprintln!("{t:?}");
    assert!(t.recovered >= 50, "{t:?}");
}

/// Failover: the new QPs of the sender's member device 0 are made on its device 1 (its port
/// is down), so the replay and everything after go over other keys on both sides.
fn move_off_device_0(r: &mut Run, side: Side, _epoch: u32) {
    if side == Side::Sender && r.case.sender_devs > 1 {
        for q in (0..r.case.nqps()).step_by(r.case.sender_devs) {
            r.fab.place_qp(Side::Sender, q, 1);
        }
    }
}

#[test]
fn the_loss_of_a_member_device_fails_over_to_the_others() {
    let mut moved = 0;
    for seed in seeds(400..520) {
        let mut r = run_with(seed, Duration::from_secs(30), &fail_device_0, Some(move_off_device_0));
        assert_recovered(seed, &mut r);
        moved += usize::from(r.case.sender_devs > 1 && r.fab.routes(Side::Sender).iter().all(|q| q.dev != 0));
    }
    assert!(
        moved >= 20,
        "seeds whose sender ended on its other devices only: {moved}"
    );
}

/// The sender's QPs go where a fused device's recovery puts them: striped over its members as
/// at the start, less those whose ports are down (`sender_members_down`).
fn place_by_ports(r: &mut Run, side: Side, _epoch: u32) {
    let devs = r.case.sender_devs;
    let Some(rc) = r.recovery.as_ref() else { return };
    if side != Side::Sender || devs < 2 {
        return;
    }
    let up: Vec<usize> = (0..devs).filter(|d| !rc.sender_members_down.contains(d)).collect();
    for q in 0..r.case.nqps() {
        let home = q % devs;
        let dev = if up.contains(&home) { home } else { up[q % up.len()] };
        r.fab.place_qp(Side::Sender, q, dev);
    }
}

/// The sender's member device 0's port goes down (its QPs there fail) or comes up again (a
/// failback), as the driver sees it: a port event starts a recovery.
fn member_0_port(r: &mut Run, down: bool) {
    let Some(rc) = r.recovery.as_mut() else { return };
    if down {
        rc.sender_members_down = vec![0];
        let on_0: Vec<usize> = (0..r.case.nqps())
            .filter(|&q| r.fab.routes(Side::Sender)[q].dev == 0)
            .collect();
        for q in on_0 {
            r.fab.fail_qp(Side::Sender, q, WC_RETRY_EXC_ERR);
        }
        r.local_event(Side::Sender, "member 0's port went down");
    } else {
        rc.sender_members_down.clear();
        r.local_event(Side::Sender, "member 0's port is up again (failback)");
    }
}

/// A member's port flaps: down (failover), up (failback), down again a few turns into the
/// failback's recovery (so in any of its phases), up again: every message exactly once, and
/// the QPs end striped over both members.
#[test]
fn a_member_port_that_goes_down_again_during_its_failback_is_failed_over_again() {
    let (mut striped, mut flapped) = (0, 0);
    for seed in seeds(1200..1320) {
        let again = [1, 3, 10, 40, 120][seed as usize % 5];
        let down = |r: &mut Run| member_0_port(r, true);
        let up = |r: &mut Run| member_0_port(r, false);
        let schedule: [Injection<'_>; 4] = [(0, &down), (300, &up), (300 + again, &down), (900, &up)];
        let mut r = run_scheduled(seed, Duration::from_secs(30), &schedule, Some(place_by_ports));
        assert_recovered(seed, &mut r);
        let rc = r.recovery.as_ref().expect("recovery");
        let attempts = rc.ends.iter().map(|e| e.attempts).max().unwrap_or(0);
        if r.case.sender_devs > 1 && attempts >= 4 {
            flapped += 1;
            let devs: std::collections::BTreeSet<usize> = r.fab.routes(Side::Sender).iter().map(|q| q.dev).collect();
            striped += usize::from(devs.len() == r.case.sender_devs.min(r.case.nqps()));
        }
    }
    assert!(flapped >= 15, "seeds through both flaps on a fused sender: {flapped}");
    assert_eq!(
        striped, flapped,
        "after the last failback the QPs are striped over every member"
    );
}

/// Recovery messages the peer never got (it missed them): the attempt waits PEER_WAIT, fails,
/// and the newer one the peer joins recovers — never a wait for the whole bound.
#[test]
fn lost_recovery_messages_are_made_up_by_a_newer_attempt() {
    let t = all_recover(
        1400..1520,
        &|r| {
            fail_some_qp(r, Side::Sender, WC_RETRY_EXC_ERR);
            let lose = 1 + r.rng.below(3) as u32;
            if let Some(rc) = r.recovery.as_mut() {
                rc.lose_messages = lose;
            }
        },
        None,
    );
    eprintln!("{t:?}");
    assert!(t.recovered >= 50, "{t:?}");
    assert!(t.attempts >= t.recovered + 40, "a lost message cost an attempt: {t:?}");
}

#[test]
fn the_receiver_failing_first_is_recovered() {
    let t = all_recover(600..720, &|r| fail_some_qp(r, Side::Receiver, WC_REM_ACCESS_ERR), None);
    eprintln!("{t:?}");
    assert!(t.recovered >= 20, "{t:?}");
}

/// At the first rebuild, the new QPs fail too: the receiver's CTS QP (its rewrites fail
/// while it waits for them to land) and the sender's (its first work request after the resume,
/// before anything completed): the next attempts recover.
fn fail_new_qps_once(r: &mut Run, side: Side, epoch: u32) {
    if epoch == 1 {
        match side {
            Side::Receiver => r.fab.fail_qp(Side::Receiver, 0, WC_RETRY_EXC_ERR),
            Side::Sender => {
                for q in 0..r.case.nqps() {
                    r.fab.fail_qp(Side::Sender, q, WC_RETRY_EXC_ERR);
                }
            }
        }
    }
}

#[test]
fn a_failure_during_recovery_is_recovered_by_the_next_attempt() {
    let t = all_recover(
        800..900,
        &|r| fail_some_qp(r, Side::Sender, WC_RETRY_EXC_ERR),
        Some(fail_new_qps_once),
    );
    eprintln!("{t:?}");
    assert!(
        t.attempts >= t.recovered + 30,
        "recoveries took several attempts: {t:?}"
    );
}

fn fail_new_qps_always(r: &mut Run, _side: Side, _epoch: u32) {
    for q in 0..r.case.nqps() {
        r.fab.fail_qp(Side::Sender, q, WC_RETRY_EXC_ERR);
        r.fab.fail_qp(Side::Receiver, q, WC_RETRY_EXC_ERR);
    }
}

#[test]
fn qps_that_keep_failing_fail_the_comm_at_the_bound_and_nothing_hangs() {
    let mut gave_up = 0;
    for seed in seeds(1000..1060) {
        let r = run_with(
            seed,
            Duration::from_secs(2),
            &|r| fail_some_qp(r, Side::Sender, WC_RETRY_EXC_ERR),
            Some(fail_new_qps_always),
        );
        if r.finished() {
            // The failure hit no work request (nothing was posted on that QP after it).
            continue;
        }
        let e = r
            .send
            .state
            .check()
            .err()
            .or(r.recv.state.check().err())
            .expect("an end failed");
        if e.message.contains("could not be recovered") {
            gave_up += 1;
            assert!(e.message.contains("attempts"), "seed {seed}: {}", e.message);
            let rc = r.recovery.as_ref().expect("recovery");
            let attempts = rc.ends.iter().map(|e| e.attempts).max().unwrap_or(0);
            assert!(
                attempts >= 3,
                "seed {seed}: backoff 0.1+0.2+0.4+0.8 s fits the 2 s bound: {attempts} attempts"
            );
        }
    }
    assert!(gave_up >= 20, "{gave_up} of 60 gave up");
}

fn close_at_first_rebuild(r: &mut Run, _side: Side, _epoch: u32) {
    r.close_channel();
}

#[test]
fn the_peer_dying_during_recovery_is_an_error_never_a_hang() {
    let mut errors = 0;
    for seed in seeds(1100..1180) {
        let mut r = run_with(
            seed,
            Duration::from_secs(30),
            &|r| fail_some_qp(r, Side::Sender, WC_RETRY_EXC_ERR),
            Some(close_at_first_rebuild),
        );
        if r.finished() {
            continue;
        }
        errors += 1;
        assert!(
            r.send.state.failed() && r.recv.state.failed(),
            "seed {seed}: both ends fail"
        );
        for k in 0..r.sends.len() {
            assert!(
                r.test_send(k).is_err(),
                "seed {seed}: a send of a dead connection tested ok"
            );
        }
        for k in 0..r.recvs.len() {
            assert!(
                r.test_recv(k).is_err(),
                "seed {seed}: a receive of a dead connection tested ok"
            );
        }
    }
    assert!(errors >= 30, "{errors}");
}

#[test]
fn a_lying_recovery_report_fails_the_comm() {
    // The sender told it took more messages than were posted: fails the sender, no panic.
    let mut r = Run::new(random_case(7));
    r.enable_recovery(Duration::from_secs(5), 0);
    for _ in 0..300 {
        let _ = r.turn();
    }
    r.send.begin_recovery();
    let fifo = r.fifo;
    let lie = vec![u64::MAX / 2; r.case.nqps()];
    let Run { fab, send, .. } = &mut r;
    let view = sim_net::RingView {
        regions: &mut fab.regions,
        region: fifo,
    };
    let got = send.resume(&view, &lie, &mut |_| panic!("nothing is posted for a lie"));
    assert!(got.unwrap_err().message.contains("lying peer"));
    assert!(r.send.state.failed());
    // And a head outside what the receiver posted.
    r.recv.begin_recovery();
    let got = r.recv.resume(u64::MAX, &mut |_| panic!("nothing is posted for a lie"));
    assert!(got.unwrap_err().message.contains("lying peer"));
}

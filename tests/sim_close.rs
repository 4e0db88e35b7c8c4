//! A receiver that closes, in the two-endpoint simulation (wire version 7, see
//! docs/design/data-path.md#closing): its report (`RecvCore::close_report`) settles the
//! sender's sends (`SendCore::handle_peer_close`). Three cases, each over many seeds of
//! `sim_net::run`'s random connections: the acknowledgement of the last writes lost at the
//! close, a close racing a retransmission (its failure or its late acknowledgement), and a
//! close with receives in flight. The oracle: a send reported done has every byte at the
//! receiver (written once); a send the receiver never took fails with an error that counts
//! it; no send is left waiting. `SIM_EXTRA_SEEDS=n` runs n more seeds per case.

mod sim_net;

use nccl_net_ferroce::error::Error;
use sim_net::run::{random_case, Run};
use sim_net::{Side, Wc, WC_RETRY_EXC_ERR};

/// Seeds per case (plus `SIM_EXTRA_SEEDS`).
fn seeds() -> u64 {
    60 + std::env::var("SIM_EXTRA_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A run of `seed`'s random case (at most 16 groups, no torn writes: a close takes what
/// landed whole).
fn new_run(seed: u64) -> Run {
    let mut case = random_case(seed);
    case.groups.truncate(16);
    case.faults.torn_writes = 0;
    Run::new(case)
}

/// Turn until `stop` holds; `false` when nothing moved for long (the sends that lost their
/// acknowledgements hold every send-queue credit: that seed proves nothing).
fn drive(r: &mut Run, stop: &dyn Fn(&Run) -> bool, mut at_turn: impl FnMut(&mut Run, u64)) -> bool {
    let seed = r.case.seed;
    let (mut idle, mut turns) = (0u32, 0u64);
    while !stop(r) {
        turns += 1;
        at_turn(r, turns);
        match r.turn() {
            Ok(true) => idle = 0,
            Ok(false) => {
                idle += 1;
                if idle > 20_000 {
                    return false;
                }
            }
            Err(e) => panic!("seed {seed}: {e} in {}", r.progress()),
        }
    }
    true
}

/// What the sender's tests said after the close.
#[derive(Default, Debug)]
struct Settled {
    done: usize,
    failed: usize,
    error: Option<Error>,
}

/// The sender after the receiver's report, as its driver's test does: progress, fail what is
/// left, then every send in flight is either done (its bytes checked at the receiver) or fails.
fn settle(r: &mut Run) -> Settled {
    let seed = r.case.seed;
    let mut out = Settled::default();
    let _ = r.sender_post_waiting();
    if let Err(e) = r.send.fail_untaken() {
        out.error = Some(e);
    }
    for (idx, g, i) in std::mem::take(&mut r.sends) {
        match r.send.test(idx) {
            Ok(Some(size)) => {
                r.check_buffer(g, i, size as usize);
                out.done += 1;
            }
            Ok(None) => panic!("seed {seed}: send ({g},{i}) left waiting after the close"),
            Err(_) => out.failed += 1,
        }
    }
    out
}

/// The receiver took every message, and the acknowledgements of the sender's writes from a
/// random point on were lost (the last ones at least): the report completes every send, none
/// fails, and the comm stays sound.
#[test]
fn a_lost_last_ack_at_close_loses_nothing() {
    let mut tally = (0, 0);
    for seed in 0..seeds() {
        let mut r = new_run(seed);
        let left = r.rng.below(4) as usize;
        let total = r.case.groups.len();
        let all_taken = |r: &Run| r.groups_done == total;
        let ok = drive(&mut r, &all_taken, |r, _| {
            if r.fab.lost_acks[0].is_none() && r.send_order.len() - r.next_send <= left {
                r.fab.lost_acks[Side::Sender.index()] = Some(Vec::new());
            }
        });
        if !ok {
            tally.1 += 1;
            continue;
        }
        // The receiver's last CTS writes (verdicts on eager messages) land before it closes.
        while r.fab.step(&mut r.rng) {}
        r.receiver_closes().unwrap();
        let s = settle(&mut r);
        assert!(s.error.is_none(), "seed {seed}: {:?}", s.error);
        assert_eq!(s.failed, 0, "seed {seed}");
        r.sends_done += s.done;
        assert_eq!(r.sends_done, r.send_order.len(), "seed {seed}: every send done");
        assert_eq!(r.send.state.pool.in_flight(), 0, "seed {seed}");
        tally.0 += 1;
    }
    assert!(tally.0 >= seeds() / 2, "too few seeds ran to the close: {tally:?}");
}

/// The close races a retransmission of a write whose acknowledgement was lost: its failure
/// (retries exceeded against the destroyed QP) is polled before the report, or its late
/// acknowledgement after it. Neither changes the outcome: every send done, once.
#[test]
fn a_close_racing_a_retransmission_changes_nothing() {
    let mut ran = 0;
    for seed in 0..seeds() {
        let mut r = new_run(seed);
        let total = r.case.groups.len();
        let all_taken = |r: &Run| r.groups_done == total;
        let ok = drive(&mut r, &all_taken, |r, _| {
            if r.fab.lost_acks[0].is_none() && r.send_order.len() - r.next_send <= 1 {
                r.fab.lost_acks[Side::Sender.index()] = Some(Vec::new());
            }
        });
        if !ok {
            continue;
        }
        while r.fab.step(&mut r.rng) {}
        let lost = r.fab.lost_acks[0].take().unwrap_or_default();
        let failure_first = r.rng.chance(50);
        if failure_first {
            // The driver polls the failure, finds the report waiting on the side channel and
            // settles by it: the failed completion is never the core's.
            if let Some(last) = lost.last() {
                let failed = Wc {
                    status: WC_RETRY_EXC_ERR,
                    ..*last
                };
                r.fab.push_completion(Side::Sender, failed);
                let polled = r.fab.drain_cq(Side::Sender);
                assert!(polled.iter().any(|w| w.status == WC_RETRY_EXC_ERR));
            }
        }
        r.receiver_closes().unwrap();
        if !failure_first {
            // The retransmission was acknowledged after all, just before the QP went.
            for wc in lost {
                r.fab.push_completion(Side::Sender, wc);
            }
            for _ in 0..4 {
                r.poll(Side::Sender);
            }
        }
        let s = settle(&mut r);
        assert!(s.error.is_none() && s.failed == 0, "seed {seed}: {s:?}");
        r.sends_done += s.done;
        assert_eq!(r.sends_done, r.send_order.len(), "seed {seed}: every send done once");
        ran += 1;
    }
    assert!(ran >= seeds() / 2, "too few seeds ran to the close: {ran}");
}

/// The receiver closes at a random point with receives in flight (NCCL never does; other
/// clients may). The sends it took are done with their bytes at the receiver; the others fail
/// at once with an error that counts them, and a send started after the close fails too.
#[test]
fn a_close_with_receives_in_flight_fails_only_what_was_never_taken() {
    let mut partial = 0;
    for seed in 0..seeds() {
        let mut r = new_run(seed);
        let close_at = 50 + r.rng.below(3000);
        let total = r.case.groups.len();
        let turns = std::cell::Cell::new(0u64);
        let stop = |r: &Run| r.groups_done == total || turns.get() >= close_at;
        drive(&mut r, &stop, |_, t| turns.set(t));
        let receives_left = r.recvs.len();
        r.receiver_closes().unwrap();
        let s = settle(&mut r);
        let counted = s.error.as_ref().map_or(0, |e| count_in(&e.message));
        assert_eq!(
            counted, s.failed,
            "seed {seed}: the error counts the sends that failed: {:?}",
            s.error
        );
        if s.failed > 0 {
            partial += 1;
            assert!(
                receives_left > 0 || r.next_group < total,
                "seed {seed}: a failure with every receive taken"
            );
        }
        if r.next_send < r.send_order.len() {
            assert!(
                r.try_isend().is_err(),
                "seed {seed}: a send after the close fails at once"
            );
        }
    }
    assert!(partial > 0, "no seed closed with a send in flight");
}

/// The count in "N send(s) it never took".
fn count_in(message: &str) -> usize {
    let end = message.find(" send(s) it never took").expect("the count");
    let start = message[..end].rfind(' ').map_or(0, |i| i + 1);
    message[start..end].parse().expect("a number")
}

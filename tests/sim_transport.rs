//! Two endpoints of the transport's sans-IO core (a `SendCore` and a `RecvCore`) on a virtual
//! clock, joined by the in-memory NIC of `sim_net`, driven the way NCCL drives a connection
//! until every request is done or the run fails. No sockets, no threads, no verbs.
//!
//! The run and its oracle are `sim_net::run` (shared with the `transport_core` fuzz target):
//! every receive reports min(sent, posted) bytes per buffer, every byte of it equals the
//! sender's and was written exactly once, nothing is written outside what was posted, every
//! send reports the bytes it sent, and nothing is left in flight. A failing case prints its
//! seed; `SIM_SEED=n cargo test --test sim_transport seeded` replays one.

mod sim_net;

use nccl_net_ferroce::error::Error;
use nccl_net_ferroce::transport::proto::fifo::{self, CtsEntry, RING};
use nccl_net_ferroce::transport::proto::limits::MAX_DEVS;
use nccl_net_ferroce::transport::proto::recv::{Irecv, RecvCore};
use nccl_net_ferroce::transport::proto::request::{self, ReqKind};
use nccl_net_ferroce::transport::proto::send::Isend;
use nccl_net_ferroce::transport::proto::split;
use sim_net::run::{random_case, run_case, Case, Msg, Run};
use sim_net::{Faults, RingView, Side};
use std::time::Duration;

#[test]
fn seeded() {
    let seeds: Vec<u64> = match std::env::var("SIM_SEED") {
        Ok(s) => vec![s.parse().expect("SIM_SEED is a number")],
        Err(_) => (0..500).collect(),
    };
    for seed in seeds {
        run_case(random_case(seed));
    }
}

fn single(posted: usize, sent: usize) -> Vec<Msg> {
    vec![Msg { posted, sent, tag: 1 }]
}

#[test]
fn zero_byte_and_larger_receive_buffers() {
    let groups = vec![single(0, 0), single(4096, 0), single(1 << 20, 100), single(100, 100)];
    run_case(Case::simple(groups));
}

#[test]
fn a_send_larger_than_the_buffer_is_truncated_and_reported_once() {
    let groups = vec![single(100, 1000), single(10, 20), single(300, 300)];
    let r = run_case(Case::simple(groups));
    assert_eq!(r.truncations, 1, "reported once per comm");
}

#[test]
fn every_qp_count_and_mode_with_fused_devices() {
    for (devs_s, devs_r) in [(1, 1), (2, 1), (1, 3), (2, 2)] {
        for qps in 1..=8 {
            for split in [false, true] {
                let groups = (0..12)
                    .map(|g| {
                        (0..(g % 8 + 1))
                            .map(|i| Msg {
                                posted: 5000 + 777 * i,
                                sent: 4000 + 333 * i + g,
                                tag: i as i32,
                            })
                            .collect()
                    })
                    .collect();
                let mut c = Case::simple(groups);
                c.seed = (devs_s * 100 + devs_r * 10 + qps) as u64 + if split { 1000 } else { 0 };
                c.sender_devs = devs_s;
                c.receiver_devs = devs_r;
                c.qps_per_conn = qps;
                c.split = split;
                c.faults = Faults {
                    torn_writes: 20,
                    late_completions: 20,
                };
                run_case(c);
            }
        }
    }
}

/// NCCL keeps 32 receives in flight; the 33rd says "retry later" until one is reported.
#[test]
fn thirty_two_receives_in_flight_then_retry_later() {
    let mut r = Run::new(Case::simple((0..40).map(|_| single(64, 64)).collect()));
    for _ in 0..request::RECVS_IN_FLIGHT {
        assert!(matches!(r.try_irecv().unwrap(), Some(Irecv::Started(_))));
    }
    assert_eq!(r.try_irecv().unwrap(), Some(Irecv::Busy), "the 33rd receive");
    r.run();
}

/// Groups of 8 fill the 64-entry ring after 8 groups; the 9th is refused (a NULL request)
/// until the oldest is reported. 64 sends are then in flight at once.
#[test]
fn full_ring_back_pressure_and_64_sends_in_flight() {
    let group = |g: usize| {
        (0..8)
            .map(|i| Msg {
                posted: 256,
                sent: 200 + g,
                tag: i,
            })
            .collect()
    };
    let mut c = Case::simple((0..12).map(group).collect());
    c.qps_per_conn = 8;
    let mut r = Run::new(c);
    for _ in 0..RING / 8 {
        assert!(matches!(r.try_irecv().unwrap(), Some(Irecv::Started(_))));
    }
    assert_eq!(r.try_irecv().unwrap(), Some(Irecv::Busy), "the ring is full");
    // Let the CTS writes land, then start every send the ring allows.
    while r.fab.step(&mut r.rng) {}
    for _ in 0..64 {
        assert!(matches!(r.try_isend().unwrap(), Some(Isend::Started { .. })));
    }
    assert_eq!(r.send.state.pool.in_flight(), 64);
    assert_eq!(
        r.try_isend().unwrap(),
        Some(Isend::NoBuffer),
        "no 9th group: the ring is full"
    );
    r.run();
}

/// One QP of 64 credits takes 7 chains of 9 WRs (groups of 8): the 8th complete group waits
/// for credits and goes out once completions came back.
#[test]
fn a_group_waits_for_send_queue_credits() {
    let group = |_| {
        (0..8)
            .map(|i| Msg {
                posted: 64,
                sent: 64,
                tag: i,
            })
            .collect()
    };
    let mut r = Run::new(Case::simple((0..8).map(group).collect()));
    for _ in 0..8 {
        assert!(matches!(r.try_irecv().unwrap(), Some(Irecv::Started(_))));
    }
    while r.fab.step(&mut r.rng) {}
    for _ in 0..64 {
        assert!(matches!(r.try_isend().unwrap(), Some(Isend::Started { .. })));
    }
    assert!(r.send.waiting(), "the 8th group waits for credits");
    r.sender_post_waiting().unwrap();
    assert!(r.send.waiting(), "no completion came back yet");
    r.run();
    assert!(!r.send.waiting());
}

/// Messages past the devices' `max_msg_sz` (here 1 KiB) go in pieces: full groups of eight
/// buffers at the largest size a receive takes (7 pieces each, chains of 57 WRs, beyond one
/// post's batch), single messages of 1..7 pieces, over 1 and 3 QPs; every byte lands once and
/// the simulated NIC refuses any WR past 1 KiB.
#[test]
fn messages_past_max_msg_sz_go_in_pieces() {
    let max = split::max_buffer_bytes(1024);
    assert_eq!(max, 7 * 1024);
    for (qps, split) in [(1, false), (3, true)] {
        let full = || {
            (0..8)
                .map(|i| Msg {
                    posted: max,
                    sent: max,
                    tag: i,
                })
                .collect::<Vec<_>>()
        };
        let mut groups = vec![full(), single(max, max), single(max, 1025), full()];
        groups.extend((1..=7).map(|p| single(max, p * 1024 - 1)));
        let mut c = Case::simple(groups);
        c.wr_bytes = 1024;
        c.qps_per_conn = qps;
        c.split = split;
        run_case(c);
    }
}

/// A receive takes buffers up to `max_buffer_bytes` of its devices (the `maxP2pBytes` they
/// report), and refuses one byte more with an error that says so, changing nothing.
#[test]
fn a_receive_past_the_largest_message_is_refused() {
    let max = split::max_buffer_bytes(1024);
    let mut at = Case::simple(vec![single(max, max)]);
    at.wr_bytes = 1024;
    run_case(at);
    let mut past = Case::simple(vec![single(max + 1, 1), single(64, 64)]);
    past.wr_bytes = 1024;
    let mut r = Run::new(past);
    let err = r.try_irecv().unwrap_err();
    assert!(err.message.contains("larger than the 7168 bytes"), "{err}");
    assert!(!r.recv.state.failed(), "a refused receive fails nothing");
}

/// Receives are posted ahead in batches: 64 messages cost 4 `ibv_post_recv` calls per QP they
/// use (not one per message per QP), on one QP and split over three.
#[test]
fn receives_are_posted_sixteen_at_a_time() {
    use nccl_net_ferroce::transport::proto::recv::RQ_BATCH;
    for (qps, split) in [(1, false), (3, true)] {
        let mut c = Case::simple((0..64).map(|_| single(300, 300)).collect());
        c.qps_per_conn = qps;
        c.split = split;
        let r = run_case(c);
        assert_eq!(
            r.fab.queues.recv_posts[Side::Receiver.index()],
            qps * 64 / RQ_BATCH,
            "{qps} QPs"
        );
    }
}

/// A completion on a QP that no posted receive waits for (a replayed or forged write with
/// immediate) fails the comm, naming the QP; the owed completion before it counts normally.
#[test]
fn a_completion_no_receive_waits_for_fails_the_comm() {
    let mut r = Run::new(Case::simple(vec![single(64, 64)]));
    let Some(Irecv::Started(_)) = r.try_irecv().unwrap() else {
        panic!("irecv")
    };
    let wr_ids = r.fab.queues.take_receives(Side::Receiver, 2);
    r.recv.handle_completion(wr_ids[0], Some(64));
    assert!(!r.recv.state.failed(), "the owed completion is fine");
    r.recv.handle_completion(wr_ids[1], Some(64));
    assert!(r.recv.state.failed(), "a second completion for one receive");
    let err = r.recv.state.check().unwrap_err();
    assert!(err.message.contains("no posted receive waits for"), "{err}");
}

/// A CTS entry whose stamp is there but whose seal never verifies is "landing" for a while,
/// then a clear error (not a hang, not a wrong buffer).
#[test]
fn a_corrupt_cts_entry_fails_the_comm_after_the_landing_timeout() {
    let mut r = Run::new(Case::simple(vec![single(64, 64)]));
    let mut e = CtsEntry::new(0x1234, 64, [1; MAX_DEVS], 1, 1, 0).to_wire();
    e.seal ^= 1;
    let fifo = r.fifo;
    let bytes = sim_net::entry_to_bytes(&e);
    r.fab.regions[fifo].bytes[..64].copy_from_slice(&bytes);
    assert_eq!(r.try_isend().unwrap(), Some(Isend::NoBuffer), "landing, not accepted");
    r.now = r.now + Duration::from_millis(50);
    assert_eq!(r.try_isend().unwrap(), Some(Isend::NoBuffer), "still landing");
    r.now = r.now + Duration::from_millis(60);
    let err = r.try_isend().unwrap_err();
    assert!(err.message.contains("never became consistent"), "{err}");
    assert!(r.send.state.failed());
    assert!(r.try_isend().is_err(), "a failed comm stays failed");
}

/// Flushes: up to 32 in flight, each reads the last non-empty buffer on every device; one
/// more is an error.
#[test]
fn flushes_complete_and_the_33rd_is_an_error() {
    let mut c = Case::simple((0..4).map(|_| single(64, 64)).collect());
    c.receiver_devs = 2;
    c.flush_percent = 100;
    run_case(c);
    let mut r = Run::new(Case::simple(vec![single(64, 64)]));
    r.run();
    for _ in 0..request::FLUSHES_IN_FLIGHT {
        r.flush(0).unwrap();
    }
    assert_eq!(r.recv.flushes_in_flight(), request::FLUSHES_IN_FLIGHT);
    let data = r.fab.base(r.recv_data) as usize;
    let keys = r.fab.keys(r.recv_data);
    let scratch = sim_net::scratch_sges(&r.fab, r.scratch, 1);
    let Run { fab, recv, .. } = &mut r;
    let err = recv
        .iflush(data, &keys, &scratch, &mut |p| fab.queues.post(Side::Receiver, p))
        .unwrap_err();
    assert!(err.message.contains("already in flight"), "{err}");
    assert_eq!(RecvCore::flush_target(&[0, 5, 0]), Some(1));
    assert_eq!(RecvCore::flush_target(&[0, 0]), None);
}

/// Drive a case where one QP fails mid-run (a completion error on a chosen QP) or the peer
/// stops answering: the failing side reports the error, its requests never report success
/// afterwards, the other side fails when its liveness probe sees the peer gone (emulated
/// here as the driver does), and nothing hangs or panics.
fn run_with_failure(seed: u64, fail: impl Fn(&mut Run)) {
    let mut case = random_case(seed);
    case.groups.truncate(20);
    let mut r = Run::new(case);
    let mut turns = 0u64;
    let fail_at = 50 + r.rng.below(400);
    let both_failed = |r: &Run| r.send.state.failed() && r.recv.state.failed();
    while !r.finished() && !both_failed(&r) {
        turns += 1;
        assert!(turns < 2_000_000, "seed {seed}: hang after a failure: {}", r.progress());
        if turns == fail_at {
            fail(&mut r);
        }
        // The liveness probe: one side failed and closed its side channel.
        if turns > fail_at + 2000 && (r.send.state.failed() || r.recv.state.failed()) {
            r.send.state.fail(Error::remote("peer gone"));
            r.recv.state.fail(Error::remote("peer gone"));
        }
        match r.turn() {
            Ok(_) => {}
            Err(e) => {
                assert!(
                    r.send.state.failed() || r.recv.state.failed(),
                    "seed {seed}: an error without a failed comm: {e}"
                );
            }
        }
        if turns > fail_at + 200_000 {
            // Nothing more was posted after the fault: the run may simply end.
            break;
        }
    }
    if r.send.state.failed() {
        assert!(r.try_isend().is_err() || r.next_send == r.send_order.len());
        for k in 0..r.sends.len() {
            assert!(
                r.test_send(k).is_err(),
                "seed {seed}: a send of a failed comm was tested ok"
            );
        }
    }
    if r.recv.state.failed() {
        for k in 0..r.recvs.len() {
            assert!(
                r.test_recv(k).is_err(),
                "seed {seed}: a receive of a failed comm was tested ok"
            );
        }
    }
}

#[test]
fn a_completion_error_on_a_chosen_qp_fails_the_comm_and_nothing_hangs() {
    for seed in 0..60 {
        run_with_failure(seed, |r| {
            let side = if r.rng.chance(50) { Side::Sender } else { Side::Receiver };
            let qp = r.rng.below(r.case.nqps() as u64) as usize;
            r.fab.fail_qp(side, qp, sim_net::WC_REM_ACCESS_ERR);
        });
    }
}

#[test]
fn a_peer_that_stops_answering_fails_the_sender_and_nothing_hangs() {
    for seed in 100..140 {
        run_with_failure(seed, |r| {
            r.fab.silent[0] = true;
            r.fab.silent[1] = true;
        });
    }
}

/// The request kinds the receiver hands out.
#[test]
fn receive_and_flush_requests_are_told_apart() {
    let mut r = Run::new(Case::simple(vec![single(64, 64)]));
    let Some(Irecv::Started(idx)) = r.try_irecv().unwrap() else {
        panic!("irecv")
    };
    assert_eq!(r.recv.kind_of(idx), Some(ReqKind::Recv));
    r.run();
    assert_eq!(r.recv.kind_of(idx), Some(ReqKind::Free));
}

/// A peer that claims more bytes than were posted (its completion record lies) gets the
/// posted size reported, never more.
#[test]
fn sizes_a_peer_claims_beyond_the_posted_buffer_are_clamped() {
    let group = vec![
        Msg {
            posted: 100,
            sent: 100,
            tag: 1,
        },
        Msg {
            posted: 50,
            sent: 50,
            tag: 2,
        },
    ];
    let mut r = Run::new(Case::simple(vec![group]));
    let Some(Irecv::Started(idx)) = r.try_irecv().unwrap() else {
        panic!("irecv")
    };
    // The lying record: bytes SIZES_IN_ENTRY.. of the group's first staging entry.
    let at = fifo::SIZES_IN_ENTRY;
    let staging = r.staging;
    r.fab.regions[staging].bytes[at..at + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
    r.fab.regions[staging].bytes[at + 4..at + 8].copy_from_slice(&7u32.to_le_bytes());
    // The group's receive (one QP) completes, as if the sender's writes had landed.
    for wr_id in r.fab.queues.take_receives(Side::Receiver, 1) {
        r.recv.handle_completion(wr_id, Some(0));
    }
    let view = RingView {
        regions: &mut r.fab.regions,
        region: staging,
    };
    let done = r.recv.test(&view, idx).unwrap().expect("all receives completed");
    assert_eq!(&done.sizes[..2], &[100, 7], "clamped to the posted 100; 7 ≤ 50 stands");
}

/// A flush read the NIC refuses (a key of no registration) fails the comm: its test reports
/// the error.
#[test]
fn a_failed_flush_read_is_reported_by_test() {
    let mut r = Run::new(Case::simple(vec![single(64, 64)]));
    r.run();
    let data = r.fab.base(r.recv_data) as usize;
    let bad_keys = [0xdead; MAX_DEVS];
    let scratch = sim_net::scratch_sges(&r.fab, r.scratch, 1);
    let Run { fab, recv, .. } = &mut r;
    let idx = recv
        .iflush(data, &bad_keys, &scratch, &mut |p| fab.queues.post(Side::Receiver, p))
        .unwrap();
    while r.fab.step(&mut r.rng) {}
    r.poll(Side::Receiver);
    let view = RingView {
        regions: &mut r.fab.regions,
        region: r.staging,
    };
    let err = r.recv.test(&view, idx).unwrap_err();
    assert!(err.message.contains("flush read failed"), "{err}");
}

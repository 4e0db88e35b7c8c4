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
use nccl_net_ferroce::transport::proto::recv::{Irecv, Oversized, RecvCore};
use nccl_net_ferroce::transport::proto::request::{self, ReqKind};
use nccl_net_ferroce::transport::proto::send::{Isend, SendBuf};
use nccl_net_ferroce::transport::proto::split;
use sim_net::run::{random_case, run_case, Case, Msg, Run};
use sim_net::{Fabric, Faults, RingView, Side};
use std::time::Duration;

/// Seeds 0..500; for a soak, `SIM_SEEDS=n SIM_START=s cargo test --release --test
/// sim_transport seeded` runs seeds s..s+n instead.
#[test]
fn seeded() {
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|s| s.parse::<u64>().unwrap_or_else(|_| panic!("{name} is a number")))
    };
    let seeds: Vec<u64> = match (var("SIM_SEED"), var("SIM_SEEDS")) {
        (Some(seed), _) => vec![seed],
        (None, Some(n)) => {
            let start = var("SIM_START").unwrap_or(0);
            (start..start + n).collect()
        }
        (None, None) => (0..500).collect(),
    };
    for seed in seeds {
        run_case(random_case(seed));
    }
}

/// The eager path over many seeds: small sends whose receives are not posted yet go at once
/// and land in the receives posted after them, exactly once; claims on grouped receives, on
/// receives into GPU memory or with another tag are refused and go through the CTS path, in
/// their order (the oracle checks every byte and size either way).
#[test]
fn eager_sends_fill_receives_posted_after_them_and_refused_ones_take_the_cts_path() {
    let (mut eager, mut bound, mut refused) = (0, 0, 0);
    for seed in 0..300u64 {
        let mut c = random_case(seed);
        c.eager_max = [8, 224, 1000][seed as usize % 3];
        c.named_imm = true;
        // Mostly single receives of small messages, as NCCL's LL protocol posts them.
        for g in c.groups.iter_mut() {
            if seed % 4 != 0 {
                g.truncate(1);
            }
            for m in g.iter_mut() {
                m.posted %= 1200;
                m.sent = m.sent.min(m.posted + 10) % 1200;
            }
        }
        let r = run_case(c);
        eager += r.eager_sends;
        let k = r.recv.eager_counts();
        bound += k.bound;
        refused += k.refused;
        // Both ends decided the same claims alike. A refused claim on a group never posted (the
        // run ends first) stays undecided at the receiver; in a job the group comes later.
        let sender = r.send.eager().expect("the eager path is on");
        assert_eq!(k.bound, sender.bound, "seed {seed}: bound on both ends");
        assert!(
            k.refused <= sender.refused_msgs && k.bound + sender.refused_msgs == r.eager_sends as u64,
            "seed {seed}: receiver {k:?}, sender refused {}, eager sends {}",
            sender.refused_msgs,
            r.eager_sends
        );
    }
    eprintln!("eager sends {eager}, bound {bound}, refused {refused}");
    assert!(
        eager > 1000 && bound > 500 && refused > 50,
        "eager {eager}, bound {bound}, refused {refused}"
    );
}

/// A refused claim makes every later claim of its epoch refused, and those may name receives
/// past the ones NCCL posts (grouped receives take several sends each). The receiver decides
/// them at once: were it to wait for their receives, a receiver that posts a receive only after
/// earlier ones completed (NCCL's step window) would wait for messages of the next epoch decided
/// behind them: a hang (found by the C-ABI test over softroce, seen here with a window of 1–3).
#[test]
fn claims_of_a_refused_epoch_never_wait_for_receives_not_posted() {
    for seed in 0..200u64 {
        let mut c = random_case(seed);
        c.eager_max = 224;
        c.named_imm = true;
        c.recv_window = 1 + seed as usize % 3;
        for (k, g) in c.groups.iter_mut().enumerate() {
            // Singles and groups of 2 alternate irregularly; small messages.
            g.truncate(if k % 3 == 1 { 2 } else { 1 });
            for m in g.iter_mut() {
                m.posted %= 300;
                m.sent = m.sent.min(m.posted);
            }
        }
        run_case(c);
    }
}

/// Eager off (FERROCE_EAGER_MAX=0, or a version-4 peer): no send goes eagerly, every one waits
/// for its CTS as before.
#[test]
fn without_the_eager_path_every_send_waits_for_its_cts() {
    for (eager_max, named) in [(0, true), (224, false)] {
        let mut c = Case::simple((0..50).map(|_| single(64, 8)).collect());
        c.eager_max = eager_max;
        c.named_imm = named;
        let r = run_case(c);
        assert_eq!(r.eager_sends, 0, "eager_max {eager_max}, named {named}");
    }
}

/// The receiver posts one receive and the sender's first send fills it through the CTS path;
/// both are then tested to completion (the caller checks they are).
fn first_message_through_the_cts_path(r: &mut Run) {
    assert!(r.try_irecv().unwrap().is_some());
    for _ in 0..2000 {
        if r.next_send == 0 {
            r.try_isend().unwrap();
        }
        r.fab.step(&mut r.rng);
        r.poll(Side::Sender);
        r.poll(Side::Receiver);
        if !r.sends.is_empty() {
            r.test_send(0).unwrap();
        }
        if !r.recvs.is_empty() {
            r.test_recv(0).unwrap();
        }
    }
}

/// Eager messages whose receives are never posted (the receiver closed its comm): once their
/// writes are acknowledged the sender has nothing left with the NIC while the sends stay in
/// flight for a verdict only the receiver could give. That is what lets the driver fail them
/// when the side channel says the receiver is gone (a send whose writes are still with the NIC
/// ends by itself: acknowledged, or failed by the transport's retries).
#[test]
fn eager_sends_the_receiver_never_answers_leave_nothing_with_the_nic() {
    let mut c = Case::simple((0..5).map(|_| single(64, 8)).collect());
    c.eager_max = 224;
    let mut r = Run::new(c);
    // The one receive the receiver posts: its CTS brings the sender the eager credit.
    first_message_through_the_cts_path(&mut r);
    assert_eq!((r.sends_done, r.groups_done), (1, 1), "{}", r.progress());
    for k in 1..5 {
        let got = r.try_isend().unwrap();
        assert!(
            matches!(got, Some(Isend::Started { eager: true, .. })),
            "send {k}: {got:?}"
        );
    }
    assert!(r.send.chains_in_flight(), "the eager writes are posted");
    for _ in 0..1000 {
        r.fab.step(&mut r.rng);
        r.poll(Side::Sender);
    }
    assert!(
        !r.send.chains_in_flight(),
        "every eager write was acknowledged: {}",
        r.progress()
    );
    for k in 0..4 {
        r.test_send(k).unwrap();
    }
    assert_eq!(r.sends_done, 1, "without a verdict no eager send completes");
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
    // Let the CTS writes land (the first receive's went at once, with nothing to batch it
    // with; the receiver's next look at the comm writes the other seven in one RDMA write),
    // then start every send the ring allows.
    let steps = r.fab.executed;
    r.receiver_flush_cts().unwrap();
    while r.fab.step(&mut r.rng) {}
    assert_eq!(
        r.fab.executed - steps,
        2,
        "two CTS writes for eight receives posted back to back"
    );
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
    r.receiver_flush_cts().unwrap();
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
    // Version 4: completions in posting order, immediates unnamed.
    let mut c = Case::simple(vec![single(64, 64)]);
    c.named_imm = false;
    let mut r = Run::new(c);
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

/// Version 5: a completion names its receive. One that names a receive not waiting on that QP
/// (done already, never posted, a group with a single's immediate) fails the comm; a size past
/// the posted buffer is clamped, as on version 4.
#[test]
fn a_named_completion_of_no_waiting_receive_fails_the_comm() {
    use nccl_net_ferroce::transport::proto::eager::Imm;
    let mut r = Run::new(Case::simple(vec![single(64, 64), single(10, 10)]));
    let (Some(Irecv::Started(a)), Some(Irecv::Started(b))) = (r.try_irecv().unwrap(), r.try_irecv().unwrap()) else {
        panic!("irecv")
    };
    let wr_ids = r.fab.queues.take_receives(Side::Receiver, 3);
    // The second receive (ring position 1) completes first, with a size past its buffer.
    r.recv
        .handle_completion(wr_ids[0], Some(Imm::Single { pos: 1, size: 99 }.to_u32()));
    r.recv
        .handle_completion(wr_ids[1], Some(Imm::Single { pos: 0, size: 64 }.to_u32()));
    assert!(
        !r.recv.state.failed(),
        "completions out of posting order are fine once named"
    );
    let staging = r.staging;
    let view = RingView {
        regions: &mut r.fab.regions,
        region: staging,
    };
    let done = r.recv.test(&view, b).unwrap().expect("done");
    assert_eq!((done.n, done.sizes[0]), (1, 10), "clamped to the posted 10 bytes");
    assert_eq!(r.recv.test(&view, a).unwrap().expect("done").sizes[0], 64);
    r.recv
        .handle_completion(wr_ids[2], Some(Imm::Single { pos: 0, size: 64 }.to_u32()));
    let err = r.recv.state.check().unwrap_err();
    assert!(err.message.contains("names no receive waiting there"), "{err}");
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

/// Write `e` (host order) over the sender's FIFO entry at ring position `pos`, as a lying
/// receiver's CTS write would.
fn write_fifo_entry(r: &mut Run, pos: usize, e: &CtsEntry) {
    let fifo = r.fifo;
    let at = pos * fifo::ENTRY_BYTES;
    r.fab.regions[fifo].bytes[at..at + fifo::ENTRY_BYTES].copy_from_slice(&sim_net::entry_to_bytes(&e.to_wire()));
}

/// A well-sealed CTS entry stamped for a posting counter the sender does not expect at its
/// head, from the future (garbage) or an old one written over what was there (a replay), is no
/// "not posted yet": it is bounded like a landing entry and then fails the comm, naming the
/// peer and the counter it claimed. Left untouched, an old lap's entry is never an error.
#[test]
fn issue_14_a_stale_or_future_cts_stamp_at_the_head_fails_the_comm() {
    // A counter from the future at the head of a fresh ring.
    let mut r = Run::new(Case::simple(vec![single(64, 64)]));
    write_fifo_entry(&mut r, 0, &CtsEntry::new(0x1234, 64, [1; MAX_DEVS], 1, 1, 5));
    assert_eq!(r.try_isend().unwrap(), Some(Isend::NoBuffer));
    r.now = r.now + Duration::from_millis(50);
    assert_eq!(
        r.try_isend().unwrap(),
        Some(Isend::NoBuffer),
        "bounded, not failed at once"
    );
    r.now = r.now + Duration::from_millis(60);
    let err = r.try_isend().unwrap_err();
    assert!(
        err.message.contains("posting counter 5") && err.message.contains("the simulated receiver"),
        "{err}"
    );
    assert!(r.send.state.failed());

    // A replay: after one lap the sender owes group 64 at entry 0, where group 0's entry was
    // left. Left alone it is no error; group 0's (well-sealed) entry written there again, with
    // another buffer, is a lie.
    let mut r = Run::new(Case::simple((0..RING).map(|_| single(64, 64)).collect()));
    r.run();
    for _ in 0..3 {
        assert_eq!(probe_isend(&mut r).unwrap(), Isend::NoBuffer);
        r.now = r.now + Duration::from_millis(60);
    }
    assert!(!r.send.state.failed(), "the entry left from the last lap is no error");
    write_fifo_entry(&mut r, 0, &CtsEntry::new(0x9999, 64, [1; MAX_DEVS], 1, 1, 0));
    assert_eq!(probe_isend(&mut r).unwrap(), Isend::NoBuffer);
    r.now = r.now + Duration::from_millis(150);
    let err = probe_isend(&mut r).unwrap_err();
    assert!(
        err.message.contains("posting counter 0") && err.message.contains("owes group 64"),
        "{err}"
    );

    // A replay that lands before the sender looks at the entry: group 0 (one entry) was sent,
    // then its entry is written again at entry 1, where group 1 is owed, before any isend
    // reads entry 1. What the sender consumed there is nothing (zeroed memory): a lie too.
    let mut r = Run::new(Case::simple(vec![single(64, 64)]));
    r.run();
    write_fifo_entry(&mut r, 1, &CtsEntry::new(0x9999, 64, [1; MAX_DEVS], 1, 1, 0));
    assert_eq!(probe_isend(&mut r).unwrap(), Isend::NoBuffer);
    r.now = r.now + Duration::from_millis(150);
    let err = probe_isend(&mut r).unwrap_err();
    assert!(
        err.message.contains("posting counter 0") && err.message.contains("owes group 1"),
        "{err}"
    );
}

/// One isend of 8 bytes with tag 1 straight into the sender's core (past the case's own).
fn probe_isend(r: &mut Run) -> Result<Isend, Error> {
    let send = SendBuf {
        data: r.fab.base(r.send_data) as usize,
        size: 8,
        tag: 1,
        lkeys: r.fab.keys(r.send_data),
        host: true,
    };
    let (now, fifo) = (r.now, r.fifo);
    let Run { fab, send: core, .. } = r;
    let Fabric { regions, queues, .. } = fab;
    let mut view = RingView { regions, region: fifo };
    core.isend(&mut view, || now, send, &mut |p| queues.post(Side::Sender, p))
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

/// A peer that claims more bytes than were posted (its completion record lies, and it wrote
/// a larger size over the staged entry too, which it can: the staging block is remotely
/// writable) gets the posted size reported, never more, and the first such claim of the comm
/// is reported for the WARN; a later one is clamped without a second report.
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
    let mut c = Case::simple(vec![group, single(10, 10)]);
    c.named_imm = false;
    let mut r = Run::new(c);
    let Some(Irecv::Started(idx)) = r.try_irecv().unwrap() else {
        panic!("irecv")
    };
    // The lying record: bytes SIZES_IN_ENTRY.. of the group's first staging entry.
    let at = fifo::SIZES_IN_ENTRY;
    let staging = r.staging;
    r.fab.regions[staging].bytes[at..at + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
    r.fab.regions[staging].bytes[at + 4..at + 8].copy_from_slice(&7u32.to_le_bytes());
    // The staged entry's size (bytes 8..16 of entry 0), rewritten by the peer.
    r.fab.regions[staging].bytes[8..16].copy_from_slice(&u64::MAX.to_ne_bytes());
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
    assert_eq!(
        done.oversized,
        Some(Oversized {
            buffer: 0,
            n: 2,
            claimed: 1_000_000,
            posted: 100
        })
    );

    // A single receive of 10 bytes whose immediate claims 99: clamped, not reported again.
    let Some(Irecv::Started(idx)) = r.try_irecv().unwrap() else {
        panic!("irecv")
    };
    for wr_id in r.fab.queues.take_receives(Side::Receiver, 1) {
        r.recv.handle_completion(wr_id, Some(99));
    }
    let view = RingView {
        regions: &mut r.fab.regions,
        region: staging,
    };
    let done = r.recv.test(&view, idx).unwrap().expect("the receive completed");
    assert_eq!((done.n, done.sizes[0], done.oversized), (1, 10, None));
}

/// A grouped receive's immediate names the ring position of its completion record; one that
/// names another group's (a replayed or forged completion) fails the comm, naming the peer
/// and what it claimed, instead of completing the request with another group's sizes.
#[test]
fn issue_14_a_grouped_receive_completed_with_another_groups_immediate_fails_the_comm() {
    let pair = || {
        [1, 2]
            .map(|tag| Msg {
                posted: 64,
                sent: 64,
                tag,
            })
            .to_vec()
    };
    let mut c = Case::simple(vec![pair(), pair()]);
    c.named_imm = false;
    let mut r = Run::new(c);
    let mut groups = Vec::new();
    for _ in 0..2 {
        let Some(Irecv::Started(idx)) = r.try_irecv().unwrap() else {
            panic!("irecv")
        };
        groups.push(idx);
    }
    // One QP: its receives complete the groups in posting order.
    let wr_ids = r.fab.queues.take_receives(Side::Receiver, 2);
    assert_eq!(wr_ids.len(), 2);
    // Group 0 (record at entry 0) completes with its own position: no error.
    r.recv.handle_completion(wr_ids[0], Some(0));
    assert!(!r.recv.state.failed());
    // Group 1's record is at entry 2; the peer completes it with group 0's position again.
    r.recv.handle_completion(wr_ids[1], Some(0));
    let staging = r.staging;
    let view = RingView {
        regions: &mut r.fab.regions,
        region: staging,
    };
    let err = r.recv.test(&view, groups[1]).unwrap_err();
    assert!(
        err.message.contains("the simulated sender")
            && err.message.contains("staging entry 2")
            && err.message.contains("immediate 0"),
        "{err}"
    );
    assert!(r.recv.test(&view, groups[0]).is_err(), "the whole comm failed");
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

/// A receiver that closes right after an eager message completed its receive: the CTS write
/// that carries the message's verdict may not have landed yet (lost and waiting for its
/// retransmission, or still queued in the provider), and a close that destroyed it would leave
/// the send without an answer. The close posts a signaled zero-length write behind the CTS
/// writes (`post_close_markers`) and waits for it; once it completed, the verdict is in the
/// sender's FIFO and the send completes. With nothing left unacknowledged, or without the eager
/// path, there is nothing to mark.
#[test]
fn a_receiver_closing_after_an_eager_delivery_first_lands_the_verdict() {
    let mut c = Case::simple((0..2).map(|_| single(64, 8)).collect());
    c.eager_max = 224;
    let mut r = Run::new(c);
    // Message 0 through the CTS path: its CTS brings the sender the eager credit.
    first_message_through_the_cts_path(&mut r);
    assert_eq!((r.sends_done, r.groups_done), (1, 1), "{}", r.progress());
    let got = r.try_isend().unwrap();
    assert!(matches!(got, Some(Isend::Started { eager: true, .. })), "{got:?}");
    for _ in 0..1000 {
        if !r.send.chains_in_flight() {
            break;
        }
        r.fab.step(&mut r.rng);
        r.poll(Side::Sender);
    }
    assert!(
        !r.send.chains_in_flight(),
        "the eager write was acknowledged: {}",
        r.progress()
    );
    // The receive is posted after its message landed: it completes at once, its CTS write (the
    // verdict) only posted.
    assert!(r.try_irecv().unwrap().is_some());
    for _ in 0..100 {
        r.poll(Side::Receiver);
        if !r.recvs.is_empty() {
            r.test_recv(0).unwrap();
        }
    }
    assert_eq!(
        r.groups_done,
        2,
        "the eager message completed its receive: {}",
        r.progress()
    );
    r.test_send(0).unwrap();
    assert_eq!(r.sends_done, 1, "no verdict yet");
    let Run { fab, recv, .. } = &mut r;
    let marked = recv
        .post_close_markers(&mut |p| fab.queues.post(Side::Receiver, p))
        .unwrap();
    assert_ne!(marked, 0, "the close marks the CTS QP with a write not acknowledged");
    assert!(!r.recv.cts_landed(marked));
    for _ in 0..2000 {
        if r.recv.cts_landed(marked) {
            break;
        }
        r.fab.step(&mut r.rng);
        r.poll(Side::Receiver);
    }
    assert!(r.recv.cts_landed(marked), "the marker completed: {}", r.progress());
    for _ in 0..100 {
        r.poll(Side::Sender);
        if !r.sends.is_empty() {
            r.test_send(0).unwrap();
        }
    }
    assert_eq!(
        r.sends_done,
        2,
        "the verdict landed, the send completed: {}",
        r.progress()
    );
    let Run { fab, recv, .. } = &mut r;
    assert_eq!(
        recv.post_close_markers(&mut |p| fab.queues.post(Side::Receiver, p))
            .unwrap(),
        0,
        "every CTS write acknowledged: nothing to wait for"
    );

    let mut c = Case::simple(vec![single(64, 8)]);
    c.eager_max = 0;
    let mut r = Run::new(c);
    assert!(r.try_irecv().unwrap().is_some());
    r.receiver_flush_cts().unwrap();
    let Run { fab, recv, .. } = &mut r;
    assert_eq!(
        recv.post_close_markers(&mut |p| fab.queues.post(Side::Receiver, p))
            .unwrap(),
        0,
        "without the eager path a completed receive's CTS was read before its data came"
    );
}

/// An eager send from a GPU's memory (the sender's CUDA or DMA-BUF registration) never goes
/// inline: the provider copies an inline payload with the CPU at the post, and the CPU cannot
/// read a GPU's memory (on a real NIC, a crash in `ibv_post_send`). Its payload goes by DMA in a
/// write of its own, then its header inline; from host memory the same sends go inline, in one
/// write each. (The fabric also refuses an inline WR that reads a GPU's memory, in every case.)
#[test]
fn an_eager_send_from_gpu_memory_never_goes_inline() {
    for gpu in [false, true] {
        let mut c = Case::simple((0..40).map(|k| single(224, 8 + 5 * k)).collect());
        c.eager_max = 224;
        c.send_gpu = gpu;
        // The receiver lags (one receive posted at a time), so the sends go before their CTS.
        c.recv_window = 1;
        let r = run_case(c);
        assert!(r.eager_sends >= 30, "gpu {gpu}: {} of 40 sends eager", r.eager_sends);
        let inline = r.fab.queues.inline_payloads[Side::Sender.index()];
        if gpu {
            assert_eq!(inline, 0, "no inline payload from a GPU's memory");
        } else {
            assert_eq!(
                inline, r.eager_sends,
                "one inline write per eager send from host memory"
            );
        }
    }
}

/// Found by the `transport_core` fuzz target (input kept as
/// `fuzz/corpus/transport_core/regression-eager-write-past-max-msg-sz`): with a device whose WRs
/// carry less than `FERROCE_EAGER_MAX` (a small `max_msg_sz`), an eager message's payload write
/// went past it. The eager path now sends only what one WR carries; larger sends take the CTS
/// path, cut into pieces.
#[test]
fn issue_13_fuzz_an_eager_write_past_max_msg_sz() {
    let mut c = Case::simple((0..40).map(|k| single(4000, 1000 + 70 * k)).collect());
    c.eager_max = 4064;
    c.eager_inline = 64;
    c.wr_bytes = 1694;
    let r = run_case(c);
    assert!(r.eager_sends > 0, "sends of up to 1662 bytes still go eagerly");
}

/// Found by the `transport_core` fuzz target (input kept as
/// `fuzz/corpus/transport_core/regression-cts-batch-past-max-msg-sz`): receives posted back to
/// back on a device whose WRs carry little (a small `max_msg_sz`) were batched into one CTS
/// write past it. A batched write now stays within one WR's bytes.
#[test]
fn issue_13_fuzz_a_batched_cts_write_past_max_msg_sz() {
    let mut c = Case::simple((0..60).map(|_| single(64, 64)).collect());
    c.wr_bytes = 1593;
    c.recv_test_percent = 5;
    for seed in 0..20 {
        c.seed = seed;
        run_case(c.clone());
    }
}

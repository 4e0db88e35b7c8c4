//! Two endpoints of the transport's sans-IO core (a `SendCore` and a `RecvCore`) on a virtual
//! clock, joined by the in-memory NIC of `sim_net`, driven the way NCCL drives a connection
//! until every request is done or the run fails. No sockets, no threads, no verbs.
//!
//! The oracle is naive: every receive reports min(sent, posted) bytes per buffer, every byte
//! of it equals the sender's and was written exactly once, nothing is written outside what was
//! posted, every send reports the bytes it sent, and nothing is left in flight. A failing case
//! prints its seed; `SIM_SEED=n cargo test --test sim_transport seeded` replays one.

mod sim_net;

use nccl_net_ferroce::error::Error;
use nccl_net_ferroce::transport::proto::fifo::{self, CtsEntry, RING, RING_BYTES};
use nccl_net_ferroce::transport::proto::limits::MAX_DEVS;
use nccl_net_ferroce::transport::proto::plan::QpRoute;
use nccl_net_ferroce::transport::proto::recv::{Irecv, RecvBuf, RecvConfig, RecvCore, CTS_DEPTH};
use nccl_net_ferroce::transport::proto::request::{self, ReqKind};
use nccl_net_ferroce::transport::proto::send::{Isend, SendBuf, SendConfig, SendCore, SQ_DEPTH};
use nccl_net_ferroce::transport::proto::split;
use nccl_net_ferroce::transport::proto::time::Time;
use sim_net::{Fabric, Faults, RingView, Rng, Side, Wc};
use std::time::Duration;

/// One buffer of a grouped receive and the send that goes into it.
#[derive(Clone, Copy, Debug)]
struct Msg {
    posted: usize,
    sent: usize,
    tag: i32,
}

/// The shape of a connection and what goes over it.
#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    sender_devs: usize,
    receiver_devs: usize,
    qps_per_conn: usize,
    split: bool,
    ar_threshold: Option<usize>,
    inline_cts: bool,
    groups: Vec<Vec<Msg>>,
    faults: Faults,
    /// Flush (one-byte read back) after this percentage of receives.
    flush_percent: u64,
    /// How eagerly the receiver tests (percent of its turns): low keeps many in flight.
    recv_test_percent: u64,
    send_test_percent: u64,
}

impl Case {
    fn simple(groups: Vec<Vec<Msg>>) -> Case {
        Case {
            seed: 1,
            sender_devs: 1,
            receiver_devs: 1,
            qps_per_conn: 1,
            split: false,
            ar_threshold: None,
            inline_cts: false,
            groups,
            faults: Faults::default(),
            flush_percent: 0,
            recv_test_percent: 50,
            send_test_percent: 50,
        }
    }

    fn nqps(&self) -> usize {
        self.qps_per_conn * self.sender_devs.max(self.receiver_devs)
    }
}

fn fail_quietly(_: &Error) {}

/// Both ends, the fabric and the bookkeeping of a run.
struct Run {
    case: Case,
    rng: Rng,
    fab: Fabric,
    now: Time,
    send: SendCore,
    recv: RecvCore,
    fifo: usize,
    staging: usize,
    send_data: usize,
    recv_data: usize,
    scratch: usize,
    /// Offsets of each message in the data regions.
    send_off: Vec<Vec<usize>>,
    recv_off: Vec<Vec<usize>>,
    /// The sender's isends in order: (group, buffer).
    send_order: Vec<(usize, usize)>,
    next_send: usize,
    next_group: usize,
    sends: Vec<(u16, usize, usize)>,
    recvs: Vec<(u16, usize)>,
    flushes: Vec<u16>,
    sends_done: usize,
    groups_done: usize,
    truncations: usize,
}

fn routes(n: usize, local: usize, remote: usize) -> Vec<QpRoute> {
    (0..n)
        .map(|i| QpRoute {
            dev: i % local,
            remote_dev: i % remote,
        })
        .collect()
}

impl Run {
    fn new(case: Case) -> Run {
        let mut rng = Rng(case.seed);
        let nqps = case.nqps();
        let (nl, nr) = (case.sender_devs, case.receiver_devs);
        let sroutes = routes(nqps, nl, nr);
        let rroutes = routes(nqps, nr, nl);
        let mut fab = Fabric::new(sroutes.clone(), rroutes.clone(), [SQ_DEPTH, CTS_DEPTH], case.faults);
        let fifo = fab.register(Side::Sender, RING_BYTES, nl);
        let staging = fab.register(Side::Receiver, RING_BYTES, nr);
        let mut send_off = Vec::new();
        let mut recv_off = Vec::new();
        let (mut s_total, mut r_total) = (0, 0);
        for g in &case.groups {
            send_off.push(g.iter().map(|m| (s_total, s_total += m.sent).0).collect());
            recv_off.push(g.iter().map(|m| (r_total, r_total += m.posted).0).collect());
        }
        let send_data = fab.register(Side::Sender, s_total.max(1), nl);
        let recv_data = fab.register(Side::Receiver, r_total.max(1), nr);
        let scratch = fab.register(Side::Receiver, MAX_DEVS, nr);
        for b in fab.regions[send_data].bytes.iter_mut() {
            *b = rng.next() as u8;
        }
        // NCCL sends a group's messages in any order, groups in posting order.
        let mut send_order = Vec::new();
        for (g, msgs) in case.groups.iter().enumerate() {
            let mut order: Vec<usize> = (0..msgs.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            // A send matches the first unmatched buffer with its tag: with repeated tags,
            // sends of one tag go to its buffers in order.
            let mut by_tag: Vec<usize> = order.clone();
            for t in 0..order.len() {
                let tag = msgs[order[t]].tag;
                let nth = order[..t].iter().filter(|&&j| msgs[j].tag == tag).count();
                by_tag[t] = (0..msgs.len()).filter(|&j| msgs[j].tag == tag).nth(nth).expect("tag");
            }
            send_order.extend(by_tag.into_iter().map(|i| (g, i)));
        }
        let qps_per_req = split::qps_per_request(case.split, nqps, nl.max(nr));
        let send = SendCore::new(
            SendConfig {
                routes: sroutes,
                qps_per_req,
                ar_threshold: case.ar_threshold,
                landing_timeout: Duration::from_millis(100),
                fifo: fab.local_block(fifo),
                peer_records: fab.remote_block(staging, fifo::SIZES_IN_ENTRY as u64),
                peer: "the simulated receiver".into(),
            },
            fail_quietly,
        );
        let recv = RecvCore::new(
            RecvConfig {
                routes: rroutes,
                ndevs: nr,
                qps_per_req,
                staging: fab.local_block(staging),
                peer_fifo: fab.remote_block(fifo, 0),
                cts_inline_max: [if case.inline_cts { 64 } else { 0 }; MAX_DEVS],
            },
            fail_quietly,
        );
        Run {
            case,
            rng,
            fab,
            now: Time::ZERO,
            send,
            recv,
            fifo,
            staging,
            send_data,
            recv_data,
            scratch,
            send_off,
            recv_off,
            send_order,
            next_send: 0,
            next_group: 0,
            sends: Vec::new(),
            recvs: Vec::new(),
            flushes: Vec::new(),
            sends_done: 0,
            groups_done: 0,
            truncations: 0,
        }
    }

    fn finished(&self) -> bool {
        self.sends_done == self.send_order.len()
            && self.groups_done == self.case.groups.len()
            && self.flushes.is_empty()
    }

    fn msg(&self, g: usize, i: usize) -> Msg {
        self.case.groups[g][i]
    }

    /// The receiver posts its next group.
    fn try_irecv(&mut self) -> Result<Option<Irecv>, Error> {
        let g = self.next_group;
        if g >= self.case.groups.len() {
            return Ok(None);
        }
        let base = self.fab.base(self.recv_data);
        let keys = self.fab.keys(self.recv_data);
        let bufs: Vec<RecvBuf> = self.case.groups[g]
            .iter()
            .zip(&self.recv_off[g])
            .map(|(m, &off)| RecvBuf {
                data: (base + off as u64) as usize,
                size: m.posted,
                tag: m.tag,
                rkeys: keys,
            })
            .collect();
        let staging = self.staging;
        let Run { fab, recv, .. } = self;
        let Fabric { regions, queues, .. } = fab;
        let mut view = RingView {
            regions,
            region: staging,
        };
        let got = recv.irecv(&mut view, &bufs, &mut |p| queues.post(Side::Receiver, p))?;
        if let Irecv::Started(idx) = got {
            self.recvs.push((idx, g));
            self.next_group += 1;
        }
        Ok(Some(got))
    }

    /// The sender tries its next isend.
    fn try_isend(&mut self) -> Result<Option<Isend>, Error> {
        let Some(&(g, i)) = self.send_order.get(self.next_send) else {
            return Ok(None);
        };
        let m = self.msg(g, i);
        let send = SendBuf {
            data: (self.fab.base(self.send_data) + self.send_off[g][i] as u64) as usize,
            size: m.sent,
            tag: m.tag,
            lkeys: self.fab.keys(self.send_data),
        };
        let now = self.now;
        let fifo = self.fifo;
        let Run { fab, send: core, .. } = self;
        let Fabric { regions, queues, .. } = fab;
        let mut view = RingView { regions, region: fifo };
        let got = core.isend(&mut view, || now, send, &mut |p| queues.post(Side::Sender, p))?;
        if let Isend::Started { idx, truncated_to } = got {
            if let Some(t) = truncated_to {
                assert!(
                    m.sent > m.posted && t == m.posted,
                    "seed {}: truncation reported wrongly",
                    self.case.seed
                );
                self.truncations += 1;
            }
            self.sends.push((idx, g, i));
            self.next_send += 1;
        }
        Ok(Some(got))
    }

    fn sender_post_waiting(&mut self) -> Result<(), Error> {
        let fifo = self.fifo;
        let Run { fab, send, .. } = self;
        let Fabric { regions, queues, .. } = fab;
        let mut view = RingView { regions, region: fifo };
        send.post_waiting(&mut view, &mut |p| queues.post(Side::Sender, p))
    }

    /// Deliver completions to one side, as its driver's poll would.
    fn poll(&mut self, side: Side) {
        let wcs = self.fab.poll(side, 8, &mut self.rng);
        for wc in wcs {
            self.deliver(side, wc);
        }
        if side == Side::Receiver {
            for wc in self.fab.poll_flush() {
                if wc.status == sim_net::WC_SUCCESS {
                    self.recv.handle_flush_completion(wc.wr_id);
                } else {
                    self.recv
                        .state
                        .fail(Error::system(format!("flush read failed: status {}", wc.status)));
                }
            }
        }
    }

    fn deliver(&mut self, side: Side, wc: Wc) {
        if wc.status != sim_net::WC_SUCCESS {
            let e = Error::remote(format!("completion error on QP {} (status {})", wc.qp, wc.status));
            match side {
                Side::Sender => self.send.state.fail(e),
                Side::Receiver => self.recv.state.fail(e),
            };
            return;
        }
        match side {
            Side::Sender => self.send.handle_completion(wc.wr_id),
            Side::Receiver => self.recv.handle_completion(wc.wr_id, wc.imm),
        }
    }

    fn test_send(&mut self, k: usize) -> Result<(), Error> {
        self.sender_post_waiting()?;
        let (idx, g, i) = self.sends[k];
        if let Some(size) = self.send.test(idx)? {
            let m = self.msg(g, i);
            assert_eq!(
                size as usize,
                m.sent.min(m.posted),
                "seed {}: send ({g},{i}) reported size",
                self.case.seed
            );
            self.sends.swap_remove(k);
            self.sends_done += 1;
        }
        Ok(())
    }

    fn test_recv(&mut self, k: usize) -> Result<(), Error> {
        let (idx, g) = self.recvs[k];
        let staging = self.staging;
        let view = RingView {
            regions: &mut self.fab.regions,
            region: staging,
        };
        let Some(done) = self.recv.test(&view, idx)? else {
            return Ok(());
        };
        self.recvs.swap_remove(k);
        self.groups_done += 1;
        assert_eq!(
            done.n,
            self.case.groups[g].len(),
            "seed {}: group {g} buffer count",
            self.case.seed
        );
        for i in 0..done.n {
            self.check_buffer(g, i, done.sizes[i] as usize);
        }
        if self.rng.chance(self.case.flush_percent) {
            self.flush(g)?;
        }
        Ok(())
    }

    /// The oracle for one received buffer.
    fn check_buffer(&self, g: usize, i: usize, reported: usize) {
        let seed = self.case.seed;
        let m = self.msg(g, i);
        let want = m.sent.min(m.posted);
        assert_eq!(reported, want, "seed {seed}: group {g} buffer {i} reported size");
        let r = &self.fab.regions[self.recv_data];
        let s = &self.fab.regions[self.send_data];
        let (ro, so) = (self.recv_off[g][i], self.send_off[g][i]);
        assert_eq!(
            &r.bytes[ro..ro + want],
            &s.bytes[so..so + want],
            "seed {seed}: group {g} buffer {i} bytes"
        );
        if let Some(p) = r.writes[ro..ro + want].iter().position(|&w| w != 1) {
            panic!(
                "seed {seed}: group {g} buffer {i} byte {p} written {} times",
                r.writes[ro + p]
            );
        }
        if let Some(p) = r.writes[ro + want..ro + m.posted].iter().position(|&w| w != 0) {
            panic!(
                "seed {seed}: group {g} buffer {i}: byte {} past the message was written",
                want + p
            );
        }
    }

    fn flush(&mut self, g: usize) -> Result<(), Error> {
        let sizes: Vec<i32> = self.case.groups[g]
            .iter()
            .map(|m| m.sent.min(m.posted) as i32)
            .collect();
        let Some(last) = RecvCore::flush_target(&sizes) else {
            return Ok(());
        };
        if self.recv.flushes_in_flight() >= request::FLUSHES_IN_FLIGHT {
            return Ok(());
        }
        let data = (self.fab.base(self.recv_data) + self.recv_off[g][last] as u64) as usize;
        let keys = self.fab.keys(self.recv_data);
        let scratch = sim_net::scratch_sges(&self.fab, self.scratch, self.case.receiver_devs);
        let Run { fab, recv, .. } = self;
        let r = recv.iflush(data, &keys, &scratch, &mut |p| fab.queues.post(Side::Receiver, p))?;
        self.flushes.push(r);
        Ok(())
    }

    fn test_flush(&mut self, k: usize) -> Result<(), Error> {
        let staging = self.staging;
        let view = RingView {
            regions: &mut self.fab.regions,
            region: staging,
        };
        if let Some(done) = self.recv.test(&view, self.flushes[k])? {
            assert_eq!(done.n, 0, "a flush reports no sizes");
            self.flushes.swap_remove(k);
        }
        Ok(())
    }

    /// One NCCL-like turn: a random one of post, send, NIC step, poll, test.
    fn turn(&mut self) -> Result<bool, Error> {
        self.now = self.now + Duration::from_micros(1);
        let executed = self.fab.executed;
        let before = (
            self.next_group,
            self.next_send,
            self.sends_done,
            self.groups_done,
            self.flushes.len(),
        );
        match self.rng.below(8) {
            0 => {
                self.try_irecv()?;
            }
            1 => {
                self.try_isend()?;
            }
            2 | 3 => {
                self.fab.step(&mut self.rng);
            }
            4 => self.poll(Side::Sender),
            5 => self.poll(Side::Receiver),
            6 => {
                if !self.sends.is_empty() && self.rng.chance(self.case.send_test_percent) {
                    let k = self.rng.below(self.sends.len() as u64) as usize;
                    self.test_send(k)?;
                } else {
                    self.sender_post_waiting()?;
                }
            }
            _ => {
                if !self.flushes.is_empty() && self.rng.chance(30) {
                    let k = self.rng.below(self.flushes.len() as u64) as usize;
                    self.test_flush(k)?;
                } else if !self.recvs.is_empty() && self.rng.chance(self.case.recv_test_percent) {
                    let k = self.rng.below(self.recvs.len() as u64) as usize;
                    self.test_recv(k)?;
                }
            }
        }
        let after = (
            self.next_group,
            self.next_send,
            self.sends_done,
            self.groups_done,
            self.flushes.len(),
        );
        Ok(before != after || executed != self.fab.executed)
    }

    /// Drive until every request is done; panics (with the seed) on a wrong result or when
    /// nothing moves for a long time.
    fn run(&mut self) {
        let seed = self.case.seed;
        let mut idle = 0u32;
        while !self.finished() {
            match self.turn() {
                Ok(true) => idle = 0,
                Ok(false) => {
                    idle += 1;
                    // Completions may be queued or late: idle turns are normal, a long streak
                    // with nothing queued anywhere is a hang.
                    assert!(
                        idle < 20_000,
                        "seed {seed}: no progress (hang) in {:?}",
                        self.progress()
                    );
                }
                Err(e) => panic!("seed {seed}: {e} in {:?}", self.progress()),
            }
        }
        self.check_quiet();
    }

    fn progress(&self) -> String {
        format!(
            "groups posted {}/{} done {}, sends started {}/{} done {}, flushes {}",
            self.next_group,
            self.case.groups.len(),
            self.groups_done,
            self.next_send,
            self.send_order.len(),
            self.sends_done,
            self.flushes.len()
        )
    }

    /// After a clean run: nothing in flight, no receive left posted, the NIC idle, and no
    /// byte of the receive region written more than once.
    fn check_quiet(&mut self) {
        let seed = self.case.seed;
        assert_eq!(self.send.state.pool.in_flight(), 0, "seed {seed}: sends left in flight");
        assert_eq!(
            self.recv.state.pool.in_flight(),
            0,
            "seed {seed}: receives left in flight"
        );
        assert!(!self.fab.busy(), "seed {seed}: the NIC still has work");
        assert_eq!(
            self.fab.posted_receives(Side::Receiver),
            0,
            "seed {seed}: receives left posted"
        );
        let r = &self.fab.regions[self.recv_data];
        assert!(r.writes.iter().all(|&w| w <= 1), "seed {seed}: a byte written twice");
        assert_eq!(self.fab.posted_receives(Side::Sender), 0);
    }
}

/// Run a case; a panic names its seed.
fn run_case(case: Case) -> Run {
    let seed = case.seed;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut r = Run::new(case);
        r.run();
        r
    }));
    match result {
        Ok(r) => r,
        Err(p) => {
            eprintln!("sim_transport: failing seed {seed} (replay: SIM_SEED={seed} cargo test --release --test sim_transport seeded)");
            std::panic::resume_unwind(p)
        }
    }
}

/// A random case for `seed`: 1–3 devices each side, 1–4 QPs per connection, split or not,
/// AR or not, inline CTS or not, groups of 1–8 with sizes from 0 to 64 KiB, some sends larger
/// than their buffer, some repeated tags, torn writes and late completions.
fn random_case(seed: u64) -> Case {
    let mut rng = Rng(seed ^ 0x5eed_0000);
    let ngroups = rng.range(1, 40);
    let size = |rng: &mut Rng| match rng.below(6) {
        0 => 0,
        1 => rng.range(1, 200),
        2 => rng.range(1, 8) * 128,
        _ => rng.range(0, 64 << 10),
    };
    let groups = (0..ngroups)
        .map(|_| {
            let n = if rng.chance(50) { 1 } else { rng.range(2, 8) };
            (0..n)
                .map(|i| {
                    let posted = size(&mut rng);
                    let sent = if rng.chance(10) {
                        size(&mut rng)
                    } else {
                        rng.range(0, posted)
                    };
                    let tag = if rng.chance(10) { 7 } else { i as i32 * 3 + 1 };
                    Msg { posted, sent, tag }
                })
                .collect()
        })
        .collect();
    Case {
        seed,
        sender_devs: rng.range(1, 3),
        receiver_devs: rng.range(1, 3),
        qps_per_conn: rng.range(1, 4),
        split: rng.chance(50),
        ar_threshold: rng.chance(30).then(|| rng.range(0, 8192)),
        inline_cts: rng.chance(30),
        groups,
        faults: Faults {
            torn_writes: rng.below(30),
            late_completions: rng.below(30),
        },
        flush_percent: rng.below(40),
        recv_test_percent: rng.range(5, 90) as u64,
        send_test_percent: rng.range(5, 90) as u64,
    }
}

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
}

/// One isend of 8 bytes with tag 1 straight into the sender's core (past the case's own).
fn probe_isend(r: &mut Run) -> Result<Isend, Error> {
    let send = SendBuf {
        data: r.fab.base(r.send_data) as usize,
        size: 8,
        tag: 1,
        lkeys: r.fab.keys(r.send_data),
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
    // Every receive the core posted completes, as if the sender's writes had landed.
    for wr_id in r.fab.queues.take_receives(Side::Receiver) {
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

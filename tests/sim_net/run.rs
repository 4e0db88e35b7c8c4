//! The two-endpoint run the simulation tests and the `transport_core` fuzz target share: a
//! [`Case`] (the connection's shape and the messages), a [`Run`] that drives a `SendCore` and a
//! `RecvCore` over the [`Fabric`] the way NCCL drives a connection, and the oracle it checks
//! (every receive reports min(sent, posted) bytes per buffer, every byte equals the sender's
//! and was written exactly once, nothing past the message is written, every send reports the
//! bytes it sent, nothing is left in flight). Every choice comes from the run's [`Rng`]: a seed
//! replays a case, a fuzzer's bytes steer one. Failures panic with the seed.

use super::{Fabric, Faults, RingView, Rng, Side, Wc};
use nccl_net_ferroce::error::Error;
use nccl_net_ferroce::transport::proto::eager::{self, EagerSendConfig};
use nccl_net_ferroce::transport::proto::fifo::{self, RING_BYTES};
use nccl_net_ferroce::transport::proto::limits::{self, MAX_DEVS};
use nccl_net_ferroce::transport::proto::plan::QpRoute;
use nccl_net_ferroce::transport::proto::recovery::{Action, Recovery, Role};
use nccl_net_ferroce::transport::proto::recv::{
    EagerRecvConfig, Irecv, RecvBuf, RecvConfig, RecvCore, CTS_DEPTH, RQ_BATCH,
};
use nccl_net_ferroce::transport::proto::request;
use nccl_net_ferroce::transport::proto::send::{Isend, PeerClose, SendBuf, SendConfig, SendCore, SQ_DEPTH};
use nccl_net_ferroce::transport::proto::split;
use nccl_net_ferroce::transport::proto::time::Time;
use std::collections::VecDeque;
use std::time::Duration;

/// A recovery message on the side channel (`proto::recovery`): the Hello carries the side's
/// report (the receiver's completions taken per QP, the sender's next FIFO entry).
#[derive(Clone, Debug)]
pub enum ChanMsg {
    Hello { epoch: u32, taken: Vec<u64>, head: u64 },
    Ready { epoch: u32 },
}

/// How a run recovers from QP failures: both ends' [`Recovery`], the side channel between
/// them, and what the oracle must allow (bytes of an unfinished message written again).
pub struct Recovering {
    pub ends: [Recovery; 2],
    /// Messages on their way to each side.
    pub inbox: [VecDeque<ChanMsg>; 2],
    /// Every message delivered so far, for duplicates.
    pub delivered: [Vec<ChanMsg>; 2],
    /// The peer's last Hello each side got.
    pub hello: [Option<ChanMsg>; 2],
    /// Percent of channel deliveries that repeat an earlier message instead.
    pub duplicate_percent: u64,
    /// The side channel closed (a peer died): both ends fail.
    pub closed: bool,
    /// Chains replayed and CTS entries written again, over the run.
    pub replayed_chains: usize,
    pub landed_unacked: usize,
    pub cts_rewritten: usize,
    /// Called at every Rebuild (side, epoch): a test injects faults during a recovery.
    pub on_rebuild: Option<fn(&mut Run, Side, u32)>,
    /// The next this many messages either side sends are lost (a peer that missed them).
    pub lose_messages: u32,
    /// The sender's member devices whose ports are down (a test's rebuild hook places no QP
    /// there).
    pub sender_members_down: Vec<usize>,
}

impl Recovering {
    /// `side` sends `msg` to its peer (unless it is one of the messages to lose).
    fn send_message(&mut self, side: Side, msg: ChanMsg) {
        if self.lose_messages > 0 {
            self.lose_messages -= 1;
            return;
        }
        self.inbox[side.peer().index()].push_back(msg);
    }
}

/// One buffer of a grouped receive and the send that goes into it.
#[derive(Clone, Copy, Debug)]
pub struct Msg {
    pub posted: usize,
    pub sent: usize,
    pub tag: i32,
}

/// The shape of a connection and what goes over it.
#[derive(Clone, Debug)]
pub struct Case {
    pub seed: u64,
    pub sender_devs: usize,
    pub receiver_devs: usize,
    pub qps_per_conn: usize,
    pub split: bool,
    pub ar_threshold: Option<usize>,
    pub inline_cts: bool,
    /// `max_msg_sz` of both sides' devices: chunks past it go in several WRs.
    pub wr_bytes: usize,
    pub groups: Vec<Vec<Msg>>,
    pub faults: Faults,
    /// Flush (one-byte read back) after this percentage of receives.
    pub flush_percent: u64,
    /// How eagerly the receiver tests (percent of its turns): low keeps many in flight.
    pub recv_test_percent: u64,
    pub send_test_percent: u64,
    /// The eager path: the largest payload sent eagerly (0: off, as on a version-4 connection),
    /// the eager QP's inline bytes (below header + payload: the payload goes in its own write),
    /// and the percentage of receives posted into GPU memory (an eager claim on them is refused).
    pub eager_max: usize,
    pub eager_inline: usize,
    pub gpu_percent: u64,
    /// Completions name their receive (a version-5 connection; the eager path needs it).
    pub named_imm: bool,
    /// The receiver posts a group only while fewer than this many are posted and not done,
    /// as NCCL's proxy posts a step's receive only after an earlier step's completed (0: no
    /// limit).
    pub recv_window: usize,
    /// The sender's buffers are a GPU's memory (only the NIC reads them: never inline).
    pub send_gpu: bool,
}

impl Case {
    pub fn simple(groups: Vec<Vec<Msg>>) -> Case {
        Case {
            seed: 1,
            sender_devs: 1,
            receiver_devs: 1,
            qps_per_conn: 1,
            split: false,
            ar_threshold: None,
            inline_cts: false,
            wr_bytes: limits::MAX_WR_BYTES,
            groups,
            faults: Faults::default(),
            flush_percent: 0,
            recv_test_percent: 50,
            send_test_percent: 50,
            eager_max: 0,
            eager_inline: 256,
            gpu_percent: 0,
            named_imm: true,
            recv_window: 0,
            send_gpu: false,
        }
    }

    pub fn nqps(&self) -> usize {
        self.qps_per_conn * self.sender_devs.max(self.receiver_devs)
    }
}

pub fn fail_quietly(_: &Error) {}

/// Both ends, the fabric and the bookkeeping of a run.
pub struct Run {
    pub case: Case,
    pub rng: Rng,
    pub fab: Fabric,
    pub now: Time,
    pub send: SendCore,
    pub recv: RecvCore,
    pub fifo: usize,
    pub staging: usize,
    pub send_data: usize,
    pub recv_data: usize,
    pub scratch: usize,
    /// Offsets of each message in the data regions.
    pub send_off: Vec<Vec<usize>>,
    pub recv_off: Vec<Vec<usize>>,
    /// The sender's isends in order: (group, buffer).
    pub send_order: Vec<(usize, usize)>,
    pub next_send: usize,
    pub next_group: usize,
    pub sends: Vec<(u16, usize, usize)>,
    pub recvs: Vec<(u16, usize)>,
    pub flushes: Vec<u16>,
    pub sends_done: usize,
    pub groups_done: usize,
    pub truncations: usize,
    /// Sends that went eagerly.
    pub eager_sends: usize,
    /// Set: QP failures are recovered from instead of failing the comm.
    pub recovery: Option<Recovering>,
    /// Per finished receive buffer: its range in the receive region and the write counts it
    /// had when its request was reported done (nothing may write there afterwards).
    pub finished_writes: Vec<(usize, Vec<u16>)>,
}

pub fn routes(n: usize, local: usize, remote: usize) -> Vec<QpRoute> {
    (0..n)
        .map(|i| QpRoute {
            dev: i % local,
            remote_dev: i % remote,
        })
        .collect()
}

impl Run {
    pub fn new(case: Case) -> Run {
        let seed = case.seed;
        Run::with_rng(case, Rng::new(seed))
    }

    /// A run whose every choice comes from `rng`.
    pub fn with_rng(case: Case, mut rng: Rng) -> Run {
        let nqps = case.nqps();
        let (nl, nr) = (case.sender_devs, case.receiver_devs);
        let sroutes = routes(nqps, nl, nr);
        let rroutes = routes(nqps, nr, nl);
        let mut fab = Fabric::new(sroutes.clone(), rroutes.clone(), [SQ_DEPTH, CTS_DEPTH], case.faults);
        fab.queues.max_msg = case.wr_bytes;
        let fifo = fab.register(Side::Sender, RING_BYTES, nl);
        // The staging ring, then (as the driver lays it out) the eager landing ring.
        let staging = fab.register(Side::Receiver, RING_BYTES + eager::ring_bytes(case.eager_max), nr);
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
        fab.regions[send_data].cpu = !case.send_gpu;
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
                local_devs: nl,
                peer_devs: nr,
                qps_per_req,
                ar_threshold: case.ar_threshold,
                landing_timeout: Duration::from_millis(100),
                wr_bytes: case.wr_bytes,
                fifo: fab.local_block(fifo),
                peer_records: fab.remote_block(staging, fifo::SIZES_IN_ENTRY as u64),
                peer: "the simulated receiver".into(),
                eager: (case.eager_max > 0).then(|| EagerSendConfig {
                    max: case.eager_max,
                    inline_max: case.eager_inline,
                    landing: fab.remote_block(staging, RING_BYTES as u64).addr,
                    landing_rkeys: fab.remote_block(staging, 0).rkeys,
                    slot_bytes: eager::slot_bytes(case.eager_max),
                }),
                named_imm: case.named_imm,
            },
            fail_quietly,
        );
        let recv = RecvCore::new(
            RecvConfig {
                routes: rroutes,
                cts_qps: nr.min(nqps),
                qps_per_req,
                staging: fab.local_block(staging),
                peer_fifo: fab.remote_block(fifo, 0),
                cts_inline_max: [if case.inline_cts { 64 } else { 0 }; MAX_DEVS],
                max_buffer_bytes: split::max_buffer_bytes(case.wr_bytes),
                wr_bytes: case.wr_bytes,
                peer: "the simulated sender".into(),
                eager: (case.eager_max > 0).then(|| EagerRecvConfig {
                    landing: fab.base(staging) + RING_BYTES as u64,
                    slot_bytes: eager::slot_bytes(case.eager_max),
                    max: case.eager_max,
                }),
                named_imm: case.named_imm,
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
            eager_sends: 0,
            recovery: None,
            finished_writes: Vec::new(),
        }
    }

    /// Recover from QP failures, bounded by `timeout` of virtual time.
    pub fn enable_recovery(&mut self, timeout: Duration, duplicate_percent: u64) {
        self.recovery = Some(Recovering {
            ends: [
                Recovery::new(Role::Sender, timeout, "the simulated receiver".into()),
                Recovery::new(Role::Receiver, timeout, "the simulated sender".into()),
            ],
            inbox: [VecDeque::new(), VecDeque::new()],
            delivered: [Vec::new(), Vec::new()],
            hello: [None, None],
            duplicate_percent,
            closed: false,
            replayed_chains: 0,
            landed_unacked: 0,
            cts_rewritten: 0,
            on_rebuild: None,
            lose_messages: 0,
            sender_members_down: Vec::new(),
        });
    }

    fn fail_side(&mut self, side: Side, e: Error) {
        match side {
            Side::Sender => self.send.state.fail(e),
            Side::Receiver => self.recv.state.fail(e),
        };
    }

    /// Carry out what `side`'s recovery asks, and what that leads to.
    pub fn act(&mut self, side: Side, actions: Vec<Action>) {
        let mut todo: VecDeque<Action> = actions.into();
        while let Some(a) = todo.pop_front() {
            let Some(rc) = self.recovery.as_mut() else { return };
            if rc.closed {
                return;
            }
            match a {
                Action::Pause => match side {
                    Side::Sender => self.send.begin_recovery(),
                    Side::Receiver => self.recv.begin_recovery(),
                },
                Action::Rebuild { epoch } => {
                    match side {
                        Side::Sender => self.send.begin_recovery(),
                        Side::Receiver => self.recv.begin_recovery(),
                    }
                    // The receiver takes every completion of its old QPs before it destroys
                    // them (the driver moves them to ERR and polls until each posted receive
                    // flushed): a message the sender saw acknowledged is one it reports taken.
                    // The sender may leave its completions behind: what it did not take, the
                    // receiver's report settles.
                    if side == Side::Receiver || self.rng.chance(50) {
                        for wc in self.fab.drain_cq(side) {
                            if wc.status == super::WC_SUCCESS && wc.gen == self.fab.queues.gen[side.index()][wc.qp] {
                                self.handle_ok(side, wc);
                            }
                        }
                    }
                    self.fab.replace_qps(side, epoch);
                    if side == Side::Receiver {
                        let Run { fab, recv, .. } = self;
                        if recv
                            .repost_receives(&mut |p| fab.queues.post(Side::Receiver, p))
                            .is_err()
                        {
                            continue;
                        }
                    }
                    if let Some(hook) = self.recovery.as_ref().and_then(|r| r.on_rebuild) {
                        hook(self, side, epoch);
                    }
                    let Some(rc) = self.recovery.as_mut() else { return };
                    todo.extend(rc.ends[side.index()].rebuilt(epoch));
                }
                Action::SendHello { epoch } => {
                    let msg = ChanMsg::Hello {
                        epoch,
                        taken: self.recv.taken(),
                        head: self.send.fifo_head(),
                    };
                    rc.send_message(side, msg);
                }
                Action::Connect { epoch } => {
                    // The new QPs sit where the Hellos say (a failover may have moved them).
                    let moved = match side {
                        Side::Sender => self.send.reroute(self.fab.routes(Side::Sender)),
                        Side::Receiver => self.recv.reroute(self.fab.routes(Side::Receiver)),
                    };
                    if let Err(e) = moved {
                        self.fail_side(side, e);
                        continue;
                    }
                    let Some(rc) = self.recovery.as_mut() else { return };
                    todo.extend(rc.ends[side.index()].connected(epoch))
                }
                Action::SendReady { epoch } => rc.send_message(side, ChanMsg::Ready { epoch }),
                Action::Resume { epoch } => {
                    let Some(ChanMsg::Hello { epoch: e, taken, head }) = rc.hello[side.index()].clone() else {
                        panic!(
                            "seed {}: {side:?} resumes epoch {epoch} without the peer's Hello",
                            self.case.seed
                        );
                    };
                    assert_eq!(
                        e, epoch,
                        "seed {}: {side:?} resumes with another epoch's report",
                        self.case.seed
                    );
                    let fifo = self.fifo;
                    let Run { fab, send, recv, .. } = self;
                    let Fabric { regions, queues, .. } = fab;
                    match side {
                        Side::Sender => {
                            let view = RingView { regions, region: fifo };
                            if let Ok(r) = send.resume(&view, &taken, &mut |p| queues.post(Side::Sender, p)) {
                                if let Some(rc) = self.recovery.as_mut() {
                                    rc.replayed_chains += r.chains;
                                    rc.landed_unacked += r.landed;
                                }
                            }
                        }
                        Side::Receiver => {
                            if let Ok(n) = recv.resume(head, &mut |p| queues.post(Side::Receiver, p)) {
                                if let Some(rc) = self.recovery.as_mut() {
                                    rc.cts_rewritten += n;
                                }
                                todo.extend(self.check_landed());
                            }
                        }
                    }
                }
                Action::Fail(e) => self.fail_side(side, e),
            }
        }
    }

    /// The receiver's recovery learns that its CTS rewrites landed (after each poll).
    fn check_landed(&mut self) -> Vec<Action> {
        let Some(rc) = self.recovery.as_mut() else {
            return Vec::new();
        };
        let end = &mut rc.ends[Side::Receiver.index()];
        if end.landing() && self.recv.rewrites_landed() {
            let epoch = end.epoch();
            return end.landed(epoch);
        }
        Vec::new()
    }

    /// Deliver the next side-channel message to `side` (or, sometimes, one it already had);
    /// false when there was none.
    pub fn deliver_message(&mut self, side: Side) -> bool {
        let Some(rc) = self.recovery.as_mut() else { return false };
        let s = side.index();
        let msg = if !rc.delivered[s].is_empty() && self.rng.chance(rc.duplicate_percent) {
            let k = self.rng.below(rc.delivered[s].len() as u64) as usize;
            rc.delivered[s][k].clone()
        } else if let Some(m) = rc.inbox[s].pop_front() {
            rc.delivered[s].push(m.clone());
            m
        } else {
            return false;
        };
        let now = self.now;
        let actions = match msg {
            ChanMsg::Hello { epoch, .. } => {
                let newer = match &rc.hello[s] {
                    Some(ChanMsg::Hello { epoch: e, .. }) => epoch > *e,
                    _ => true,
                };
                if newer {
                    rc.hello[s] = Some(msg.clone());
                }
                rc.ends[s].peer_hello(now, epoch)
            }
            ChanMsg::Ready { epoch } => rc.ends[s].peer_ready(epoch),
        };
        self.act(side, actions);
        true
    }

    /// `side`'s driver starts a recovery without a failed completion (a port event, a
    /// fused device's member back for a failback): `cause` in words.
    pub fn local_event(&mut self, side: Side, cause: &str) {
        let now = self.now;
        let Some(rc) = self.recovery.as_mut() else { return };
        let actions = rc.ends[side.index()].local_failure(now, cause);
        self.act(side, actions);
    }

    /// The peer died: its side channel closed. Both ends fail, as the driver's read of the
    /// side channel does.
    pub fn close_channel(&mut self) {
        if let Some(rc) = self.recovery.as_mut() {
            rc.closed = true;
        }
        self.send
            .state
            .fail(Error::remote("the side channel closed (peer gone)"));
        self.recv
            .state
            .fail(Error::remote("the side channel closed (peer gone)"));
    }

    fn handle_ok(&mut self, side: Side, wc: Wc) {
        match side {
            Side::Sender => self.send.handle_completion(wc.wr_id),
            Side::Receiver => self.recv.handle_completion(wc.wr_id, wc.imm),
        }
    }

    pub fn finished(&self) -> bool {
        self.sends_done == self.send_order.len()
            && self.groups_done == self.case.groups.len()
            && self.flushes.is_empty()
    }

    pub fn msg(&self, g: usize, i: usize) -> Msg {
        self.case.groups[g][i]
    }

    /// The receiver posts its next group.
    pub fn try_irecv(&mut self) -> Result<Option<Irecv>, Error> {
        let g = self.next_group;
        if g >= self.case.groups.len() || (self.case.recv_window > 0 && g >= self.groups_done + self.case.recv_window) {
            return Ok(None);
        }
        let base = self.fab.base(self.recv_data);
        let keys = self.fab.keys(self.recv_data);
        let host = !self.rng.chance(self.case.gpu_percent);
        let bufs: Vec<RecvBuf> = self.case.groups[g]
            .iter()
            .zip(&self.recv_off[g])
            .map(|(m, &off)| RecvBuf {
                data: (base + off as u64) as usize,
                size: m.posted,
                tag: m.tag,
                rkeys: keys,
                host,
            })
            .collect();
        let staging = self.staging;
        let Run { fab, recv, .. } = self;
        let Fabric { regions, queues, .. } = fab;
        let mut view = RingView {
            regions,
            region: staging,
        };
        let got = recv.irecv(&mut view, &bufs, &mut |p| queues.post(Side::Receiver, p));
        self.fab.apply_deliveries();
        let got = got?;
        if let Irecv::Started(idx) = got {
            self.recvs.push((idx, g));
            self.next_group += 1;
        }
        Ok(Some(got))
    }

    /// The sender tries its next isend.
    pub fn try_isend(&mut self) -> Result<Option<Isend>, Error> {
        let Some(&(g, i)) = self.send_order.get(self.next_send) else {
            return Ok(None);
        };
        let m = self.msg(g, i);
        let send = SendBuf {
            data: (self.fab.base(self.send_data) + self.send_off[g][i] as u64) as usize,
            size: m.sent,
            tag: m.tag,
            lkeys: self.fab.keys(self.send_data),
            host: !self.case.send_gpu,
        };
        let now = self.now;
        let fifo = self.fifo;
        let Run { fab, send: core, .. } = self;
        let Fabric { regions, queues, .. } = fab;
        let mut view = RingView { regions, region: fifo };
        let got = core.isend(&mut view, || now, send, &mut |p| queues.post(Side::Sender, p))?;
        if let Isend::Started {
            idx,
            truncated_to,
            eager,
        } = got
        {
            self.eager_sends += usize::from(eager);
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

    pub fn sender_post_waiting(&mut self) -> Result<(), Error> {
        let fifo = self.fifo;
        let now = self.now;
        let Run { fab, send, .. } = self;
        let Fabric { regions, queues, .. } = fab;
        let mut view = RingView { regions, region: fifo };
        send.progress(&mut view, || now, &mut |p| queues.post(Side::Sender, p))
    }

    /// The receiver closes (wire version 7): its report reaches the sender, which settles its
    /// sends by it; the chains that landed without their acknowledgement here.
    pub fn receiver_closes(&mut self) -> Result<usize, Error> {
        let (receives, in_flight, taken) = self.recv.close_report();
        let fifo = self.fifo;
        let Run { fab, send, .. } = self;
        let view = RingView {
            regions: &mut fab.regions,
            region: fifo,
        };
        send.handle_peer_close(&view, PeerClose { receives, in_flight }, &taken)
    }

    /// The receiver decides the eager messages that arrived, as its driver does after a poll.
    pub fn receiver_decide_eager(&mut self) {
        let staging = self.staging;
        let Run { fab, recv, .. } = self;
        let Fabric { regions, queues, .. } = fab;
        let view = RingView {
            regions,
            region: staging,
        };
        let _ = recv.decide_eager(&view, &mut |p| queues.post(Side::Receiver, p));
        self.fab.apply_deliveries();
    }

    /// Deliver completions to one side, as its driver's poll would.
    pub fn poll(&mut self, side: Side) {
        // As the driver does: every completion of the batch is taken in order, and a failure
        // among them acted on after it (a recovery begun mid-batch would drain the CQ past the
        // completions still in the batch, and take them out of their QP's order).
        let wcs = self.fab.poll(side, 8, &mut self.rng);
        let mut failure = None;
        for wc in wcs {
            if let Some(cause) = self.deliver(side, wc) {
                failure.get_or_insert(cause);
            }
        }
        if let Some(cause) = failure {
            self.failed_completion(side, cause);
        }
        if side == Side::Receiver {
            self.receiver_decide_eager();
            let actions = self.check_landed();
            self.act(Side::Receiver, actions);
            for wc in self.fab.poll_flush() {
                if wc.status == super::WC_SUCCESS {
                    self.recv.handle_flush_completion(wc.wr_id);
                } else {
                    self.recv
                        .state
                        .fail(Error::system(format!("flush read failed: status {}", wc.status)));
                }
            }
        }
    }

    /// Take one completion; a failed one is returned as its cause, for after the batch.
    pub fn deliver(&mut self, side: Side, wc: Wc) -> Option<String> {
        // A completion of a QP that was replaced: the driver tells it by its QP number.
        if wc.gen != self.fab.queues.gen[side.index()][wc.qp] {
            return None;
        }
        if wc.status != super::WC_SUCCESS {
            return Some(format!("completion error on QP {} (status {})", wc.qp, wc.status));
        }
        if let Some(rc) = self.recovery.as_mut() {
            rc.ends[side.index()].progressed();
        }
        self.handle_ok(side, wc);
        None
    }

    /// A failed completion: a recovery starts, or without one the comm fails.
    fn failed_completion(&mut self, side: Side, cause: String) {
        if let Some(rc) = self.recovery.as_mut() {
            let actions = rc.ends[side.index()].local_failure(self.now, &cause);
            self.act(side, actions);
            return;
        }
        self.fail_side(side, Error::remote(cause));
    }

    pub fn test_send(&mut self, k: usize) -> Result<(), Error> {
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

    /// The receiver writes the CTS entries it staged, as its driver does in every test.
    pub fn receiver_flush_cts(&mut self) -> Result<(), Error> {
        let Run { fab, recv, .. } = self;
        recv.flush_cts(&mut |p| fab.queues.post(Side::Receiver, p))
    }

    pub fn test_recv(&mut self, k: usize) -> Result<(), Error> {
        self.receiver_flush_cts()?;
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
            let ro = self.recv_off[g][i];
            let posted = self.msg(g, i).posted;
            self.finished_writes
                .push((ro, self.fab.regions[self.recv_data].writes[ro..ro + posted].to_vec()));
        }
        if self.rng.chance(self.case.flush_percent) {
            self.flush(g)?;
        }
        Ok(())
    }

    /// The oracle for one received buffer.
    pub fn check_buffer(&self, g: usize, i: usize, reported: usize) {
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
        // With recovery a message that had not completed may be written again (its request
        // was not done, so NCCL did not look); never after it completed (checked at the end).
        let once = self.recovery.is_none();
        if let Some(p) = r.writes[ro..ro + want].iter().position(|&w| w == 0 || (once && w != 1)) {
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

    pub fn flush(&mut self, g: usize) -> Result<(), Error> {
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
        let scratch = super::scratch_sges(&self.fab, self.scratch, self.case.receiver_devs);
        let Run { fab, recv, .. } = self;
        let r = recv.iflush(data, &keys, &scratch, &mut |p| fab.queues.post(Side::Receiver, p))?;
        self.flushes.push(r);
        Ok(())
    }

    pub fn test_flush(&mut self, k: usize) -> Result<(), Error> {
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
    pub fn turn(&mut self) -> Result<bool, Error> {
        self.now = self.now + Duration::from_micros(1);
        if self.recovery.is_some() {
            for side in [Side::Sender, Side::Receiver] {
                let now = self.now;
                let actions = self
                    .recovery
                    .as_mut()
                    .map_or(Vec::new(), |rc| rc.ends[side.index()].tick(now));
                self.act(side, actions);
            }
            if self.rng.chance(15) {
                let side = if self.rng.chance(50) {
                    Side::Sender
                } else {
                    Side::Receiver
                };
                return Ok(self.deliver_message(side));
            }
        }
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
    pub fn run(&mut self) {
        let seed = self.case.seed;
        let mut idle = 0u32;
        while !self.finished() {
            match self.turn() {
                Ok(true) => idle = 0,
                Ok(false) if self.recovering_now() => {
                    // A recovery waits for its backoff: let virtual time pass.
                    self.now = self.now + Duration::from_millis(1);
                }
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

    /// Whether either end is in a recovery.
    pub fn recovering_now(&self) -> bool {
        self.recovery
            .as_ref()
            .is_some_and(|rc| !rc.closed && rc.ends.iter().any(|e| e.active()))
    }

    pub fn progress(&self) -> String {
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
    pub fn check_quiet(&mut self) {
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
            self.recv.spare_receives(),
            "seed {seed}: receives left posted besides the ones posted ahead"
        );
        // The eager QP keeps a receive to spare for every eager message the credit allows, and
        // the receives of a group an eager message filled (one per QP it spans) are spare again.
        let eager_spare = if self.case.eager_max > 0 && self.case.named_imm {
            eager::SLOTS + self.recv.eager_counts().bound as usize * self.case.nqps()
        } else {
            0
        };
        assert!(
            self.recv.spare_receives() <= self.case.nqps() * RQ_BATCH + eager_spare,
            "seed {seed}: at most a batch posted ahead per QP (and the eager QP's credit): {} spare on {} QPs, eager {:?} ({})",
            self.recv.spare_receives(),
            self.case.nqps(),
            self.recv.eager_counts(),
            self.case.eager_max
        );
        let r = &self.fab.regions[self.recv_data];
        if self.recovery.is_none() {
            assert!(r.writes.iter().all(|&w| w <= 1), "seed {seed}: a byte written twice");
        }
        for (ro, snapshot) in &self.finished_writes {
            assert_eq!(
                &r.writes[*ro..ro + snapshot.len()],
                &snapshot[..],
                "seed {seed}: a receive buffer at {ro} was written after its request completed"
            );
        }
        assert_eq!(self.fab.posted_receives(Side::Sender), 0);
    }
}

/// Run a case; a panic names its seed.
pub fn run_case(case: Case) -> Run {
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
/// AR or not, inline CTS or not, devices whose WRs carry 9–16 KiB or 1 GiB, groups of 1–8 with
/// sizes from 0 to 64 KiB, some sends larger than their buffer, some repeated tags, torn writes
/// and late completions; the eager path on (of 8 B – 4 KiB, inline or not) or off, some
/// receives into GPU memory.
pub fn random_case(seed: u64) -> Case {
    case_from(seed, &mut Rng::new(seed ^ 0x5eed_0000))
}

/// The case [`random_case`] describes, its choices drawn from `rng`.
pub fn case_from(seed: u64, rng: &mut Rng) -> Case {
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
                    let posted = size(rng);
                    let sent = if rng.chance(10) {
                        size(rng)
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
        // Devices whose WRs carry as little as 1/7 of the largest buffer (64 KiB): chunks go
        // in up to 7 pieces, groups in chains of up to 57 WRs. Pieces are whole CHUNK_ALIGN
        // units, so the smallest such device is the one whose 7 aligned pieces hold 64 KiB.
        wr_bytes: if rng.chance(40) {
            let unit = limits::PIECES_PER_BUFFER * split::CHUNK_ALIGN;
            rng.range((64usize << 10).div_ceil(unit) * split::CHUNK_ALIGN, 16 << 10)
        } else {
            limits::MAX_WR_BYTES
        },
        groups,
        faults: Faults {
            torn_writes: rng.below(30),
            late_completions: rng.below(30),
        },
        flush_percent: rng.below(40),
        recv_test_percent: rng.range(5, 90) as u64,
        send_test_percent: rng.range(5, 90) as u64,
        // Drawn last, so the choices above stay what earlier seeds made them.
        eager_max: if rng.chance(70) {
            [8, 64, 224, 1000, 4064][rng.below(5) as usize]
        } else {
            0
        },
        eager_inline: if rng.chance(30) { 64 } else { 256 },
        gpu_percent: if rng.chance(30) { rng.below(60) } else { 0 },
        named_imm: !rng.chance(20),
        recv_window: if rng.chance(30) { rng.range(1, 4) } else { 0 },
        send_gpu: rng.chance(25),
    }
}

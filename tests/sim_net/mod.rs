//! A simulated RDMA fabric for the transport's sans-IO core: a sender core and a receiver core
//! joined by an in-memory NIC that executes their plans (RDMA WRITE, WRITE WITH IMMEDIATE,
//! READ) on byte buffers, on a virtual clock, with seeded faults. Everything is deterministic
//! for a seed.
//!
//! The NIC keeps RC's promises and no more: work requests of one QP execute in order, QPs
//! interleave at random, a write's bytes may land in two pieces with the peer looking in
//! between (a torn write), completions are delivered late and in bursts; a signaled completion
//! comes only after its write landed. Keys are checked like a NIC does: a key names one region
//! on one member device, and an access outside the region or with a key of another device is
//! a remote (or local) access error that moves the QP to the error state and flushes the rest.
#![allow(dead_code)]

use nccl_net_ferroce::error::Error;
use nccl_net_ferroce::transport::proto::eager;
use nccl_net_ferroce::transport::proto::fifo::{self, CtsEntry, RING_BYTES};
use nccl_net_ferroce::transport::proto::limits::{MAX_CHAIN, MAX_DEVS};
use nccl_net_ferroce::transport::proto::plan::{LocalBlock, Op, Post, QpRoute, RemoteBlock, Sge, WorkRequest};
use nccl_net_ferroce::transport::proto::recv::{StagingRing, RQ_DEPTH};
use nccl_net_ferroce::transport::proto::send::FifoRing;
use std::collections::VecDeque;

pub mod run;

/// Every choice of a simulation: splitmix64 from a seed, or (for a fuzzer) the input's bytes
/// first, 8 per draw, then splitmix64 from what they left, so any input ends in a full run.
pub struct Rng {
    state: u64,
    steer: Vec<u8>,
    used: usize,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng {
            state: seed,
            steer: Vec::new(),
            used: 0,
        }
    }

    /// Draws come from `bytes` (little-endian, 8 at a time) while they last.
    pub fn steered(bytes: &[u8]) -> Rng {
        Rng {
            state: bytes.len() as u64,
            steer: bytes.to_vec(),
            used: 0,
        }
    }

    pub fn next(&mut self) -> u64 {
        if self.used < self.steer.len() {
            let end = (self.used + 8).min(self.steer.len());
            let mut word = [0u8; 8];
            word[..end - self.used].copy_from_slice(&self.steer[self.used..end]);
            self.used = end;
            let v = u64::from_le_bytes(word);
            self.state ^= v;
            return v;
        }
        // splitmix64
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo + 1) as u64) as usize
    }
}

/// The two ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    Sender,
    Receiver,
}

impl Side {
    pub fn peer(self) -> Side {
        match self {
            Side::Sender => Side::Receiver,
            Side::Receiver => Side::Sender,
        }
    }
    pub fn index(self) -> usize {
        self as usize
    }
}

/// `ibv_wc_status` values the simulated NIC reports.
pub const WC_SUCCESS: u32 = 0;
pub const WC_LOC_PROT_ERR: u32 = 4;
pub const WC_WR_FLUSH_ERR: u32 = 5;
pub const WC_REM_ACCESS_ERR: u32 = 10;
pub const WC_RETRY_EXC_ERR: u32 = 12;

/// A registered region of one side, with a key per member device of that side and a count of
/// the writes each byte took.
pub struct Region {
    pub side: Side,
    pub base: u64,
    pub bytes: Vec<u8>,
    pub writes: Vec<u16>,
    pub ndevs: usize,
    /// Host memory the CPU may read; false for a GPU's, which only the NIC's DMA reaches (an
    /// inline WR's payload is copied by the CPU at the post).
    pub cpu: bool,
}

/// The key of region `r` on member device `dev`.
pub fn key(r: usize, dev: usize) -> u32 {
    (((r + 1) as u32) << 8) | dev as u32
}

/// A completion as the NIC reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub imm: Option<u32>,
    pub qp: usize,
    /// The generation of the QP it came from ([`Fabric::replace_qps`]): a driver tells a
    /// completion of a destroyed QP by its QP number.
    pub gen: u32,
}

/// A piece of a write that has landed partly: the rest lands later.
struct Torn {
    dst_region: usize,
    dst_off: usize,
    rest: Vec<u8>,
}

struct Qp {
    sq: VecDeque<WorkRequest>,
    /// Posted WRs whose send-queue slot is not free yet (signaled flag of each): a slot is
    /// freed when the completion of a signaled WR at or after it is polled, as on a NIC.
    unretired: VecDeque<bool>,
    rq: VecDeque<u64>,
    /// A write of this QP half landed: the next step finishes it before anything else.
    torn: Option<(Torn, Option<WorkRequest>)>,
    failed: bool,
    /// Inject this status on the next executed WR.
    fail_next: Option<u32>,
}

impl Qp {
    fn new() -> Qp {
        Qp {
            sq: VecDeque::new(),
            unretired: VecDeque::new(),
            rq: VecDeque::new(),
            torn: None,
            failed: false,
            fail_next: None,
        }
    }
}

/// Seeded faults of a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Percent of writes that land in two pieces with a step in between.
    pub torn_writes: u64,
    /// Percent of polls that deliver nothing even when completions are queued (late CQEs).
    pub late_completions: u64,
}

/// The send and receive queues of both sides: what the cores post into (apart from memory,
/// so that a core can read its ring while it posts).
pub struct Queues {
    qps: [Vec<Qp>; 2],
    /// `max_send_wr` of each side's QPs: posting past it is a bug the NIC would punish.
    sq_depth: [usize; 2],
    /// `max_msg_sz` of every QP: a WR carrying more is a bug the NIC would punish.
    pub max_msg: usize,
    /// Receive posts (`ibv_post_recv` calls) per side.
    pub recv_posts: [usize; 2],
    /// Inline WRs posted with a payload (beyond an eager header), per side.
    pub inline_payloads: [usize; 2],
    /// Per side and QP: its generation, the recovery epoch that made it (0 at connect).
    pub gen: [Vec<u32>; 2],
    flush_sq: VecDeque<(usize, WorkRequest)>,
    /// Eager deliveries the receiver planned (source, destination, bytes): the CPU copies
    /// them before the core is called again ([`Fabric::apply_deliveries`]).
    deliveries: VecDeque<(u64, u64, usize)>,
}

impl Queues {
    /// Take the oldest `per_qp` posted receives of every QP of `side` (their wr_ids), as a test
    /// that completes them by hand does.
    pub fn take_receives(&mut self, side: Side, per_qp: usize) -> Vec<u64> {
        self.qps[side.index()]
            .iter_mut()
            .flat_map(|q| {
                let n = per_qp.min(q.rq.len());
                q.rq.drain(..n)
            })
            .collect()
    }

    /// Queue what a core planned on `side`.
    pub fn post(&mut self, side: Side, p: Post<'_>) -> Result<(), Error> {
        match p {
            Post::Send { qp, chain } => {
                let q = self.qps[side.index()]
                    .get_mut(qp)
                    .ok_or_else(|| Error::internal(format!("post on QP {qp} that does not exist")))?;
                assert!(chain.len() <= MAX_CHAIN, "a chain of {} WRs", chain.len());
                if let Some(w) = chain
                    .iter()
                    .find(|w| w.local.is_some_and(|s| s.len as usize > self.max_msg))
                {
                    panic!(
                        "{side:?} QP {qp}: a WR of {:?} bytes past max_msg_sz {}",
                        w.local.map(|s| s.len),
                        self.max_msg
                    );
                }
                let depth = self.sq_depth[side.index()];
                assert!(
                    q.unretired.len() + chain.len() <= depth,
                    "{side:?} QP {qp}: send queue overflow ({} unretired + {} > max_send_wr {depth})",
                    q.unretired.len(),
                    chain.len()
                );
                q.unretired.extend(chain.iter().map(|w| w.signaled));
                self.inline_payloads[side.index()] += chain.iter().filter(|w| w.inline && w.local.is_some()).count();
                q.sq.extend(chain.iter().copied());
            }
            Post::Recv { qp, wr_id, count } => {
                let q = self.qps[side.index()]
                    .get_mut(qp)
                    .ok_or_else(|| Error::internal(format!("receive on QP {qp} that does not exist")))?;
                assert!(
                    q.rq.len() + count <= RQ_DEPTH,
                    "{side:?} QP {qp}: receive queue overflow ({} posted + {count} > max_recv_wr {RQ_DEPTH})",
                    q.rq.len()
                );
                q.rq.extend(std::iter::repeat_n(wr_id, count));
                self.recv_posts[side.index()] += 1;
            }
            Post::Flush { dev, wr } => {
                assert_eq!(side, Side::Receiver, "only the receiver flushes");
                self.flush_sq.push_back((dev, wr));
            }
            Post::Deliver { src, dst, len } => {
                assert_eq!(side, Side::Receiver, "only the receiver delivers eager messages");
                self.deliveries.push_back((src, dst, len));
            }
        }
        Ok(())
    }
}

/// The fabric: memory, both sides' QPs (QP i of the sender is paired with QP i of the
/// receiver), their CQs, and the receiver's loopback flush QPs.
pub struct Fabric {
    pub regions: Vec<Region>,
    pub queues: Queues,
    routes: [Vec<QpRoute>; 2],
    cqs: [VecDeque<Wc>; 2],
    pub flush_cq: VecDeque<Wc>,
    pub faults: Faults,
    /// The peer of this side stopped answering: its WRs time out.
    pub silent: [bool; 2],
    pub executed: u64,
    /// While `Some`, the acknowledgements of this side's signaled writes are lost on the way:
    /// their completions are kept here instead of in the CQ (a test may deliver them late).
    pub lost_acks: [Option<Vec<Wc>>; 2],
}

impl Fabric {
    /// `routes[side][i]`: where QP i of that side lives.
    /// `sq_depth`: `max_send_wr` of the sender's and the receiver's QPs.
    pub fn new(
        sender_routes: Vec<QpRoute>,
        receiver_routes: Vec<QpRoute>,
        sq_depth: [usize; 2],
        faults: Faults,
    ) -> Fabric {
        let n = sender_routes.len();
        assert_eq!(n, receiver_routes.len());
        Fabric {
            regions: Vec::new(),
            queues: Queues {
                qps: [(0..n).map(|_| Qp::new()).collect(), (0..n).map(|_| Qp::new()).collect()],
                flush_sq: VecDeque::new(),
                deliveries: VecDeque::new(),
                sq_depth,
                max_msg: usize::MAX,
                recv_posts: [0; 2],
                inline_payloads: [0; 2],
                gen: [vec![0; n], vec![0; n]],
            },
            routes: [sender_routes, receiver_routes],
            cqs: [VecDeque::new(), VecDeque::new()],
            flush_cq: VecDeque::new(),
            faults,
            silent: [false; 2],
            executed: 0,
            lost_acks: [None, None],
        }
    }

    /// Register `len` zeroed bytes on `side` (with `ndevs` member devices); its region index.
    pub fn register(&mut self, side: Side, len: usize, ndevs: usize) -> usize {
        let base = 0x1000_0000u64 * (self.regions.len() as u64 + 1);
        self.regions.push(Region {
            side,
            base,
            bytes: vec![0; len],
            writes: vec![0; len],
            ndevs,
            cpu: true,
        });
        self.regions.len() - 1
    }

    pub fn base(&self, r: usize) -> u64 {
        self.regions[r].base
    }

    /// The region's address and keys as the core names a local block.
    pub fn local_block(&self, r: usize) -> LocalBlock {
        let mut lkeys = [0; MAX_DEVS];
        for (d, k) in lkeys.iter_mut().enumerate().take(self.regions[r].ndevs) {
            *k = key(r, d);
        }
        LocalBlock {
            addr: self.regions[r].base,
            lkeys,
        }
    }

    /// The region (at `offset`) as the peer names it.
    pub fn remote_block(&self, r: usize, offset: u64) -> RemoteBlock {
        let b = self.local_block(r);
        RemoteBlock {
            addr: b.addr + offset,
            rkeys: b.lkeys,
        }
    }

    pub fn keys(&self, r: usize) -> [u32; MAX_DEVS] {
        self.local_block(r).lkeys
    }

    /// The region and offset of `[addr, addr+len)` under key `k` on `side`, if `k` is that
    /// region's key on `dev`.
    fn lookup(&self, side: Side, dev: usize, k: u32, addr: u64, len: usize) -> Option<(usize, usize)> {
        let r = ((k >> 8) as usize).checked_sub(1)?;
        let reg = self.regions.get(r)?;
        if reg.side != side || (k & 0xff) as usize != dev || dev >= reg.ndevs {
            return None;
        }
        let off = addr.checked_sub(reg.base)? as usize;
        (off.checked_add(len)? <= reg.bytes.len()).then_some((r, off))
    }

    /// Make QP `qp` of `side` fail its next work request with `status`.
    pub fn fail_qp(&mut self, side: Side, qp: usize, status: u32) {
        self.queues.qps[side.index()][qp].fail_next = Some(status);
    }

    /// Destroy every QP of `side` and create new ones of generation `gen` (a recovery): what
    /// the old ones still held is gone without a completion (a write half landed stays half
    /// landed), their completions already in the CQ stay there. A QP talks only to the peer's
    /// QP of the same generation.
    pub fn replace_qps(&mut self, side: Side, gen: u32) {
        for (q, g) in self.queues.qps[side.index()]
            .iter_mut()
            .zip(self.queues.gen[side.index()].iter_mut())
        {
            *q = Qp::new();
            *g = gen;
        }
    }

    /// A recovery put `side`'s QP `qp` on its member device `dev` (a fused device's failover):
    /// the peer's QP `qp` now talks to that device.
    pub fn place_qp(&mut self, side: Side, qp: usize, dev: usize) {
        self.routes[side.index()][qp].dev = dev;
        self.routes[side.peer().index()][qp].remote_dev = dev;
    }

    /// Where `side`'s QPs live now.
    pub fn routes(&self, side: Side) -> &[QpRoute] {
        &self.routes[side.index()]
    }

    /// Whether any work is left to execute.
    pub fn busy(&self) -> bool {
        !self.queues.flush_sq.is_empty()
            || self
                .queues
                .qps
                .iter()
                .flatten()
                .any(|q| !q.failed && (!q.sq.is_empty() || q.torn.is_some()))
    }

    /// Execute one step: one work request of a random QP with work (or the rest of a torn
    /// write), or one flush read. Returns false when there was nothing to do.
    pub fn step(&mut self, rng: &mut Rng) -> bool {
        let mut ready: Vec<(Side, usize)> = Vec::new();
        for side in [Side::Sender, Side::Receiver] {
            for (i, q) in self.queues.qps[side.index()].iter().enumerate() {
                // A failed QP still flushes what was posted to it (as a NIC does).
                if !q.sq.is_empty() || (!q.failed && q.torn.is_some()) {
                    ready.push((side, i));
                }
            }
        }
        let flush = !self.queues.flush_sq.is_empty();
        let choices = ready.len() + usize::from(flush);
        if choices == 0 {
            return false;
        }
        let pick = rng.below(choices as u64) as usize;
        if pick == ready.len() {
            self.step_flush();
        } else {
            let (side, qp) = ready[pick];
            self.step_qp(side, qp, rng);
        }
        self.executed += 1;
        true
    }

    fn complete(&mut self, side: Side, wc: Wc) {
        if let (Some(lost), WC_SUCCESS, None) = (&mut self.lost_acks[side.index()], wc.status, wc.imm) {
            lost.push(wc);
            return;
        }
        self.push_completion(side, wc);
    }

    /// Put `wc` in `side`'s CQ (a test delivers a late acknowledgement or a failure).
    pub fn push_completion(&mut self, side: Side, wc: Wc) {
        self.cqs[side.index()].push_back(wc);
    }

    /// Move QP `qp` of `side` to the error state: `wr` (the failing one) completes with
    /// `status`, every WR and receive still queued with WR_FLUSH_ERR.
    fn error_qp(&mut self, side: Side, qp: usize, wr: &WorkRequest, status: u32) {
        self.complete(
            side,
            Wc {
                wr_id: wr.wr_id,
                status,
                imm: None,
                qp,
                gen: self.queues.gen[side.index()][qp],
            },
        );
        let q = &mut self.queues.qps[side.index()][qp];
        q.failed = true;
        q.torn = None;
        let flushed: Vec<u64> = q.sq.drain(..).map(|w| w.wr_id).chain(q.rq.drain(..)).collect();
        let gen = self.queues.gen[side.index()][qp];
        for wr_id in flushed {
            self.complete(
                side,
                Wc {
                    wr_id,
                    status: WC_WR_FLUSH_ERR,
                    imm: None,
                    qp,
                    gen,
                },
            );
        }
    }

    fn step_qp(&mut self, side: Side, qp: usize, rng: &mut Rng) {
        let s = side.index();
        if let Some((torn, finish)) = self.queues.qps[s][qp].torn.take() {
            // The rest of a half-landed write goes only to the QP the first part went to:
            // when the peer replaced its QPs meanwhile, stopped answering, or its QP went to
            // the error state (which drops what arrives), the message is lost (retries run out).
            let peer = side.peer().index();
            if self.queues.gen[s][qp] != self.queues.gen[peer][qp] || self.silent[s] || self.queues.qps[peer][qp].failed
            {
                if let Some(wr) = finish {
                    self.error_qp(side, qp, &wr, WC_RETRY_EXC_ERR);
                }
                return;
            }
            self.land(torn.dst_region, torn.dst_off, &torn.rest);
            if let Some(wr) = finish {
                self.finish(side, qp, &wr);
            }
            return;
        }
        let Some(wr) = self.queues.qps[s][qp].sq.pop_front() else {
            return;
        };
        if let Some(status) = self.queues.qps[s][qp].fail_next.take() {
            self.error_qp(side, qp, &wr, status);
            return;
        }
        if self.queues.qps[s][qp].failed {
            // Posted after the QP went to the error state: flushed, as a NIC does.
            let gen = self.queues.gen[s][qp];
            self.complete(
                side,
                Wc {
                    wr_id: wr.wr_id,
                    status: WC_WR_FLUSH_ERR,
                    imm: None,
                    qp,
                    gen,
                },
            );
            return;
        }
        let paired = self.queues.gen[s][qp] == self.queues.gen[side.peer().index()][qp];
        if self.silent[s] || !paired || self.queues.qps[side.peer().index()][qp].failed {
            // The peer stopped answering, or its QP is in the error state and answers
            // nothing: the transport retries run out.
            self.error_qp(side, qp, &wr, WC_RETRY_EXC_ERR);
            return;
        }
        let route = self.routes[s][qp];
        let len = wr.len();
        let src = match wr.local {
            None => Some((usize::MAX, 0)),
            Some(sge) => self.lookup(side, route.dev, sge.lkey, sge.addr, sge.len as usize),
        };
        let Some((src_r, src_off)) = src else {
            self.error_qp(side, qp, &wr, WC_LOC_PROT_ERR);
            return;
        };
        match wr.op {
            Op::Write | Op::WriteImm(_) => {
                let Some((dst_r, dst_off)) =
                    self.lookup(side.peer(), route.remote_dev, wr.remote.rkey, wr.remote.addr, len)
                else {
                    self.error_qp(side, qp, &wr, WC_REM_ACCESS_ERR);
                    return;
                };
                if matches!(wr.op, Op::WriteImm(_)) && self.queues.qps[side.peer().index()][qp].rq.is_empty() {
                    panic!("{side:?} QP {qp}: a write with immediate found no posted receive at the peer (the receiver must post before it sends its CTS)");
                }
                // An inline prefix (an eager header) comes from the WR, then the SGE's bytes.
                let mut data = wr.prefix.map_or(Vec::new(), |p| p.to_vec());
                let local = wr.local.map_or(0, |s| s.len as usize);
                if local > 0 {
                    assert!(wr.prefix.is_none() || wr.inline, "a prefix on a WR that is not inline");
                    assert!(
                        !wr.inline || self.regions[src_r].cpu,
                        "{side:?} QP {qp}: an inline WR whose payload is a GPU's memory (the provider would copy it with the CPU)"
                    );
                    data.extend_from_slice(&self.regions[src_r].bytes[src_off..src_off + local]);
                }
                if len > 1 && rng.chance(self.faults.torn_writes) {
                    // The NIC may store any part first: here the tail, so that a CTS entry's
                    // stamp can be there before the rest of it.
                    let cut = rng.range(1, len - 1);
                    self.land(dst_r, dst_off + cut, &data[cut..]);
                    self.queues.qps[s][qp].torn = Some((
                        Torn {
                            dst_region: dst_r,
                            dst_off,
                            rest: data[..cut].to_vec(),
                        },
                        Some(wr),
                    ));
                    return;
                }
                self.land(dst_r, dst_off, &data);
                self.finish(side, qp, &wr);
            }
            Op::Read => panic!("a read on a data QP"),
        }
    }

    /// What follows a write that has fully landed: the peer's receive completion for a
    /// write with immediate, and our completion when signaled.
    fn finish(&mut self, side: Side, qp: usize, wr: &WorkRequest) {
        if let Op::WriteImm(imm) = wr.op {
            let peer = side.peer();
            if let Some(recv) = self.queues.qps[peer.index()][qp].rq.pop_front() {
                self.complete(
                    peer,
                    Wc {
                        wr_id: recv,
                        status: WC_SUCCESS,
                        imm: Some(imm),
                        qp,
                        gen: self.queues.gen[peer.index()][qp],
                    },
                );
            }
        }
        if wr.signaled {
            self.complete(
                side,
                Wc {
                    wr_id: wr.wr_id,
                    status: WC_SUCCESS,
                    imm: None,
                    qp,
                    gen: self.queues.gen[side.index()][qp],
                },
            );
        }
    }

    fn land(&mut self, r: usize, off: usize, data: &[u8]) {
        let reg = &mut self.regions[r];
        reg.bytes[off..off + data.len()].copy_from_slice(data);
        for w in &mut reg.writes[off..off + data.len()] {
            *w = w.saturating_add(1);
        }
    }

    fn step_flush(&mut self) {
        let Some((dev, wr)) = self.queues.flush_sq.pop_front() else {
            return;
        };
        let ok = wr.op == Op::Read
            && wr.local.is_some_and(|l| {
                self.lookup(Side::Receiver, dev, l.lkey, l.addr, l.len as usize)
                    .is_some()
            })
            && self
                .lookup(Side::Receiver, dev, wr.remote.rkey, wr.remote.addr, wr.len())
                .is_some();
        let status = if ok { WC_SUCCESS } else { WC_REM_ACCESS_ERR };
        self.flush_cq.push_back(Wc {
            wr_id: wr.wr_id,
            status,
            imm: None,
            qp: usize::MAX,
            gen: 0,
        });
    }

    /// Take up to `max` completions of `side` (none at all, sometimes, when completions are
    /// late).
    pub fn poll(&mut self, side: Side, max: usize, rng: &mut Rng) -> Vec<Wc> {
        if rng.chance(self.faults.late_completions) {
            return Vec::new();
        }
        let q = &mut self.cqs[side.index()];
        let n = q.len().min(max);
        let got: Vec<Wc> = q.drain(..n).collect();
        for wc in &got {
            // A polled send completion frees its WR's slot and every one before it.
            let Some(qp) = self.queues.qps[side.index()].get_mut(wc.qp) else {
                continue;
            };
            if wc.status == WC_SUCCESS && wc.imm.is_none() {
                while let Some(signaled) = qp.unretired.pop_front() {
                    if signaled {
                        break;
                    }
                }
            } else if wc.status != WC_SUCCESS {
                qp.unretired.clear();
            }
        }
        got
    }

    /// The receiver's region and offset holding `len` bytes at `addr`, if one does.
    fn receiver_bytes(&self, addr: u64, len: usize) -> Option<(usize, usize)> {
        self.regions.iter().enumerate().find_map(|(i, r)| {
            let off = addr.checked_sub(r.base)? as usize;
            (r.side == Side::Receiver && off + len <= r.bytes.len()).then_some((i, off))
        })
    }

    /// Carry out the eager deliveries the receiver planned: copies from its landing ring into
    /// its buffers (each byte copied counts as a write, as the NIC's do).
    pub fn apply_deliveries(&mut self) {
        while let Some((src, dst, len)) = self.queues.deliveries.pop_front() {
            let (Some((sr, so)), Some((dr, dof))) = (self.receiver_bytes(src, len), self.receiver_bytes(dst, len))
            else {
                panic!("an eager delivery of {len} bytes from {src:#x} to {dst:#x} outside the receiver's memory");
            };
            let data = self.regions[sr].bytes[so..so + len].to_vec();
            self.land(dr, dof, &data);
        }
    }

    /// Everything `side`'s CQ holds (no late completions): a driver emptying it.
    pub fn drain_cq(&mut self, side: Side) -> Vec<Wc> {
        self.cqs[side.index()].drain(..).collect()
    }

    pub fn poll_flush(&mut self) -> Vec<Wc> {
        self.flush_cq.drain(..).collect()
    }

    /// Posted receives not yet consumed (for the leak check at the end of a run).
    pub fn posted_receives(&self, side: Side) -> usize {
        self.queues.qps[side.index()].iter().map(|q| q.rq.len()).sum()
    }
}

/// A ring block of the fabric as a core reads and writes it.
pub struct RingView<'a> {
    pub regions: &'a mut Vec<Region>,
    pub region: usize,
}

impl RingView<'_> {
    fn at(&self, pos: usize) -> usize {
        (pos % fifo::RING) * fifo::ENTRY_BYTES
    }
    fn bytes(&self) -> &[u8] {
        &self.regions[self.region].bytes[..RING_BYTES]
    }
    fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.bytes()[off..off + 8].try_into().expect("8 bytes"))
    }
    fn u32_at(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.bytes()[off..off + 4].try_into().expect("4 bytes"))
    }
}

/// Entry bytes <-> entry, in wire order (as the NIC leaves them in memory).
pub fn entry_from_bytes(b: &[u8]) -> CtsEntry {
    let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let mut rkeys = [0; MAX_DEVS];
    for (i, k) in rkeys.iter_mut().enumerate() {
        *k = u32_at(16 + 4 * i);
    }
    CtsEntry {
        addr: u64_at(0),
        size: u64_at(8),
        rkeys,
        seal: u32_at(48),
        tag: u32_at(52),
        stamp: u64_at(56),
    }
}

pub fn entry_to_bytes(e: &CtsEntry) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&e.addr.to_ne_bytes());
    b[8..16].copy_from_slice(&e.size.to_ne_bytes());
    for (i, k) in e.rkeys.iter().enumerate() {
        b[16 + 4 * i..20 + 4 * i].copy_from_slice(&k.to_ne_bytes());
    }
    b[48..52].copy_from_slice(&e.seal.to_ne_bytes());
    b[52..56].copy_from_slice(&e.tag.to_ne_bytes());
    b[56..64].copy_from_slice(&e.stamp.to_ne_bytes());
    b
}

impl FifoRing for RingView<'_> {
    fn load_stamp(&self, pos: usize) -> u64 {
        // Wire order = little-endian bytes, as the raw word sits in memory.
        u64::from_ne_bytes(self.u64_at(self.at(pos) + fifo::STAMP_OFFSET).to_le_bytes())
    }
    fn load_entry(&self, pos: usize) -> CtsEntry {
        let o = self.at(pos);
        entry_from_bytes(&self.bytes()[o..o + 64])
    }
    fn store_sizes(&mut self, pos: usize, sizes: &[u32]) {
        let o = self.at(pos) + fifo::SIZES_IN_ENTRY;
        let reg = &mut self.regions[self.region];
        for (i, s) in sizes.iter().enumerate() {
            reg.bytes[o + 4 * i..o + 4 * i + 4].copy_from_slice(&s.to_le_bytes());
        }
    }
}

impl StagingRing for RingView<'_> {
    fn store_entry(&mut self, pos: usize, wire: &CtsEntry) {
        let o = self.at(pos);
        self.regions[self.region].bytes[o..o + 64].copy_from_slice(&entry_to_bytes(wire));
    }
    fn load_record(&self, pos: usize, i: usize) -> u32 {
        self.u32_at(self.at(pos) + fifo::SIZES_IN_ENTRY + 4 * (i % 8))
    }
    fn load_eager_header(&self, slot: usize) -> [u8; eager::EAGER_HEADER_BYTES] {
        // The landing ring follows the staging ring in the same region, as in the driver.
        let bytes = &self.regions[self.region].bytes;
        let slot_bytes = bytes.len().saturating_sub(RING_BYTES) / eager::SLOTS;
        let mut h = [0u8; eager::EAGER_HEADER_BYTES];
        if slot_bytes >= eager::EAGER_HEADER_BYTES {
            let o = RING_BYTES + (slot % eager::SLOTS) * slot_bytes;
            h.copy_from_slice(&bytes[o..o + eager::EAGER_HEADER_BYTES]);
        }
        h
    }
}

/// A scratch word per device for flush reads.
pub fn scratch_sges(fabric: &Fabric, r: usize, ndevs: usize) -> Vec<Sge> {
    (0..ndevs)
        .map(|d| Sge {
            addr: fabric.base(r) + d as u64,
            len: 1,
            lkey: key(r, d),
        })
        .collect()
}

//! The receiver's protocol (docs/nccl-net-abi.md#data-path, #flush): make sure every QP the
//! message will use has a
//! zero-SGE receive posted for it, stage the CTS entries of the grouped receive and plan their
//! RDMA writes into the next entries of the sender's FIFO ring (two writes when they straddle
//! its end), and complete when every used QP delivered its WRITE WITH IMMEDIATE. `iflush` plans
//! a one-byte read of the last non-empty buffer per local device (the driver's loopback QPs).
//!
//! Receives are posted ahead, [`RQ_BATCH`] per `ibv_post_recv`, not one per message: a QP's
//! receives are all alike (zero SGEs, the QP's index as `wr_id`), and a QP completes them in the
//! order the sender posted its chains on it, which is posting-counter order on both ends (the
//! sender posts groups strictly in order, and both ends compute a message's QPs from the
//! counter). So each QP keeps the requests it owes a completion to, oldest first, and a
//! completion goes to the oldest. A completion no request waits for is a peer that wrote more
//! than it was asked to: the comm fails.
//!
//! `irecv` says "retry later" (no side effects) when [`request::RECVS_IN_FLIGHT`] receives are
//! in flight, when the ring has no room for the group, or when the CTS QP has no send-queue
//! credit left ([`CTS_DEPTH`]). At most [`request::FLUSHES_IN_FLIGHT`] flushes are in flight;
//! one more is an error (a NULL flush request would mean "nothing to flush").

use super::eager::{self, GroupView, Header, Imm, EAGER_QP, SLOTS};
use super::fifo::{self, CtsEntry};
use super::limits::{MAX_DEVS, MAX_RECVS};
use super::plan::{LocalBlock, Op, Post, QpRoute, Remote, RemoteBlock, Sge, WorkRequest};
use super::request::{self, ReqKind, RequestPool};
use super::split;
use super::state::{CommState, FailureReport};
use crate::error::{Error, Result};

/// Send-queue depth of a receiver QP, and the CQ entries its CTS writes may take. Bound: CTS
/// WRs posted on a device's CTS QP and not yet retired ≤ CTS_DEPTH, enforced by `irecv` (which
/// says "retry later" beyond); a WR is retired when the completion of a signaled one at or
/// after it shows the queue got that far. Every [`CTS_SIGNAL_EVERY`]-th is signaled, so
/// whenever `irecv` is refused for credits (≥ CTS_DEPTH − 1 unretired, one irecv posts ≤ 2)
/// a signaled one is among them and its completion will come.
pub const CTS_DEPTH: usize = 32;
/// One CTS write in this many is signaled.
pub const CTS_SIGNAL_EVERY: u64 = 8;
const _: () = assert!(CTS_DEPTH as u64 > CTS_SIGNAL_EVERY && CTS_DEPTH >= 2);

/// Receives one `ibv_post_recv` posts on a QP when the QP has none to spare for the next
/// message: so a QP has at most `RECVS_IN_FLIGHT + RQ_BATCH − 1` posted, and the eager QP
/// [`eager::SLOTS`] more ([`RQ_DEPTH`]).
pub const RQ_BATCH: usize = 16;
/// Receives the eager QP keeps spare before a CTS write grants eager credit: one for every
/// eager message the credit lets the sender have in flight, and one for the receive the write's
/// own group may take on that QP.
const EAGER_SPARE: usize = SLOTS + 1;
// Eager groups the sender may not have consumed yet hold ring entries here; a whole group of the
// most buffers must still fit beside them and the most single receives.
const _: () = assert!(SLOTS + request::RECVS_IN_FLIGHT + MAX_RECVS <= fifo::RING);
/// Receive-queue depth of a receiver QP (`max_recv_wr`), and the CQ entries its receives may
/// take when the QP fails and flushes them all: [`rq_depth`], at most this.
pub const RQ_DEPTH: usize = request::RECVS_IN_FLIGHT + RQ_BATCH + SLOTS;

/// The receive-queue depth of a receiver QP, with the eager path or without.
pub fn rq_depth(eager: bool) -> usize {
    request::RECVS_IN_FLIGHT + RQ_BATCH + if eager { SLOTS } else { 0 }
}

/// `wr_id` kinds (top byte); the low 16 bits are a request index (flush reads) or a QP index
/// (receives), or for CTS writes the device (bits 48..56) and the write's sequence number on
/// that device's CTS QP (bits 0..48).
const KIND_SHIFT: u32 = 56;
const KIND_RECV: u64 = 1;
const KIND_CTS: u64 = 2;
const KIND_FLUSH: u64 = 3;
const SEQ_MASK: u64 = (1 << 48) - 1;
/// A single receive's [`request::Request::size`] while its size is in the completion record
/// (no message size is this large: they saturate at `i32::MAX`).
const SIZE_IN_RECORD: u32 = u32::MAX;

fn wr_id(kind: u64, idx: u16) -> u64 {
    (kind << KIND_SHIFT) | u64::from(idx)
}

fn cts_wr_id(d: usize, seq: u64) -> u64 {
    (KIND_CTS << KIND_SHIFT) | ((d as u64 & 0xff) << 48) | (seq & SEQ_MASK)
}

/// The receiver's CTS staging ring (the source of CTS writes), where the sender's NIC also
/// writes a grouped receive's sizes (its completion record, [`fifo::SIZES_IN_ENTRY`] of the
/// group's first entry). The driver implements it with volatile accesses. The whole block is
/// remotely writable, so nothing the core trusts is read back from it but the records (the
/// posted sizes it clamps them to are kept in the core).
pub trait StagingRing {
    /// Store the wire-order entry at ring position `pos` (< RING).
    fn store_entry(&mut self, pos: usize, wire: &CtsEntry);
    /// Size `i` (< 8) of the completion record of the group at `pos`, host order.
    fn load_record(&self, pos: usize, i: usize) -> u32;
    /// The header of the eager message in landing slot `slot` (< SLOTS), once its write with
    /// immediate completed (all zero without a landing ring).
    fn load_eager_header(&self, slot: usize) -> [u8; eager::EAGER_HEADER_BYTES];
}

/// The receiver's side of the eager path: its landing ring.
#[derive(Clone, Copy, Debug)]
pub struct EagerRecvConfig {
    /// Slot 0 of the landing ring (slot `s` is `s × slot_bytes` further).
    pub landing: u64,
    pub slot_bytes: usize,
    /// The largest payload a slot holds.
    pub max: usize,
}

/// What the receiver needs to know of its connection.
#[derive(Clone, Debug)]
pub struct RecvConfig {
    /// Per QP of the connection: its local and the peer's member device.
    pub routes: Vec<QpRoute>,
    /// The QPs that carry the CTS writes, receive by receive in turn: QP 0 ..`cts_qps` (one
    /// per local member device; fewer when the connection has fewer QPs, as active-standby's).
    pub cts_qps: usize,
    /// QPs each message is spread over.
    pub qps_per_req: usize,
    /// Our CTS staging block.
    pub staging: LocalBlock,
    /// The sender's FIFO ring.
    pub peer_fifo: RemoteBlock,
    /// Per local device: CTS writes of up to this many bytes are posted inline (0: never).
    pub cts_inline_max: [u32; MAX_DEVS],
    /// The largest buffer a receive takes: [`super::split::max_buffer_bytes`] of our devices,
    /// the `maxP2pBytes` the properties report.
    pub max_buffer_bytes: usize,
    /// The most bytes one WR carries (the devices' `max_msg_sz`): a batched CTS write stays
    /// within it.
    pub wr_bytes: usize,
    /// The peer as messages name it (its side-channel address).
    pub peer: String,
    /// The eager path (a version-5 connection with a landing ring); `None`: off.
    pub eager: Option<EagerRecvConfig>,
    /// Completions name their receive ([`eager::Imm`]): a version-5 connection.
    pub named_imm: bool,
}

/// One buffer of a grouped receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvBuf {
    pub data: usize,
    pub size: usize,
    pub tag: i32,
    /// The registration's rkey on every member device.
    pub rkeys: [u32; MAX_DEVS],
    /// Host memory: an eager message can be copied into it by the CPU.
    pub host: bool,
}

/// The answer to an irecv.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Irecv {
    /// Request `idx` of the pool took the receive.
    Started(u16),
    /// Every receive slot is in flight or the ring has no room for the group: retry later.
    Busy,
    /// The CTS QP has no send-queue credit: reap completions, then try again (or retry later).
    NoCtsCredit,
}

/// A request `test` found done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvDone {
    /// Sizes reported (buffers of a receive; 0 for a flush).
    pub n: usize,
    pub sizes: [u32; MAX_RECVS],
    /// The first time in this comm the sender claimed more than a buffer's posted size (the
    /// driver WARNs it once; the size reported is the posted one).
    pub oversized: Option<Oversized>,
}

/// A size the sender claimed past what the buffer posted: no honest sender does that (it
/// truncates to the posted size itself), so the peer is lying or corrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Oversized {
    /// Buffer `buffer` of a group of `n`.
    pub buffer: usize,
    pub n: usize,
    pub claimed: u32,
    pub posted: u64,
}

/// The receiver's state machine.
pub struct RecvCore {
    pub state: CommState,
    cfg: RecvConfig,
    /// Posting counter: receives posted so far.
    counter: u64,
    /// Entries of the ring held by posted groups.
    ring: fifo::RingAlloc,
    /// Receives posted and not yet reclaimed by test().
    recvs_in_flight: usize,
    /// Flush requests taken by iflush and not yet reclaimed by test() (≤ FLUSHES_IN_FLIGHT).
    flushes_in_flight: usize,
    /// Per device: CTS writes posted on its CTS QP, and how many of them are retired.
    cts_posted: [u64; MAX_DEVS],
    cts_retired: [u64; MAX_DEVS],
    /// Per QP of the connection: its posted receives and the requests they are for.
    rqs: Box<[ReceiveQueue]>,
    /// The posted size of the buffer at each ring position (kept here, not read back from the
    /// staging block, which the peer can write).
    posted: [u64; fifo::RING],
    /// The request of the group whose first entry is at each ring position (what a named
    /// completion finds its receive by).
    req_at: [u8; fifo::RING],
    /// A claim past a posted size was reported (once per comm).
    oversized_reported: bool,
    /// Between [`RecvCore::begin_recovery`] and [`RecvCore::resume`]: nothing is posted.
    recovering: bool,
    /// The CTS writes [`RecvCore::resume`] posted again have landed once device 0's CTS QP
    /// retired this many.
    rewritten_until: u64,
    /// The eager path's state (`None`: off).
    eager: Option<Box<EagerRecv>>,
    /// CTS entries staged and not written yet ([`RecvCore::flush_cts`]).
    pending_cts: Option<PendingCts>,
}

/// Consecutive ring entries staged for one CTS write on device `d`'s CTS QP.
#[derive(Clone, Copy, Debug)]
struct PendingCts {
    d: usize,
    start: u64,
    n: usize,
}

/// What the receiver keeps of the eager path ([`super::eager`]).
struct EagerRecv {
    cfg: EagerRecvConfig,
    /// Eager messages arrived (their completions taken), and how many of them are decided.
    arrived: u64,
    decided: u64,
    /// The credit the last CTS write granted (the sender may have sent this many).
    granted: u64,
    /// The claim and epoch of the last message decided (claims only increase).
    last_claim: Option<u64>,
    last_epoch: u32,
    /// The epoch one of whose claims was refused: the rest of it is refused too.
    refused_epoch: Option<u32>,
    /// Per ring position of a group's first entry: the group as a claim needs it, and its
    /// [`CLAIM_OK`] / [`CLAIM_LIVE`] / [`CLAIM_BOUND`] marks.
    groups: [Claimable; fifo::RING],
    marks: [u8; fifo::RING],
    /// Messages bound and refused (for statistics and tests).
    bound: u64,
    refused: u64,
}

/// A posted group as an eager claim on it is decided (16 bytes: memory per connection).
#[derive(Clone, Copy, Default)]
struct Claimable {
    addr: u64,
    /// The group's posting counter, low 32 bits (claims are on groups in flight, far fewer
    /// than 2^31 apart).
    counter: u32,
    tag: i32,
}

/// A single receive into host memory: an eager message can fill it.
const CLAIM_OK: u8 = 1;
/// Posted and not yet reported by test.
const CLAIM_LIVE: u8 = 2;
/// An eager message filled it (no chain comes for it).
const CLAIM_BOUND: u8 = 4;

/// Eager messages the receiver has decided (for statistics and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EagerCounts {
    pub bound: u64,
    pub refused: u64,
}

/// One QP's receive side: the requests owed a completion on it, oldest first (each in flight,
/// so at most [`request::RECVS_IN_FLIGHT`]), and how many posted receives no request claims.
#[derive(Clone, Copy)]
struct ReceiveQueue {
    owed: [u16; request::RECVS_IN_FLIGHT],
    head: u8,
    len: u8,
    /// Posted receives beyond one per owed request (< RQ_BATCH).
    spare: u8,
    /// Completions taken on this QP since the connection was made (what a recovery reports).
    taken: u64,
}

const _: () = assert!(request::RECVS_IN_FLIGHT < u8::MAX as usize, "a queue length fits u8");
const _: () = assert!(RQ_BATCH < u8::MAX as usize, "spare receives fit u8");

impl ReceiveQueue {
    const EMPTY: ReceiveQueue = ReceiveQueue {
        owed: [0; request::RECVS_IN_FLIGHT],
        head: 0,
        len: 0,
        spare: 0,
        taken: 0,
    };

    /// Request `r` is owed the next completion after those already owed (false: full, which
    /// the bound on receives in flight rules out).
    fn push(&mut self, r: u16) -> bool {
        let len = usize::from(self.len);
        if len >= self.owed.len() {
            return false;
        }
        self.owed[(usize::from(self.head) + len) % self.owed.len()] = r;
        self.len += 1;
        true
    }

    /// The request the oldest owed completion is for.
    fn front(&self) -> Option<u16> {
        (self.len > 0).then(|| self.owed[usize::from(self.head)])
    }

    fn pop(&mut self) -> Option<u16> {
        let r = self.front()?;
        self.head = ((usize::from(self.head) + 1) % self.owed.len()) as u8;
        self.len -= 1;
        self.taken += 1;
        Some(r)
    }

    /// Take request `r` out of the owed ones, wherever it is (the requests after it keep their
    /// order); false when it is not owed here.
    fn remove(&mut self, r: u16) -> bool {
        let cap = self.owed.len();
        let (head, len) = (usize::from(self.head), usize::from(self.len));
        let Some(k) = (0..len).find(|&k| self.owed[(head + k) % cap] == r) else {
            return false;
        };
        for j in k..len - 1 {
            self.owed[(head + j) % cap] = self.owed[(head + j + 1) % cap];
        }
        self.len -= 1;
        true
    }

    /// A completion named request `r` (a version-5 connection): the receive it took was `r`'s.
    fn take(&mut self, r: u16) -> bool {
        let owed = self.remove(r);
        self.taken += u64::from(owed);
        owed
    }

    /// Request `r` is owed nothing any more (an eager message filled it): its receive is spare
    /// again.
    fn forget(&mut self, r: u16) {
        if self.remove(r) {
            self.spare += 1;
        }
    }
}

/// Why an eager header cannot come from an honest sender, if it cannot.
fn eager_header_lie(e: &EagerRecv, h: &Header) -> Option<String> {
    if u64::from(h.seq) != e.decided & u64::from(u32::MAX) {
        return Some(format!("says it is message {} where {} is due", h.seq, e.decided));
    }
    if h.len as usize > e.cfg.max {
        return Some(format!("says {} bytes, past the {} a slot holds", h.len, e.cfg.max));
    }
    // Claims increase within an epoch; a new epoch starts at the sender's next group, which a
    // refused claim of the last one may have named already.
    let again = h.epoch == e.last_epoch && e.last_claim.is_some_and(|c| h.claim <= c);
    if again || h.epoch < e.last_epoch {
        return Some(format!(
            "claims receive {} in epoch {} after receive {:?} in epoch {}",
            h.claim, h.epoch, e.last_claim, e.last_epoch
        ));
    }
    None
}

impl RecvCore {
    pub fn new(cfg: RecvConfig, report: FailureReport) -> RecvCore {
        RecvCore {
            state: CommState::new(RequestPool::new(std::ptr::null_mut(), request::RECV_REQUESTS), report),
            counter: 0,
            ring: fifo::RingAlloc::default(),
            recvs_in_flight: 0,
            flushes_in_flight: 0,
            cts_posted: [0; MAX_DEVS],
            cts_retired: [0; MAX_DEVS],
            posted: [0; fifo::RING],
            req_at: [0; fifo::RING],
            oversized_reported: false,
            recovering: false,
            rewritten_until: 0,
            pending_cts: None,
            rqs: vec![ReceiveQueue::EMPTY; cfg.routes.len()].into_boxed_slice(),
            // The eager path needs completions that name their receive.
            eager: cfg.eager.filter(|_| cfg.named_imm).map(|e| {
                Box::new(EagerRecv {
                    cfg: e,
                    arrived: 0,
                    decided: 0,
                    granted: 0,
                    last_claim: None,
                    last_epoch: 0,
                    refused_epoch: None,
                    groups: [Claimable::default(); fifo::RING],
                    marks: [0; fifo::RING],
                    bound: 0,
                    refused: 0,
                })
            }),
            cfg,
        }
    }

    /// Eager messages decided so far.
    pub fn eager_counts(&self) -> EagerCounts {
        self.eager.as_ref().map_or(EagerCounts::default(), |e| EagerCounts {
            bound: e.bound,
            refused: e.refused,
        })
    }

    /// Receives posted ahead on every QP that no request claims yet (they stay posted until
    /// the QP is destroyed).
    pub fn spare_receives(&self) -> usize {
        self.rqs.iter().map(|q| usize::from(q.spare)).sum()
    }

    /// Flush requests in flight.
    pub fn flushes_in_flight(&self) -> usize {
        self.flushes_in_flight
    }

    /// Whether device `d`'s CTS QP takes `writes` more WRs within [`CTS_DEPTH`].
    fn cts_room(&self, d: usize, writes: u64) -> bool {
        self.cts_posted[d] + writes - self.cts_retired[d] <= CTS_DEPTH as u64
    }

    /// Post a grouped receive of `bufs` (1..=8 buffers of ≤ `max_buffer_bytes` each).
    pub fn irecv(
        &mut self,
        ring: &mut impl StagingRing,
        bufs: &[RecvBuf],
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<Irecv> {
        self.state.check()?;
        let n = bufs.len();
        if n == 0 || n > MAX_RECVS {
            return Err(Error::internal(format!(
                "irecv: a group of {n} buffers (1..={MAX_RECVS})"
            )));
        }
        if let Some(b) = bufs.iter().find(|b| b.size > self.cfg.max_buffer_bytes) {
            return Err(Error::internal(format!(
                "irecv: a buffer of {} bytes is larger than the {} bytes this device takes in one message (the maxP2pBytes it reports)",
                b.size, self.cfg.max_buffer_bytes
            )));
        }
        // Everything that can say "retry later" is checked before anything changes. NCCL
        // never has more than 32 receives in flight; ring entries come back in posting order
        // as receives complete; CTS credits as signaled CTS writes complete.
        if self.recvs_in_flight >= request::RECVS_IN_FLIGHT || !self.ring.fits(n) || self.recovering {
            return Ok(Irecv::Busy);
        }
        let id = self.counter;
        let d = (id % self.cfg.cts_qps.max(1) as u64) as usize;
        let start = self.ring.next_start();
        // This group's writes, and the staged ones it may have to flush first.
        let staged = self
            .pending_cts
            .map_or(0, |p| fifo::pieces(p.start, p.n).iter().filter(|x| x.1 > 0).count());
        let writes = (fifo::pieces(start, n).iter().filter(|p| p.1 > 0).count() + staged) as u64;
        if !self.cts_room(d, writes) {
            return Ok(Irecv::NoCtsCredit);
        }
        let Some(r) = self.state.pool.alloc(ReqKind::Recv) else {
            return Ok(Irecv::Busy);
        };
        let Some(start) = self.ring.alloc(n) else {
            self.state.pool.free(r);
            return Ok(Irecv::Busy);
        };
        self.recvs_in_flight += 1;
        let nq = self.cfg.qps_per_req;
        if let Some(req) = self.state.pool.get_mut(r) {
            req.set_pos_n(fifo::ring_pos(start), n);
            req.pending = request::pending_count(nq);
        }
        if let Err(e) = self.post_group(ring, r, id, start, d, bufs, post) {
            return Err(self.state.fail(e));
        }
        self.counter += 1;
        // An eager message that arrived before this receive may claim it.
        self.decide_eager(ring, post)?;
        Ok(Irecv::Started(r))
    }

    /// Decide the eager messages that arrived, in their order, as far as the groups they claim
    /// are posted ([`super::eager`]): a bound one is copied into its buffer and completes the
    /// receive; a refused one is dropped (the sender sends it again through the CTS path).
    /// Either way its slot is free, which the next CTS write's credit says. A header no honest
    /// sender writes fails the comm.
    pub fn decide_eager(
        &mut self,
        ring: &impl StagingRing,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(e) = self.eager.as_mut() else {
            return Ok(());
        };
        while e.decided < e.arrived {
            let slot = eager::slot_of(e.decided);
            let h = Header::parse(&ring.load_eager_header(slot));
            if let Some(why) = eager_header_lie(e, &h) {
                let err = Error::remote(format!(
                    "the sender {} wrote an eager message (slot {slot}) whose header {why}: a corrupt or lying peer",
                    self.cfg.peer
                ));
                return Err(self.state.fail(err));
            }
            if e.refused_epoch == Some(h.epoch) {
                // A claim of an epoch already refused is refused whatever its group: decided at
                // once, so that it never waits for a receive NCCL may post only after later
                // messages (of the next epoch) arrived.
                e.refused += 1;
                e.last_claim = Some(h.claim);
                e.decided += 1;
                self.ring.prove(h.head);
                continue;
            }
            if h.claim >= self.counter {
                // Its group is not posted yet: decided at the irecv that posts it.
                return Ok(());
            }
            let pos = (0..fifo::RING).find(|&p| e.marks[p] & CLAIM_LIVE != 0 && e.groups[p].counter == h.claim as u32);
            let Some(pos) = pos else {
                let err = Error::remote(format!(
                    "the sender {} sent an eager message for receive {}, which this side has already completed: a corrupt or lying peer",
                    self.cfg.peer, h.claim
                ));
                return Err(self.state.fail(err));
            };
            let g = e.groups[pos];
            let view = GroupView {
                eager_ok: e.marks[pos] & CLAIM_OK != 0,
                tag: g.tag,
            };
            let req = u16::from(self.req_at[pos]);
            if eager::binds(view, h.tag, e.refused_epoch == Some(h.epoch)) {
                let len = u64::from(h.len).min(self.posted[pos]) as usize;
                let src = e.cfg.landing + (slot * e.cfg.slot_bytes + eager::EAGER_HEADER_BYTES) as u64;
                if len > 0 {
                    if let Err(err) = post(Post::Deliver { src, dst: g.addr, len }) {
                        return Err(self.state.fail(err));
                    }
                }
                e.marks[pos] |= CLAIM_BOUND;
                e.bound += 1;
                if let Some(r) = self.state.pool.get_mut(req) {
                    r.size = len as u32;
                    r.pending = 0;
                }
                let (nq, nqps) = (self.cfg.qps_per_req, self.cfg.routes.len());
                for j in 0..nq {
                    if let Some(rq) = self.rqs.get_mut(split::qp_for_chunk(h.claim, nq, j, nqps)) {
                        rq.forget(req);
                    }
                }
            } else {
                e.refused_epoch = Some(h.epoch);
                e.refused += 1;
            }
            e.last_claim = Some(h.claim);
            e.last_epoch = h.epoch;
            e.decided += 1;
            // The sender had read every CTS entry before `head` when it sent this.
            self.ring.prove(h.head);
        }
        Ok(())
    }

    /// The receives, the staged entries and the CTS writes of group `id` (request `r`, ring
    /// entries from `start`, CTS QP of device `d`).
    #[allow(clippy::too_many_arguments)]
    fn post_group(
        &mut self,
        ring: &mut impl StagingRing,
        r: u16,
        id: u64,
        start: u64,
        d: usize,
        bufs: &[RecvBuf],
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        // Receives for every eager message the credit this CTS grants may bring, before it.
        if self.eager.is_some() {
            self.keep_spare(EAGER_QP, EAGER_SPARE, post)?;
        }
        // A posted receive for this message on every QP the sender will complete on.
        for qp in self.qps_of(id) {
            let Some(rq) = self.rqs.get_mut(qp) else {
                return Err(Error::internal(format!(
                    "irecv: QP {qp} of a connection of {}",
                    self.rqs.len()
                )));
            };
            if rq.spare == 0 {
                post(Post::Recv {
                    qp,
                    wr_id: wr_id(KIND_RECV, qp as u16),
                    count: RQ_BATCH,
                })?;
                rq.spare = RQ_BATCH as u8;
            }
            if !rq.push(r) {
                return Err(Error::internal(format!(
                    "irecv: QP {qp} already owes {} receives",
                    request::RECVS_IN_FLIGHT
                )));
            }
            rq.spare -= 1;
        }
        let n = bufs.len();
        self.req_at[fifo::ring_pos(start)] = r as u8;
        let eager_ok = n == 1 && bufs[0].host;
        let credit = self.eager.as_mut().map(|e| {
            e.granted = e.decided + SLOTS as u64;
            let pos = fifo::ring_pos(start);
            e.groups[pos] = Claimable {
                addr: bufs[0].data as u64,
                counter: id as u32,
                tag: bufs[0].tag,
            };
            e.marks[pos] = CLAIM_LIVE | if eager_ok { CLAIM_OK } else { 0 };
            e.granted
        });
        for (i, b) in bufs.iter().enumerate() {
            let mut e = CtsEntry::new(b.data as u64, b.size as u64, b.rkeys, n, b.tag, id);
            if let Some(credit) = credit {
                e = e.with_eager(credit, eager_ok);
            }
            // The ring gave these entries to this group: the group that had them before
            // completed and was reported (its CTS write was read by the NIC, its completion
            // record by us).
            let pos = fifo::ring_pos(start + i as u64);
            ring.store_entry(pos, &e.to_wire());
            self.posted[pos] = b.size as u64;
        }
        // The CTS write waits for the next flush ([`RecvCore::flush_cts`]): receives posted
        // back to back whose entries follow each other in the ring go in one write.
        let joined = self.pending_cts.as_mut().is_some_and(|p| {
            let fits = p.d == d
                && p.start + p.n as u64 == start
                && fifo::ring_pos(p.start) + p.n + n <= fifo::RING
                && (p.n + n) * fifo::ENTRY_BYTES <= self.cfg.wr_bytes;
            if fits {
                p.n += n;
            }
            fits
        });
        if !joined {
            self.flush_cts(post)?;
            self.pending_cts = Some(PendingCts { d, start, n });
        }
        // A receive with none other in flight goes at once: nothing to batch it with, and a
        // caller that posts one receive and then waits on something else (its send to the
        // same peer) would otherwise hold it back.
        if self.recvs_in_flight <= 1 {
            self.flush_cts(post)?;
        }
        Ok(())
    }

    /// Whether CTS entries wait for [`RecvCore::flush_cts`].
    pub fn cts_staged(&self) -> bool {
        self.pending_cts.is_some()
    }

    /// Write the CTS entries staged since the last flush into the sender's FIFO: one RDMA
    /// write for receives posted back to back on one CTS QP (two when they straddle the ring's
    /// end). The I/O layer flushes in every call that looks at the comm after posting (test, a
    /// refused irecv), so a CTS waits at most until the caller next looks at it, which NCCL's
    /// proxy does in the same progress step; a comm nobody calls is flushed by the idle round
    /// of a comm that waits (`watch`, within about 100 ms).
    pub fn flush_cts(&mut self, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        let Some(p) = self.pending_cts.take() else {
            return Ok(());
        };
        for (pos, len) in fifo::pieces(p.start, p.n) {
            if len == 0 {
                continue;
            }
            // Regularly reap the send queue (unsignaled WRs stay outstanding until then).
            let signaled = self.cts_posted[p.d] % CTS_SIGNAL_EVERY == CTS_SIGNAL_EVERY - 1;
            if let Err(e) = self.post_cts(p.d, pos, len, signaled, post) {
                return Err(self.state.fail(e));
            }
        }
        Ok(())
    }

    /// Closing: a signaled zero-length write on every CTS QP with CTS writes not known to have
    /// landed, whose completion retires them all (RC completes in order). With the eager path an
    /// eager message completes its receive before its group's CTS write — the verdict the sender
    /// waits for — was acknowledged; a receiver that closes at once would destroy that write with
    /// its QP (lost on the wire, or still queued in the provider), and the sender's send would
    /// fail though its message was taken. Without the eager path a receive completes only after
    /// the sender read its CTS. Returns the CTS QPs marked (a bit each; 0: nothing to wait for).
    pub fn post_close_markers(&mut self, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<u32> {
        if self.eager.is_none() || self.state.failed() || self.recovering() {
            return Ok(0);
        }
        let mut marked = 0;
        for d in 0..self.cfg.cts_qps.min(self.cfg.routes.len()).min(MAX_DEVS) {
            if self.cts_retired[d] >= self.cts_posted[d] || !self.cts_room(d, 1) {
                continue;
            }
            // Zero entries: no local memory, signaled.
            self.post_cts(d, 0, 0, true, post)?;
            marked |= 1 << d;
        }
        Ok(marked)
    }

    /// Whether every CTS write posted on the CTS QPs of `marked` was acknowledged.
    pub fn cts_landed(&self, marked: u32) -> bool {
        (0..MAX_DEVS).all(|d| marked & (1 << d) == 0 || self.cts_retired[d] >= self.cts_posted[d])
    }

    /// Post receives on QP `qp` in batches until it has at least `want` to spare.
    fn keep_spare(&mut self, qp: usize, want: usize, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        let Some(rq) = self.rqs.get_mut(qp) else {
            return Err(Error::internal(format!(
                "a receive on QP {qp} of a connection of {}",
                self.rqs.len()
            )));
        };
        while usize::from(rq.spare) < want {
            post(Post::Recv {
                qp,
                wr_id: wr_id(KIND_RECV, qp as u16),
                count: RQ_BATCH,
            })?;
            rq.spare += RQ_BATCH as u8;
        }
        Ok(())
    }

    /// Post the CTS write of the `len` staged entries from ring position `pos` into the same
    /// entries of the sender's FIFO, on device `d`'s CTS QP.
    fn post_cts(
        &mut self,
        d: usize,
        pos: usize,
        len: usize,
        signaled: bool,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        let rdev = self.cfg.routes.get(d).map_or(0, |r| r.remote_dev).min(MAX_DEVS - 1);
        let bytes = (len * fifo::ENTRY_BYTES) as u32;
        let wr = WorkRequest {
            wr_id: cts_wr_id(d, self.cts_posted[d]),
            op: Op::Write,
            // A close marker writes nothing (`post_close_markers`).
            local: (len > 0).then(|| Sge {
                addr: self.cfg.staging.addr + (pos * fifo::ENTRY_BYTES) as u64,
                len: bytes,
                lkey: self.cfg.staging.lkeys[d],
            }),
            remote: Remote {
                addr: self.cfg.peer_fifo.addr + (pos * fifo::ENTRY_BYTES) as u64,
                rkey: self.cfg.peer_fifo.rkeys[rdev],
            },
            signaled,
            inline: len > 0 && bytes <= self.cfg.cts_inline_max[d],
            prefix: None,
        };
        // Counted before posting: a WR the provider may hold counts against the queue.
        self.cts_posted[d] += 1;
        post(Post::Send {
            qp: d,
            chain: std::slice::from_ref(&wr),
        })
    }

    /// The QPs group `id`'s message completes on (one per QP it is spread over).
    fn qps_of(&self, id: u64) -> impl Iterator<Item = usize> {
        let (nq, nqps) = (self.cfg.qps_per_req, self.cfg.routes.len());
        (0..nq).map(move |j| split::qp_for_chunk(id, nq, j, nqps))
    }

    /// The QPs the receive posted last completes on (for the profiler's per-QP events), with
    /// the `wr_id` of their receives.
    pub fn last_receive_qps(&self) -> impl Iterator<Item = (usize, u64)> {
        self.qps_of(self.counter.wrapping_sub(1))
            .map(|qp| (qp, wr_id(KIND_RECV, qp as u16)))
    }

    /// The buffer a flush of this group reads back: the last non-empty one (`None`: nothing
    /// to flush).
    pub fn flush_target(sizes: &[i32]) -> Option<usize> {
        (0..sizes.len()).rev().find(|&i| sizes[i] > 0)
    }

    /// Start a flush: one one-byte read of `data` (rkey per device) into each device's
    /// `scratch`.
    pub fn iflush(
        &mut self,
        data: usize,
        rkeys: &[u32; MAX_DEVS],
        scratch: &[Sge],
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<u16> {
        self.state.check()?;
        // A NULL flush request means "nothing to flush" to NCCL, so a flush beyond the bound
        // must be an error here, not a retry (NCCL keeps ≤ 32 requests per comm, flushes
        // included: docs/nccl-net-abi.md#limits). The bound sizes the flush QPs and CQs.
        if self.flushes_in_flight >= request::FLUSHES_IN_FLIGHT {
            return Err(Error::internal(format!(
                "iflush: {} flushes of this receive comm are already in flight (NCCL keeps at most {} requests per comm)",
                self.flushes_in_flight,
                request::RECVS_IN_FLIGHT
            )));
        }
        let Some(r) = self.state.pool.alloc(ReqKind::Flush) else {
            return Err(Error::internal(format!(
                "iflush: all {} request slots of the receive comm are in flight",
                request::RECV_REQUESTS
            )));
        };
        if let Some(req) = self.state.pool.get_mut(r) {
            req.pending = request::pending_count(scratch.len());
        }
        self.flushes_in_flight += 1;
        for (dev, s) in scratch.iter().enumerate() {
            let wr = WorkRequest {
                wr_id: wr_id(KIND_FLUSH, r),
                op: Op::Read,
                local: Some(Sge { len: 1, ..*s }),
                remote: Remote {
                    addr: data as u64,
                    rkey: rkeys[dev.min(MAX_DEVS - 1)],
                },
                signaled: true,
                inline: false,
                prefix: None,
            };
            if let Err(e) = post(Post::Flush { dev, wr }) {
                return Err(self.state.fail(e));
            }
        }
        Ok(r)
    }

    /// A successful completion on a data CQ: a receive (with the sender's immediate) or a
    /// signaled CTS write (it and every CTS write before it on that QP are retired).
    ///
    /// The immediate of a single receive is its size; a grouped receive's names the ring
    /// position of the group's completion record, which must be the group's own: anything else
    /// is a replayed or forged completion (an honest sender's receives complete in posting
    /// order on each QP), and fails the comm.
    pub fn handle_completion(&mut self, wr_id: u64, imm: Option<u32>) {
        match wr_id >> KIND_SHIFT {
            KIND_RECV if self.cfg.named_imm => {
                let qp = (wr_id & 0xffff) as usize;
                self.named_completion(qp, imm);
            }
            KIND_RECV => {
                let qp = (wr_id & 0xffff) as usize;
                let Some(idx) = self.rqs.get_mut(qp).and_then(ReceiveQueue::pop) else {
                    self.state.fail(Error::remote(format!(
                        "the sender {} completed a message on QP {qp} that no posted receive waits for (an RDMA write with immediate it was not asked for: a replayed, duplicated or forged completion)",
                        self.cfg.peer
                    )));
                    return;
                };
                let Some(r) = self.state.pool.get_mut(idx) else {
                    return;
                };
                if r.kind() != ReqKind::Recv {
                    return;
                }
                let (n, pos) = (r.n(), r.pos());
                match imm {
                    Some(imm) if n > 1 && imm as usize != pos => {
                        let e = Error::remote(format!(
                            "the sender {} completed a grouped receive of {n} buffers (completion record at staging entry {pos}) with the immediate {imm}, which names another group's record: a replayed or forged completion from a corrupt or lying peer",
                            self.cfg.peer
                        ));
                        // The comm's error from now on (state.check returns it).
                        self.state.fail(e);
                    }
                    Some(imm) => {
                        r.size = imm;
                        r.complete_one();
                    }
                    None => {
                        r.complete_one();
                    }
                }
            }
            KIND_CTS => {
                let d = ((wr_id >> 48) & 0xff) as usize;
                let seq = wr_id & SEQ_MASK;
                if let Some(r) = self.cts_retired.get_mut(d) {
                    *r = (*r).max(seq + 1);
                }
            }
            _ => {}
        }
    }

    /// A completion on QP `qp` of a version-5 connection: its immediate names the receive.
    fn named_completion(&mut self, qp: usize, imm: Option<u32>) {
        let (pos, size) = match imm.map(Imm::parse) {
            Some(Imm::Eager { slot }) if self.eager.is_some() => return self.eager_arrived(qp, slot as u32),
            Some(Imm::Single { pos, size }) => (pos, Some(size)),
            Some(Imm::Record { pos }) => (pos, None),
            _ => (fifo::RING, None),
        };
        let r = self.req_at.get(pos).map_or(u16::MAX, |&r| u16::from(r));
        let live = self
            .state
            .pool
            .get(r)
            .is_some_and(|q| q.kind() == ReqKind::Recv && q.pos() == pos && (q.n() == 1 || size.is_none()));
        if !live || !self.rqs.get_mut(qp).is_some_and(|q| q.take(r)) {
            self.state.fail(Error::remote(format!(
                "the sender {} completed a message on QP {qp} with the immediate {imm:?}, which names no receive waiting there: a replayed or forged completion (or a duplicated one)",
                self.cfg.peer
            )));
            return;
        }
        if let Some(q) = self.state.pool.get_mut(r) {
            q.size = size.unwrap_or(SIZE_IN_RECORD);
            q.complete_one();
        }
    }

    /// An eager message arrived in landing slot `slot` over QP `qp` (decided by
    /// [`RecvCore::decide_eager`]). It must come on the eager QP, in order, within the credit.
    fn eager_arrived(&mut self, qp: usize, slot: u32) {
        let Some(e) = self.eager.as_mut() else {
            return;
        };
        let due = eager::slot_of(e.arrived);
        let lie = if qp != EAGER_QP {
            Some(format!("on QP {qp}, not the eager QP {EAGER_QP}"))
        } else if slot as usize != due {
            Some(format!("into slot {slot} where slot {due} is due"))
        } else if e.arrived >= e.granted {
            Some(format!("past the credit of {} messages this side granted", e.granted))
        } else {
            None
        };
        let rq = self.rqs.get_mut(EAGER_QP);
        match (lie, rq) {
            (None, Some(rq)) if rq.spare > 0 => {
                rq.spare -= 1;
                rq.taken += 1;
                e.arrived += 1;
            }
            (lie, _) => {
                let why = lie.unwrap_or_else(|| "with no receive to spare for it".to_string());
                self.state.fail(Error::remote(format!(
                    "the sender {} wrote an eager message {why}: a corrupt or lying peer",
                    self.cfg.peer
                )));
            }
        }
    }

    /// A successful read on a flush CQ: one device of the flush request is done.
    pub fn handle_flush_completion(&mut self, wr_id: u64) {
        if wr_id >> KIND_SHIFT != KIND_FLUSH {
            return;
        }
        if let Some(r) = self.state.pool.get_mut((wr_id & 0xffff) as u16) {
            if r.kind() == ReqKind::Flush {
                r.complete_one();
            }
        }
    }

    /// The kind of request `idx` (`None`: not one of ours).
    pub fn kind_of(&self, idx: u16) -> Option<ReqKind> {
        self.state.pool.get(idx).map(|r| r.kind())
    }

    /// Whether request `idx` is done: a receive reports its sizes (never more than was
    /// posted, whatever the peer claims) and gives its ring entries back; the slot is
    /// reclaimed. `None`: still in flight. A failed comm reports its error for every request.
    pub fn test(&mut self, ring: &impl StagingRing, idx: u16) -> Result<Option<RecvDone>> {
        self.state.check()?;
        let Some(r) = self.state.pool.get(idx) else {
            return Err(Error::internal("test: unknown receive request"));
        };
        let kind = r.kind();
        if kind != ReqKind::Recv && kind != ReqKind::Flush {
            return Err(Error::internal(
                "test: the request is not in flight (already completed?)",
            ));
        }
        if r.pending != 0 {
            return Ok(None);
        }
        let mut done = RecvDone {
            n: 0,
            sizes: [0; MAX_RECVS],
            oversized: None,
        };
        if kind == ReqKind::Recv {
            let (n, pos) = (r.n(), r.pos());
            for i in 0..n {
                let got = if n == 1 && r.size != SIZE_IN_RECORD {
                    r.size
                } else {
                    ring.load_record(pos, i)
                };
                let posted = self.posted[fifo::ring_pos((pos + i) as u64)];
                if u64::from(got) > posted && !self.oversized_reported {
                    self.oversized_reported = true;
                    done.oversized = Some(Oversized {
                        buffer: i,
                        n,
                        claimed: got,
                        posted,
                    });
                }
                done.sizes[i] = u64::from(got).min(posted) as u32;
            }
            done.n = n;
            self.recvs_in_flight -= 1;
            // We have read the group's record, and unless an eager message filled it the
            // sender consumed it (it sent), and every group before it: its ring entries are
            // free once every group posted before it is too. An eager group's entries wait
            // until the sender is known to have read them. The ring position is mod RING; the
            // absolute start is the one at or below the ring's next start.
            let start = self.ring.abs_start(pos);
            let bound = match self.eager.as_mut() {
                Some(e) => {
                    let bound = e.marks[pos] & CLAIM_BOUND != 0;
                    e.marks[pos] = 0;
                    bound
                }
                None => false,
            };
            if !bound {
                self.ring.prove(start + n as u64);
            }
            self.ring.release(start, n);
        } else {
            self.flushes_in_flight -= 1;
        }
        self.state.pool.free(idx);
        Ok(Some(done))
    }

    /// Stop posting: the connection's QPs failed and are being replaced ([`super::recovery`]).
    /// irecv says "retry later" until [`RecvCore::resume`]. Completions polled from the old
    /// QPs meanwhile are still taken (each is a message that landed); failed ones are dropped.
    pub fn begin_recovery(&mut self) {
        self.recovering = true;
        // The resume writes every entry the sender has not read again, these among them.
        self.pending_cts = None;
    }

    /// The recovery placed the QPs on other members (failover, failback): the CTS writes,
    /// also the rewrite, take the new routes.
    pub fn reroute(&mut self, routes: &[QpRoute]) -> Result<()> {
        super::plan::reroute(&mut self.cfg.routes, routes, MAX_DEVS, MAX_DEVS)
    }

    pub fn recovering(&self) -> bool {
        self.recovering
    }

    /// The receiver's part of a recovery report: per QP, the write-with-immediate completions
    /// taken on it since the connection was made. Final once every completion of the old QPs
    /// was taken: the driver moves them to ERR and polls until each posted receive flushed,
    /// so a message the sender saw acknowledged is one this side counts.
    pub fn taken(&self) -> Vec<u64> {
        self.rqs.iter().map(|q| q.taken).collect()
    }

    /// Whether `wr_id` is one of our receives (a QP moved to ERR flushes each).
    pub fn is_receive(wr_id: u64) -> bool {
        wr_id >> KIND_SHIFT == KIND_RECV
    }

    /// Receives posted on each QP: one per request it owes a completion, and the ones to
    /// spare (what a QP moved to ERR flushes).
    pub fn posted_receives(&self, qp: usize) -> usize {
        self.rqs
            .get(qp)
            .map_or(0, |q| usize::from(q.len) + usize::from(q.spare))
    }

    /// Post the receives of the connection's new QPs (empty receive queues): one per request
    /// each QP still owes a completion, and a batch to spare.
    pub fn repost_receives(&mut self, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        for qp in 0..self.rqs.len() {
            // In batches of at most RQ_BATCH, as every receive post; the eager QP keeps as
            // many to spare as the credit granted may need.
            let spare = if qp == EAGER_QP && self.eager.is_some() {
                EAGER_SPARE.next_multiple_of(RQ_BATCH)
            } else {
                RQ_BATCH
            };
            let mut left = usize::from(self.rqs[qp].len) + spare;
            while left > 0 {
                let count = left.min(RQ_BATCH);
                if let Err(e) = post(Post::Recv {
                    qp,
                    wr_id: wr_id(KIND_RECV, qp as u16),
                    count,
                }) {
                    return Err(self.state.fail(e));
                }
                left -= count;
            }
            self.rqs[qp].spare = spare as u8;
        }
        Ok(())
    }

    /// Carry on over the new QPs once the sender said where its next group starts in the FIFO
    /// ring (`sender_head`): the CTS entries from there on may not have reached it, so they
    /// are written again (the same bytes; at most two signaled writes, on device 0's CTS QP).
    /// The sender must not take an entry from there before [`RecvCore::rewrites_landed`]
    /// (a rewrite landing late would cover the sizes a grouped send stages in its entry), so
    /// the recovery sends its Ready only then. Every CTS write of the old QPs is gone. A head
    /// outside the entries this side posted fails the comm. Returns the entries written again.
    pub fn resume(&mut self, sender_head: u64, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<usize> {
        self.state.check()?;
        let (oldest, next) = (self.ring.oldest(), self.ring.next_start());
        if sender_head < oldest || sender_head > next {
            return Err(self.state.fail(Error::remote(format!(
                "the sender {} says its next CTS entry is {sender_head}, but this side's entries in flight are {oldest}..{next}: a corrupt or lying peer",
                self.cfg.peer
            ))));
        }
        self.cts_retired = self.cts_posted;
        self.ring.prove(sender_head);
        let n = (next - sender_head) as usize;
        let d = 0;
        for (pos, len) in fifo::pieces(sender_head, n) {
            if len == 0 {
                continue;
            }
            // Signaled: its completion says it landed.
            if let Err(e) = self.post_cts(d, pos, len, true, post) {
                return Err(self.state.fail(e));
            }
        }
        self.rewritten_until = self.cts_posted[d];
        self.recovering = false;
        Ok(n)
    }

    /// Whether the CTS writes of the last [`RecvCore::resume`] have landed at the sender.
    pub fn rewrites_landed(&self) -> bool {
        self.cts_retired[0] >= self.rewritten_until
    }

    /// The operation and byte count of a `wr_id` (for a completion error's WARN).
    pub fn describe(&self, wr_id: u64) -> (&'static str, usize) {
        let low = (wr_id & 0xffff) as u16;
        let r = match wr_id >> KIND_SHIFT {
            KIND_RECV => self.rqs.get(usize::from(low)).and_then(ReceiveQueue::front),
            _ => Some(low),
        }
        .and_then(|i| self.state.pool.get(i));
        match wr_id >> KIND_SHIFT {
            // (The byte count of a failed receive is the announced size, when one arrived.)
            KIND_RECV => (
                "receive (RDMA write with immediate from the sender)",
                r.map_or(0, |r| r.size as usize),
            ),
            KIND_CTS => ("RDMA write (CTS to the sender)", fifo::ENTRY_BYTES),
            KIND_FLUSH => ("RDMA read (GPU flush)", 1),
            _ => ("unknown operation", 0),
        }
    }
}

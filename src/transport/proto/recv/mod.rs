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
//!
//! One concept per file: [`cts`] posts receives and writes CTS entries (the CTS path),
//! [`close`] marks the CTS writes a closing comm waits for, [`eager_path`] decides the eager
//! messages that landed, [`completion`] takes completions and reports requests, [`flush`]
//! plans GPU-flush reads, [`replay`] carries a connection over a recovery; [`rq`] keeps each
//! QP's owed receives and [`wr_id`] the `wr_id` layouts.

use super::eager::{self, SLOTS};
use super::fifo::{self, CtsEntry};
use super::limits::{MAX_DEVS, MAX_RECVS};
use super::plan::{LocalBlock, QpRoute, RemoteBlock};
use super::request::{self, RequestPool};
use super::state::{CommState, FailureReport};
use rq::ReceiveQueue;

mod close;
mod completion;
mod cts;
mod eager_path;
mod flush;
mod replay;
mod rq;
#[cfg(test)]
mod tests;
mod wr_id;

pub use rq::RQ_BATCH;

/// Send-queue depth of a receiver QP, and the CQ entries its CTS writes may take. Bound: CTS
/// WRs posted on a device's CTS QP and not yet retired ≤ CTS_DEPTH, enforced by `irecv` (which
/// says "retry later" beyond); a WR is retired when the completion of a signaled one at or
/// after it shows the queue got that far. Every [`CTS_SIGNAL_EVERY`]-th is signaled, so
/// whenever `irecv` is refused for credits (≥ CTS_DEPTH − 3 unretired: one irecv posts ≤ 2
/// writes, and may flush ≤ 2 staged ones first) a signaled one is among them and its
/// completion will come.
pub const CTS_DEPTH: usize = 32;
/// One CTS write in this many is signaled. Each signaled one is a completion the NIC makes and
/// the receiver polls (on softroce, CPU time of both); half of [`CTS_DEPTH`] keeps the credit
/// rule above with room to spare (docs/design/data-path.md, transfers).
pub const CTS_SIGNAL_EVERY: u64 = 16;
const _: () = assert!(CTS_DEPTH as u64 >= CTS_SIGNAL_EVERY + 3 && CTS_DEPTH >= 4);

/// Receives the eager QP keeps spare before a CTS write grants eager credit: one for every
/// eager message the credit lets the sender have in flight, and one for the receive the write's
/// own group may take on that QP.
const EAGER_SPARE: usize = SLOTS + 1;
// Eager groups the sender may not have consumed yet hold ring entries here; a whole group of the
// most buffers must still fit beside them and the most single receives.
const _: () = assert!(SLOTS + request::RECVS_IN_FLIGHT + MAX_RECVS <= fifo::RING);
#[cfg(any(test, feature = "testing"))]
/// Receive-queue depth of a receiver QP (`max_recv_wr`), and the CQ entries its receives may
/// take when the QP fails and flushes them all: [`rq_depth`], at most this.
pub const RQ_DEPTH: usize = request::RECVS_IN_FLIGHT + RQ_BATCH + SLOTS;

/// The receive-queue depth of a receiver QP, with the eager path or without.
pub fn rq_depth(eager: bool) -> usize {
    request::RECVS_IN_FLIGHT + RQ_BATCH + if eager { SLOTS } else { 0 }
}

/// A single receive's [`request::Request::size`] while its size is in the completion record
/// (no message size is this large: they saturate at `i32::MAX`).
const SIZE_IN_RECORD: u32 = u32::MAX;

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

impl RecvCore {
    pub fn new(cfg: RecvConfig, report: FailureReport) -> RecvCore {
        RecvCore {
            state: CommState::new(RequestPool::with_capacity(request::RECV_REQUESTS), report),
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
}

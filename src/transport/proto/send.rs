//! The sender's protocol (spec §8.8): read the receiver's CTS entries from our FIFO ring, match
//! isends to the buffers of the oldest group by tag, and when the group is complete plan RDMA
//! WRITEs (split in 128-byte multiples over the chosen QPs) ending in one signaled RDMA WRITE
//! WITH IMMEDIATE per QP.
//!
//! Every data QP has [`SQ_DEPTH`] send-queue credits: a chain of k WRs takes k, and the
//! completion of its signaled last WR (which retires the whole chain: RC completes in order)
//! gives them back. A complete group whose chains do not fit waits (its requests are in flight,
//! not done) and is planned by a later call once completions gave credits back.
//!
//! A grouped send stages its n sizes (the source of the completion-record write) in the first
//! FIFO entry of the group ([`fifo::SIZES_IN_ENTRY`]). The entry is dead for us once the group
//! was copied out: we read its stamp again only for a later posting counter (the stamp is
//! untouched, so it never matches). The receiver writes it again only after this group's
//! receive completed, so after every write reading these sizes executed at the receiver (a
//! retransmitted duplicate is not executed again, IBTA C9-105). So the FIFO needs no separate
//! sizes array.
//!
//! Nothing here allocates after construction.

use super::fifo::{self, CtsEntry, GroupState};
use super::limits::{self, MAX_CHAIN, MAX_DEVS, MAX_RECVS};
use super::plan::{LocalBlock, Op, Post, QpRoute, Remote, RemoteBlock, Sge, WorkRequest};
use super::request::{self, ReqKind, RequestPool, SendWrId};
use super::split::{self, WrPlan};
use super::state::{CommState, FailureReport};
use super::time::Time;
use crate::error::{Error, Result};
use std::time::Duration;

/// Send-queue credits of a data QP, its `max_send_wr`, and its CQ entries. Bound: WRs posted on
/// the QP and not yet retired by a polled completion ≤ SQ_DEPTH (the credits), so the send
/// queue cannot overflow, and neither can the CQ: a QP puts at most one entry per chain there
/// (its signaled WR), or one per WR when it fails and flushes them all. 64: 64 single messages
/// or 7 groups of 8 (9 WRs each) in flight per QP; a chain is ≤ [`MAX_CHAIN`] WRs, so an idle
/// QP always takes one.
pub const SQ_DEPTH: usize = 64;
const _: () = assert!(SQ_DEPTH >= MAX_CHAIN && SQ_DEPTH <= u16::MAX as usize);

/// The sender's FIFO ring, registered memory the receiver's NIC writes CTS entries into. The
/// driver implements it with volatile loads (the stamp alone first, then, after an acquire
/// fence, the entries); the simulation with plain bytes.
pub trait FifoRing {
    /// The raw (wire-order) stamp word of the entry at ring position `pos` (< RING), alone.
    fn load_stamp(&self, pos: usize) -> u64;
    /// The whole entry at `pos` (wire order), loaded after its stamp matched.
    fn load_entry(&self, pos: usize) -> CtsEntry;
    /// Stage a grouped send's sizes (host order; stored little-endian) in the consumed entry
    /// at `pos`, from byte [`fifo::SIZES_IN_ENTRY`].
    fn store_sizes(&mut self, pos: usize, sizes: &[u32]);
}

/// What the sender needs to know of its connection.
#[derive(Clone, Debug)]
pub struct SendConfig {
    /// Per QP of the connection: its local and the peer's member device.
    pub routes: Vec<QpRoute>,
    /// QPs each message is spread over.
    pub qps_per_req: usize,
    /// Adaptive routing: single messages larger than this complete with a separate zero-byte
    /// write-with-immediate. `None`: off.
    pub ar_threshold: Option<usize>,
    /// Give up when a group's stamp is there but its entries never verify for this long.
    pub landing_timeout: Duration,
    /// The most bytes one RDMA WRITE carries (the smallest `max_msg_sz` of our member
    /// devices, at most [`limits::MAX_WR_BYTES`]); longer chunks are cut into pieces.
    pub wr_bytes: usize,
    /// Our FIFO block (the source of the grouped sizes write).
    pub fifo: LocalBlock,
    /// The peer as messages name it (its side-channel address).
    pub peer: String,
    /// The receiver's completion records: the record of ring position `p` is `p × ENTRY_BYTES`
    /// past `addr`.
    pub peer_records: RemoteBlock,
}

/// The oldest group once all its entries have landed. `matched` full and `active` = complete
/// and waiting for send-queue credits.
struct CurGroup {
    active: bool,
    n: usize,
    entries: [CtsEntry; MAX_RECVS],
    matched: u8,
    reqs: [u16; MAX_RECVS],
    data: [usize; MAX_RECVS],
    len: [usize; MAX_RECVS],
    lkeys: [[u32; MAX_DEVS]; MAX_RECVS],
}

/// The answer to an isend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isend {
    /// Request `idx` of the pool took the send. `truncated_to`: the posted receive is smaller
    /// than the send (reported once per comm): the send carries this many bytes.
    Started { idx: u16, truncated_to: Option<usize> },
    /// No receive buffer with this tag in the oldest group yet: retry later.
    NoBuffer,
    /// Every request slot is in flight, or the group before waits for send-queue credits.
    Busy,
}

/// The sender's state machine.
pub struct SendCore {
    pub state: CommState,
    cfg: SendConfig,
    /// Groups consumed (posted) so far: the posting counter of the next group.
    counter: u64,
    /// Absolute FIFO entry where the next group starts.
    head: u64,
    /// Send-queue credits per QP of the connection.
    credits: Box<[u16]>,
    cur: CurGroup,
    truncate_reported: bool,
    /// When the current group's stamp was first seen without consistent entries.
    landing_since: Option<Time>,
}

impl SendCore {
    pub fn new(cfg: SendConfig, report: FailureReport) -> SendCore {
        let credits = vec![SQ_DEPTH as u16; cfg.routes.len()].into_boxed_slice();
        SendCore {
            state: CommState::new(RequestPool::new(std::ptr::null_mut(), request::SEND_REQUESTS), report),
            cfg,
            counter: 0,
            head: 0,
            credits,
            cur: CurGroup {
                active: false,
                n: 0,
                entries: [CtsEntry::default(); MAX_RECVS],
                matched: 0,
                reqs: [0; MAX_RECVS],
                data: [0; MAX_RECVS],
                len: [0; MAX_RECVS],
                lkeys: [[0; MAX_DEVS]; MAX_RECVS],
            },
            truncate_reported: false,
            landing_since: None,
        }
    }

    /// QPs of the connection.
    pub fn qps(&self) -> usize {
        self.cfg.routes.len()
    }

    /// Whether the current group is complete and waits for send-queue credits.
    pub fn waiting(&self) -> bool {
        self.cur.active && self.cur.matched == fifo::full_mask(self.cur.n)
    }

    /// Whether the oldest group is matched in part: some of its buffers still wait for their
    /// isend.
    pub fn group_open(&self) -> bool {
        self.cur.active && !self.waiting()
    }

    /// Look for the next group in the ring; true when all its entries are there and sealed.
    /// `now` is asked only while a group is landing.
    fn load_group(&mut self, ring: &impl FifoRing, now: impl FnOnce() -> Time) -> Result<bool> {
        let mut es = [CtsEntry::default(); MAX_RECVS];
        let st = fifo::read_group(
            self.head,
            self.counter,
            |pos| ring.load_stamp(pos),
            |pos| ring.load_entry(pos),
            &mut es,
        );
        match st {
            GroupState::Ready(n) => {
                self.landing_since = None;
                self.cur.active = true;
                self.cur.n = n;
                self.cur.entries = es;
                self.cur.matched = 0;
                Ok(true)
            }
            GroupState::NotPosted => {
                self.landing_since = None;
                Ok(false)
            }
            GroupState::Landing => {
                // Still being written; a seal that never verifies means a broken peer.
                let now = now();
                let since = *self.landing_since.get_or_insert(now);
                let waited = now.saturating_since(since);
                if waited > self.cfg.landing_timeout {
                    return Err(self.state.fail(Error::remote(format!(
                        "the CTS entries from the receiver {} for group {} (FIFO entry {}) never became consistent (seal/count mismatch for {waited:?}): a corrupt or incompatible peer",
                        self.cfg.peer,
                        self.counter,
                        fifo::ring_pos(self.head),
                    ))));
                }
                Ok(false)
            }
        }
    }

    /// Start a send of `size` bytes at `data` (lkeys per member device) to the buffer with
    /// `tag` in the oldest posted group. The group is planned into `post` as soon as every one
    /// of its buffers has a send (and its chains fit the credits).
    pub fn isend(
        &mut self,
        ring: &mut impl FifoRing,
        now: impl FnOnce() -> Time,
        send: SendBuf,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<Isend> {
        self.state.check()?;
        if self.waiting() {
            return Ok(Isend::Busy);
        }
        if !self.cur.active && !self.load_group(ring, now)? {
            return Ok(Isend::NoBuffer);
        }
        let n = self.cur.n;
        let Some(i) = fifo::match_tag(&self.cur.entries[..n], self.cur.matched, send.tag) else {
            return Ok(Isend::NoBuffer);
        };
        let Some(r) = self.state.pool.alloc(ReqKind::Send) else {
            return Ok(Isend::Busy);
        };
        let posted = usize::try_from(self.cur.entries[i].size).unwrap_or(usize::MAX);
        let len = send.size.min(posted);
        let truncated_to = (send.size > posted && !self.truncate_reported).then_some(posted);
        self.truncate_reported |= truncated_to.is_some();
        self.cur.reqs[i] = r;
        self.cur.data[i] = send.data;
        self.cur.len[i] = len;
        self.cur.lkeys[i] = send.lkeys;
        self.cur.matched |= 1 << i;
        let pos = fifo::ring_pos(self.head);
        if let Some(req) = self.state.pool.get_mut(r) {
            req.set_pos_n(pos, n);
            req.size = reported_size(len);
            // Not posted yet: one placeholder completion, replaced when the group is posted.
            req.pending = 1;
        }
        self.post_waiting(ring, post)?;
        Ok(Isend::Started { idx: r, truncated_to })
    }

    /// Plan the complete current group into `post` if every chain fits its QP's credits (else
    /// leave it waiting). A posting error fails the comm.
    pub fn post_waiting(
        &mut self,
        ring: &mut impl FifoRing,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        if !self.waiting() {
            return Ok(());
        }
        let id = self.counter;
        let n = self.cur.n;
        let nq = self.cfg.qps_per_req;
        let nqps = self.qps();
        let ar_split = n == 1 && self.cfg.ar_threshold.is_some_and(|t| self.cur.len[0] > t);
        // On the stack: a comm keeps no plan between calls (memory per connection).
        let mut plan = [WrPlan::ZeroImm; MAX_CHAIN];
        let mut chain = [WorkRequest::EMPTY; MAX_CHAIN];
        let wr_bytes = self.cfg.wr_bytes;
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            let Some(k) = split::plan_chain(&self.cur.len[..n], nq, j, ar_split, wr_bytes, &mut plan) else {
                return Err(self.state.fail(self.oversized_group()));
            };
            if usize::from(self.credits[q]) < k {
                return Ok(());
            }
        }
        let pos = fifo::ring_pos(self.head);
        if n > 1 {
            let mut sizes = [0u32; MAX_RECVS];
            for (s, &l) in sizes.iter_mut().zip(&self.cur.len[..n]) {
                *s = reported_size(l);
            }
            ring.store_sizes(pos, &sizes[..n]);
        }
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            // Planned above, so it fits.
            let k = split::plan_chain(&self.cur.len[..n], nq, j, ar_split, wr_bytes, &mut plan).unwrap_or(0);
            self.build_chain(q, &plan[..k], pos, &mut chain);
            // Taken before posting: a partly posted chain still counts against the queue.
            self.credits[q] -= k as u16;
            if let Err(e) = post(Post::Send {
                qp: q,
                chain: &chain[..k],
            }) {
                return Err(self.state.fail(e));
            }
        }
        for &r in &self.cur.reqs[..n] {
            if let Some(req) = self.state.pool.get_mut(r) {
                req.pending = request::pending_count(nq);
            }
        }
        self.counter += 1;
        self.head += n as u64;
        self.cur.active = false;
        Ok(())
    }

    /// Why the complete current group cannot be posted: a buffer takes more WRs than one chain
    /// holds (the receiver posted more than this side's `maxP2pBytes`).
    fn oversized_group(&self) -> Error {
        let largest = self.cur.len[..self.cur.n].iter().copied().max().unwrap_or(0);
        Error::internal(format!(
            "a send of {largest} bytes to {} needs more than {MAX_CHAIN} RDMA writes on one QP: this side carries at most {} bytes per message (maxP2pBytes: {} pieces of {} bytes, the devices' max_msg_sz); the receiver posted a larger buffer — check that both sides run the same ferroce and NICs with the same max_msg_sz",
            self.cfg.peer,
            split::max_buffer_bytes(self.cfg.wr_bytes),
            limits::PIECES_PER_BUFFER,
            split::piece_bytes(self.cfg.wr_bytes),
        ))
    }

    /// Turn the planned WRs of QP `q` into work requests in `chain`.
    fn build_chain(&self, q: usize, plan: &[WrPlan], pos: usize, chain: &mut [WorkRequest; MAX_CHAIN]) {
        let k = plan.len();
        let route = self.cfg.routes[q];
        let (ldev, rdev) = (route.dev.min(MAX_DEVS - 1), route.remote_dev.min(MAX_DEVS - 1));
        let n = self.cur.n;
        let wr_id = SendWrId::new(&self.cur.reqs[..n], k, q).0;
        let completion_imm = reported_size(self.cur.len[0]);
        for x in 0..k {
            let cur = &self.cur;
            chain[x] = match plan[x] {
                WrPlan::Data { sub, off, len, imm } => {
                    let i = usize::from(sub);
                    let e = &cur.entries[i];
                    WorkRequest {
                        wr_id,
                        op: if imm { Op::WriteImm(completion_imm) } else { Op::Write },
                        local: (len > 0).then(|| Sge {
                            addr: (cur.data[i] + off) as u64,
                            len: len as u32,
                            lkey: cur.lkeys[i][ldev],
                        }),
                        remote: Remote {
                            addr: e.addr.wrapping_add(off as u64),
                            rkey: e.rkeys[rdev],
                        },
                        signaled: imm,
                        inline: false,
                    }
                }
                // AR: a zero-length write carries the completion behind the bulk data.
                WrPlan::ZeroImm => WorkRequest {
                    wr_id,
                    op: Op::WriteImm(completion_imm),
                    local: None,
                    remote: Remote {
                        addr: cur.entries[0].addr,
                        rkey: cur.entries[0].rkeys[rdev],
                    },
                    signaled: true,
                    inline: false,
                },
                // Grouped: the n sizes go into the receiver's completion record of the group
                // (inside its CTS staging entry, fifo::SIZES_IN_ENTRY).
                WrPlan::SizesImm => WorkRequest {
                    wr_id,
                    op: Op::WriteImm(pos as u32),
                    local: Some(Sge {
                        addr: self.cfg.fifo.addr + (pos * fifo::ENTRY_BYTES + fifo::SIZES_IN_ENTRY) as u64,
                        len: (n * 4) as u32,
                        lkey: self.cfg.fifo.lkeys[ldev],
                    }),
                    remote: Remote {
                        addr: self.cfg.peer_records.addr + (pos * fifo::ENTRY_BYTES) as u64,
                        rkey: self.cfg.peer_records.rkeys[rdev],
                    },
                    signaled: true,
                    inline: false,
                },
            };
        }
    }

    /// A successful completion: the final signaled write of one QP's chain for a group. It
    /// retires the whole chain: its WRs' credits come back, and each request of the group
    /// counts one of the QPs it waits for.
    pub fn handle_completion(&mut self, wr_id: u64) {
        let w = SendWrId(wr_id);
        if let Some(c) = self.credits.get_mut(w.qp()) {
            *c = (usize::from(*c) + w.chain()).min(SQ_DEPTH) as u16;
        }
        let pool = &mut self.state.pool;
        let n = pool.get(w.lane(0)).map_or(1, |r| r.n());
        for lane in 0..n {
            if let Some(r) = pool.get_mut(w.lane(lane)) {
                if r.kind() == ReqKind::Send {
                    r.complete_one();
                }
            }
        }
    }

    /// Whether send request `idx` is done: its size, and the slot is reclaimed. `None`: still
    /// in flight. A failed comm reports its error for every request.
    pub fn test(&mut self, idx: u16) -> Result<Option<u32>> {
        self.state.check()?;
        let Some(r) = self.state.pool.get(idx) else {
            return Err(Error::internal("test: unknown send request"));
        };
        if r.kind() != ReqKind::Send {
            return Err(Error::internal(
                "test: the request is not in flight (already completed?)",
            ));
        }
        if r.pending != 0 {
            return Ok(None);
        }
        let size = r.size;
        self.state.pool.free(idx);
        Ok(Some(size))
    }

    /// The operation and byte count of a send `wr_id` (for a completion error's WARN).
    pub fn describe(&self, wr_id: u64) -> (&'static str, usize) {
        let w = SendWrId(wr_id);
        let pool = &self.state.pool;
        let n = pool.get(w.lane(0)).map_or(1, |r| r.n());
        let bytes = (0..n)
            .filter_map(|l| pool.get(w.lane(l)))
            .map(|r| r.size as usize)
            .sum();
        ("RDMA write (data)", bytes)
    }
}

/// A message size as the immediate, a completion record and [`Request::size`] carry it:
/// saturated at `u32::MAX` (4 GiB − 1). Exact below that, which is every size `test` can
/// report: its sizes are `int`, so both ends saturate them at `i32::MAX` there anyway.
///
/// [`Request::size`]: super::request::Request::size
pub fn reported_size(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

/// One isend's buffer as the core needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendBuf {
    pub data: usize,
    pub size: usize,
    pub tag: i32,
    /// The registration's lkey on every member device.
    pub lkeys: [u32; MAX_DEVS],
}

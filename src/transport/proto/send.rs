//! The sender's protocol (docs/nccl-net-abi.md#data-path): read the receiver's CTS entries from
//! our FIFO ring, match
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

use super::eager::{self, EagerSendConfig, GroupView, Header, Imm, SenderState, EAGER_QP};
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
    /// Member devices of this side and of the peer: every key and buffer covers them all, and
    /// a recovery may move QPs to any of them (the routes may use fewer: active-standby).
    pub local_devs: usize,
    pub peer_devs: usize,
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
    /// The eager path (a version-5 connection whose receiver offers a landing ring, and
    /// `FERROCE_EAGER_MAX` > 0 here); `None`: off.
    pub eager: Option<EagerSendConfig>,
    /// Completions name their receive ([`eager::Imm`]): a version-5 connection.
    pub named_imm: bool,
}

/// The oldest group once all its entries have landed. `matched` full and `active` = complete
/// and waiting for send-queue credits. A recovery rebuilds one of these for each group it posts
/// again.
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
    /// than the send (reported once per comm): the send carries this many bytes. `eager`: it
    /// went at once to the receiver's landing ring, claiming its next receive.
    Started {
        idx: u16,
        truncated_to: Option<usize>,
        eager: bool,
    },
    /// No receive buffer with this tag in the oldest group yet: retry later.
    NoBuffer,
    /// Every request slot is in flight, or the group before waits for send-queue credits.
    Busy,
}

/// What the sender keeps of each send request until it completes, so that a recovery can post
/// its chains again on new QPs (NCCL keeps the buffer until the request completes): the
/// buffer's address, and packed its length (bits 0..35: at most 7 GiB), its index in the group
/// (bits 35..38) and the low bits of its group's posting counter (bits 38..64).
#[derive(Clone, Copy, Default)]
struct Kept {
    data: u64,
    packed: u64,
}

const KEPT_LEN_BITS: u32 = 35;
const KEPT_BUF_SHIFT: u32 = KEPT_LEN_BITS;
const KEPT_COUNTER_SHIFT: u32 = KEPT_BUF_SHIFT + 3;
const KEPT_COUNTER_MASK: u64 = (1 << (64 - KEPT_COUNTER_SHIFT)) - 1;
const _: () = assert!(
    (1u64 << KEPT_LEN_BITS) > (limits::PIECES_PER_BUFFER * limits::MAX_WR_BYTES) as u64,
    "the largest buffer's length fits"
);

impl Kept {
    fn new(data: usize, len: usize, buf: usize) -> Kept {
        Kept {
            data: data as u64,
            packed: (len as u64 & ((1 << KEPT_LEN_BITS) - 1)) | ((buf as u64 & 7) << KEPT_BUF_SHIFT),
        }
    }
    fn len(self) -> usize {
        (self.packed & ((1 << KEPT_LEN_BITS) - 1)) as usize
    }
    fn buf(self) -> usize {
        ((self.packed >> KEPT_BUF_SHIFT) & 7) as usize
    }
    fn set_counter(&mut self, counter: u64) {
        self.packed =
            (self.packed & ((1 << KEPT_COUNTER_SHIFT) - 1)) | ((counter & KEPT_COUNTER_MASK) << KEPT_COUNTER_SHIFT);
    }
    fn counter_low(self) -> u64 {
        self.packed >> KEPT_COUNTER_SHIFT
    }
}

/// The chains of one QP posted and not yet retired by a successful completion, oldest first
/// (RC retires them in that order), each named by the request in its lane 0, and how many
/// chains the QP was given since the connection was made.
#[derive(Clone, Copy)]
struct ChainLog {
    lane0: [u8; SQ_DEPTH],
    head: u8,
    len: u8,
    posted: u64,
}

const _: () = assert!(SQ_DEPTH < u8::MAX as usize, "a chain count fits u8");
/// A chain log entry of an eager message: this bit and its slot (request indices stay below).
const EAGER_CHAIN: u16 = 0x80;
const _: () = assert!(
    request::SEND_REQUESTS <= EAGER_CHAIN as usize,
    "request indices stay below the mark"
);
const _: () = assert!(eager::SLOTS < EAGER_CHAIN as usize, "a slot fits beside the mark");

/// The slot of an eager chain's log entry (`None`: a group's chain).
fn eager_chain(lane0: u16) -> Option<usize> {
    (lane0 & EAGER_CHAIN != 0).then_some(usize::from(lane0 & !EAGER_CHAIN))
}
const _: () = assert!(request::SEND_REQUESTS <= u8::MAX as usize, "a request index fits u8");

impl ChainLog {
    const EMPTY: ChainLog = ChainLog {
        lane0: [0; SQ_DEPTH],
        head: 0,
        len: 0,
        posted: 0,
    };
    fn push(&mut self, lane0: u16) {
        // A chain takes ≥ 1 credit of SQ_DEPTH, so at most SQ_DEPTH are unretired.
        if usize::from(self.len) < SQ_DEPTH {
            self.lane0[(usize::from(self.head) + usize::from(self.len)) % SQ_DEPTH] = lane0 as u8;
            self.len += 1;
        }
        self.posted += 1;
    }
    fn pop(&mut self) {
        if self.len > 0 {
            self.head = ((usize::from(self.head) + 1) % SQ_DEPTH) as u8;
            self.len -= 1;
        }
    }
    fn at(&self, k: usize) -> u16 {
        u16::from(self.lane0[(usize::from(self.head) + k) % SQ_DEPTH])
    }
    /// The oldest unretired chain's entry (the one the next completion retires).
    fn front(&self) -> Option<u16> {
        (self.len > 0).then(|| self.at(0))
    }
    /// Chains retired so far.
    fn retired(&self) -> u64 {
        self.posted - u64::from(self.len)
    }
}

/// What [`SendCore::resume`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Chains the receiver had taken although their completions never came back here.
    pub landed: usize,
    /// Chains posted again, and their bytes.
    pub chains: usize,
    pub bytes: u64,
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
    /// When the current group's stamp was first seen without consistent entries, or an
    /// impossible entry at the head ([`fifo::impossible_head_entry`]).
    landing_since: Option<Time>,
    /// Per ring position, the stamp and seal words (wire order) of the entry this side last
    /// consumed there (zero: never, the memory is as allocated): what an honest receiver
    /// leaves there until it posts the group the sender expects. Kept from the consumption,
    /// not sampled when the head gets there, so a rewrite that lands before the sender looks
    /// is caught too.
    consumed_stamps: [u64; fifo::RING],
    consumed_seals: [u32; fifo::RING],
    /// Per request: its buffer (for a replay).
    kept: Box<[Kept]>,
    /// Per request and local member device: its buffer's lkey.
    kept_lkeys: Box<[u32]>,
    nldevs: usize,
    /// Per ring position and remote member device: the rkeys of the group's first CTS entry,
    /// which a grouped send's staged sizes overwrite in the FIFO ring.
    first_rkeys: Box<[u32]>,
    nrdevs: usize,
    /// Per QP: its unretired chains.
    chains: Box<[ChainLog]>,
    /// Between [`SendCore::begin_recovery`] and [`SendCore::resume`]: nothing is posted.
    recovering: bool,
    /// The eager path's state (`None`: off).
    eager: Option<Box<SenderState>>,
}

impl SendCore {
    pub fn new(cfg: SendConfig, report: FailureReport) -> SendCore {
        let credits = vec![SQ_DEPTH as u16; cfg.routes.len()].into_boxed_slice();
        let routed = |dev: fn(&QpRoute) -> usize| cfg.routes.iter().map(|r| dev(r) + 1).max().unwrap_or(1);
        let nldevs = cfg.local_devs.max(routed(|r| r.dev)).min(MAX_DEVS);
        let nrdevs = cfg.peer_devs.max(routed(|r| r.remote_dev)).min(MAX_DEVS);
        let chains = vec![ChainLog::EMPTY; credits.len()].into_boxed_slice();
        // The eager path needs completions that name their receive, and its writes stay within
        // what one WR carries (header and payload together, when inline).
        let cfg_eager = cfg.eager.filter(|_| cfg.named_imm).map(|mut e| {
            e.max = e.max.min(cfg.wr_bytes.saturating_sub(eager::EAGER_HEADER_BYTES));
            e
        });
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
            consumed_stamps: [0; fifo::RING],
            consumed_seals: [0; fifo::RING],
            kept: vec![Kept::default(); request::SEND_REQUESTS].into_boxed_slice(),
            kept_lkeys: vec![0; request::SEND_REQUESTS * nldevs].into_boxed_slice(),
            nldevs,
            first_rkeys: vec![0; fifo::RING * nrdevs].into_boxed_slice(),
            nrdevs,
            chains,
            recovering: false,
            eager: cfg_eager.map(|c| Box::new(SenderState::new(c))),
        }
    }

    /// The eager path's state, for statistics and tests (`None`: off).
    pub fn eager(&self) -> Option<&SenderState> {
        self.eager.as_deref()
    }

    /// QPs of the connection.
    pub fn qps(&self) -> usize {
        self.cfg.routes.len()
    }

    /// Whether the current group is complete and waits for send-queue credits.
    pub fn waiting(&self) -> bool {
        self.cur.active && self.cur.matched == fifo::full_mask(self.cur.n)
    }

    /// Whether a posted chain still waits for its completion: work of this comm the NIC ends
    /// by itself (acknowledged, or failed once the transport's retries are spent). Requests
    /// in flight without one wait for the receiver alone (its CTS, or an eager message's
    /// verdict).
    pub fn chains_in_flight(&self) -> bool {
        self.chains.iter().any(|log| log.len > 0)
    }

    /// Whether the oldest group is matched in part: some of its buffers still wait for their
    /// isend.
    pub fn group_open(&self) -> bool {
        self.cur.active && !self.waiting()
    }

    /// Look for the next group in the ring; true when all its entries are there and sealed.
    /// `now` is asked only while a group is landing.
    fn load_group(&mut self, ring: &impl FifoRing, now: impl Fn() -> Time + Copy) -> Result<bool> {
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
                for (i, e) in es.iter().enumerate().take(n) {
                    let w = e.to_wire();
                    let pos = fifo::ring_pos(self.head.wrapping_add(i as u64));
                    self.consumed_stamps[pos] = w.stamp;
                    self.consumed_seals[pos] = w.seal;
                }
                let first = fifo::ring_pos(self.head) * self.nrdevs;
                self.first_rkeys[first..first + self.nrdevs].copy_from_slice(&es[0].rkeys[..self.nrdevs]);
                if let Some(e) = self.eager.as_deref_mut() {
                    e.handle_credit(es[0].eager_credit());
                    e.last_ok = n == 1 && es[0].eager_ok();
                }
                self.cur.active = true;
                self.cur.n = n;
                self.cur.entries = es;
                self.cur.matched = 0;
                Ok(true)
            }
            GroupState::NotPosted => self.check_unposted_head(ring, now),
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

    /// The head entry does not announce the expected group: not posted yet, or (when its stamp
    /// or seal is one no honest receiver leaves there, [`fifo::impossible_head_entry`]) a stale,
    /// replayed or garbage CTS write. That is bounded like a landing group (a word read while
    /// the receiver's NIC stores it may look impossible for a moment) and then fails the comm.
    fn check_unposted_head(&mut self, ring: &impl FifoRing, now: impl Fn() -> Time + Copy) -> Result<bool> {
        let pos = fifo::ring_pos(self.head);
        let entry = ring.load_entry(pos);
        let (stamp, seal) = (self.consumed_stamps[pos], self.consumed_seals[pos]);
        let left_over = CtsEntry {
            stamp,
            seal,
            ..CtsEntry::default()
        };
        let Some(idx) = fifo::impossible_head_entry(&entry, &left_over, self.counter) else {
            self.landing_since = None;
            return Ok(false);
        };
        let now = now();
        let since = *self.landing_since.get_or_insert(now);
        let waited = now.saturating_since(since);
        if waited > self.cfg.landing_timeout {
            return Err(self.state.fail(Error::remote(format!(
                "the receiver {} wrote a CTS entry stamped for posting counter {} into FIFO entry {pos}, where it owes group {} (stale, replayed or garbage for {waited:?}): a corrupt or lying peer",
                self.cfg.peer,
                idx.wrapping_sub(1),
                self.counter,
            ))));
        }
        Ok(false)
    }

    /// Start a send of `size` bytes at `data` (lkeys per member device) to the buffer with
    /// `tag` in the oldest posted group. The group is planned into `post` as soon as every one
    /// of its buffers has a send (and its chains fit the credits). With the eager path on, a
    /// small send whose group's CTS has not landed goes at once ([`super::eager`]).
    pub fn isend(
        &mut self,
        ring: &mut impl FifoRing,
        now: impl Fn() -> Time + Copy,
        send: SendBuf,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<Isend> {
        self.state.check()?;
        if self.waiting() || self.recovering {
            return Ok(Isend::Busy);
        }
        self.advance(ring, now, post)?;
        if self.waiting() {
            return Ok(Isend::Busy);
        }
        if let Some(e) = self.eager.as_deref() {
            // Earlier sends go first: after open claims only another claim can follow; a
            // refused send of the same tag goes through the CTS path before this one.
            if !e.claims.is_empty() {
                return self.send_eager(send, post);
            }
            if e.deferred_tag(send.tag) {
                return Ok(Isend::NoBuffer);
            }
        }
        if !self.cur.active && !self.load_group(ring, now)? {
            return self.send_eager(send, post);
        }
        let n = self.cur.n;
        let Some(i) = fifo::match_tag(&self.cur.entries[..n], self.cur.matched, send.tag) else {
            return Ok(Isend::NoBuffer);
        };
        let Some(r) = self.state.pool.alloc(ReqKind::Send) else {
            return Ok(Isend::Busy);
        };
        let truncated_to = self.take_entry(i, r, send);
        self.post_waiting(ring, post)?;
        Ok(Isend::Started {
            idx: r,
            truncated_to,
            eager: false,
        })
    }

    /// Request `r` fills buffer `i` of the current group with `send`; the posted size when it
    /// is smaller than the send (reported once per comm).
    fn take_entry(&mut self, i: usize, r: u16, send: SendBuf) -> Option<usize> {
        let n = self.cur.n;
        let posted = usize::try_from(self.cur.entries[i].posted_size()).unwrap_or(usize::MAX);
        let len = send.size.min(posted);
        let truncated_to = (send.size > posted && !self.truncate_reported).then_some(posted);
        self.truncate_reported |= truncated_to.is_some();
        self.cur.reqs[i] = r;
        self.cur.data[i] = send.data;
        self.cur.len[i] = len;
        self.cur.lkeys[i] = send.lkeys;
        self.cur.matched |= 1 << i;
        if let Some(k) = self.kept.get_mut(usize::from(r)) {
            *k = Kept::new(send.data, len, i);
            // The counter the group will be posted with (the current group is posted next,
            // as `self.counter`): never one of a group in flight.
            k.set_counter(self.counter);
        }
        let l = usize::from(r) * self.nldevs;
        if let Some(dst) = self.kept_lkeys.get_mut(l..l + self.nldevs) {
            dst.copy_from_slice(&send.lkeys[..self.nldevs]);
        }
        let pos = fifo::ring_pos(self.head);
        if let Some(req) = self.state.pool.get_mut(r) {
            req.set_pos_n(pos, n);
            req.size = reported_size(len);
            // Not posted yet: one placeholder completion, replaced when the group is posted.
            req.pending = 1;
        }
        truncated_to
    }

    /// The send of eager slot `slot` as its request's kept buffer and lkeys describe it.
    fn eager_kept_send(&self, slot: usize) -> SendBuf {
        let Some(e) = self.eager.as_deref() else {
            return SendBuf::default();
        };
        let (r, tag, host) = (e.req[slot], e.tag[slot], e.host & (1 << slot) != 0);
        let k = self.kept.get(usize::from(r)).copied().unwrap_or_default();
        let mut lkeys = [0; MAX_DEVS];
        let l = usize::from(r) * self.nldevs;
        if let Some(src) = self.kept_lkeys.get(l..l + self.nldevs) {
            lkeys[..self.nldevs].copy_from_slice(src);
        }
        SendBuf {
            data: k.data as usize,
            size: k.len(),
            tag,
            lkeys,
            host,
        }
    }

    /// Send `send` eagerly, claiming the group after the open claims, if the eager path allows
    /// it now (else "no buffer yet": the CTS path waits for the group's CTS).
    fn send_eager(&mut self, send: SendBuf, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<Isend> {
        let Some(e) = self.eager.as_deref() else {
            return Ok(Isend::NoBuffer);
        };
        let inline = e.cfg.inline(send.host, send.size);
        let wrs = if inline || send.size == 0 { 1 } else { 2 };
        if !e.may_send(send.size) || usize::from(self.credits[EAGER_QP]) < wrs {
            return Ok(Isend::NoBuffer);
        }
        let Some(r) = self.state.pool.alloc(ReqKind::Send) else {
            return Ok(Isend::Busy);
        };
        let claim = self.counter + e.claims.len() as u64;
        if let Some(k) = self.kept.get_mut(usize::from(r)) {
            *k = Kept::new(send.data, send.size, 0);
            k.set_counter(claim);
        }
        let l = usize::from(r) * self.nldevs;
        if let Some(dst) = self.kept_lkeys.get_mut(l..l + self.nldevs) {
            dst.copy_from_slice(&send.lkeys[..self.nldevs]);
        }
        if let Some(req) = self.state.pool.get_mut(r) {
            req.set_pos_n(0, 1);
            req.size = reported_size(send.size);
            // Its write's acknowledgement, and the claim's verdict.
            req.pending = 2;
        }
        let Some(e) = self.eager.as_deref_mut() else {
            return Ok(Isend::NoBuffer);
        };
        let slot = eager::slot_of(e.sent);
        let header = Header {
            claim,
            head: self.head,
            tag: send.tag,
            len: send.size as u32,
            epoch: e.epoch,
            seq: e.sent as u32,
        };
        e.req[slot] = r;
        e.tag[slot] = send.tag;
        e.hdr[slot] = header.to_bytes();
        e.host = (e.host & !(1 << slot)) | (u32::from(send.host) << slot);
        e.acked &= !(1 << slot);
        e.busy |= 1 << slot;
        e.sent += 1;
        e.claims.push(slot);
        self.chains[EAGER_QP].push(EAGER_CHAIN | slot as u16);
        self.post_eager(slot, send, post)?;
        Ok(Isend::Started {
            idx: r,
            truncated_to: None,
            eager: true,
        })
    }

    /// Post the eager write of slot `slot` (its header kept in the eager state, its payload
    /// `send`) on the eager QP: one inline write when both fit and the payload is host memory,
    /// else the payload (by DMA) and then the header inline. The write with immediate is
    /// signaled; its completion acknowledges it. The caller logs the chain.
    fn post_eager(&mut self, slot: usize, send: SendBuf, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<()> {
        let Some(e) = self.eager.as_deref() else {
            return Ok(());
        };
        let route = self.cfg.routes.get(EAGER_QP).copied().unwrap_or_default();
        let (ldev, rdev) = (route.dev.min(MAX_DEVS - 1), route.remote_dev.min(MAX_DEVS - 1));
        let at = e.cfg.landing + (slot * e.cfg.slot_bytes) as u64;
        let rkey = e.cfg.landing_rkeys[rdev];
        let payload = (send.size > 0).then(|| Sge {
            addr: send.data as u64,
            len: send.size as u32,
            lkey: send.lkeys[ldev],
        });
        let inline = e.cfg.inline(send.host, send.size);
        let r = e.req[slot];
        let mut chain = [WorkRequest::EMPTY; 2];
        let mut k = 0;
        if !inline && payload.is_some() {
            chain[0] = WorkRequest {
                wr_id: 0,
                op: Op::Write,
                local: payload,
                remote: Remote {
                    addr: at + eager::EAGER_HEADER_BYTES as u64,
                    rkey,
                },
                signaled: false,
                inline: false,
                prefix: None,
            };
            k = 1;
        }
        chain[k] = WorkRequest {
            wr_id: 0,
            op: Op::WriteImm(Imm::Eager { slot }.to_u32()),
            local: if inline { payload } else { None },
            remote: Remote { addr: at, rkey },
            signaled: true,
            inline: true,
            prefix: Some(e.hdr[slot]),
        };
        k += 1;
        let wr_id = SendWrId::new(&[r], k, EAGER_QP).0;
        for w in &mut chain[..k] {
            w.wr_id = wr_id;
        }
        self.credits[EAGER_QP] = self.credits[EAGER_QP].saturating_sub(k as u16);
        if let Err(err) = post(Post::Send {
            qp: EAGER_QP,
            chain: &chain[..k],
        }) {
            return Err(self.state.fail(err));
        }
        Ok(())
    }

    /// Decide the open claims whose groups' CTS entries have landed, and match the refused
    /// messages to groups through the CTS path, in their order ([`super::eager`]). A bound
    /// claim consumes its group's entry; the first refusal turns every open claim into a
    /// refused message; once none is left a new epoch begins.
    fn advance(
        &mut self,
        ring: &mut impl FifoRing,
        now: impl Fn() -> Time + Copy,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        if self.recovering || self.eager.is_none() {
            return Ok(());
        }
        loop {
            let Some(e) = self.eager.as_deref() else {
                return Ok(());
            };
            let (claim, deferred) = (e.claims.front(), e.deferred.front());
            let deferred = deferred.map(|slot| (slot, e.acked(slot), e.req[slot]));
            if let Some(slot) = claim {
                if !self.cur.active && !self.load_group(ring, now)? {
                    return Ok(());
                }
                self.decide_claim(slot);
                continue;
            }
            if let Some((slot, acked, r)) = deferred {
                if !acked || self.waiting() {
                    return Ok(());
                }
                if !self.cur.active && !self.load_group(ring, now)? {
                    return Ok(());
                }
                let send = self.eager_kept_send(slot);
                let Some(i) = fifo::match_tag(&self.cur.entries[..self.cur.n], self.cur.matched, send.tag) else {
                    // The group waits for other sends first.
                    return Ok(());
                };
                self.take_entry(i, r, send);
                if let Some(e) = self.eager.as_deref_mut() {
                    e.deferred.pop();
                    e.decided(slot);
                }
                self.post_waiting(ring, post)?;
                continue;
            }
            if let Some(e) = self.eager.as_deref_mut() {
                if e.refused {
                    e.refused = false;
                    e.epoch = e.epoch.wrapping_add(1);
                }
            }
            return Ok(());
        }
    }

    /// The oldest open claim (slot `slot`) meets its group, loaded as the current one: both
    /// ends decide it alike ([`eager::binds`]).
    fn decide_claim(&mut self, slot: usize) {
        let Some(e) = self.eager.as_deref_mut() else {
            return;
        };
        let first = self.cur.entries[0];
        let view = GroupView {
            eager_ok: self.cur.n == 1 && first.eager_ok(),
            tag: first.tag as i32,
        };
        if eager::binds(view, e.tag[slot], e.refused) {
            e.claims.pop();
            e.bound += 1;
            e.decided(slot);
            let r = e.req[slot];
            let posted = usize::try_from(first.posted_size()).unwrap_or(usize::MAX);
            let len = self.kept.get(usize::from(r)).map_or(0, |k| k.len()).min(posted);
            if let Some(req) = self.state.pool.get_mut(r) {
                req.size = reported_size(len);
                req.complete_one();
            }
            // The group is consumed: nothing is written for it.
            self.counter += 1;
            self.head += self.cur.n as u64;
            self.cur.active = false;
        } else {
            e.refused = true;
            while let Some(s) = e.claims.pop() {
                e.refused_msgs += 1;
                e.deferred.push(s);
            }
        }
    }

    /// Progress without a new send: decide claims, send refused messages, post the complete
    /// current group if its chains fit.
    pub fn progress(
        &mut self,
        ring: &mut impl FifoRing,
        now: impl Fn() -> Time + Copy,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        self.state.check()?;
        self.advance(ring, now, post)?;
        self.post_waiting(ring, post)
    }

    /// Plan the complete current group into `post` if every chain fits its QP's credits (else
    /// leave it waiting). A posting error fails the comm.
    pub fn post_waiting(
        &mut self,
        ring: &mut impl FifoRing,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        if !self.waiting() || self.recovering {
            return Ok(());
        }
        let id = self.counter;
        let n = self.cur.n;
        let nq = self.cfg.qps_per_req;
        let nqps = self.qps();
        let ar_split = n == 1 && self.cfg.ar_threshold.is_some_and(|t| self.cur.len[0] > t);
        let record = self.record_form(&self.cur.len[..n]);
        // On the stack: a comm keeps no plan between calls (memory per connection).
        let mut plan = [WrPlan::ZeroImm; MAX_CHAIN];
        let mut chain = [WorkRequest::EMPTY; MAX_CHAIN];
        let wr_bytes = self.cfg.wr_bytes;
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            let Some(k) = split::plan_chain_as(&self.cur.len[..n], nq, j, ar_split, record, wr_bytes, &mut plan) else {
                return Err(self.state.fail(self.oversized_group()));
            };
            if usize::from(self.credits[q]) < k {
                return Ok(());
            }
        }
        let pos = fifo::ring_pos(self.head);
        if n > 1 || record {
            let mut sizes = [0u32; MAX_RECVS];
            for (s, &l) in sizes.iter_mut().zip(&self.cur.len[..n]) {
                *s = reported_size(l);
            }
            ring.store_sizes(pos, &sizes[..n]);
        }
        for j in 0..nq {
            let q = split::qp_for_chunk(id, nq, j, nqps);
            // Planned above, so it fits.
            let k = split::plan_chain_as(&self.cur.len[..n], nq, j, ar_split, record, wr_bytes, &mut plan).unwrap_or(0);
            self.build_chain(&self.cur, q, &plan[..k], pos, &mut chain);
            // Taken before posting: a partly posted chain still counts against the queue.
            self.credits[q] -= k as u16;
            self.chains[q].push(self.cur.reqs[0]);
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

    /// Whether a group with buffers of `lens` bytes completes with its sizes record: a grouped
    /// one, or on a version-5 connection a single one too large for the immediate.
    fn record_form(&self, lens: &[usize]) -> bool {
        self.cfg.named_imm && lens.len() == 1 && lens[0] > eager::IMM_SIZE_MAX
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

    /// Turn the planned WRs of QP `q` for group `cur` into work requests in `chain`.
    fn build_chain(&self, cur: &CurGroup, q: usize, plan: &[WrPlan], pos: usize, chain: &mut [WorkRequest; MAX_CHAIN]) {
        let k = plan.len();
        let route = self.cfg.routes[q];
        let (ldev, rdev) = (route.dev.min(MAX_DEVS - 1), route.remote_dev.min(MAX_DEVS - 1));
        let n = cur.n;
        let wr_id = SendWrId::new(&cur.reqs[..n], k, q).0;
        let (completion_imm, record_imm) = if self.cfg.named_imm {
            let size = reported_size(cur.len[0]);
            (Imm::Single { pos, size }.to_u32(), Imm::Record { pos }.to_u32())
        } else {
            (reported_size(cur.len[0]), pos as u32)
        };
        for x in 0..k {
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
                        prefix: None,
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
                    prefix: None,
                },
                // Grouped: the n sizes go into the receiver's completion record of the group
                // (inside its CTS staging entry, fifo::SIZES_IN_ENTRY).
                WrPlan::SizesImm => WorkRequest {
                    wr_id,
                    op: Op::WriteImm(record_imm),
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
                    prefix: None,
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
        // RC completes a QP's chains in order, each by its one signaled WR: this completion is
        // the oldest unretired chain's.
        let front = self.chains.get_mut(w.qp()).and_then(|log| {
            let f = log.front();
            log.pop();
            f
        });
        if let Some(slot) = front.and_then(eager_chain) {
            self.eager_acked(slot);
            return;
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

    /// The eager write of slot `slot` was acknowledged (the receiver's NIC has it).
    fn eager_acked(&mut self, slot: usize) {
        let Some(e) = self.eager.as_deref_mut() else {
            return;
        };
        if e.acked(slot) || e.busy & (1 << slot) == 0 {
            return;
        }
        e.acked |= 1 << slot;
        if !e.undecided(slot) {
            e.busy &= !(1 << slot);
        }
        if let Some(r) = self.state.pool.get_mut(e.req[slot]) {
            if r.kind() == ReqKind::Send {
                r.complete_one();
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

    /// Stop posting: the connection's QPs failed and are being replaced ([`super::recovery`]).
    /// isend says "retry later" until [`SendCore::resume`]. Completions polled meanwhile are
    /// still taken (a success is a chain the receiver has), failed ones are dropped.
    pub fn begin_recovery(&mut self) {
        self.recovering = true;
    }

    /// The recovery placed the QPs on other members (failover, failback): later chains and
    /// the replay take the new routes.
    pub fn reroute(&mut self, routes: &[QpRoute]) -> Result<()> {
        super::plan::reroute(&mut self.cfg.routes, routes, self.nldevs, self.nrdevs)
    }

    pub fn recovering(&self) -> bool {
        self.recovering
    }

    /// The sender's part of a recovery report: the absolute FIFO entry its next group starts
    /// at (every CTS entry before it was consumed; the receiver writes the rest again).
    pub fn fifo_head(&self) -> u64 {
        self.head
    }

    /// Carry on over the connection's new QPs (empty send queues) once the receiver said how
    /// many write-with-immediate completions it took on each QP since the connection was made
    /// (`taken`, one per QP). On each QP the chains up to that count landed: those whose
    /// completion never came back here count as done; the rest are posted again, in their
    /// order, into `post`. Nothing the receiver took is written again, so no buffer NCCL may
    /// already reuse is touched. A count no honest receiver gives (fewer than this side saw
    /// acknowledged, more than it posted) fails the comm.
    pub fn resume(
        &mut self,
        ring: &impl FifoRing,
        taken: &[u64],
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<Replayed> {
        self.state.check()?;
        if taken.len() != self.qps() {
            return Err(self.state.fail(Error::remote(format!(
                "the receiver {} reported completions for {} QPs in its recovery message, the connection has {}: a corrupt or incompatible peer",
                self.cfg.peer,
                taken.len(),
                self.qps()
            ))));
        }
        for (q, (&t, log)) in taken.iter().zip(self.chains.iter()).enumerate() {
            if t < log.retired() || t > log.posted {
                return Err(self.state.fail(Error::remote(format!(
                    "the receiver {} says it took {t} messages on QP {q}, but this side posted {} there and {} were acknowledged: a corrupt or lying peer",
                    self.cfg.peer,
                    log.posted,
                    log.retired()
                ))));
            }
        }
        let mut done = Replayed::default();
        let mut plan = [WrPlan::ZeroImm; MAX_CHAIN];
        let mut chain = [WorkRequest::EMPTY; MAX_CHAIN];
        for (q, &t) in taken.iter().enumerate() {
            self.credits[q] = SQ_DEPTH as u16;
            let log = self.chains[q];
            let landed = (t - log.retired()) as usize;
            for k in 0..usize::from(log.len) {
                if let Some(slot) = eager_chain(log.at(k)) {
                    if k < landed {
                        self.eager_acked(slot);
                        done.landed += 1;
                    } else {
                        done.chains += 1;
                        done.bytes += self.replay_eager(slot, post)?;
                    }
                    continue;
                }
                let Some((g, pos)) = self.kept_group(ring, log.at(k)) else {
                    return Err(self.state.fail(Error::internal(format!(
                        "recovery: chain {k} of QP {q} names no send in flight"
                    ))));
                };
                if k < landed {
                    for &r in &g.reqs[..g.n] {
                        if let Some(req) = self.state.pool.get_mut(r) {
                            req.complete_one();
                        }
                    }
                    done.landed += 1;
                    continue;
                }
                let id = self.kept_counter(log.at(k));
                let nq = self.cfg.qps_per_req;
                let nqps = self.qps();
                let Some(j) = (0..nq).find(|&j| split::qp_for_chunk(id, nq, j, nqps) == q) else {
                    return Err(self
                        .state
                        .fail(Error::internal(format!("recovery: group {id} has no chunk on QP {q}"))));
                };
                let ar_split = g.n == 1 && self.cfg.ar_threshold.is_some_and(|t| g.len[0] > t);
                let record = self.record_form(&g.len[..g.n]);
                let planned =
                    split::plan_chain_as(&g.len[..g.n], nq, j, ar_split, record, self.cfg.wr_bytes, &mut plan);
                let Some(wrs) = planned else {
                    return Err(self.state.fail(self.oversized_group()));
                };
                self.build_chain(&g, q, &plan[..wrs], pos, &mut chain);
                self.credits[q] = self.credits[q].saturating_sub(wrs as u16);
                done.chains += 1;
                done.bytes += chain[..wrs]
                    .iter()
                    .map(|w| w.local.map_or(0, |s| u64::from(s.len)))
                    .sum::<u64>();
                if let Err(e) = post(Post::Send {
                    qp: q,
                    chain: &chain[..wrs],
                }) {
                    return Err(self.state.fail(e));
                }
            }
            // The landed chains are retired; the log keeps the ones posted again, in order.
            let log = &mut self.chains[q];
            for _ in 0..landed {
                log.pop();
            }
        }
        self.recovering = false;
        Ok(done)
    }

    /// Post the eager write of slot `slot` again (a recovery found it had not landed); its
    /// payload bytes.
    fn replay_eager(&mut self, slot: usize, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<u64> {
        if self.eager.is_none() {
            return Err(self.state.fail(Error::internal(
                "recovery: an eager chain on a connection without the eager path",
            )));
        }
        let send = self.eager_kept_send(slot);
        // The chain log keeps the chain where it was (the recovery posts in its order).
        self.post_eager(slot, send, post)?;
        Ok(send.size as u64)
    }

    /// The posting counter of the group request `r` belongs to (its low bits are kept; the
    /// group is one of the last 2^26 posted).
    fn kept_counter(&self, r: u16) -> u64 {
        let low = self.kept.get(usize::from(r)).map_or(0, |k| k.counter_low());
        let back = self.counter.wrapping_sub(low) & KEPT_COUNTER_MASK;
        self.counter.wrapping_sub(back)
    }

    /// The posted group request `r` belongs to, as it was planned: its requests, buffers and
    /// CTS entries (from our FIFO ring, where they stay until the receiver completed the group:
    /// only then does it post into these entries again; the first entry's rkeys from
    /// `first_rkeys`), and its ring position. `None`: `r` is not a send in flight.
    fn kept_group(&self, ring: &impl FifoRing, r: u16) -> Option<(CurGroup, usize)> {
        let req = self.state.pool.get(r).filter(|q| q.kind() == ReqKind::Send)?;
        let (pos, n) = (req.pos(), req.n());
        let low = self.kept.get(usize::from(r))?.counter_low();
        let mut g = CurGroup {
            active: false,
            n,
            entries: [CtsEntry::default(); MAX_RECVS],
            matched: fifo::full_mask(n),
            reqs: [0; MAX_RECVS],
            data: [0; MAX_RECVS],
            len: [0; MAX_RECVS],
            lkeys: [[0; MAX_DEVS]; MAX_RECVS],
        };
        let mut found = 0u8;
        for idx in 0..self.kept.len() as u16 {
            let Some(other) = self.state.pool.get(idx) else {
                continue;
            };
            let k = self.kept[usize::from(idx)];
            if other.kind() != ReqKind::Send || other.pos() != pos || k.counter_low() != low {
                continue;
            }
            let i = k.buf().min(n - 1);
            g.reqs[i] = idx;
            g.data[i] = k.data as usize;
            g.len[i] = k.len();
            let l = usize::from(idx) * self.nldevs;
            g.lkeys[i][..self.nldevs].copy_from_slice(&self.kept_lkeys[l..l + self.nldevs]);
            found |= 1 << i;
        }
        if found != fifo::full_mask(n) {
            return None;
        }
        for i in 0..n {
            g.entries[i] = CtsEntry::from_wire(&ring.load_entry(fifo::ring_pos((pos + i) as u64)));
        }
        let f = pos * self.nrdevs;
        g.entries[0].rkeys[..self.nrdevs].copy_from_slice(&self.first_rkeys[f..f + self.nrdevs]);
        Some((g, pos))
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
/// saturated at `i32::MAX` (2 GiB − 1), which is every size `test` can report (its sizes are
/// `int`), so a single message's immediate never has [`eager::IMM_EAGER`]'s bit.
///
/// [`Request::size`]: super::request::Request::size
pub fn reported_size(len: usize) -> u32 {
    len.min(i32::MAX as usize) as u32
}

/// One isend's buffer as the core needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendBuf {
    pub data: usize,
    pub size: usize,
    pub tag: i32,
    /// The registration's lkey on every member device.
    pub lkeys: [u32; MAX_DEVS],
    /// Host memory, which the CPU may read (an inline post copies it); false for a GPU's.
    pub host: bool,
}

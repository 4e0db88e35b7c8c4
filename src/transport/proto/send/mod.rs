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
//!
//! One concept per file: [`group`] reads the receiver's groups from the FIFO ring, [`cts`]
//! matches isends to them and plans their chains (the CTS path), [`eager_path`] sends small
//! messages before their CTS and settles the claims, [`completion`] takes completions and
//! reports requests, [`replay`] carries a connection over a recovery; [`chains`] and [`kept`]
//! are the books those keep (unretired chains per QP, each request's buffer).

use super::eager::{self, EagerSendConfig, SenderState};
use super::fifo::{self, CtsEntry};
use super::limits::{MAX_DEVS, MAX_RECVS};
use super::plan::{LocalBlock, QpRoute, RemoteBlock};
use super::request::{self, RequestPool};
use super::state::{CommState, FailureReport};
use super::time::Time;
use chains::ChainLog;
use kept::Kept;
use std::time::Duration;

mod chains;
mod close;
mod completion;
mod cts;
mod eager_path;
mod group;
mod kept;
mod replay;
#[cfg(test)]
mod tests;

pub use chains::SQ_DEPTH;
pub use close::PeerClose;
#[cfg(any(test, feature = "testing"))]
pub use replay::Replayed;

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
    /// Per request: its tag (for the error that names a send the receiver never took).
    kept_tags: Box<[i32]>,
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
    /// What the receiver said when it closed ([`SendCore::handle_peer_close`]); from then on
    /// nothing is posted.
    peer_closed: Option<PeerClose>,
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
            state: CommState::new(RequestPool::with_capacity(request::SEND_REQUESTS), report),
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
            kept_tags: vec![0; request::SEND_REQUESTS].into_boxed_slice(),
            kept_lkeys: vec![0; request::SEND_REQUESTS * nldevs].into_boxed_slice(),
            nldevs,
            first_rkeys: vec![0; fifo::RING * nrdevs].into_boxed_slice(),
            nrdevs,
            chains,
            recovering: false,
            eager: cfg_eager.map(|c| Box::new(SenderState::new(c))),
            peer_closed: None,
        }
    }

    #[cfg(any(test, feature = "testing"))]
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

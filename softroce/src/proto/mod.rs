//! Sans-IO RC transport core: one [`QpCore`] per queue pair.
//!
//! # Contract
//!
//! The core reads no clock, opens no socket and spawns no thread. The driver
//! (UDP layer + progress thread) feeds it:
//!
//! * [`QpCore::handle_packet`] with every received packet addressed to this
//!   QP (BTH .. payload incl. pad, **ICRC already verified and stripped**),
//! * [`QpCore::handle_timeout`] whenever `now >= poll_timeout()`,
//!
//! and drains it:
//!
//! * [`QpCore::poll_transmit`] until `None` — each call writes one packet
//!   (BTH .. payload + pad, no ICRC) into the caller's buffer; the driver
//!   appends the ICRC and sends it to [`TransmitMeta::dgid`] / UDP 4791,
//! * [`QpCore::poll_completion`] (to the send or recv CQ per
//!   [`Completion::queue`]) and [`QpCore::poll_event`] (async events).
//!
//! Verbs calls map to [`QpCore::modify`], [`QpCore::query`],
//! [`QpCore::post_send`] and [`QpCore::post_recv`]. Memory is reached only
//! through the [`MemoryAccess`] the driver passes in (scoped to the QP's PD).
//!
//! Malformed or unexpected packets are dropped and counted in [`QpStats`];
//! nothing in this module panics on packet data.
//!
//! # Behaviour (IBTA RC, following rxe where the spec leaves room)
//!
//! * Requester: WRs are cut into path-MTU packets with consecutive PSNs (a
//!   READ consumes one PSN per response packet). AckReq is set on the last
//!   packet of every message, every 64th packet, and when the in-flight
//!   window ([`DEFAULT_MAX_INFLIGHT_PSNS`]) fills. READ/atomic WRs are limited
//!   to `max_rd_atomic` outstanding; `fence` waits for all earlier WRs.
//! * Reliability: go-back-N from the oldest unacknowledged PSN on the local
//!   ACK timeout (4.096 µs · 2^timeout, 0 = none), at once on a sequence NAK
//!   or a hole in READ responses. `retry_cnt` bounds consecutive retries
//!   without progress (IBA semantics: 7 means 7, not infinite); a NAK or ACK
//!   reporting a new responder PSN counts as progress. RNR NAKs wait the
//!   encoded time and count against `rnr_retry` (7 = infinite).
//!   Like ConnectX "adaptive retransmission", a probe timer derived from the
//!   measured RTT (max(4·SRTT + 100 µs, floor [`DEFAULT_ADAPTIVE_RETRANSMIT_FLOOR`]),
//!   doubled per unanswered probe, never past the ACK timeout, and counted
//!   from the last AckReq packet sent) also goes
//!   back N when an answer is overdue, so a lost tail packet or NAK costs a
//!   few milliseconds instead of the full timeout (67 ms at timeout 14);
//!   probes do not consume `retry_cnt`, so RETRY_EXC_ERR still comes after
//!   (retry_cnt + 1) local ACK timeouts. On by default;
//!   [`QpCore::set_adaptive_retransmit`] (`None` = pure IBA), with
//!   [`QpStats::probes`] and [`QpCore::srtt`] for diagnostics.
//! * Completer: coalesced ACKs complete every SEND/WRITE they cover, READ
//!   and atomic responses implicitly acknowledge earlier WRs; completions
//!   are strictly in order; unsignaled successes produce no CQE; an error
//!   completes the failing WR with its status and flushes the rest
//!   (WR_FLUSH_ERR), receives included.
//! * Responder (works in RTR): PSN check (sequence NAK once per hole,
//!   duplicates re-ACKed / READs regenerated from the saved resource / atomics
//!   replayed from a `max_dest_rd_atomic` history), opcode sequence, QP access
//!   flags, receive WQE (else RNR NAK with `min_rnr_timer`), lengths, R_Key
//!   (via [`MemoryAccess::remote_check`] before anything is written), execute,
//!   ACK if AckReq (coalesced with a queued ACK). Fatal errors NAK, raise
//!   QP_REQ_ERR / QP_ACCESS_ERR and move the QP to ERR.
//! * A READ response whose MR went away after the request was accepted (the
//!   application deregistered it): for a *duplicate* READ (regenerated after
//!   a retransmitted request; the requester has most likely completed it)
//!   the responder sends one NAK remote access error for that PSN, which a
//!   requester past it ignores, and the QP stays usable; for an original
//!   READ it is fatal as above, and READs queued behind it are dropped.
//!   [`QpStats::read_resp_failed`] counts both; the response queue is served
//!   in a loop, never by recursion (`sim_errors::regression_replayed_read_after_dereg`:
//!   the plugin's 1-byte flush READ over a loopback QP, then deregistration).
//! * Shared receive queues: a QP marked with [`QpCore::set_srq`] takes its
//!   receive WQEs from [`MemoryAccess::take_srq_recv`] (one call, one WQE;
//!   `None` makes the responder RNR-NAK with `min_rnr_timer`).

#![forbid(unsafe_code)]

mod completer;
pub mod limits;
pub mod mem;
mod modify;
mod qp;
mod requester;
mod responder;
pub mod state;
pub mod time;
pub mod timer;

pub use limits::{MAX_MSG_SZ, MAX_QP_RD_ATOM};
pub use mem::{AtomicOp, InMemory, LocalAccessError, MemoryAccess, RemoteAccess, RemoteAccessError};
pub use qp::QpCore;
pub use state::QpState;
pub use time::{Duration, Instant};

/// Default cap on unacknowledged PSNs in flight per QP (rxe uses 128).
pub const DEFAULT_MAX_INFLIGHT_PSNS: u32 = 128;
/// Default floor of the adaptive retransmission probe (see
/// [`QpCore::set_adaptive_retransmit`]).
pub const DEFAULT_ADAPTIVE_RETRANSMIT_FLOOR: Duration = Duration::from_millis(2);

/// An errno value returned by the verbs-facing calls (positive, like `libc::EINVAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    pub const ENOMEM: Errno = Errno(12);
    pub const EINVAL: Errno = Errno(22);
    pub const EOPNOTSUPP: Errno = Errno(95);
}

/// Why `post_send` / `post_recv` refused a WR. `errno()` gives the value
/// `ibv_post_send` returns (and `bad_wr` points at this WR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// Queue full → ENOMEM.
    QueueFull,
    /// QP in a state that cannot accept the WR (RESET/INIT/RTR for sends, RESET for recvs) → EINVAL.
    InvalidState,
    /// Too many SGEs, inline data too long, unsupported opcode, … → EINVAL.
    InvalidWr,
}

impl PostError {
    pub fn errno(self) -> Errno {
        match self {
            PostError::QueueFull => Errno::ENOMEM,
            PostError::InvalidState | PostError::InvalidWr => Errno::EINVAL,
        }
    }
}

/// A scatter/gather element (`struct ibv_sge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Send work request opcode; discriminants equal `enum ibv_wr_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WrOpcode {
    RdmaWrite = 0,
    RdmaWriteWithImm = 1,
    Send = 2,
    SendWithImm = 3,
    RdmaRead = 4,
    AtomicCmpSwp = 5,
    AtomicFetchAdd = 6,
}

impl WrOpcode {
    /// From `ibv_wr_opcode`; `None` for opcodes the core does not support
    /// (LOCAL_INV, BIND_MW, SEND_WITH_INV, TSO, …) — the verbs layer returns EINVAL/EOPNOTSUPP.
    pub fn from_ibv(v: u32) -> Option<WrOpcode> {
        Some(match v {
            0 => WrOpcode::RdmaWrite,
            1 => WrOpcode::RdmaWriteWithImm,
            2 => WrOpcode::Send,
            3 => WrOpcode::SendWithImm,
            4 => WrOpcode::RdmaRead,
            5 => WrOpcode::AtomicCmpSwp,
            6 => WrOpcode::AtomicFetchAdd,
            _ => return None,
        })
    }
    pub fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd
        )
    }
    pub fn is_atomic(self) -> bool {
        matches!(self, WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd)
    }
}

/// A send work request (`struct ibv_send_wr`, already copied out of C memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    /// Local buffers (ignored when `inline_data` is `Some`). For READ the
    /// destination; for atomics one 8-byte SGE receiving the original value.
    pub sges: Vec<Sge>,
    /// `IBV_SEND_INLINE`: the payload, copied by the verbs layer at post time.
    pub inline_data: Option<Vec<u8>>,
    /// RDMA / atomic target address and key.
    pub remote_addr: u64,
    pub rkey: u32,
    /// Immediate data exactly as in `ibv_send_wr.imm_data` (network byte
    /// order value, passed through unchanged: the 4 wire bytes are
    /// `imm_data.to_ne_bytes()`).
    pub imm_data: u32,
    /// CMP_SWP: compare value; FETCH_ADD: add value.
    pub compare_add: u64,
    /// CMP_SWP: swap value.
    pub swap: u64,
    /// `IBV_SEND_SIGNALED` (a CQE is produced on success when set or when `sq_sig_all`).
    pub signaled: bool,
    /// `IBV_SEND_SOLICITED`.
    pub solicited: bool,
    /// `IBV_SEND_FENCE`: wait for all earlier WRs to complete first.
    pub fence: bool,
}

impl SendWr {
    /// A signaled WR with everything else zero/empty — convenient with `..`.
    pub fn new(wr_id: u64, opcode: WrOpcode) -> Self {
        SendWr {
            wr_id,
            opcode,
            sges: Vec::new(),
            inline_data: None,
            remote_addr: 0,
            rkey: 0,
            imm_data: 0,
            compare_add: 0,
            swap: 0,
            signaled: true,
            solicited: false,
            fence: false,
        }
    }
    /// Total message length in bytes (inline length or sum of SGEs; for atomics 8).
    pub fn length(&self) -> u64 {
        if self.opcode.is_atomic() {
            return 8;
        }
        match &self.inline_data {
            Some(d) => d.len() as u64,
            None => self.sges.iter().map(|s| s.length as u64).sum(),
        }
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sges: Vec<Sge>,
}

/// QP capacities fixed at `ibv_create_qp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    /// `ibv_qp_init_attr.sq_sig_all`.
    pub sq_sig_all: bool,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 400,
            sq_sig_all: false,
        }
    }
}

/// `enum ibv_qp_attr_mask` bits.
pub mod attr_mask {
    pub const STATE: u32 = 1 << 0;
    pub const CUR_STATE: u32 = 1 << 1;
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const ALT_PATH: u32 = 1 << 14;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    pub const CAP: u32 = 1 << 19;
    pub const DEST_QPN: u32 = 1 << 20;
}

/// The address vector (`struct ibv_ah_attr` with its GRH): a RoCE port routes by the GID, an
/// InfiniBand port by the DLID and adds a GRH only when `is_global`
/// (docs/softroce-internals.md#infiniband-link-layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressVector {
    /// Remote GID (`::ffff:a.b.c.d` for IPv4).
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    /// `ah_attr.is_global`; RoCE requires a GRH, so RTR with neither a GRH nor a DLID is EINVAL.
    pub is_global: bool,
    pub port_num: u8,
    pub sl: u8,
    /// `ah_attr.dlid`: the destination LID on an InfiniBand port (0 on RoCE).
    pub dlid: u16,
}

/// The attributes of `ibv_modify_qp` / `ibv_query_qp` (`struct ibv_qp_attr`)
/// plus the mask saying which are valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModifyAttrs {
    /// Bits of [`attr_mask`].
    pub mask: u32,
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    /// `enum ibv_mtu`: 1=256 … 5=4096.
    pub path_mtu: u8,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    /// `IBV_ACCESS_*` bits (REMOTE_WRITE/READ/ATOMIC matter).
    pub qp_access_flags: u32,
    pub pkey_index: u16,
    pub port_num: u8,
    pub ah: AddressVector,
    pub en_sqd_async_notify: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

/// Which CQ a completion goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcQueue {
    Send,
    Recv,
}

/// `enum ibv_wc_status` values, as rdma-sys declares them.
pub use rdma_sys::ibv_wc_status as wc_status;

/// `enum ibv_wc_opcode` values.
pub mod wc_opcode {
    pub const SEND: u32 = 0;
    pub const RDMA_WRITE: u32 = 1;
    pub const RDMA_READ: u32 = 2;
    pub const COMP_SWAP: u32 = 3;
    pub const FETCH_ADD: u32 = 4;
    pub const RECV: u32 = 128;
    pub const RECV_RDMA_WITH_IMM: u32 = 129;
}

/// `enum ibv_wc_flags` bits.
pub mod wc_flags {
    pub const GRH: u32 = 1;
    pub const WITH_IMM: u32 = 2;
}

/// A work completion (the fields of `struct ibv_wc` the core knows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub queue: WcQueue,
    pub wr_id: u64,
    /// [`wc_status`] value.
    pub status: u32,
    /// [`wc_opcode`] value.
    pub opcode: u32,
    pub byte_len: u32,
    /// Immediate data, unchanged from the sender's `imm_data` (network order value).
    pub imm_data: Option<u32>,
    /// This QP's number (`wc.qp_num`).
    pub qp_num: u32,
    /// Remote QP number (`wc.src_qp`).
    pub src_qp: u32,
    /// [`wc_flags`] bits.
    pub wc_flags: u32,
    /// The message carried the Solicited Event bit (receive completions
    /// only): wakes `ibv_req_notify_cq(cq, 1)` waiters.
    pub solicited: bool,
}

/// Asynchronous events; `ibv_event_type()` gives `enum ibv_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEvent {
    /// IBV_EVENT_QP_FATAL (1): the QP entered ERR because of a local/transport error.
    QpFatal,
    /// IBV_EVENT_QP_REQ_ERR (2): the responder detected an invalid request.
    QpRequestError,
    /// IBV_EVENT_QP_ACCESS_ERR (3): the responder detected a remote access violation.
    QpAccessError,
    /// IBV_EVENT_COMM_EST (4): first packet received while in RTR.
    CommEstablished,
    /// IBV_EVENT_SQ_DRAINED (5): SQD reached with EN_SQD_ASYNC_NOTIFY and nothing outstanding.
    SqDrained,
    /// IBV_EVENT_QP_LAST_WQE_REACHED (16).
    LastWqeReached,
}

impl AsyncEvent {
    pub fn ibv_event_type(self) -> u32 {
        match self {
            AsyncEvent::QpFatal => 1,
            AsyncEvent::QpRequestError => 2,
            AsyncEvent::QpAccessError => 3,
            AsyncEvent::CommEstablished => 4,
            AsyncEvent::SqDrained => 5,
            AsyncEvent::LastWqeReached => 16,
        }
    }
}

/// Where and how to send the packet `poll_transmit` just wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmitMeta {
    /// Bytes written to the buffer (BTH .. pad; add 4 for the ICRC).
    pub len: usize,
    /// Peer GID from the AV (`::ffff:a.b.c.d` for IPv4).
    pub dgid: [u8; 16],
    /// IPv4 TOS / IPv6 traffic class from the AV.
    pub traffic_class: u8,
    /// TTL / hop limit from the AV.
    pub hop_limit: u8,
    /// The AV's InfiniBand fields: DLID, service level, GRH or not, flow label, source GID
    /// index (an IB port builds its LRH and GRH from them; RoCE uses only the GID).
    pub dlid: u16,
    pub sl: u8,
    pub is_global: bool,
    pub flow_label: u32,
    pub sgid_index: u8,
    /// Destination QP number (also in the BTH).
    pub dest_qpn: u32,
    /// True for responder output (ACK/NAK/read response/atomic ACK).
    pub is_response: bool,
}

/// Counters for diagnostics (never reset by the core).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpStats {
    pub tx_packets: u64,
    pub rx_packets: u64,
    /// Packets that failed to parse (short, bad header, bad pad) — dropped.
    pub rx_malformed: u64,
    /// Well-formed packets dropped (wrong state, wrong QP, stale response, …).
    pub rx_dropped: u64,
    pub rx_duplicates: u64,
    pub retransmits: u64,
    /// Local ACK timeouts (each consumes one `retry_cnt`).
    pub timeouts: u64,
    /// Adaptive retransmission probes (go-back-N before the ACK timeout).
    pub probes: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub acks_sent: u64,
    /// READ responses that could not be served because the MR went away
    /// (a replayed READ is NAKed, an original one is fatal).
    pub read_resp_failed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers the verbs layer passes through, as `<infiniband/verbs.h>` defines them:
    /// `enum ibv_wr_opcode` (LOCAL_INV = 7 and above unsupported), `enum ibv_qp_attr_mask`,
    /// `enum ibv_event_type`, and the errno of each refused post.
    #[test]
    fn verbs_numbers_are_the_abi_literals() {
        use WrOpcode as W;
        let ops = [
            W::RdmaWrite,
            W::RdmaWriteWithImm,
            W::Send,
            W::SendWithImm,
            W::RdmaRead,
            W::AtomicCmpSwp,
            W::AtomicFetchAdd,
        ];
        for (v, op) in ops.iter().enumerate() {
            assert_eq!(WrOpcode::from_ibv(v as u32), Some(*op));
            assert_eq!(op.is_read_or_atomic(), v >= 4, "{op:?}");
            assert_eq!(op.is_atomic(), v >= 5, "{op:?}");
        }
        assert_eq!(WrOpcode::from_ibv(7), None);

        use attr_mask as m;
        let masks = [
            m::STATE,
            m::CUR_STATE,
            m::EN_SQD_ASYNC_NOTIFY,
            m::ACCESS_FLAGS,
            m::PKEY_INDEX,
            m::PORT,
            m::QKEY,
            m::AV,
            m::PATH_MTU,
            m::TIMEOUT,
            m::RETRY_CNT,
            m::RNR_RETRY,
            m::RQ_PSN,
            m::MAX_QP_RD_ATOMIC,
            m::ALT_PATH,
            m::MIN_RNR_TIMER,
            m::SQ_PSN,
            m::MAX_DEST_RD_ATOMIC,
            m::PATH_MIG_STATE,
            m::CAP,
            m::DEST_QPN,
        ];
        for (bit, mask) in masks.iter().enumerate() {
            assert_eq!(*mask, 1 << bit, "IBV_QP_* bit {bit}");
        }

        let events = [
            (AsyncEvent::QpFatal, 1),
            (AsyncEvent::QpRequestError, 2),
            (AsyncEvent::QpAccessError, 3),
            (AsyncEvent::CommEstablished, 4),
            (AsyncEvent::SqDrained, 5),
            (AsyncEvent::LastWqeReached, 16),
        ];
        for (e, n) in events {
            assert_eq!(e.ibv_event_type(), n, "{e:?}");
        }

        assert_eq!(PostError::QueueFull.errno(), Errno::ENOMEM);
        assert_eq!(PostError::InvalidState.errno(), Errno::EINVAL);
        assert_eq!(PostError::InvalidWr.errno(), Errno::EINVAL);
    }

    /// A send WR's length: the inline bytes, else the sum of its SGEs; 8 for an atomic whatever
    /// its SGE says.
    #[test]
    fn send_wr_length_inline_sges_atomic() {
        let sge = |length| Sge {
            addr: 0,
            length,
            lkey: 1,
        };
        let wr = SendWr {
            sges: vec![sge(3), sge(4)],
            ..SendWr::new(1, WrOpcode::Send)
        };
        assert_eq!(wr.length(), 7);
        let wr = SendWr {
            inline_data: Some(vec![0; 11]),
            ..wr
        };
        assert_eq!(wr.length(), 11);
        let wr = SendWr {
            sges: vec![sge(64)],
            ..SendWr::new(1, WrOpcode::AtomicFetchAdd)
        };
        assert_eq!(wr.length(), 8);
    }
}

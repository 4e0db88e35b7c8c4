//! [`QpCore`]: requester, responder and completer of one RC QP.
//!
//! The requester half lives in `requester.rs` (segmentation, retransmit,
//! completer), the responder half in `responder.rs`; this file holds the
//! state, the verbs-facing calls and the dispatch; `modify.rs` the state transitions of
//! `ibv_modify_qp`.

use std::collections::VecDeque;

use super::state::QpState;
use super::timer::{local_ack_timeout, Timer, TimerTable};
use super::*;
use crate::wire::{self, Psn};

/// A posted send WR plus the requester's bookkeeping.
#[derive(Debug, Clone)]
pub(crate) struct SendWqe {
    pub wr: SendWr,
    /// Message length in bytes (8 for atomics).
    pub len: u32,
    /// PSNs the message consumes.
    pub npkts: u32,
    /// PSN of its first packet (valid once `started`).
    pub first_psn: Psn,
    /// PSNs assigned, at least one packet sent.
    pub started: bool,
    /// A local error found before sending; reported when it reaches the head.
    pub error: Option<u32>,
}

impl SendWqe {
    pub fn last_psn(&self) -> Psn {
        self.first_psn + (self.npkts - 1)
    }
    pub fn contains(&self, p: Psn) -> bool {
        self.started && p - self.first_psn >= 0 && self.last_psn() - p >= 0
    }
}

/// A multi-packet request message in progress at the responder.
#[derive(Debug, Clone)]
pub(crate) enum InMsg {
    Send {
        wqe: RecvWr,
        offset: u32,
    },
    Write {
        va: u64,
        rkey: u32,
        offset: u32,
        total: u32,
    },
}

/// A saved READ/atomic for duplicate handling (responder).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RdAtomicRes {
    Read {
        first_psn: Psn,
        npkts: u32,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// Queued responder output.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RespOut {
    /// ACK or NAK (`syndrome` byte) for `psn`.
    Ack {
        psn: Psn,
        syndrome: u8,
        msn: u32,
    },
    /// Remaining read response packets. `dup`: regenerated for a duplicate
    /// READ request (the requester may already have completed it).
    Read {
        psn: Psn,
        va: u64,
        rkey: u32,
        remaining: u32,
        first: bool,
        msn: u32,
        dup: bool,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

/// The sans-IO state of one RC queue pair. See the module docs of
/// [`crate::proto`] for the driving contract.
#[derive(Debug)]
pub struct QpCore {
    pub(crate) qpn: u32,
    pub(crate) caps: QpCaps,
    pub(crate) attrs: ModifyAttrs,
    pub(crate) stats: QpStats,
    pub(crate) mtu: u32,
    pub(crate) timers: TimerTable,
    pub(crate) completions: VecDeque<Completion>,
    pub(crate) events: VecDeque<AsyncEvent>,

    // ---- requester / completer ----
    pub(crate) sq: VecDeque<SendWqe>,
    /// Transmit cursor: WQE index in `sq` and packet index within it.
    pub(crate) tx_idx: usize,
    pub(crate) tx_pkt: u32,
    /// PSN for the next WQE to be started.
    pub(crate) next_psn: Psn,
    /// Oldest PSN not yet acknowledged / answered.
    pub(crate) una: Psn,
    /// One past the highest PSN ever sent.
    pub(crate) snd_max: Psn,
    pub(crate) rd_atomic_out: u32,
    pub(crate) retry_left: u8,
    pub(crate) rnr_retry_left: u8,
    pub(crate) rnr_wait: bool,
    pub(crate) pkts_since_ackreq: u32,
    pub(crate) max_inflight: u32,
    /// `una` at the last immediate (NAK/gap driven) rewind, to rewind once per hole.
    pub(crate) fast_rewind_at: Option<Psn>,
    pub(crate) sq_drained_pending: bool,
    /// Highest "next expected PSN" the responder has reported (ACK psn + 1 or
    /// NAK psn). A report beyond it is progress even while `una` is held
    /// back by an unanswered READ.
    pub(crate) peer_epsn: Psn,
    /// Smoothed RTT (first transmission of an AckReq packet → its ACK).
    pub(crate) srtt: Option<Duration>,
    /// The packet being timed: last PSN it covers and when it was sent.
    pub(crate) rtt_sample: Option<(Psn, Instant)>,
    /// Adaptive retransmission floor; `None` = off.
    pub(crate) probe_floor: Option<Duration>,
    pub(crate) probe_backoff: u32,
    /// Receive WQEs come from an SRQ through [`MemoryAccess::take_srq_recv`].
    pub(crate) srq: bool,

    // ---- responder ----
    pub(crate) rq: VecDeque<RecvWr>,
    pub(crate) epsn: Psn,
    pub(crate) msn: u32,
    /// A sequence-error (or RNR) NAK was sent for the current hole.
    pub(crate) nak_sent: bool,
    pub(crate) cur: Option<InMsg>,
    pub(crate) res: VecDeque<RdAtomicRes>,
    pub(crate) out: VecDeque<RespOut>,
    pub(crate) comm_est_raised: bool,
}

/// Every attribute bit `query` reports.
pub(super) const QUERY_MASK: u32 = attr_mask::STATE
    | attr_mask::CUR_STATE
    | attr_mask::ACCESS_FLAGS
    | attr_mask::PKEY_INDEX
    | attr_mask::PORT
    | attr_mask::AV
    | attr_mask::PATH_MTU
    | attr_mask::TIMEOUT
    | attr_mask::RETRY_CNT
    | attr_mask::RNR_RETRY
    | attr_mask::RQ_PSN
    | attr_mask::MAX_QP_RD_ATOMIC
    | attr_mask::MIN_RNR_TIMER
    | attr_mask::SQ_PSN
    | attr_mask::MAX_DEST_RD_ATOMIC
    | attr_mask::DEST_QPN
    | attr_mask::CAP;

impl QpCore {
    /// A new QP in RESET.
    pub fn new(qpn: u32, caps: QpCaps) -> Self {
        QpCore {
            qpn: qpn & Psn::MASK,
            caps,
            attrs: ModifyAttrs {
                port_num: 1,
                path_mtu: 3,
                ..ModifyAttrs::default()
            },
            stats: QpStats::default(),
            mtu: 1024,
            timers: TimerTable::default(),
            completions: VecDeque::new(),
            events: VecDeque::new(),
            sq: VecDeque::new(),
            tx_idx: 0,
            tx_pkt: 0,
            next_psn: Psn::new(0),
            una: Psn::new(0),
            snd_max: Psn::new(0),
            rd_atomic_out: 0,
            retry_left: 0,
            rnr_retry_left: 0,
            rnr_wait: false,
            pkts_since_ackreq: 0,
            max_inflight: DEFAULT_MAX_INFLIGHT_PSNS,
            fast_rewind_at: None,
            sq_drained_pending: false,
            peer_epsn: Psn::new(0),
            srtt: None,
            rtt_sample: None,
            probe_floor: Some(DEFAULT_ADAPTIVE_RETRANSMIT_FLOOR),
            probe_backoff: 0,
            srq: false,
            rq: VecDeque::new(),
            epsn: Psn::new(0),
            msn: 0,
            nak_sent: false,
            cur: None,
            res: VecDeque::new(),
            out: VecDeque::new(),
            comm_est_raised: false,
        }
    }

    /// This QP's number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.attrs.qp_state
    }

    /// Creation-time capacities.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Diagnostic counters.
    pub fn stats(&self) -> QpStats {
        self.stats
    }

    /// Send WRs posted and not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }

    /// Receive WRs posted and not yet consumed.
    pub fn recv_queue_len(&self) -> usize {
        self.rq.len()
    }

    pub(crate) fn send_completion(&self, w: &SendWqe, status: u32) -> Completion {
        let opcode = match w.wr.opcode {
            WrOpcode::Send | WrOpcode::SendWithImm => wc_opcode::SEND,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => wc_opcode::RDMA_WRITE,
            WrOpcode::RdmaRead => wc_opcode::RDMA_READ,
            WrOpcode::AtomicCmpSwp => wc_opcode::COMP_SWAP,
            WrOpcode::AtomicFetchAdd => wc_opcode::FETCH_ADD,
        };
        Completion {
            queue: WcQueue::Send,
            wr_id: w.wr.wr_id,
            status,
            opcode,
            byte_len: w.len,
            imm_data: None,
            qp_num: self.qpn,
            src_qp: self.attrs.dest_qp_num,
            wc_flags: 0,
            solicited: false,
        }
    }

    /// `ibv_post_send` of one WR (the verbs layer loops over the chain and
    /// stops at the first error). Needs RTS or SQD (SQD: queued, not sent);
    /// in ERR the WR is accepted and completes with WR_FLUSH_ERR.
    pub fn post_send(&mut self, now: Instant, wr: SendWr) -> Result<(), PostError> {
        let _ = now;
        let state = self.attrs.qp_state;
        if !matches!(state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(PostError::InvalidState);
        }
        if self.sq.len() >= self.caps.max_send_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sges.len() > self.caps.max_send_sge as usize {
            return Err(PostError::InvalidWr);
        }
        if let Some(d) = &wr.inline_data {
            if d.len() > self.caps.max_inline_data as usize || wr.opcode.is_read_or_atomic() {
                return Err(PostError::InvalidWr);
            }
        }
        let len64 = if wr.opcode.is_atomic() {
            8
        } else if let Some(d) = &wr.inline_data {
            d.len() as u64
        } else {
            wr.sges.iter().map(|s| u64::from(s.length)).sum()
        };
        let mut error = None;
        let len = if len64 > u64::from(MAX_MSG_SZ) {
            error = Some(wc_status::IBV_WC_LOC_LEN_ERR);
            0
        } else {
            len64 as u32
        };
        let npkts = if wr.opcode.is_atomic() {
            1
        } else {
            len.div_ceil(self.mtu).max(1)
        };
        let w = SendWqe {
            wr,
            len,
            npkts,
            first_psn: Psn::new(0),
            started: false,
            error,
        };
        if state == QpState::Err {
            let c = self.send_completion(&w, wc_status::IBV_WC_WR_FLUSH_ERR);
            self.completions.push_back(c);
            return Ok(());
        }
        self.sq.push_back(w);
        Ok(())
    }

    /// `ibv_post_recv` of one WR. Legal in every state but RESET; in ERR it
    /// completes at once with WR_FLUSH_ERR.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.srq {
            // ibv_post_recv on a QP attached to an SRQ is EINVAL.
            return Err(PostError::InvalidWr);
        }
        match self.attrs.qp_state {
            QpState::Reset => return Err(PostError::InvalidState),
            QpState::Err => {
                let c = self.recv_flush(wr.wr_id);
                self.completions.push_back(c);
                return Ok(());
            }
            _ => {}
        }
        if self.rq.len() >= self.caps.max_recv_wr as usize {
            return Err(PostError::QueueFull);
        }
        if wr.sges.len() > self.caps.max_recv_sge as usize {
            return Err(PostError::InvalidWr);
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// Feed one received packet addressed to this QP: BTH .. payload + pad,
    /// ICRC already verified and removed. Requests go to the responder,
    /// ACKs / read responses / atomic ACKs to the completer.
    pub fn handle_packet(&mut self, now: Instant, packet: &[u8], mem: &mut dyn MemoryAccess) {
        let Ok(p) = wire::RocePacketRepr::parse(packet) else {
            self.stats.rx_malformed += 1;
            return;
        };
        self.stats.rx_packets += 1;
        if p.bth.dest_qp != self.qpn {
            self.stats.rx_dropped += 1;
            return;
        }
        let state = self.attrs.qp_state;
        if p.bth.opcode.is_request() {
            if !matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe) {
                self.stats.rx_dropped += 1;
                return;
            }
            //= IBTA Vol 1 §11.6.3 / docs/softroce-internals.md#design-rules
            //# COMM_EST when the first packet arrives in RTR, as real NICs raise it.
            if state == QpState::Rtr && !self.comm_est_raised {
                self.comm_est_raised = true;
                self.events.push_back(AsyncEvent::CommEstablished);
            }
            self.handle_request(now, &p, mem);
        } else {
            if !matches!(state, QpState::Rts | QpState::Sqd | QpState::Sqe) {
                self.stats.rx_dropped += 1;
                return;
            }
            self.handle_response(now, &p, mem);
        }
        self.check_sq_drained();
    }

    /// Write the next packet to send (BTH .. pad, without ICRC) into `buf`
    /// (cleared first, capacity reused), or `None` if nothing is due. Call
    /// until `None` after every input. Payloads are gathered via `mem`.
    /// Responses (ACK/NAK, read responses) go before new requests.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &mut dyn MemoryAccess,
        buf: &mut Vec<u8>,
    ) -> Option<TransmitMeta> {
        if let Some(len) = self.poll_response(mem, buf) {
            self.stats.tx_packets += 1;
            return Some(self.meta(len, true));
        }
        let len = self.poll_request(now, mem, buf)?;
        self.stats.tx_packets += 1;
        Some(self.meta(len, false))
    }

    fn meta(&self, len: usize, is_response: bool) -> TransmitMeta {
        TransmitMeta {
            len,
            dgid: self.attrs.ah.dgid,
            traffic_class: self.attrs.ah.traffic_class,
            hop_limit: self.attrs.ah.hop_limit,
            dlid: self.attrs.ah.dlid,
            sl: self.attrs.ah.sl,
            is_global: self.attrs.ah.is_global,
            flow_label: self.attrs.ah.flow_label,
            sgid_index: self.attrs.ah.sgid_index,
            dest_qpn: self.attrs.dest_qp_num,
            is_response,
        }
    }

    /// The earliest instant at which [`Self::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_timeout()
    }

    /// Fire every timer that expired at `now` (retransmit, RNR).
    pub fn handle_timeout(&mut self, now: Instant) {
        for t in Timer::VALUES {
            if self.timers.is_expired(t, now) {
                self.timers.stop(t);
                match t {
                    Timer::Retransmit => self.on_retransmit_timeout(now),
                    Timer::Rnr => self.on_rnr_timeout(now),
                    Timer::Probe => self.on_probe_timeout(now),
                }
            }
        }
        self.check_sq_drained();
    }

    pub(crate) fn arm_retransmit(&mut self, now: Instant) {
        if let Some(d) = local_ack_timeout(self.attrs.timeout) {
            self.timers.set(Timer::Retransmit, now + d);
        }
        self.arm_probe(now);
    }

    /// Arm the adaptive retransmission probe: 4·SRTT + 100 µs, at least the
    /// floor, doubled per unanswered probe; not past the local ACK timeout.
    pub(crate) fn arm_probe(&mut self, now: Instant) {
        let Some(floor) = self.probe_floor else {
            self.timers.stop(Timer::Probe);
            return;
        };
        let base = self
            .srtt
            .map_or(0, |s| s.as_nanos().saturating_mul(4).saturating_add(100_000));
        let rto = base
            .max(floor.as_nanos())
            .saturating_mul(1 << self.probe_backoff.min(16));
        let at = now + Duration::from_nanos(rto);
        match self.timers.get(Timer::Retransmit) {
            Some(rt) if at >= rt => self.timers.stop(Timer::Probe),
            _ => self.timers.set(Timer::Probe, at),
        }
    }

    /// Adaptive retransmission (ConnectX-style): go back N before the local
    /// ACK timeout when the measured RTT says an answer is overdue. `floor`
    /// is the shortest probe delay; `None` turns it off (pure IBA timing).
    /// Probes never consume `retry_cnt`.
    pub fn set_adaptive_retransmit(&mut self, floor: Option<Duration>) {
        self.probe_floor = floor;
        if floor.is_none() {
            self.timers.stop(Timer::Probe);
        }
    }

    /// Smoothed round-trip time measured by the requester, if any.
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt
    }

    /// Next work completion, in order per queue.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop_front()
    }

    /// Override the cap on unacknowledged PSNs in flight
    /// (default [`DEFAULT_MAX_INFLIGHT_PSNS`]; clamped to 1..=2^22).
    pub fn set_max_inflight_psns(&mut self, n: u32) {
        self.max_inflight = n.clamp(1, 1 << 22);
    }

    /// Attach the QP to a shared receive queue (`ibv_qp_init_attr.srq`):
    /// its responder takes receive WQEs from
    /// [`MemoryAccess::take_srq_recv`], `post_recv` is EINVAL, and entering
    /// ERR raises [`AsyncEvent::LastWqeReached`] (after flushing any WQE it
    /// had taken but not completed, on its own receive queue).
    pub fn set_srq(&mut self, on: bool) {
        self.srq = on;
    }

    /// True when nothing is queued for transmission, nothing is awaiting
    /// acknowledgement and no completion or event is pending.
    pub fn is_idle(&self) -> bool {
        self.sq.is_empty() && self.out.is_empty() && self.completions.is_empty() && self.events.is_empty()
    }

    fn check_sq_drained(&mut self) {
        if self.sq_drained_pending && self.attrs.qp_state == QpState::Sqd && self.sq.iter().all(|w| !w.started) {
            self.sq_drained_pending = false;
            self.events.push_back(AsyncEvent::SqDrained);
        }
    }
}

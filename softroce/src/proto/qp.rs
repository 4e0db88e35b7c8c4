//! [`QpCore`]: requester, responder and completer of one RC QP.

use super::*;

/// The sans-IO state of one RC queue pair. See the module docs of
/// [`crate::proto`] for the driving contract.
#[derive(Debug)]
pub struct QpCore {
    qpn: u32,
    caps: QpCaps,
    attrs: ModifyAttrs,
    stats: QpStats,
}

impl QpCore {
    /// A new QP in RESET.
    pub fn new(qpn: u32, caps: QpCaps) -> Self {
        QpCore {
            qpn,
            caps,
            attrs: ModifyAttrs::default(),
            stats: QpStats::default(),
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

    /// `ibv_modify_qp`. Illegal transitions, missing required attributes,
    /// attributes not allowed on the edge and out-of-range values → EINVAL;
    /// nothing changes on error. Moving to ERR flushes every outstanding WR
    /// (WR_FLUSH_ERR completions); moving to RESET empties both queues silently.
    pub fn modify(&mut self, attrs: &ModifyAttrs) -> Result<(), Errno> {
        let _ = attrs;
        Err(Errno::EOPNOTSUPP)
    }

    /// `ibv_query_qp`: every attribute, `mask` = all bits the core tracks.
    pub fn query(&self) -> ModifyAttrs {
        self.attrs
    }

    /// `ibv_post_send` of one WR (the verbs layer loops over the chain and
    /// stops at the first error). Needs RTS or SQD (SQD: queued, not sent);
    /// in ERR the WR is accepted and completes with WR_FLUSH_ERR.
    pub fn post_send(&mut self, now: Instant, wr: SendWr) -> Result<(), PostError> {
        let _ = (now, wr);
        Err(PostError::InvalidState)
    }

    /// `ibv_post_recv` of one WR. Legal in every state but RESET; in ERR it
    /// completes at once with WR_FLUSH_ERR.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        let _ = wr;
        Err(PostError::InvalidState)
    }

    /// Feed one received packet addressed to this QP: BTH .. payload + pad,
    /// ICRC already verified and removed. Requests go to the responder,
    /// ACKs / read responses / atomic ACKs to the completer.
    pub fn handle_packet(&mut self, now: Instant, packet: &[u8], mem: &mut dyn MemoryAccess) {
        let _ = (now, packet, mem);
    }

    /// Write the next packet to send (BTH .. pad, without ICRC) into `buf`
    /// (cleared first, capacity reused), or `None` if nothing is due. Call
    /// until `None` after every input. Payloads are gathered via `mem`.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &mut dyn MemoryAccess,
        buf: &mut Vec<u8>,
    ) -> Option<TransmitMeta> {
        let _ = (now, mem, buf);
        None
    }

    /// The earliest instant at which [`Self::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    /// Fire every timer that expired at `now` (retransmit, RNR).
    pub fn handle_timeout(&mut self, now: Instant) {
        let _ = now;
    }

    /// Next work completion, in order per queue.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        None
    }

    /// Next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        None
    }

    /// Override the cap on unacknowledged PSNs in flight
    /// (default [`DEFAULT_MAX_INFLIGHT_PSNS`]; clamped to 1..=2^22).
    pub fn set_max_inflight_psns(&mut self, n: u32) {
        let _ = n;
    }
}

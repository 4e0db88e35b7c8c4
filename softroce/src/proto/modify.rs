//! `ibv_modify_qp` and `ibv_query_qp` on a [`QpCore`]: the checked state transitions, entering
//! a state (RESET empties the queues, ERR flushes every outstanding WR), and the value checks of
//! the attributes.

use super::qp::{InMsg, QpCore, QUERY_MASK};
use super::state::{check_transition, QpState};
use super::*;
use crate::wire::{self, Psn};

impl QpCore {
    /// `ibv_modify_qp`. Illegal transitions, missing required attributes,
    /// attributes not allowed on the edge and out-of-range values → EINVAL;
    /// nothing changes on error. Moving to ERR flushes every outstanding WR
    /// (WR_FLUSH_ERR completions); moving to RESET empties both queues silently.
    pub fn modify(&mut self, a: &ModifyAttrs) -> Result<(), Errno> {
        use attr_mask as m;
        let cur = self.attrs.qp_state;
        let mask = a.mask;
        if mask & m::CUR_STATE != 0 && a.cur_qp_state != cur {
            return Err(Errno::EINVAL);
        }
        let target = if mask & m::STATE != 0 { a.qp_state } else { cur };
        check_transition(cur, target, mask).map_err(|_| Errno::EINVAL)?;
        check_values(a)?;
        apply_attrs(&mut self.attrs, a);
        self.mtu = wire::mtu_bytes(self.attrs.path_mtu).unwrap_or(1024);

        if target != cur || target == QpState::Reset {
            self.enter_state(target);
        } else {
            self.attrs.qp_state = target;
        }
        if mask & (m::RETRY_CNT | m::RNR_RETRY) != 0 {
            self.retry_left = self.attrs.retry_cnt;
            self.rnr_retry_left = self.attrs.rnr_retry;
        }
        Ok(())
    }

    fn enter_state(&mut self, target: QpState) {
        let from = self.attrs.qp_state;
        self.attrs.qp_state = target;
        match target {
            QpState::Reset => self.reset(),
            QpState::Rtr => {
                self.epsn = Psn::new(self.attrs.rq_psn);
                self.msn = 0;
                self.nak_sent = false;
                self.cur = None;
                self.res.clear();
                self.out.clear();
            }
            QpState::Rts if from == QpState::Rtr => {
                let p = Psn::new(self.attrs.sq_psn);
                self.next_psn = p;
                self.una = p;
                self.snd_max = p;
                self.peer_epsn = p;
                self.retry_left = self.attrs.retry_cnt;
                self.rnr_retry_left = self.attrs.rnr_retry;
            }
            QpState::Sqd => {
                self.sq_drained_pending = self.attrs.en_sqd_async_notify != 0;
            }
            QpState::Err => {
                self.flush();
                self.out.clear();
            }
            _ => {}
        }
    }

    fn reset(&mut self) {
        let (qpn, caps, max_inflight, stats, floor, srq) = (
            self.qpn,
            self.caps,
            self.max_inflight,
            self.stats,
            self.probe_floor,
            self.srq,
        );
        *self = QpCore::new(qpn, caps);
        self.max_inflight = max_inflight;
        self.stats = stats;
        self.probe_floor = floor;
        self.srq = srq;
    }

    /// Move to ERR because of an error the QP detected, raising `event`.
    pub(crate) fn enter_error(&mut self, event: Option<AsyncEvent>) {
        if self.attrs.qp_state == QpState::Err {
            return;
        }
        if let Some(e) = event {
            self.events.push_back(e);
        }
        self.attrs.qp_state = QpState::Err;
        self.flush();
    }

    /// Complete everything outstanding with WR_FLUSH_ERR (a head WQE with a
    /// recorded error gets that status instead).
    //= docs/softroce-internals.md#rc-reliability
    //# After an error, remaining WRs complete with WR_FLUSH_ERR, and so do posted receives.
    fn flush(&mut self) {
        //= IBTA Vol 1 §11.6.3.2 (Affiliated asynchronous events)
        //# Last WQE Reached: a QP associated with an SRQ transitioned to the Error
        //# state and no more WQEs will be consumed from the SRQ.
        if self.srq {
            self.events.push_back(AsyncEvent::LastWqeReached);
        }
        self.timers.clear();
        self.rnr_wait = false;
        while let Some(w) = self.sq.pop_front() {
            let status = w.error.unwrap_or(wc_status::IBV_WC_WR_FLUSH_ERR);
            self.completions.push_back(self.send_completion(&w, status));
        }
        self.tx_idx = 0;
        self.tx_pkt = 0;
        self.rd_atomic_out = 0;
        if let Some(InMsg::Send { wqe, .. }) = self.cur.take() {
            self.completions.push_back(self.recv_flush(wqe.wr_id));
        }
        while let Some(r) = self.rq.pop_front() {
            self.completions.push_back(self.recv_flush(r.wr_id));
        }
        // Responses queued before a QP-detected error (read responses, then
        // the NAK that explains the error) still go out, in order;
        // `modify(ERR)` discards them (see `enter_state`).
    }

    pub(super) fn recv_flush(&self, wr_id: u64) -> Completion {
        Completion {
            queue: WcQueue::Recv,
            wr_id,
            status: wc_status::IBV_WC_WR_FLUSH_ERR,
            opcode: wc_opcode::RECV,
            byte_len: 0,
            imm_data: None,
            qp_num: self.qpn,
            src_qp: self.attrs.dest_qp_num,
            wc_flags: 0,
            solicited: false,
        }
    }

    /// `ibv_query_qp`: every attribute, `mask` = all bits the core tracks.
    pub fn query(&self) -> ModifyAttrs {
        ModifyAttrs {
            mask: QUERY_MASK,
            cur_qp_state: self.attrs.qp_state,
            ..self.attrs
        }
    }
}

/// The value checks of `ibv_modify_qp` (as ib_modify_qp / the providers do).
fn check_values(a: &ModifyAttrs) -> Result<(), Errno> {
    use attr_mask as m;
    let mask = a.mask;
    if mask & m::PATH_MTU != 0 && wire::mtu_bytes(a.path_mtu).is_none() {
        return Err(Errno::EINVAL);
    }
    if mask & m::TIMEOUT != 0 && a.timeout > 31 {
        return Err(Errno::EINVAL);
    }
    if mask & m::RETRY_CNT != 0 && a.retry_cnt > 7 {
        return Err(Errno::EINVAL);
    }
    if mask & m::RNR_RETRY != 0 && a.rnr_retry > 7 {
        return Err(Errno::EINVAL);
    }
    if mask & m::MIN_RNR_TIMER != 0 && a.min_rnr_timer > 31 {
        return Err(Errno::EINVAL);
    }
    if mask & m::MAX_QP_RD_ATOMIC != 0 && a.max_rd_atomic > MAX_QP_RD_ATOM {
        return Err(Errno::EINVAL);
    }
    if mask & m::MAX_DEST_RD_ATOMIC != 0 && a.max_dest_rd_atomic > MAX_QP_RD_ATOM {
        return Err(Errno::EINVAL);
    }
    if mask & m::PORT != 0 && a.port_num != 1 {
        return Err(Errno::EINVAL);
    }
    if mask & m::PKEY_INDEX != 0 && a.pkey_index >= super::limits::MAX_PKEYS {
        return Err(Errno::EINVAL);
    }
    if mask & m::DEST_QPN != 0 && a.dest_qp_num > Psn::MASK {
        return Err(Errno::EINVAL);
    }
    //= docs/softroce-internals.md#design-rules
    //# rc_pingpong needs -g 0 (as on real RoCE); reject RTR without GRH.
    // (An InfiniBand port routes by DLID, so there an AV without GRH names a DLID; the verbs
    // layer checks the rule of each link layer, the core only that the AV names a destination.)
    if mask & m::AV != 0 && !a.ah.is_global && a.ah.dlid == 0 {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Copies the attributes `a.mask` selects into `s` (all checked).
fn apply_attrs(s: &mut ModifyAttrs, a: &ModifyAttrs) {
    use attr_mask as m;
    let mask = a.mask;
    if mask & m::ACCESS_FLAGS != 0 {
        s.qp_access_flags = a.qp_access_flags;
    }
    if mask & m::PKEY_INDEX != 0 {
        s.pkey_index = a.pkey_index;
    }
    if mask & m::PORT != 0 {
        s.port_num = a.port_num;
    }
    if mask & m::AV != 0 {
        s.ah = a.ah;
    }
    if mask & m::PATH_MTU != 0 {
        s.path_mtu = a.path_mtu;
    }
    if mask & m::TIMEOUT != 0 {
        s.timeout = a.timeout;
    }
    if mask & m::RETRY_CNT != 0 {
        s.retry_cnt = a.retry_cnt;
    }
    if mask & m::RNR_RETRY != 0 {
        s.rnr_retry = a.rnr_retry;
    }
    if mask & m::RQ_PSN != 0 {
        s.rq_psn = a.rq_psn & Psn::MASK;
    }
    if mask & m::SQ_PSN != 0 {
        s.sq_psn = a.sq_psn & Psn::MASK;
    }
    if mask & m::MAX_QP_RD_ATOMIC != 0 {
        s.max_rd_atomic = a.max_rd_atomic;
    }
    if mask & m::MAX_DEST_RD_ATOMIC != 0 {
        s.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if mask & m::MIN_RNR_TIMER != 0 {
        s.min_rnr_timer = a.min_rnr_timer;
    }
    if mask & m::DEST_QPN != 0 {
        s.dest_qp_num = a.dest_qp_num;
    }
    if mask & m::EN_SQD_ASYNC_NOTIFY != 0 {
        s.en_sqd_async_notify = a.en_sqd_async_notify;
    }
}

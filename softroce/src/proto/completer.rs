//! The requester's completer on a [`QpCore`]: ACKs, NAKs, READ responses and atomic ACKs
//! matched against the send queue, completions in posting order, and the retransmit, RNR and
//! probe timeouts.

use super::qp::QpCore;
use super::requester::scatter;
use super::state::QpState;
use super::timer::{rnr_delay, Timer};
use super::*;
use crate::wire::opcode::MsgKind;
use crate::wire::{NakCode, Psn, RocePacketRepr, Syndrome};

impl QpCore {
    /// Pop the head WQE and report it (successes only if signaled).
    fn complete_head(&mut self, status: u32) {
        let Some(w) = self.sq.pop_front() else { return };
        if w.started && w.wr.opcode.is_read_or_atomic() {
            self.rd_atomic_out = self.rd_atomic_out.saturating_sub(1);
        }
        if self.tx_idx > 0 {
            self.tx_idx -= 1;
        } else {
            self.tx_pkt = 0;
        }
        if w.started && w.last_psn() + 1 - self.una > 0 {
            self.una = w.last_psn() + 1;
        }
        //= docs/softroce-internals.md#rc-reliability
        //# Only signaled WRs (or sq_sig_all) produce a CQE, but errors always do.
        if status != wc_status::IBV_WC_SUCCESS || w.wr.signaled || self.caps.sq_sig_all {
            let c = self.send_completion(&w, status);
            self.completions.push_back(c);
        }
        if status != wc_status::IBV_WC_SUCCESS {
            self.enter_error(None);
        }
    }

    /// If the head WQE carries a local error, report it and enter ERR.
    pub(super) fn complete_head_error(&mut self) {
        if let Some(status) = self.sq.front().and_then(|w| w.error) {
            self.complete_head(status);
        }
    }

    /// Forward progress: reset retry counters and the retransmit timer.
    fn on_progress(&mut self, now: Instant) {
        if self.una - self.peer_epsn > 0 {
            self.peer_epsn = self.una;
        }
        if let Some((p, sent)) = self.rtt_sample {
            if self.una - p > 0 {
                let sample = (now - sent).as_nanos();
                let srtt = self.srtt.map_or(sample, |s| (s.as_nanos() * 7 + sample) / 8);
                self.srtt = Some(Duration::from_nanos(srtt));
                self.rtt_sample = None;
            }
        }
        self.probe_backoff = 0;
        self.retry_left = self.attrs.retry_cnt;
        self.rnr_retry_left = self.attrs.rnr_retry;
        self.fast_rewind_at = None;
        if self.una - self.snd_max < 0 {
            self.arm_retransmit(now);
        } else {
            self.timers.stop(Timer::Retransmit);
            self.timers.stop(Timer::Probe);
        }
        if self.cursor_psn() - self.una < 0 {
            let una = self.una;
            self.seek(una);
        }
        self.complete_head_error();
    }

    /// Everything before `p` is acknowledged: complete SEND/WRITE WQEs that
    /// end before `p`. Returns `true` if a READ/atomic ending before `p` is
    /// still unanswered (its responses were lost).
    //= docs/softroce-internals.md#packetisation-psn-and-acknowledgements
    //# A requester must accept coalesced ACKs: an ACK for PSN p acknowledges every request packet ≤ p.
    fn ack_before(&mut self, now: Instant, p: Psn) -> bool {
        let old = self.una;
        let mut lost = false;
        while let Some(w) = self.sq.front() {
            if !w.started || w.error.is_some() || w.last_psn() - p >= 0 {
                break;
            }
            if w.wr.opcode.is_read_or_atomic() {
                lost = true;
                break;
            }
            self.complete_head(wc_status::IBV_WC_SUCCESS);
            if self.attrs.qp_state == QpState::Err {
                return false;
            }
        }
        if !lost {
            if let Some(w) = self.sq.front() {
                if w.contains(p) && !w.wr.opcode.is_read_or_atomic() && p - self.una > 0 {
                    self.una = p;
                }
            }
        }
        if self.una - old > 0 {
            self.on_progress(now);
        }
        lost
    }

    /// Record the responder's expected PSN from an ACK/NAK; `true` (and the
    /// retry counter is refilled) if it moved forward.
    fn note_peer_epsn(&mut self, p: Psn) -> bool {
        if p - self.peer_epsn > 0 && p - self.snd_max <= 0 {
            self.peer_epsn = p;
            self.retry_left = self.attrs.retry_cnt;
            true
        } else {
            false
        }
    }

    /// Retransmit from `una` now (once per hole).
    fn fast_rewind(&mut self) {
        if self.fast_rewind_at == Some(self.una) {
            return;
        }
        self.fast_rewind_at = Some(self.una);
        self.rewind();
    }

    pub(crate) fn handle_response(&mut self, now: Instant, p: &RocePacketRepr, mem: &mut dyn MemoryAccess) {
        let psn = p.bth.psn;
        // Responses for PSNs never sent are bogus; far-behind ones are stale.
        if psn - self.snd_max >= 0 || psn - self.una < -1 {
            self.stats.rx_dropped += 1;
            return;
        }
        let Some((kind, _)) = p.bth.opcode.kind() else { return };
        let syndrome = p.aeth.map(|a| a.syndrome);
        match (kind, syndrome) {
            (MsgKind::Ack, Some(Syndrome::Ack { .. })) => {
                self.note_peer_epsn(psn + 1);
                if self.ack_before(now, psn + 1) {
                    self.fast_rewind();
                }
            }
            (MsgKind::Ack, Some(Syndrome::RnrNak { timer })) => self.on_rnr_nak(now, psn, timer),
            (MsgKind::Ack, Some(Syndrome::Nak(code))) => self.on_nak(now, psn, code),
            (MsgKind::ReadResponse, _) => self.on_read_response(now, p, mem),
            (MsgKind::AtomicAck, Some(Syndrome::Ack { .. })) => self.on_atomic_ack(now, p, mem),
            _ => self.stats.rx_dropped += 1,
        }
    }

    fn on_read_response(&mut self, now: Instant, p: &RocePacketRepr, mem: &mut dyn MemoryAccess) {
        let psn = p.bth.psn;
        if psn - self.una < 0 {
            self.stats.rx_duplicates += 1;
            return;
        }
        if self.ack_before(now, psn) {
            self.fast_rewind();
            return;
        }
        let Some(w) = self.sq.front() else { return };
        if w.wr.opcode != WrOpcode::RdmaRead || !w.contains(psn) {
            self.stats.rx_dropped += 1;
            return;
        }
        if psn != self.una {
            // A response packet was lost: ask again for the tail.
            self.fast_rewind();
            return;
        }
        let i = (psn - w.first_psn) as u32;
        let off = i * self.mtu;
        let is_last = psn == w.last_psn();
        let expect = if is_last { w.len - off.min(w.len) } else { self.mtu };
        if p.payload.len() != expect as usize {
            self.stats.rx_dropped += 1;
            return;
        }
        if let Err(status) = scatter(mem, &w.wr.sges, off, p.payload) {
            self.complete_head(status);
            return;
        }
        self.una = psn + 1;
        if is_last {
            self.complete_head(wc_status::IBV_WC_SUCCESS);
        }
        self.on_progress(now);
    }

    fn on_atomic_ack(&mut self, now: Instant, p: &RocePacketRepr, mem: &mut dyn MemoryAccess) {
        let psn = p.bth.psn;
        if psn - self.una < 0 {
            self.stats.rx_duplicates += 1;
            return;
        }
        if self.ack_before(now, psn) {
            self.fast_rewind();
            return;
        }
        let Some(w) = self.sq.front() else { return };
        if !w.wr.opcode.is_atomic() || w.first_psn != psn || !w.started {
            self.stats.rx_dropped += 1;
            return;
        }
        let orig = p.atomic_ack_eth.map(|a| a.orig).unwrap_or(0);
        //= docs/softroce-internals.md#extension-headers
        //# The requester stores the returned original value into its local SGE in host order.
        if let Err(status) = scatter(mem, &w.wr.sges, 0, &orig.to_ne_bytes()) {
            self.complete_head(status);
            return;
        }
        self.complete_head(wc_status::IBV_WC_SUCCESS);
        self.on_progress(now);
    }

    fn on_nak(&mut self, now: Instant, psn: Psn, code: NakCode) {
        match code {
            //= docs/softroce-internals.md#rc-reliability
            //# NAK sequence error with PSN p: everything before p is implicitly acked;
            //# retransmit from p at once
            NakCode::PsnSequenceError => {
                self.stats.seq_naks_received += 1;
                if psn - self.una < 0 || self.rnr_wait {
                    return;
                }
                let fresh = self.note_peer_epsn(psn);
                self.ack_before(now, psn);
                if self.attrs.qp_state == QpState::Err {
                    return;
                }
                if !fresh {
                    // The same hole again: a retry without progress.
                    if self.retry_left == 0 {
                        self.complete_head(wc_status::IBV_WC_RETRY_EXC_ERR);
                        return;
                    }
                    self.retry_left -= 1;
                }
                self.fast_rewind_at = None;
                self.fast_rewind();
            }
            //# 0x61 → REM_INV_REQ_ERR (9), 0x62 → REM_ACCESS_ERR (10), 0x63 → REM_OP_ERR (11);
            //# these are fatal (QP → ERR).
            other => {
                if psn - self.una < 0 {
                    return;
                }
                self.ack_before(now, psn);
                if self.attrs.qp_state == QpState::Err {
                    return;
                }
                let status = match other {
                    NakCode::RemoteAccessError => wc_status::IBV_WC_REM_ACCESS_ERR,
                    NakCode::RemoteOperationalError => wc_status::IBV_WC_REM_OP_ERR,
                    _ => wc_status::IBV_WC_REM_INV_REQ_ERR,
                };
                self.complete_head(status);
            }
        }
    }

    //= docs/softroce-internals.md#rc-reliability
    //# RNR NAK: wait the encoded time, then go back to the NAKed PSN; counts against
    //# rnr_retry (7 = infinite) → RNR_RETRY_EXC_ERR when exhausted.
    fn on_rnr_nak(&mut self, now: Instant, psn: Psn, timer: u8) {
        self.stats.rnr_naks_received += 1;
        if psn - self.una < 0 || self.rnr_wait {
            return;
        }
        self.ack_before(now, psn);
        if self.attrs.qp_state == QpState::Err {
            return;
        }
        if self.rnr_retry_left == 0 {
            self.complete_head(wc_status::IBV_WC_RNR_RETRY_EXC_ERR);
            return;
        }
        if self.rnr_retry_left != 7 {
            self.rnr_retry_left -= 1;
        }
        self.rewind();
        self.rnr_wait = true;
        self.timers.stop(Timer::Retransmit);
        self.timers.stop(Timer::Probe);
        self.timers.set(Timer::Rnr, now + rnr_delay(timer));
    }

    pub(crate) fn on_rnr_timeout(&mut self, now: Instant) {
        self.rnr_wait = false;
        self.rewind();
        if self.una - self.snd_max < 0 {
            self.arm_retransmit(now);
        }
    }

    pub(crate) fn on_probe_timeout(&mut self, now: Instant) {
        if !matches!(self.attrs.qp_state, QpState::Rts | QpState::Sqd) || self.rnr_wait {
            return;
        }
        if self.una - self.snd_max >= 0 {
            return; // nothing outstanding
        }
        self.stats.probes += 1;
        self.fast_rewind_at = None;
        self.rewind();
        self.probe_backoff += 1;
        self.arm_probe(now);
    }

    //= docs/softroce-internals.md#rc-reliability
    //# retry_cnt (0–7) bounds consecutive timeout/NAK-sequence retries without
    //# progress; exhausted → RETRY_EXC_ERR and QP error.
    pub(crate) fn on_retransmit_timeout(&mut self, now: Instant) {
        if !matches!(self.attrs.qp_state, QpState::Rts | QpState::Sqd) || self.rnr_wait {
            return;
        }
        if self.una - self.snd_max >= 0 {
            return; // nothing outstanding
        }
        self.stats.timeouts += 1;
        if self.retry_left == 0 {
            self.complete_head(wc_status::IBV_WC_RETRY_EXC_ERR);
            return;
        }
        self.retry_left -= 1;
        self.fast_rewind_at = None;
        self.rewind();
        self.arm_retransmit(now);
    }
}

//! Requester and completer: segmentation of send WRs into packets, PSN
//! assignment, AckReq, go-back-N retransmission, NAK/RNR handling and send
//! completions.

use super::qp::{QpCore, SendWqe};
use super::state::QpState;
use super::timer::{rnr_delay, Timer};
use super::*;
use crate::wire::opcode::MsgKind;
use crate::wire::{self, AtomicEthRepr, BthRepr, NakCode, OpCode, Psn, RethRepr, RocePacketRepr, Syndrome};

/// AckReq at least every this many packets inside long messages.
//= docs/softroce-internals.md#packetisation-psn-and-acknowledgements
//# AckReq (rxe): set on the last packet of every request message and on every ~64th packet inside long messages.
const ACK_REQ_EVERY: u32 = 64;

/// Gather `out.len()` bytes at byte `offset` of the WR's payload.
fn gather(mem: &dyn MemoryAccess, wr: &SendWr, offset: u32, out: &mut [u8]) -> Result<(), LocalAccessError> {
    if out.is_empty() {
        return Ok(());
    }
    if let Some(d) = &wr.inline_data {
        let start = offset as usize;
        let src = d.get(start..start + out.len()).ok_or(LocalAccessError::OutOfBounds)?;
        out.copy_from_slice(src);
        return Ok(());
    }
    let mut skip = u64::from(offset);
    let mut done = 0usize;
    for s in &wr.sges {
        if done == out.len() {
            break;
        }
        let l = u64::from(s.length);
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(out.len() - done);
        mem.local_read(s.lkey, s.addr + skip, &mut out[done..done + n])?;
        done += n;
        skip = 0;
    }
    if done == out.len() {
        Ok(())
    } else {
        Err(LocalAccessError::OutOfBounds)
    }
}

/// Scatter `data` at byte `offset` into `sges`. `Err(LOC_LEN_ERR)` if it
/// does not fit, `Err(LOC_PROT_ERR)` on an access error.
pub(crate) fn scatter(mem: &mut dyn MemoryAccess, sges: &[Sge], offset: u32, data: &[u8]) -> Result<(), u32> {
    if data.is_empty() {
        return Ok(());
    }
    let mut skip = u64::from(offset);
    let mut done = 0usize;
    for s in sges {
        if done == data.len() {
            break;
        }
        let l = u64::from(s.length);
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(data.len() - done);
        mem.local_write(s.lkey, s.addr + skip, &data[done..done + n])
            .map_err(|_| wc_status::IBV_WC_LOC_PROT_ERR)?;
        done += n;
        skip = 0;
    }
    if done == data.len() {
        Ok(())
    } else {
        Err(wc_status::IBV_WC_LOC_LEN_ERR)
    }
}

/// Make `buf` exactly `len` bytes long without zero-filling bytes that the
/// caller overwrites anyway (headers, payload): only growth is zeroed. The
/// caller must write every byte (pad included).
pub(crate) fn set_len(buf: &mut Vec<u8>, len: usize) {
    if buf.len() >= len {
        buf.truncate(len);
    } else {
        buf.resize(len, 0);
    }
}

/// Validate a WQE's local buffers before its first packet.
fn check_local(mem: &dyn MemoryAccess, w: &SendWqe) -> Result<(), u32> {
    if w.wr.inline_data.is_some() {
        return Ok(());
    }
    let write = w.wr.opcode.is_read_or_atomic();
    for s in &w.wr.sges {
        mem.local_check(s.lkey, s.addr, u64::from(s.length), write)
            .map_err(|_| wc_status::IBV_WC_LOC_PROT_ERR)?;
    }
    if w.wr.opcode.is_atomic() && w.wr.sges.iter().map(|s| u64::from(s.length)).sum::<u64>() < 8 {
        return Err(wc_status::IBV_WC_LOC_LEN_ERR);
    }
    Ok(())
}

fn imm_to_wire(imm: u32) -> u32 {
    //= docs/softroce-internals.md#design-rules
    //# imm_data is big-endian on both sides of the API — never swap it.
    u32::from_be_bytes(imm.to_ne_bytes())
}

/// One request packet's headers and payload range (see `QpCore::request_headers`).
struct RequestPacket {
    bth: BthRepr,
    reth: Option<RethRepr>,
    atomic_eth: Option<AtomicEthRepr>,
    immdt: Option<u32>,
    payload_off: u32,
    payload_len: u32,
    /// The packet ends the WQE's transmission.
    advance_whole: bool,
    /// The last packet of the message (AckReq is always set on it).
    last: bool,
}

/// The opcode of a SEND or WRITE packet by its place in the message.
fn data_opcode(is_send: bool, first: bool, last: bool, imm: bool) -> OpCode {
    match (is_send, first, last, imm) {
        (true, true, true, false) => OpCode::SendOnly,
        (true, true, true, true) => OpCode::SendOnlyWithImm,
        (true, true, false, _) => OpCode::SendFirst,
        (true, false, false, _) => OpCode::SendMiddle,
        (true, false, true, false) => OpCode::SendLast,
        (true, false, true, true) => OpCode::SendLastWithImm,
        (false, true, true, false) => OpCode::WriteOnly,
        (false, true, true, true) => OpCode::WriteOnlyWithImm,
        (false, true, false, _) => OpCode::WriteFirst,
        (false, false, false, _) => OpCode::WriteMiddle,
        (false, false, true, false) => OpCode::WriteLast,
        (false, false, true, true) => OpCode::WriteLastWithImm,
    }
}

impl QpCore {
    fn max_rd_atomic(&self) -> u32 {
        u32::from(self.attrs.max_rd_atomic).max(1)
    }

    /// PSN of the packet at the transmit cursor.
    pub(crate) fn cursor_psn(&self) -> Psn {
        match self.sq.get(self.tx_idx) {
            Some(w) if w.started => w.first_psn + self.tx_pkt,
            _ => self.next_psn,
        }
    }

    /// Move the transmit cursor to `psn` (go-back-N) or, if `psn` lies past
    /// every started WQE, to the first unstarted one.
    pub(crate) fn seek(&mut self, psn: Psn) {
        for (i, w) in self.sq.iter().enumerate() {
            if !w.started || w.contains(psn) {
                self.tx_idx = i;
                self.tx_pkt = if w.started && !w.wr.opcode.is_atomic() {
                    (psn - w.first_psn) as u32
                } else {
                    0
                };
                return;
            }
        }
        self.tx_idx = self.sq.len();
        self.tx_pkt = 0;
    }

    /// Go back to the oldest unacknowledged PSN.
    fn rewind(&mut self) {
        let una = self.una;
        self.seek(una);
        self.pkts_since_ackreq = 0;
        // Karn: no RTT sample across a retransmission.
        self.rtt_sample = None;
    }

    /// Build the next request packet, if the window, state and limits allow.
    pub(crate) fn poll_request(
        &mut self,
        now: Instant,
        mem: &mut dyn MemoryAccess,
        buf: &mut Vec<u8>,
    ) -> Option<usize> {
        let state = self.attrs.qp_state;
        if !matches!(state, QpState::Rts | QpState::Sqd) || self.rnr_wait {
            return None;
        }
        self.complete_head_error();
        if self.attrs.qp_state != state {
            return None;
        }
        let idx = self.tx_idx;
        let w = self.sq.get(idx)?;
        if w.error.is_some() {
            return None; // reported when it reaches the head
        }
        if !w.started {
            self.start_wqe(idx, state, mem)?;
        }
        let w = self.sq.get(idx)?;
        let psn = w.first_psn + self.tx_pkt;
        let inflight = (psn - self.una).max(0) as u32;
        if inflight >= self.max_inflight {
            return None;
        }
        let mut req = self.request_headers(w, psn);
        self.pkts_since_ackreq += 1;
        req.bth.ack_req = req.last || self.pkts_since_ackreq >= ACK_REQ_EVERY || inflight + 1 >= self.max_inflight;
        if req.bth.ack_req {
            self.pkts_since_ackreq = 0;
        }
        let repr = RocePacketRepr {
            bth: req.bth,
            reth: req.reth,
            atomic_eth: req.atomic_eth,
            aeth: None,
            atomic_ack_eth: None,
            immdt: req.immdt,
            ieth: None,
            payload: &[],
        };
        let hdr = repr.header_len();
        let plen = req.payload_len as usize;
        set_len(buf, hdr + plen + wire::pad_len(plen));
        buf[hdr + plen..].fill(0); // pad
        repr.emit_headers(&mut buf[..hdr], plen);
        if gather(mem, &w.wr, req.payload_off, &mut buf[hdr..hdr + plen]).is_err() {
            // Memory changed under us (MR deregistered): local protection error.
            if let Some(w) = self.sq.get_mut(idx) {
                w.error = Some(wc_status::IBV_WC_LOC_PROT_ERR);
            }
            buf.clear();
            self.complete_head_error();
            return None;
        }
        let end = if req.advance_whole {
            w.first_psn + w.npkts
        } else {
            psn + 1
        };
        self.request_sent(now, &req, end);
        Some(buf.len())
    }

    /// Assigns PSNs to the not yet started WQE at `idx`, if fences, the
    /// read/atomic limit, the in-flight window and its local buffers allow.
    fn start_wqe(&mut self, idx: usize, state: QpState, mem: &dyn MemoryAccess) -> Option<()> {
        let max_rd = self.max_rd_atomic();
        let w = self.sq.get(idx)?;
        if state == QpState::Sqd {
            return None;
        }
        //= docs/softroce-internals.md#rc-reliability
        //# IBV_SEND_FENCE holds the WR until earlier reads/atomics are complete
        //# (rxe simply waits until every earlier WR has completed).
        if w.wr.fence && idx > 0 {
            return None;
        }
        //# READ/ATOMIC WRs count against max_rd_atomic outstanding operations
        if w.wr.opcode.is_read_or_atomic() && self.rd_atomic_out >= max_rd {
            return None;
        }
        if (self.next_psn - self.una) as u32 >= self.max_inflight {
            return None;
        }
        if let Err(status) = check_local(mem, w) {
            if let Some(w) = self.sq.get_mut(idx) {
                w.error = Some(status);
            }
            self.complete_head_error();
            return None;
        }
        let first = self.next_psn;
        let w = self.sq.get_mut(idx)?;
        w.started = true;
        w.first_psn = first;
        self.next_psn = first + w.npkts;
        if w.wr.opcode.is_read_or_atomic() {
            self.rd_atomic_out += 1;
        }
        Some(())
    }

    /// The headers of packet `self.tx_pkt` of WQE `w` (PSN `psn`); AckReq is
    /// left to the caller.
    fn request_headers(&self, w: &SendWqe, psn: Psn) -> RequestPacket {
        let mtu = self.mtu;
        let i = self.tx_pkt;
        let wr = &w.wr;
        let mut req = RequestPacket {
            bth: BthRepr {
                opcode: OpCode::SendOnly,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: wire::DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qp: self.attrs.dest_qp_num,
                ack_req: false,
                psn,
            },
            reth: None,
            atomic_eth: None,
            immdt: None,
            payload_off: 0,
            payload_len: 0,
            advance_whole: true,
            last: true,
        };
        match wr.opcode {
            WrOpcode::RdmaRead => {
                // A (re)issued READ asks for the tail starting at packet i.
                //= docs/softroce-internals.md#rc-reliability
                //# for a partially answered READ, re-issue the request for the missing tail
                //# with adjusted VA/length and the first missing PSN
                let off = u64::from(i) * u64::from(mtu);
                req.bth.opcode = OpCode::ReadRequest;
                req.reth = Some(RethRepr {
                    va: wr.remote_addr.wrapping_add(off),
                    rkey: wr.rkey,
                    dma_len: w.len.saturating_sub(off as u32),
                });
            }
            WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => {
                let cmp = wr.opcode == WrOpcode::AtomicCmpSwp;
                req.bth.opcode = if cmp { OpCode::CompareSwap } else { OpCode::FetchAdd };
                req.atomic_eth = Some(AtomicEthRepr {
                    va: wr.remote_addr,
                    rkey: wr.rkey,
                    swap_add: if cmp { wr.swap } else { wr.compare_add },
                    compare: if cmp { wr.compare_add } else { 0 },
                });
            }
            op => {
                let is_send = matches!(op, WrOpcode::Send | WrOpcode::SendWithImm);
                let imm = matches!(op, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
                req.payload_off = i * mtu;
                req.payload_len = (w.len - req.payload_off.min(w.len)).min(mtu);
                let first = i == 0;
                let last = i + 1 >= w.npkts;
                req.bth.opcode = data_opcode(is_send, first, last, imm);
                if !is_send && first {
                    req.reth = Some(RethRepr {
                        va: wr.remote_addr,
                        rkey: wr.rkey,
                        dma_len: w.len,
                    });
                }
                if imm && last {
                    req.immdt = Some(imm_to_wire(wr.imm_data));
                }
                //= docs/softroce-internals.md#packetisation-psn-and-acknowledgements
                //# Solicited Event set only on the last packet of a SEND or WRITE-with-imm
                //# when the WR had IBV_SEND_SOLICITED.
                req.bth.solicited = last && wr.solicited && (is_send || imm);
                req.advance_whole = last;
                req.last = last;
            }
        }
        req
    }

    /// Bookkeeping after a request packet ending at PSN `end` (exclusive) left:
    /// the transmit cursor, `snd_max`, the RTT sample and the retransmit timer.
    fn request_sent(&mut self, now: Instant, req: &RequestPacket, end: Psn) {
        if req.advance_whole {
            self.tx_idx += 1;
            self.tx_pkt = 0;
        } else {
            self.tx_pkt += 1;
        }
        if end - self.snd_max > 0 {
            self.snd_max = end;
            if req.bth.ack_req && self.rtt_sample.is_none() && self.probe_floor.is_some() {
                self.rtt_sample = Some((end - 1, now));
            }
        } else {
            self.stats.retransmits += 1;
        }
        if self.timers.get(Timer::Retransmit).is_none() {
            self.arm_retransmit(now);
        }
    }

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
    fn complete_head_error(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_scatter_across_sges() {
        let mut mem = InMemory::new();
        let (lk, _) = mem.register(0x1000, 16, mem::access::LOCAL_WRITE);
        mem.poke(0x1000, &(0u8..16).collect::<Vec<_>>());
        let mut wr = SendWr::new(1, WrOpcode::Send);
        wr.sges = vec![
            Sge {
                addr: 0x1000,
                length: 3,
                lkey: lk,
            },
            Sge {
                addr: 0x1008,
                length: 8,
                lkey: lk,
            },
        ];
        let mut out = [0u8; 6];
        gather(&mem, &wr, 1, &mut out).unwrap();
        assert_eq!(out, [1, 2, 8, 9, 10, 11]);
        assert!(gather(&mem, &wr, 8, &mut out).is_err());
        assert_eq!(scatter(&mut mem, &wr.sges, 2, &[0xAA, 0xBB]), Ok(()));
        assert_eq!(mem.peek(0x1000, 3).unwrap(), &[0, 1, 0xAA]);
        assert_eq!(mem.peek(0x1008, 1).unwrap(), &[0xBB]);
        assert_eq!(
            scatter(&mut mem, &wr.sges, 10, &[0; 2]),
            Err(wc_status::IBV_WC_LOC_LEN_ERR)
        );
        let bad = [Sge {
            addr: 0x1000,
            length: 4,
            lkey: 999,
        }];
        assert_eq!(scatter(&mut mem, &bad, 0, &[0; 2]), Err(wc_status::IBV_WC_LOC_PROT_ERR));
    }
}

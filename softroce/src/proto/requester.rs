//! Requester and completer: segmentation of send WRs into packets, PSN
//! assignment, AckReq, go-back-N retransmission, NAK/RNR handling and send
//! completions.

use super::qp::{QpCore, SendWqe};
use super::state::QpState;
use super::timer::Timer;
use super::*;
use crate::wire::{self, AtomicEthRepr, BthRepr, OpCode, Psn, RethRepr, RocePacketRepr};

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
    pub(super) fn rewind(&mut self) {
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
        } else if req.bth.ack_req {
            // The probe says an answer is overdue, and no answer to this packet can come before
            // it left: count from here, not from the first packet of the burst. A driver that
            // takes long to send a burst (a 256 KiB WRITE is 64 packets copied and sent in
            // software, or its thread is descheduled halfway) would otherwise see the probe
            // expire before the last packet is out and resend the whole message. The local ACK
            // timeout (IBA) still runs from the first packet, so a silent peer ends as before.
            self.arm_probe(now);
        }
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

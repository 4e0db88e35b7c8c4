//! Responder: PSN checking, duplicate handling, execution of SEND / WRITE /
//! READ / atomics, ACK coalescing, NAKs and receive completions.

use super::qp::{InMsg, QpCore, RdAtomicRes, RespOut};
use super::requester::{scatter, set_len};
use super::state::QpState;
use super::*;
use crate::wire::opcode::{MsgKind, Position};
use crate::wire::{self, AethRepr, AtomicAckEthRepr, BthRepr, NakCode, OpCode, Psn, RocePacketRepr, Syndrome};

const ACK: u8 = 0x1F; // ACK, no credit information (rxe)

/// How a request failed validation.
enum Fatal {
    InvalidRequest,
    RemoteAccess,
    RemoteOperational,
}

impl Fatal {
    fn nak(&self) -> NakCode {
        match self {
            Fatal::InvalidRequest => NakCode::InvalidRequest,
            Fatal::RemoteAccess => NakCode::RemoteAccessError,
            Fatal::RemoteOperational => NakCode::RemoteOperationalError,
        }
    }
}

fn imm_from_wire(v: u32) -> u32 {
    u32::from_ne_bytes(v.to_be_bytes())
}

impl QpCore {
    fn queue_ack(&mut self, psn: Psn) {
        // Coalesce with a queued plain ACK: ACKs are cumulative.
        if let Some(RespOut::Ack {
            psn: p,
            syndrome: ACK,
            msn,
        }) = self.out.back_mut()
        {
            *p = psn;
            *msn = self.msn;
            return;
        }
        self.out.push_back(RespOut::Ack {
            psn,
            syndrome: ACK,
            msn: self.msn,
        });
    }

    fn queue_nak(&mut self, psn: Psn, code: NakCode) {
        self.out.push_back(RespOut::Ack {
            psn,
            syndrome: Syndrome::Nak(code).to_byte(),
            msn: self.msn,
        });
    }

    fn fatal(&mut self, psn: Psn, f: Fatal) {
        //= docs/softroce-internals.md#rc-reliability
        //# Fatal errors (remote access, invalid request, operational) → NAK, error
        //# completion if a receive WQE was consumed, QP to ERR.
        if self.attrs.qp_state == QpState::Err {
            return; // already failed: one NAK is enough
        }
        self.queue_nak(psn, f.nak());
        if let Some(InMsg::Send { wqe, .. }) = self.cur.take() {
            let status = match f {
                Fatal::InvalidRequest => wc_status::IBV_WC_REM_INV_REQ_ERR,
                Fatal::RemoteAccess => wc_status::IBV_WC_REM_ACCESS_ERR,
                Fatal::RemoteOperational => wc_status::IBV_WC_REM_OP_ERR,
            };
            self.recv_completion(wqe.wr_id, status, wc_opcode::RECV, 0, None);
        }
        let ev = match f {
            Fatal::RemoteAccess => AsyncEvent::QpAccessError,
            _ => AsyncEvent::QpRequestError,
        };
        self.enter_error(Some(ev));
    }

    fn mark_solicited(&mut self, se: bool) {
        if let Some(c) = self.completions.back_mut() {
            c.solicited = se;
        }
    }

    fn recv_completion(&mut self, wr_id: u64, status: u32, opcode: u32, byte_len: u32, imm: Option<u32>) {
        let mut flags = wc_flags::GRH;
        if imm.is_some() {
            flags |= wc_flags::WITH_IMM;
        }
        self.completions.push_back(Completion {
            queue: WcQueue::Recv,
            wr_id,
            status,
            opcode,
            byte_len,
            imm_data: imm,
            qp_num: self.qpn,
            src_qp: self.attrs.dest_qp_num,
            wc_flags: flags,
            solicited: false,
        });
    }

    pub(crate) fn handle_request(&mut self, _now: Instant, p: &RocePacketRepr, mem: &mut dyn MemoryAccess) {
        let psn = p.bth.psn;
        let d = psn - self.epsn;
        if d > 0 {
            //= docs/softroce-internals.md#rc-reliability
            //# PSN ahead of expected → NAK PSN sequence error carrying the expected
            //# PSN, sent once until the gap closes; drop the packet.
            if !self.nak_sent {
                self.nak_sent = true;
                self.stats.seq_naks_sent += 1;
                let e = self.epsn;
                self.queue_nak(e, NakCode::PsnSequenceError);
            }
            self.stats.rx_dropped += 1;
            return;
        }
        if d < 0 {
            self.stats.rx_duplicates += 1;
            self.handle_duplicate(p);
            return;
        }
        if let Err(f) = self.execute(p, mem) {
            self.fatal(psn, f);
        }
    }

    //= docs/softroce-internals.md#rc-reliability
    //# PSN behind (duplicate) → SEND/WRITE: re-send an ACK for the last completed PSN,
    //# do not re-execute. READ: find the saved read resource whose PSN range covers it
    //# and regenerate responses starting at that PSN. Atomic: resend the stored
    //# original value without re-executing. Not found → drop.
    fn handle_duplicate(&mut self, p: &RocePacketRepr) {
        let psn = p.bth.psn;
        let Some((kind, _)) = p.bth.opcode.kind() else { return };
        match kind {
            MsgKind::Send | MsgKind::Write if p.bth.ack_req => {
                let last = self.epsn - 1;
                self.queue_ack(last);
            }
            MsgKind::Read => {
                let mtu = self.mtu;
                let found = self.res.iter().find_map(|r| match *r {
                    RdAtomicRes::Read {
                        first_psn,
                        npkts,
                        va,
                        rkey,
                        len,
                    } if psn - first_psn >= 0 && (psn - first_psn) < npkts as i32 => {
                        let off = (psn - first_psn) as u32 * mtu;
                        Some((
                            first_psn,
                            npkts,
                            va.wrapping_add(u64::from(off)),
                            rkey,
                            len.saturating_sub(off),
                        ))
                    }
                    _ => None,
                });
                let Some((first_psn, npkts, va, rkey, remaining)) = found else {
                    return;
                };
                // Responses of this resource already queued from this PSN or
                // earlier? Then they will cover it.
                let queued = self.out.iter().any(|o| {
                    matches!(o, RespOut::Read { psn: q, .. }
                        if *q - first_psn >= 0 && *q - first_psn < npkts as i32 && *q - psn <= 0)
                });
                if queued {
                    return;
                }
                let msn = self.msn;
                self.out.push_back(RespOut::Read {
                    psn,
                    va,
                    rkey,
                    remaining,
                    first: true,
                    msn,
                    dup: true,
                });
            }
            MsgKind::Atomic => {
                let found = self.res.iter().find_map(|r| match *r {
                    RdAtomicRes::Atomic { psn: q, orig } if q == psn => Some(orig),
                    _ => None,
                });
                if let Some(orig) = found {
                    let msn = self.msn;
                    self.out.push_back(RespOut::AtomicAck { psn, orig, msn });
                }
            }
            _ => {}
        }
    }

    fn push_res(&mut self, r: RdAtomicRes) {
        //= docs/softroce-internals.md#rc-reliability
        //# Keep max_dest_rd_atomic read/atomic resources (ring) for step 3.
        let cap = usize::from(self.attrs.max_dest_rd_atomic).max(1);
        while self.res.len() >= cap {
            self.res.pop_front();
        }
        self.res.push_back(r);
    }

    /// Validate and execute an in-order request (rxe's order).
    fn execute(&mut self, p: &RocePacketRepr, mem: &mut dyn MemoryAccess) -> Result<(), Fatal> {
        let op = p.bth.opcode;
        let psn = p.bth.psn;
        let Some((kind, pos)) = op.kind() else {
            return Err(Fatal::InvalidRequest);
        };
        if !self.check_request(p, kind, pos, mem)? {
            return Ok(()); // RNR NAK queued
        }
        match kind {
            MsgKind::Send => self.exec_send(p, pos, mem)?,
            MsgKind::Write => self.exec_write(p, pos, mem)?,
            MsgKind::Read => return self.exec_read(p, mem),
            MsgKind::Atomic => return self.exec_atomic(p, mem),
            _ => return Err(Fatal::InvalidRequest),
        }
        self.advance(1);
        if p.bth.ack_req {
            self.queue_ack(psn);
        }
        Ok(())
    }

    /// Steps 1-4 of the responder's checks: opcode sequence, QP access
    /// flags, resources, length. `Ok(false)`: no receive WQE, an RNR NAK is
    /// queued and the request is not executed.
    fn check_request(
        &mut self,
        p: &RocePacketRepr,
        kind: MsgKind,
        pos: Position,
        mem: &mut dyn MemoryAccess,
    ) -> Result<bool, Fatal> {
        let op = p.bth.opcode;
        let psn = p.bth.psn;
        let mtu = self.mtu;
        let plen = p.payload.len() as u32;

        // 1. Opcode sequence.
        //# a Middle/Last without a First, or a new First while a message is open → NAK invalid request
        let in_send = matches!(self.cur, Some(InMsg::Send { .. }));
        let in_write = matches!(self.cur, Some(InMsg::Write { .. }));
        let continuing = matches!(pos, Position::Middle | Position::Last);
        match kind {
            MsgKind::Send if continuing != in_send || in_write => return Err(Fatal::InvalidRequest),
            MsgKind::Write if continuing != in_write || in_send => return Err(Fatal::InvalidRequest),
            MsgKind::Read | MsgKind::Atomic if self.cur.is_some() => return Err(Fatal::InvalidRequest),
            _ => {}
        }
        // 2. QP access flags.
        //# QP access flags (qp_access_flags lacks REMOTE_WRITE/READ/ATOMIC for the op → NAK invalid request)
        let acc = self.attrs.qp_access_flags;
        let need = match kind {
            MsgKind::Write => mem::access::REMOTE_WRITE,
            MsgKind::Read => mem::access::REMOTE_READ,
            MsgKind::Atomic => mem::access::REMOTE_ATOMIC,
            _ => 0,
        };
        if acc & need != need {
            return Err(Fatal::InvalidRequest);
        }
        // 3. Resources.
        //# SEND/WRITE-imm First/Only need a receive WQE, else RNR NAK carrying this PSN
        //# and the QP's min_rnr_timer; READ/atomic need max_dest_rd_atomic > 0
        let needs_wqe = (kind == MsgKind::Send && matches!(pos, Position::First | Position::Only))
            || matches!(op, OpCode::WriteLastWithImm | OpCode::WriteOnlyWithImm);
        if needs_wqe && self.rq.is_empty() && self.srq {
            if let Some(w) = mem.take_srq_recv() {
                self.rq.push_back(w);
            }
        }
        if needs_wqe && self.rq.is_empty() {
            self.stats.rnr_naks_sent += 1;
            self.nak_sent = true;
            let code = Syndrome::RnrNak {
                timer: self.attrs.min_rnr_timer,
            }
            .to_byte();
            self.out.push_back(RespOut::Ack {
                psn,
                syndrome: code,
                msn: self.msn,
            });
            return Ok(false);
        }
        if matches!(kind, MsgKind::Read | MsgKind::Atomic) && self.attrs.max_dest_rd_atomic == 0 {
            return Err(Fatal::InvalidRequest);
        }
        // 4. Length.
        //# First/Middle payload == MTU, Last 1..MTU, Only ≤ MTU
        let len_ok = match pos {
            Position::First | Position::Middle => plen == mtu,
            Position::Last => (1..=mtu).contains(&plen),
            Position::Only => plen <= mtu,
        };
        if matches!(kind, MsgKind::Send | MsgKind::Write) && !len_ok {
            return Err(Fatal::InvalidRequest);
        }
        Ok(true)
    }

    /// Accepts a READ request: saves it as a resource (for duplicates) and
    /// queues its response packets.
    fn exec_read(&mut self, p: &RocePacketRepr, mem: &mut dyn MemoryAccess) -> Result<(), Fatal> {
        let psn = p.bth.psn;
        let reth = p.reth.ok_or(Fatal::InvalidRequest)?;
        if reth.dma_len > MAX_MSG_SZ {
            return Err(Fatal::InvalidRequest);
        }
        //# R_Key → MR of the same PD with the right access and [VA, VA+len) inside it
        //# → else NAK remote access error
        if reth.dma_len > 0 {
            mem.remote_check(reth.rkey, reth.va, u64::from(reth.dma_len), RemoteAccess::Read)
                .map_err(|_| Fatal::RemoteAccess)?;
        }
        let npkts = reth.dma_len.div_ceil(self.mtu).max(1);
        self.push_res(RdAtomicRes::Read {
            first_psn: psn,
            npkts,
            va: reth.va,
            rkey: reth.rkey,
            len: reth.dma_len,
        });
        //# MSN: ... READ when the request is accepted
        self.msn = (self.msn + 1) & Psn::MASK;
        let msn = self.msn;
        self.out.push_back(RespOut::Read {
            psn,
            va: reth.va,
            rkey: reth.rkey,
            remaining: reth.dma_len,
            first: true,
            msn,
            dup: false,
        });
        self.advance(npkts);
        Ok(())
    }

    /// Executes an atomic request and queues its acknowledge.
    fn exec_atomic(&mut self, p: &RocePacketRepr, mem: &mut dyn MemoryAccess) -> Result<(), Fatal> {
        let psn = p.bth.psn;
        let a = p.atomic_eth.ok_or(Fatal::InvalidRequest)?;
        //# the target memory word is a host-order 64-bit integer that must be
        //# 8-byte aligned (else NAK Invalid Request)
        if !a.va.is_multiple_of(8) {
            return Err(Fatal::InvalidRequest);
        }
        let aop = if p.bth.opcode == OpCode::CompareSwap {
            AtomicOp::CompareSwap {
                compare: a.compare,
                swap: a.swap_add,
            }
        } else {
            AtomicOp::FetchAdd { add: a.swap_add }
        };
        let orig = mem.remote_atomic(a.rkey, a.va, aop).map_err(|e| match e {
            RemoteAccessError::Misaligned => Fatal::InvalidRequest,
            _ => Fatal::RemoteAccess,
        })?;
        self.push_res(RdAtomicRes::Atomic { psn, orig });
        self.msn = (self.msn + 1) & Psn::MASK;
        let msn = self.msn;
        self.out.push_back(RespOut::AtomicAck { psn, orig, msn });
        self.advance(1);
        Ok(())
    }

    fn advance(&mut self, n: u32) {
        self.epsn += n;
        self.nak_sent = false;
    }

    fn exec_send(&mut self, p: &RocePacketRepr, pos: Position, mem: &mut dyn MemoryAccess) -> Result<(), Fatal> {
        let (wqe, offset) = match self.cur.take() {
            Some(InMsg::Send { wqe, offset }) => (wqe, offset),
            _ => match self.rq.pop_front() {
                Some(w) => (w, 0),
                None => return Err(Fatal::RemoteOperational),
            },
        };
        match scatter(mem, &wqe.sges, offset, p.payload) {
            Ok(()) => {}
            Err(status) => {
                //# SEND data larger than the receive WQE's buffers → NAK invalid request, and
                //# the receive WQE completes in error (IBA: local length error)
                let f = if status == wc_status::IBV_WC_LOC_LEN_ERR {
                    Fatal::InvalidRequest
                } else {
                    Fatal::RemoteOperational
                };
                self.recv_completion(wqe.wr_id, status, wc_opcode::RECV, 0, None);
                return Err(f);
            }
        }
        let offset = offset.saturating_add(p.payload.len() as u32);
        if matches!(pos, Position::Last | Position::Only) {
            self.msn = (self.msn + 1) & Psn::MASK;
            let imm = p.immdt.map(imm_from_wire);
            self.recv_completion(wqe.wr_id, wc_status::IBV_WC_SUCCESS, wc_opcode::RECV, offset, imm);
            self.mark_solicited(p.bth.solicited);
        } else {
            self.cur = Some(InMsg::Send { wqe, offset });
        }
        Ok(())
    }

    fn exec_write(&mut self, p: &RocePacketRepr, pos: Position, mem: &mut dyn MemoryAccess) -> Result<(), Fatal> {
        let (va, rkey, offset, total) = match self.cur.take() {
            Some(InMsg::Write {
                va,
                rkey,
                offset,
                total,
            }) => (va, rkey, offset, total),
            _ => {
                let reth = p.reth.ok_or(Fatal::InvalidRequest)?;
                if reth.dma_len > MAX_MSG_SZ {
                    return Err(Fatal::InvalidRequest);
                }
                if reth.dma_len > 0 {
                    mem.remote_check(reth.rkey, reth.va, u64::from(reth.dma_len), RemoteAccess::Write)
                        .map_err(|_| Fatal::RemoteAccess)?;
                }
                (reth.va, reth.rkey, 0, reth.dma_len)
            }
        };
        let plen = p.payload.len() as u32;
        let end = offset.checked_add(plen).ok_or(Fatal::InvalidRequest)?;
        //# the last WRITE packet must end exactly at the RETH length → else NAK invalid request
        let last = matches!(pos, Position::Last | Position::Only);
        if end > total || (last && end != total) {
            return Err(Fatal::InvalidRequest);
        }
        mem.remote_write(rkey, va.wrapping_add(u64::from(offset)), p.payload)
            .map_err(|_| Fatal::RemoteAccess)?;
        if last {
            self.msn = (self.msn + 1) & Psn::MASK;
            if let Some(imm) = p.immdt {
                if let Some(wqe) = self.rq.pop_front() {
                    self.recv_completion(
                        wqe.wr_id,
                        wc_status::IBV_WC_SUCCESS,
                        wc_opcode::RECV_RDMA_WITH_IMM,
                        total,
                        Some(imm_from_wire(imm)),
                    );
                    self.mark_solicited(p.bth.solicited);
                }
            }
        } else {
            self.cur = Some(InMsg::Write {
                va,
                rkey,
                offset: end,
                total,
            });
        }
        Ok(())
    }

    /// Build the next queued responder packet.
    pub(crate) fn poll_response(&mut self, mem: &mut dyn MemoryAccess, buf: &mut Vec<u8>) -> Option<usize> {
        let bth = BthRepr {
            opcode: OpCode::Acknowledge,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: wire::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: self.attrs.dest_qp_num,
            ack_req: false,
            psn: Psn::new(0),
        };
        // A loop, never recursion: an entry that cannot be served is popped
        // and the next one is tried (regression: unbounded recursion when a
        // replayed READ hit a deregistered MR).
        loop {
            match *self.out.front()? {
                RespOut::Ack { psn, syndrome, msn } => {
                    self.out.pop_front();
                    if syndrome == ACK {
                        self.stats.acks_sent += 1;
                    }
                    let aeth = AethRepr {
                        syndrome: Syndrome::from_byte(syndrome),
                        msn,
                    };
                    return Some(emit_ack(buf, BthRepr { psn, ..bth }, aeth, None));
                }
                RespOut::AtomicAck { psn, orig, msn } => {
                    self.out.pop_front();
                    let bth = BthRepr {
                        opcode: OpCode::AtomicAcknowledge,
                        psn,
                        ..bth
                    };
                    let aeth = AethRepr {
                        syndrome: Syndrome::ACK_NO_CREDITS,
                        msn,
                    };
                    return Some(emit_ack(buf, bth, aeth, Some(AtomicAckEthRepr { orig })));
                }
                RespOut::Read {
                    psn,
                    va,
                    rkey,
                    remaining,
                    first,
                    msn,
                    dup,
                } => {
                    let chunk = ReadChunk {
                        psn,
                        va,
                        rkey,
                        remaining,
                        first,
                        msn,
                        dup,
                    };
                    if let Some(len) = self.read_response(mem, buf, bth, chunk) {
                        return Some(len);
                    }
                }
            }
        }
    }

    /// The memory a READ response reads went away after the request was accepted: the entry is
    /// dropped; a replayed READ is NAKed (the requester most likely completed it already and
    /// then deregistered the buffer; a requester past that PSN ignores the NAK) and the QP stays
    /// usable, a first READ fails the QP with a remote access error.
    fn read_memory_gone(&mut self, psn: Psn, dup: bool) {
        self.out.pop_front();
        self.stats.read_resp_failed += 1;
        if dup {
            let nak = Syndrome::Nak(NakCode::RemoteAccessError).to_byte();
            let msn = self.msn;
            self.out.push_front(RespOut::Ack {
                psn,
                syndrome: nak,
                msn,
            });
        } else {
            self.fatal(psn, Fatal::RemoteAccess);
        }
    }

    /// Builds the next packet of the READ response at the front of `out`
    /// (`chunk`), or pops it when its memory is gone (`None`: serve the next
    /// entry).
    fn read_response(
        &mut self,
        mem: &mut dyn MemoryAccess,
        buf: &mut Vec<u8>,
        mut bth: BthRepr,
        chunk: ReadChunk,
    ) -> Option<usize> {
        let mtu = self.mtu;
        let ReadChunk {
            psn,
            va,
            rkey,
            remaining,
            first,
            msn,
            dup,
        } = chunk;
        let len = remaining.min(mtu);
        let last = remaining <= mtu;
        bth.opcode = match (first, last) {
            (true, true) => OpCode::ReadResponseOnly,
            (true, false) => OpCode::ReadResponseFirst,
            (false, true) => OpCode::ReadResponseLast,
            (false, false) => OpCode::ReadResponseMiddle,
        };
        bth.psn = psn;
        let repr = RocePacketRepr {
            bth,
            reth: None,
            atomic_eth: None,
            aeth: (first || last).then_some(AethRepr {
                syndrome: Syndrome::ACK_NO_CREDITS,
                msn,
            }),
            atomic_ack_eth: None,
            immdt: None,
            ieth: None,
            payload: &[],
        };
        let hdr = repr.header_len();
        let plen = len as usize;
        set_len(buf, hdr + plen + wire::pad_len(plen));
        buf[hdr + plen..].fill(0); // pad
        repr.emit_headers(&mut buf[..hdr], plen);
        if mem.remote_read(rkey, va, &mut buf[hdr..hdr + plen]).is_err() {
            buf.clear();
            self.read_memory_gone(psn, dup);
            return None;
        }
        if last {
            self.out.pop_front();
        } else if let Some(RespOut::Read {
            psn: p,
            va: v,
            remaining: r,
            first: f,
            ..
        }) = self.out.front_mut()
        {
            *p = psn + 1;
            *v = va.wrapping_add(u64::from(len));
            *r = remaining - len;
            *f = false;
        }
        Some(buf.len())
    }
}

/// The READ response packet at the front of the responder's queue (the
/// fields of [`RespOut::Read`]).
#[derive(Clone, Copy)]
struct ReadChunk {
    psn: Psn,
    va: u64,
    rkey: u32,
    remaining: u32,
    first: bool,
    msn: u32,
    dup: bool,
}

/// Writes an ACK / NAK (or, with `atomic_ack_eth`, an atomic acknowledge)
/// into `buf`; returns its length.
fn emit_ack(buf: &mut Vec<u8>, bth: BthRepr, aeth: AethRepr, atomic_ack_eth: Option<AtomicAckEthRepr>) -> usize {
    let repr = RocePacketRepr {
        bth,
        reth: None,
        atomic_eth: None,
        aeth: Some(aeth),
        atomic_ack_eth,
        immdt: None,
        ieth: None,
        payload: &[],
    };
    buf.clear();
    buf.resize(repr.buffer_len(), 0);
    repr.emit(buf);
    buf.len()
}

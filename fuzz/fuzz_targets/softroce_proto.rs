//! softroce's sans-IO protocol core (`softroce::proto::QpCore`) fed arbitrary event sequences:
//! two connected RC QPs (endpoints and connection from softroce/tests/sim_common; a lighter
//! network than its `Pair`, which fills 2 MiB per input; virtual clock) with
//! work requests of every kind posted, the network lossy, duplicating and reordering at times,
//! links going down and up, and forged packets (random opcodes, PSNs near the expected ones or
//! anywhere, lengths, keys, addresses, AETH syndromes, MSNs) and raw bytes delivered to either
//! side, the requester and the responder.
//!
//! Invariants, beyond "no panic":
//! * every packet a QP transmits parses, is addressed to the peer QP and its GID;
//! * every completion names a work request that was posted on that queue, at most once;
//! * a successful receive completion reports no more bytes than its buffers hold;
//! * once the faults stop and the network runs to idle, every posted send work request has
//!   completed (successfully or not): a forged packet can fail a QP, never hang its requests;
//!   and no timer is left armed.
#![no_main]

#[path = "../../softroce/tests/sim_common/mod.rs"]
mod sim_common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use sim_common::*;
use softroce::proto::*;
use softroce::wire::{AethRepr, AtomicEthRepr, BthRepr, OpCode, Psn, RethRepr, RocePacketRepr, Syndrome};
use std::collections::{HashMap, HashSet};

/// First PSNs of endpoint 0 and 1 (sim_common::Pair::new).
const FIRST_PSN: [u32; 2] = [0xFF_FFF0, 0x12_3456];
const QPN: [u32; 2] = [0x11, 0x22];

/// Two endpoints joined by an in-memory network with seeded faults, on a virtual clock.
struct Net {
    ep: [Endpoint; 2],
    now: Instant,
    faults: Faults,
    link_up: [bool; 2],
    rng: Rng,
    /// (delivery time, sequence, destination, transport bytes).
    wire: Vec<(Instant, u64, usize, Vec<u8>)>,
    seq: u64,
    buf: Vec<u8>,
}

impl Net {
    fn new(s: &Setup) -> Net {
        let mut a = Endpoint::new(QPN[0], [127, 0, 0, 1], s.caps);
        let mut b = Endpoint::new(QPN[1], [127, 0, 0, 2], s.caps);
        connect_qp(&mut a.qp, s, QPN[1], gid(b.ip), FIRST_PSN[0], FIRST_PSN[1]);
        connect_qp(&mut b.qp, s, QPN[0], gid(a.ip), FIRST_PSN[1], FIRST_PSN[0]);
        Net {
            ep: [a, b],
            now: Instant::from_micros(1),
            faults: Faults::default(),
            link_up: [true, true],
            rng: Rng(1),
            wire: vec![],
            seq: 0,
            buf: Vec::with_capacity(8192),
        }
    }

    fn collect(&mut self) {
        for ep in self.ep.iter_mut() {
            while let Some(c) = ep.qp.poll_completion() {
                match c.queue {
                    WcQueue::Send => ep.send_cq.push(c),
                    WcQueue::Recv => ep.recv_cq.push(c),
                }
            }
            while ep.qp.poll_event().is_some() {}
        }
    }

    fn transmit(&mut self) {
        for i in 0..2 {
            loop {
                let ep = &mut self.ep[i];
                let Some(meta) = ep.qp.poll_transmit(self.now, &mut ep.mem, &mut self.buf) else {
                    break;
                };
                assert_eq!(meta.len, self.buf.len());
                assert_eq!(
                    meta.dgid,
                    gid(self.ep[1 - i].ip),
                    "endpoint {i} sends to its peer's GID"
                );
                let p = RocePacketRepr::parse(&self.buf).expect("a transmitted packet parses");
                assert_eq!(p.bth.dest_qp, QPN[1 - i], "endpoint {i} sends to its peer QP");
                if !self.link_up[i] || self.rng.chance(self.faults.loss) {
                    continue;
                }
                let copies = if self.rng.chance(self.faults.dup) { 2 } else { 1 };
                for _ in 0..copies {
                    let mut at = self.now + Duration::from_micros(5);
                    if self.rng.chance(self.faults.reorder) {
                        at += Duration::from_micros(1 + self.rng.below(30));
                    }
                    self.seq += 1;
                    self.wire.push((at, self.seq, 1 - i, self.buf.clone()));
                }
            }
        }
        self.collect();
    }

    /// Run for `limit` of virtual time, or until nothing is in flight and no timer is armed.
    fn run_for(&mut self, limit: Duration) {
        let end = self.now + limit;
        for _ in 0..1_000_000 {
            self.transmit();
            self.wire.sort_by_key(|p| (p.0, p.1));
            while self.wire.first().is_some_and(|p| p.0 <= self.now) {
                let (_, _, to, bytes) = self.wire.remove(0);
                let now = self.now;
                let ep = &mut self.ep[to];
                ep.qp.handle_packet(now, &bytes, &mut ep.mem);
                self.transmit();
            }
            let next_pkt = self.wire.first().map(|p| p.0);
            let next_timer = self.ep.iter().filter_map(|e| e.qp.poll_timeout()).min();
            let Some(next) = next_pkt.into_iter().chain(next_timer).min() else {
                return;
            };
            if next > end {
                return;
            }
            self.now = self.now.max(next);
            for i in 0..2 {
                if self.ep[i].qp.poll_timeout().is_some_and(|t| t <= self.now) {
                    self.ep[i].qp.handle_timeout(self.now);
                }
            }
        }
        panic!("the network does not come to rest");
    }
}

struct Run {
    p: Net,
    next_wr: u64,
    /// Posted, per endpoint: send wr_ids, and recv wr_id -> capacity.
    sends: [HashSet<u64>; 2],
    recvs: [HashMap<u64, u32>; 2],
}

impl Run {
    fn post_send(&mut self, u: &mut Unstructured) -> Result<()> {
        let i = usize::from(u.arbitrary::<bool>()?);
        let op = match u.int_in_range(0..=6u8)? {
            0 => WrOpcode::RdmaWrite,
            1 => WrOpcode::RdmaWriteWithImm,
            2 => WrOpcode::Send,
            3 => WrOpcode::SendWithImm,
            4 => WrOpcode::RdmaRead,
            5 => WrOpcode::AtomicCmpSwp,
            _ => WrOpcode::AtomicFetchAdd,
        };
        let len = u.int_in_range(0..=20_000u32)?;
        let off = u64::from(u.int_in_range(0..=1000u32)?) * 8;
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let now = self.p.now;
        let ep = &mut self.p.ep[i];
        let peer_rkey_ok = u.ratio(7, 8)?;
        let mut wr = SendWr::new(wr_id, op);
        if op.is_atomic() {
            wr.sges = sge(SRC + off, 8, ep.src_lkey);
            wr.remote_addr = ATOM + (off % 4000) / 8 * 8;
            wr.compare_add = u.arbitrary()?;
            wr.swap = u.arbitrary()?;
        } else if op == WrOpcode::RdmaRead {
            wr.sges = sge(SRC + off, len, ep.src_lkey);
            wr.remote_addr = DST + off;
        } else {
            wr.sges = sge(SRC + off, len, ep.src_lkey);
            wr.remote_addr = DST + off;
            wr.imm_data = u.arbitrary()?;
        }
        // The peer's keys equal ours here (both endpoints register the same regions in the
        // same order); a wrong one now and then.
        wr.rkey = match (op.is_atomic(), peer_rkey_ok) {
            (_, false) => u.arbitrary()?,
            (true, true) => ep.atom_rkey,
            (false, true) => ep.dst_rkey,
        };
        if ep.qp.post_send(now, wr).is_ok() {
            self.sends[i].insert(wr_id);
        }
        Ok(())
    }

    fn post_recv(&mut self, u: &mut Unstructured) -> Result<()> {
        let i = usize::from(u.arbitrary::<bool>()?);
        let len = u.int_in_range(0..=20_000u32)?;
        let off = u64::from(u.int_in_range(0..=1000u32)?) * 8;
        let wr_id = self.next_wr;
        self.next_wr += 1;
        let ep = &mut self.p.ep[i];
        let wr = RecvWr {
            wr_id,
            sges: sge(DST + off, len, ep.dst_lkey),
        };
        if ep.qp.post_recv(wr).is_ok() {
            self.recvs[i].insert(wr_id, len);
        }
        Ok(())
    }

    /// A well-formed packet with input-chosen fields, delivered to endpoint `to`.
    fn forge(&mut self, u: &mut Unstructured) -> Result<()> {
        let to = usize::from(u.arbitrary::<bool>()?);
        let opcode = OpCode::from(u.int_in_range(0..=0x17u8)?);
        // PSNs near either side's first PSN (where the QPs are), or anywhere.
        let psn = if u.ratio(3, 4)? {
            let base = FIRST_PSN[usize::from(u.arbitrary::<bool>()?)];
            base.wrapping_add(i32::from(u.arbitrary::<i8>()?) as u32)
        } else {
            u.arbitrary::<u32>()?
        };
        let rkey = match u.int_in_range(0..=3u8)? {
            0 => self.p.ep[to].dst_rkey,
            1 => self.p.ep[to].src_rkey,
            2 => self.p.ep[to].atom_rkey,
            _ => u.arbitrary()?,
        };
        let va = match u.int_in_range(0..=3u8)? {
            0 => DST + u64::from(u.arbitrary::<u16>()?),
            1 => SRC + REGION as u64 - u64::from(u.arbitrary::<u16>()?),
            2 => ATOM + u64::from(u.arbitrary::<u8>()?) * 8,
            _ => u.arbitrary()?,
        };
        let payload_len = u.int_in_range(0..=4200usize)?;
        let payload = vec![u.arbitrary::<u8>()?; payload_len];
        let r = RocePacketRepr {
            bth: BthRepr {
                opcode,
                solicited: u.arbitrary()?,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: if u.ratio(15, 16)? {
                    QPN[to]
                } else {
                    u.arbitrary::<u32>()? & 0xff_ffff
                },
                ack_req: u.arbitrary()?,
                psn: Psn::new(psn & Psn::MASK),
            },
            reth: Some(RethRepr {
                va,
                rkey,
                dma_len: if u.arbitrary()? {
                    payload_len as u32
                } else {
                    u.arbitrary()?
                },
            }),
            atomic_eth: Some(AtomicEthRepr {
                va,
                rkey,
                swap_add: u.arbitrary()?,
                compare: u.arbitrary()?,
            }),
            aeth: Some(AethRepr {
                syndrome: Syndrome::from_byte(u.arbitrary()?),
                msn: u.arbitrary::<u32>()? & 0xff_ffff,
            }),
            atomic_ack_eth: Some(softroce::wire::AtomicAckEthRepr { orig: u.arbitrary()? }),
            immdt: Some(u.arbitrary()?),
            ieth: Some(u.arbitrary()?),
            payload: if opcode.has_payload() { &payload } else { &[] },
        };
        let mut buf = vec![0u8; r.buffer_len()];
        r.emit(&mut buf);
        self.deliver(to, &buf);
        Ok(())
    }

    fn deliver(&mut self, to: usize, packet: &[u8]) {
        let now = self.p.now;
        let ep = &mut self.p.ep[to];
        ep.qp.handle_packet(now, packet, &mut ep.mem);
    }

    fn step(&mut self, u: &mut Unstructured) -> Result<()> {
        match u.int_in_range(0..=7u8)? {
            0 | 1 => self.post_send(u)?,
            2 => self.post_recv(u)?,
            3 | 4 => self.forge(u)?,
            5 => {
                let to = usize::from(u.arbitrary::<bool>()?);
                let n = u.int_in_range(0..=64usize)?;
                let raw = u.bytes(n.min(u.len()))?.to_vec();
                self.deliver(to, &raw);
            }
            6 => {
                let pct = |u: &mut Unstructured| -> Result<f64> { Ok(f64::from(u.int_in_range(0..=30u8)?) / 100.0) };
                // (No bit flips: the driver's ICRC check drops them, which loss already covers.)
                self.p.faults = Faults {
                    loss: pct(u)?,
                    dup: pct(u)?,
                    reorder: pct(u)?,
                    bitflip: 0.0,
                };
                let i = usize::from(u.arbitrary::<bool>()?);
                self.p.link_up[i] = u.ratio(3, 4)?;
            }
            _ => {
                let us = u.int_in_range(1..=20_000u64)?;
                self.p.run_for(Duration::from_micros(us));
            }
        }
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let setup = Setup {
        // Few retries, so that a QP whose peer stopped answering gives up in virtual
        // milliseconds (RNR retry 7 would mean forever).
        timeout: 8,
        retry_cnt: 2,
        rnr_retry: 2,
        caps: QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            ..QpCaps::default()
        },
        ..Setup::default()
    };
    let mut run = Run {
        p: Net::new(&setup),
        next_wr: 1,
        sends: Default::default(),
        recvs: Default::default(),
    };
    let mut u = Unstructured::new(data);
    for _ in 0..256 {
        if u.is_empty() || run.step(&mut u).is_err() {
            break;
        }
    }
    // Quiesce: no more faults, links up, run to idle (sim_common bounds it).
    run.p.faults = Faults::default();
    run.p.link_up = [true, true];
    run.p.run_for(Duration::from_millis(3_600_000));
    for i in 0..2 {
        let ep = &run.p.ep[i];
        let mut seen = HashSet::new();
        for c in &ep.send_cq {
            assert!(
                run.sends[i].contains(&c.wr_id),
                "endpoint {i}: send completion of unposted wr {}",
                c.wr_id
            );
            assert!(
                seen.insert(c.wr_id),
                "endpoint {i}: send wr {} completed twice",
                c.wr_id
            );
        }
        let missing: Vec<_> = run.sends[i].difference(&seen).collect();
        assert!(
            missing.is_empty(),
            "endpoint {i} (state {:?}): send wrs {missing:?} never completed",
            ep.qp.state()
        );
        let mut seen = HashSet::new();
        for c in &ep.recv_cq {
            let Some(&cap) = run.recvs[i].get(&c.wr_id) else {
                panic!("endpoint {i}: receive completion of unposted wr {}", c.wr_id);
            };
            assert!(
                seen.insert(c.wr_id),
                "endpoint {i}: receive wr {} completed twice",
                c.wr_id
            );
            if c.status == wc_status::IBV_WC_SUCCESS && c.opcode != wc_opcode::RECV_RDMA_WITH_IMM {
                assert!(
                    c.byte_len <= cap,
                    "endpoint {i}: receive of {} bytes into {cap}",
                    c.byte_len
                );
            }
        }
        assert_eq!(
            ep.qp.poll_timeout(),
            None,
            "endpoint {i}: a timer is armed after the run to idle"
        );
    }
});

//! Every opcode, several sizes, data checked byte for byte.
#![allow(clippy::needless_range_loop)]

mod sim_common;
use sim_common::*;
use softroce::proto::*;

const SIZES: [u32; 9] = [0, 1, 3, 1023, 1024, 1025, 4096, 3 * 1024 + 5, 65536];

#[test]
fn send_and_send_imm_all_sizes() {
    let mut p = Pair::new(&Setup::default(), 1);
    let mut off = 0u64;
    for (i, &len) in SIZES.iter().enumerate() {
        let imm = i % 2 == 1;
        let dl = p.b().dst_lkey;
        p.b()
            .qp
            .post_recv(RecvWr {
                wr_id: 100 + i as u64,
                sges: sge(DST + off, len + 7, dl),
            })
            .unwrap();
        let sl = p.a().src_lkey;
        let mut wr = SendWr::new(i as u64, if imm { WrOpcode::SendWithImm } else { WrOpcode::Send });
        wr.sges = sge(SRC + off, len, sl);
        wr.imm_data = 0xdead_0000 + i as u32;
        let now = p.now;
        p.a().qp.post_send(now, wr).unwrap();
        off += u64::from(len) + 64;
    }
    p.run();
    assert_eq!(p.ep[0].send_cq.len(), SIZES.len());
    assert_eq!(p.ep[1].recv_cq.len(), SIZES.len());
    let mut off = 0u64;
    for (i, &len) in SIZES.iter().enumerate() {
        let s = p.ep[0].send_cq[i];
        assert_eq!(
            (s.wr_id, s.status, s.opcode, s.byte_len),
            (i as u64, wc_status::IBV_WC_SUCCESS, wc_opcode::SEND, len)
        );
        let r = p.ep[1].recv_cq[i];
        assert_eq!(
            (r.wr_id, r.status, r.opcode, r.byte_len),
            (100 + i as u64, wc_status::IBV_WC_SUCCESS, wc_opcode::RECV, len)
        );
        if i % 2 == 1 {
            assert_eq!(r.imm_data, Some(0xdead_0000 + i as u32));
            assert_ne!(r.wc_flags & wc_flags::WITH_IMM, 0);
        } else {
            assert_eq!(r.imm_data, None);
        }
        assert_eq!(r.src_qp, 0x11);
        assert_eq!(
            p.ep[1].peek(DST + off, len as usize),
            p.ep[0].peek(SRC + off, len as usize),
            "size {len}"
        );
        off += u64::from(len) + 64;
    }
    assert_eq!(p.ep[1].events, vec![]); // both in RTS: no COMM_EST
}

#[test]
fn write_and_write_imm_all_sizes() {
    let mut p = Pair::new(
        &Setup {
            mtu: MTU_4096,
            ..Setup::default()
        },
        2,
    );
    let mut off = 0u64;
    for (i, &len) in SIZES.iter().enumerate() {
        let imm = i % 2 == 0;
        if imm {
            p.b()
                .qp
                .post_recv(RecvWr {
                    wr_id: 200 + i as u64,
                    sges: vec![],
                })
                .unwrap();
        }
        let (sl, rk) = (p.ep[0].src_lkey, p.ep[1].dst_rkey);
        let mut wr = SendWr::new(
            i as u64,
            if imm {
                WrOpcode::RdmaWriteWithImm
            } else {
                WrOpcode::RdmaWrite
            },
        );
        wr.sges = sge(SRC + off, len, sl);
        wr.remote_addr = DST + off;
        wr.rkey = rk;
        wr.imm_data = 0x0102_0304;
        let now = p.now;
        p.a().qp.post_send(now, wr).unwrap();
        off += u64::from(len) + 64;
    }
    p.run();
    assert_eq!(p.ep[0].send_cq.len(), SIZES.len());
    let mut off = 0u64;
    let mut imms = 0;
    for (i, &len) in SIZES.iter().enumerate() {
        let s = p.ep[0].send_cq[i];
        assert_eq!(
            (s.wr_id, s.status, s.opcode),
            (i as u64, wc_status::IBV_WC_SUCCESS, wc_opcode::RDMA_WRITE)
        );
        assert_eq!(
            p.ep[1].peek(DST + off, len as usize),
            p.ep[0].peek(SRC + off, len as usize),
            "size {len}"
        );
        if i % 2 == 0 {
            let r = p.ep[1].recv_cq[imms];
            imms += 1;
            assert_eq!(
                (r.wr_id, r.status, r.opcode, r.byte_len),
                (
                    200 + i as u64,
                    wc_status::IBV_WC_SUCCESS,
                    wc_opcode::RECV_RDMA_WITH_IMM,
                    len
                )
            );
            assert_eq!(r.imm_data, Some(0x0102_0304));
        }
        off += u64::from(len) + 64;
    }
    assert_eq!(p.ep[1].recv_cq.len(), imms);
}

#[test]
fn read_all_sizes() {
    let mut p = Pair::new(&Setup::default(), 3);
    let mut off = 0u64;
    for (i, &len) in SIZES.iter().enumerate() {
        let (dl, rk) = (p.ep[0].dst_lkey, p.ep[1].src_rkey);
        let mut wr = SendWr::new(i as u64, WrOpcode::RdmaRead);
        wr.sges = sge(DST + off, len, dl);
        wr.remote_addr = SRC + off;
        wr.rkey = rk;
        let now = p.now;
        p.a().qp.post_send(now, wr).unwrap();
        off += u64::from(len) + 64;
    }
    p.run();
    assert_eq!(p.ep[0].send_cq.len(), SIZES.len());
    let mut off = 0u64;
    for (i, &len) in SIZES.iter().enumerate() {
        let s = p.ep[0].send_cq[i];
        assert_eq!(
            (s.wr_id, s.status, s.opcode, s.byte_len),
            (i as u64, wc_status::IBV_WC_SUCCESS, wc_opcode::RDMA_READ, len)
        );
        assert_eq!(
            p.ep[0].peek(DST + off, len as usize),
            p.ep[1].peek(SRC + off, len as usize),
            "size {len}"
        );
        off += u64::from(len) + 64;
    }
    assert!(p.ep[1].recv_cq.is_empty());
}

#[test]
fn atomics() {
    let mut p = Pair::new(&Setup::default(), 4);
    p.b().mem.poke(ATOM, &100u64.to_ne_bytes());
    let (al, rk) = (p.ep[0].atom_lkey, p.ep[1].atom_rkey);
    let mut fa = SendWr::new(1, WrOpcode::AtomicFetchAdd);
    fa.sges = sge(ATOM, 8, al);
    fa.remote_addr = ATOM;
    fa.rkey = rk;
    fa.compare_add = 5;
    let mut cs_hit = SendWr::new(2, WrOpcode::AtomicCmpSwp);
    cs_hit.sges = sge(ATOM + 8, 8, al);
    cs_hit.remote_addr = ATOM;
    cs_hit.rkey = rk;
    cs_hit.compare_add = 105;
    cs_hit.swap = 7;
    let mut cs_miss = cs_hit.clone();
    cs_miss.wr_id = 3;
    cs_miss.sges = sge(ATOM + 16, 8, al);
    cs_miss.swap = 9;
    let now = p.now;
    for wr in [fa, cs_hit, cs_miss] {
        p.a().qp.post_send(now, wr).unwrap();
    }
    p.run();
    let cq = &p.ep[0].send_cq;
    assert_eq!(cq.len(), 3);
    assert_eq!(
        (cq[0].status, cq[0].opcode, cq[0].byte_len),
        (wc_status::IBV_WC_SUCCESS, wc_opcode::FETCH_ADD, 8)
    );
    assert_eq!(
        (cq[1].status, cq[1].opcode),
        (wc_status::IBV_WC_SUCCESS, wc_opcode::COMP_SWAP)
    );
    assert_eq!(cq[2].status, wc_status::IBV_WC_SUCCESS);
    let word = |e: &Endpoint, a: u64| u64::from_ne_bytes(e.peek(a, 8).try_into().unwrap());
    assert_eq!(word(&p.ep[0], ATOM), 100);
    assert_eq!(word(&p.ep[0], ATOM + 8), 105);
    assert_eq!(word(&p.ep[0], ATOM + 16), 7);
    assert_eq!(word(&p.ep[1], ATOM), 7);
}

#[test]
fn bidirectional_mixed_with_selective_signaling_and_inline() {
    let mut p = Pair::new(
        &Setup {
            mtu: 1,
            ..Setup::default()
        },
        5,
    ); // 256-byte MTU
    let mut expect = [Vec::new(), Vec::new()];
    for side in 0..2 {
        let peer = 1 - side;
        for k in 0..40u64 {
            let len = (k * 97 % 3000) as u32;
            let off = k * 4096;
            let op = match k % 4 {
                0 => WrOpcode::Send,
                1 => WrOpcode::RdmaWrite,
                2 => WrOpcode::RdmaRead,
                _ => WrOpcode::RdmaWriteWithImm,
            };
            if matches!(op, WrOpcode::Send | WrOpcode::RdmaWriteWithImm) {
                let dl = p.ep[peer].dst_lkey;
                p.ep[peer]
                    .qp
                    .post_recv(RecvWr {
                        wr_id: k,
                        sges: sge(DST + off, 4096, dl),
                    })
                    .unwrap();
            }
            let mut wr = SendWr::new(k, op);
            if op == WrOpcode::RdmaRead {
                wr.sges = sge(DST + off, len, p.ep[side].dst_lkey);
                wr.remote_addr = SRC + off;
                wr.rkey = p.ep[peer].src_rkey;
            } else {
                wr.sges = sge(SRC + off, len, p.ep[side].src_lkey);
                wr.remote_addr = DST + off;
                wr.rkey = p.ep[peer].dst_rkey;
            }
            if op == WrOpcode::Send && len <= 400 {
                wr.inline_data = Some(p.ep[side].peek(SRC + off, len as usize));
                wr.sges.clear();
            }
            wr.signaled = k % 3 == 0 || k == 39;
            if wr.signaled {
                expect[side].push(k);
            }
            let now = p.now;
            p.ep[side].qp.post_send(now, wr).unwrap();
        }
    }
    p.run();
    for side in 0..2 {
        let peer = 1 - side;
        let ids: Vec<u64> = p.ep[side].send_cq.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, expect[side]);
        assert!(p.ep[side].send_cq.iter().all(|c| c.status == wc_status::IBV_WC_SUCCESS));
        for k in 0..40u64 {
            let len = (k * 97 % 3000) as usize;
            let off = k * 4096;
            let (got, want) = if k % 4 == 2 {
                (p.ep[side].peek(DST + off, len), p.ep[peer].peek(SRC + off, len))
            } else {
                (p.ep[peer].peek(DST + off, len), p.ep[side].peek(SRC + off, len))
            };
            assert_eq!(got, want, "side {side} wr {k}");
        }
        assert!(p.ep[side].qp.is_idle());
    }
}

#[test]
fn responder_in_rtr_only_works_and_raises_comm_est() {
    // perftest servers never reach RTS.
    let s = Setup::default();
    let mut p = Pair::new(&s, 6);
    // Re-create B as RTR-only.
    let mut b = Endpoint::new(0x22, [127, 0, 0, 2], s.caps);
    b.fill_src(9);
    b.qp.modify(&ModifyAttrs {
        mask: attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::ACCESS_FLAGS,
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: s.access,
        ..Default::default()
    })
    .unwrap();
    b.qp.modify(&ModifyAttrs {
        mask: attr_mask::STATE
            | attr_mask::AV
            | attr_mask::PATH_MTU
            | attr_mask::DEST_QPN
            | attr_mask::RQ_PSN
            | attr_mask::MAX_DEST_RD_ATOMIC
            | attr_mask::MIN_RNR_TIMER,
        qp_state: QpState::Rtr,
        path_mtu: s.mtu,
        dest_qp_num: 0x11,
        rq_psn: 0xFF_FFF0,
        max_dest_rd_atomic: 4,
        ah: AddressVector {
            dgid: gid([127, 0, 0, 1]),
            is_global: true,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    p.ep[1] = b;
    let (sl, rk) = (p.ep[0].src_lkey, p.ep[1].dst_rkey);
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.sges = sge(SRC, 10_000, sl);
    wr.remote_addr = DST;
    wr.rkey = rk;
    let mut rd = SendWr::new(2, WrOpcode::RdmaRead);
    rd.sges = sge(DST, 5000, p.ep[0].dst_lkey);
    rd.remote_addr = SRC;
    rd.rkey = p.ep[1].src_rkey;
    let now = p.now;
    p.a().qp.post_send(now, wr).unwrap();
    p.a().qp.post_send(now, rd).unwrap();
    p.run();
    assert_eq!(p.ep[0].send_cq.iter().map(|c| c.status).collect::<Vec<_>>(), vec![0, 0]);
    assert_eq!(p.ep[1].peek(DST, 10_000), p.ep[0].peek(SRC, 10_000));
    assert_eq!(p.ep[0].peek(DST, 5000), p.ep[1].peek(SRC, 5000));
    assert_eq!(p.ep[1].events, vec![AsyncEvent::CommEstablished]);
    // post_send in RTR is EINVAL.
    let now = p.now;
    assert_eq!(
        p.b().qp.post_send(now, SendWr::new(9, WrOpcode::Send)),
        Err(PostError::InvalidState)
    );
}

#[test]
fn write_64k_at_mtu_4096_is_16_packets_and_few_acks() {
    let mut p = Pair::new(
        &Setup {
            mtu: MTU_4096,
            ..Setup::default()
        },
        7,
    );
    let (sl, rk) = (p.ep[0].src_lkey, p.ep[1].dst_rkey);
    let n = 8;
    for k in 0..n {
        let mut wr = SendWr::new(k, WrOpcode::RdmaWrite);
        wr.sges = sge(SRC + k * 65536, 65536, sl);
        wr.remote_addr = DST + k * 65536;
        wr.rkey = rk;
        wr.signaled = k == n - 1;
        let now = p.now;
        p.a().qp.post_send(now, wr).unwrap();
    }
    p.run();
    assert_eq!(p.sent[0], 16 * n);
    // One ACK per message at most (coalesced).
    assert!(p.sent[1] <= n, "acks: {}", p.sent[1]);
    assert_eq!(p.ep[0].send_cq.len(), 1);
    assert_eq!(
        p.ep[1].peek(DST, 65536 * n as usize),
        p.ep[0].peek(SRC, 65536 * n as usize)
    );
}

/// A QP connected to itself (NCCL's GPU flush does a READ over such a loop).
#[test]
fn qp_connected_to_itself() {
    let s = Setup::default();
    let mut e = Endpoint::new(0x33, [127, 0, 0, 1], s.caps);
    e.fill_src(5);
    let g = gid(e.ip);
    connect_qp(&mut e.qp, &s, 0x33, g, 0xFF_FFFE, 0xFF_FFFE);
    let now = Instant::from_micros(1);
    let dl = e.dst_lkey;
    e.qp.post_recv(RecvWr {
        wr_id: 7,
        sges: sge(DST + 100_000, 8192, dl),
    })
    .unwrap();
    let mut rd = SendWr::new(1, WrOpcode::RdmaRead);
    rd.sges = sge(DST, 5000, e.dst_lkey);
    rd.remote_addr = SRC;
    rd.rkey = e.src_rkey;
    let mut wi = SendWr::new(2, WrOpcode::RdmaWriteWithImm);
    wi.sges = sge(SRC + 10_000, 3000, e.src_lkey);
    wi.remote_addr = DST + 50_000;
    wi.rkey = e.dst_rkey;
    wi.imm_data = 99;
    e.qp.post_send(now, rd).unwrap();
    e.qp.post_send(now, wi).unwrap();
    let mut buf = Vec::new();
    let mut pending: Vec<Vec<u8>> = Vec::new();
    for _ in 0..100 {
        while e.qp.poll_transmit(now, &mut e.mem, &mut buf).is_some() {
            pending.push(buf.clone());
        }
        if pending.is_empty() {
            break;
        }
        for p in pending.drain(..) {
            e.qp.handle_packet(now, &p, &mut e.mem);
        }
    }
    let mut cqes = Vec::new();
    while let Some(c) = e.qp.poll_completion() {
        cqes.push((c.queue, c.wr_id, c.status));
    }
    assert_eq!(cqes.len(), 3, "{cqes:?}");
    assert!(cqes.contains(&(WcQueue::Send, 1, 0)));
    assert!(cqes.contains(&(WcQueue::Send, 2, 0)));
    assert!(cqes.contains(&(WcQueue::Recv, 7, 0)));
    assert_eq!(e.peek(DST, 5000), e.peek(SRC, 5000));
    assert_eq!(e.peek(DST + 50_000, 3000), e.peek(SRC + 10_000, 3000));
}

fn read_wr(p: &Pair, id: u64, off: u64, len: u32) -> SendWr {
    let mut rd = SendWr::new(id, WrOpcode::RdmaRead);
    rd.sges = sge(DST + off, len, p.ep[0].dst_lkey);
    rd.remote_addr = SRC + off;
    rd.rkey = p.ep[1].src_rkey;
    rd
}

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    for (limit, first_burst) in [(1u8, 1u64), (2, 2), (4, 3)] {
        let mut p = Pair::new(
            &Setup {
                max_rd_atomic: limit,
                ..Setup::default()
            },
            30,
        );
        let now = p.now;
        for k in 0..3 {
            let wr = read_wr(&p, k, k * 8192, 3000);
            p.a().qp.post_send(now, wr).unwrap();
        }
        p.run_for(Duration::ZERO);
        assert_eq!(p.sent[0], first_burst, "max_rd_atomic {limit}");
        p.run();
        assert_eq!(
            p.ep[0].send_cq.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(0, 0), (1, 0), (2, 0)]
        );
        for k in 0..3u64 {
            assert_eq!(p.ep[0].peek(DST + k * 8192, 3000), p.ep[1].peek(SRC + k * 8192, 3000));
        }
    }
}

#[test]
fn fence_waits_for_the_read_before_it() {
    let mut p = Pair::new(&Setup::default(), 31);
    let now = p.now;
    let rd = read_wr(&p, 1, 0, 3000);
    p.a().qp.post_send(now, rd).unwrap();
    // A SEND of the bytes the READ brings in, fenced behind it.
    let dl = p.ep[1].dst_lkey;
    p.b()
        .qp
        .post_recv(RecvWr {
            wr_id: 9,
            sges: sge(DST + 100_000, 4096, dl),
        })
        .unwrap();
    let mut send = SendWr::new(2, WrOpcode::Send);
    send.sges = sge(DST, 3000, p.ep[0].dst_lkey);
    send.fence = true;
    p.a().qp.post_send(now, send).unwrap();
    p.run_for(Duration::ZERO);
    assert_eq!(p.sent[0], 1, "only the READ request goes out");
    p.run();
    assert_eq!(p.ep[0].send_cq.len(), 2);
    assert_eq!(p.ep[1].peek(DST + 100_000, 3000), p.ep[1].peek(SRC, 3000));
}

/// `poll_transmit` reuses the caller's buffer without zeroing it: a dirty,
/// oversized buffer must give exactly the bytes a fresh one gives.
#[test]
fn dirty_transmit_buffer_gives_identical_packets() {
    let mut streams: Vec<Vec<Vec<u8>>> = Vec::new();
    for dirty in [false, true] {
        let s = Setup::default();
        let mut ep = [
            Endpoint::new(0x11, [127, 0, 0, 1], s.caps),
            Endpoint::new(0x22, [127, 0, 0, 2], s.caps),
        ];
        ep[0].fill_src(1);
        ep[1].fill_src(2);
        let (g0, g1) = (gid(ep[0].ip), gid(ep[1].ip));
        connect_qp(&mut ep[0].qp, &s, 0x22, g1, 1, 2);
        connect_qp(&mut ep[1].qp, &s, 0x11, g0, 2, 1);
        let now = Instant::from_micros(1);
        for (k, len) in [3u32, 1500, 1, 2049, 0, 7].into_iter().enumerate() {
            let mut w = SendWr::new(
                k as u64,
                if k % 2 == 0 {
                    WrOpcode::RdmaWrite
                } else {
                    WrOpcode::RdmaRead
                },
            );
            if k % 2 == 0 {
                w.sges = sge(SRC, len, ep[0].src_lkey);
                w.remote_addr = DST;
                w.rkey = ep[1].dst_rkey;
            } else {
                w.sges = sge(DST, len, ep[0].dst_lkey);
                w.remote_addr = SRC;
                w.rkey = ep[1].src_rkey;
            }
            ep[0].qp.post_send(now, w).unwrap();
        }
        let mut out = Vec::new();
        let mut buf = if dirty { vec![0xAA; 9000] } else { Vec::new() };
        for _ in 0..20 {
            for i in 0..2 {
                let mut pkts = Vec::new();
                loop {
                    if !dirty {
                        buf = Vec::new();
                    } else {
                        buf.resize(9000, 0xAA);
                    }
                    let e = &mut ep[i];
                    let Some(m) = e.qp.poll_transmit(now, &mut e.mem, &mut buf) else {
                        break;
                    };
                    assert_eq!(m.len, buf.len());
                    pkts.push(buf.clone());
                }
                for p in pkts {
                    out.push(p.clone());
                    let e = &mut ep[1 - i];
                    e.qp.handle_packet(now, &p, &mut e.mem);
                }
            }
        }
        streams.push(out);
    }
    assert!(!streams[0].is_empty());
    assert_eq!(streams[0], streams[1]);
}

/// Receive WQEs from an SRQ (`MemoryAccess::take_srq_recv`): SENDs and
/// WRITE-with-imm consume them, an empty SRQ gives RNR NAKs until refilled,
/// `post_recv` is EINVAL, and ERR flushes a half-filled WQE and raises
/// LAST_WQE_REACHED.
#[test]
fn shared_receive_queue() {
    let mut p = Pair::new(
        &Setup {
            min_rnr_timer: 1,
            ..Setup::default()
        },
        40,
    );
    p.b().qp.set_srq(true);
    assert_eq!(p.b().qp.post_recv(RecvWr::default()), Err(PostError::InvalidWr));
    let dl = p.ep[1].dst_lkey;
    p.b().mem.srq.push_back(RecvWr {
        wr_id: 100,
        sges: sge(DST, 4096, dl),
    });
    let sl = p.ep[0].src_lkey;
    let now = p.now;
    for k in 0..3u64 {
        let mut wr = SendWr::new(
            k,
            if k == 1 {
                WrOpcode::RdmaWriteWithImm
            } else {
                WrOpcode::Send
            },
        );
        wr.sges = sge(SRC + k * 4096, 3000, sl);
        wr.remote_addr = DST + 50_000;
        wr.rkey = p.ep[1].dst_rkey;
        p.a().qp.post_send(now, wr).unwrap();
    }
    p.run_for(Duration::from_micros(500));
    // One WQE: only the first SEND landed; the WRITE_IMM is bouncing off RNR NAKs.
    assert_eq!(p.ep[1].recv_cq.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![100]);
    assert!(p.ep[1].qp.stats().rnr_naks_sent > 0);
    p.b().mem.srq.push_back(RecvWr {
        wr_id: 101,
        sges: vec![],
    });
    p.b().mem.srq.push_back(RecvWr {
        wr_id: 102,
        sges: sge(DST + 8192, 4096, dl),
    });
    p.run();
    let r: Vec<(u64, u32)> = p.ep[1].recv_cq.iter().map(|c| (c.wr_id, c.opcode)).collect();
    assert_eq!(
        r,
        vec![
            (100, wc_opcode::RECV),
            (101, wc_opcode::RECV_RDMA_WITH_IMM),
            (102, wc_opcode::RECV)
        ]
    );
    assert_eq!(p.ep[0].send_cq.len(), 3);
    assert_eq!(p.ep[1].peek(DST, 3000), p.ep[0].peek(SRC, 3000));
    assert_eq!(p.ep[1].peek(DST + 8192, 3000), p.ep[0].peek(SRC + 8192, 3000));
    // A multi-packet SEND that takes a WQE and then stops half way (peer link cut).
    p.b().mem.srq.push_back(RecvWr {
        wr_id: 103,
        sges: sge(DST, 8192, dl),
    });
    let mut wr = SendWr::new(9, WrOpcode::Send);
    wr.sges = sge(SRC, 5000, sl);
    let now = p.now;
    p.a().qp.post_send(now, wr).unwrap();
    p.faults.loss = 0.0;
    // Deliver only the first packet by cutting A's link after one step.
    p.run_for(Duration::ZERO);
    p.link_up[0] = false;
    p.net.truncate(1);
    p.run_for(Duration::from_micros(50));
    p.b()
        .qp
        .modify(&ModifyAttrs {
            mask: attr_mask::STATE,
            qp_state: QpState::Err,
            ..Default::default()
        })
        .unwrap();
    p.run_for(Duration::from_micros(50));
    let last = p.ep[1].recv_cq.last().copied().unwrap();
    assert_eq!((last.wr_id, last.status), (103, wc_status::IBV_WC_WR_FLUSH_ERR));
    assert!(p.ep[1].events.contains(&AsyncEvent::LastWqeReached));
}

/// With one READ outstanding allowed (`max_rd_atomic` 1), a WRITE before two READs is
/// acknowledged while the first READ's response is still on its way: that ACK completes the
/// WRITE and frees no READ slot, so the second READ request leaves only after the first READ's
/// response came.
#[test]
fn an_acknowledged_write_frees_no_read_slot() {
    use softroce::wire::opcode::OpCode;
    let mut p = Pair::new(
        &Setup {
            max_rd_atomic: 1,
            ..Setup::default()
        },
        11,
    );
    let (sl, dl, rk, srk) = (p.ep[0].src_lkey, p.ep[0].dst_lkey, p.ep[1].dst_rkey, p.ep[1].src_rkey);
    let mut wr = SendWr::new(1, WrOpcode::RdmaWrite);
    wr.sges = sge(SRC, 100, sl);
    wr.remote_addr = DST;
    wr.rkey = rk;
    let now = p.now;
    p.a().qp.post_send(now, wr).unwrap();
    for k in 0..2u64 {
        let mut rd = SendWr::new(2 + k, WrOpcode::RdmaRead);
        rd.sges = sge(DST + 4096 * k, 100, dl);
        rd.remote_addr = SRC + 4096 * k;
        rd.rkey = srk;
        p.a().qp.post_send(now, rd).unwrap();
    }
    let reads = |pkts: &[(OpCode, Vec<u8>)]| pkts.iter().filter(|(op, _)| *op == OpCode::ReadRequest).count();
    let first = p.send_now(0);
    assert_eq!(reads(&first), 1, "one READ outstanding at most: {first:?}");
    p.hand(1, &first);
    let answers = p.send_now(1);
    let (acks, responses): (Vec<_>, Vec<_>) = answers.into_iter().partition(|(op, _)| *op == OpCode::Acknowledge);
    assert!(
        !acks.is_empty() && !responses.is_empty(),
        "the WRITE's ACK and the READ's response"
    );
    p.hand(0, &acks);
    assert_eq!(reads(&p.send_now(0)), 0, "the first READ is still unanswered");
    p.hand(0, &responses);
    assert_eq!(reads(&p.send_now(0)), 1, "the second READ, once the first was answered");
}

/// Two 64 KiB WRITEs (16 packets each at MTU 4096) posted on a pair whose requester may have 20
/// PSNs in flight, and the 20 packets it sends at once: the first WRITE and 4 packets of the
/// second (the last of them asks for an ACK: the window is full).
fn two_writes_into_a_20_packet_window() -> (Pair, Vec<(softroce::wire::opcode::OpCode, Vec<u8>)>) {
    let mut p = Pair::new(
        &Setup {
            mtu: MTU_4096,
            ..Setup::default()
        },
        9,
    );
    p.a().qp.set_max_inflight_psns(20);
    let (sl, rk) = (p.ep[0].src_lkey, p.ep[1].dst_rkey);
    for k in 0..2u64 {
        let mut wr = SendWr::new(k, WrOpcode::RdmaWrite);
        wr.sges = sge(SRC + k * 65536, 65536, sl);
        wr.remote_addr = DST + k * 65536;
        wr.rkey = rk;
        let now = p.now;
        p.a().qp.post_send(now, wr).unwrap();
    }
    let window = p.send_now(0);
    assert_eq!(window.len(), 20, "the first WRITE and 4 packets of the second");
    (p, window)
}

/// An ACK that covers less than was sent (the first of two messages, the second's packets still
/// on their way) opens the window without moving the transmit cursor back: the next packet is
/// the first never sent, not one of the unacknowledged ones.
#[test]
fn an_ack_short_of_what_was_sent_resends_nothing() {
    let (mut p, window) = two_writes_into_a_20_packet_window();
    // Only the first message reaches the responder (its last packet asks for the ACK).
    p.hand(1, &window[..16]);
    let acks = p.send_now(1);
    assert_eq!(acks.len(), 1, "one ACK for the first message");
    p.hand(0, &acks);
    let next = p.send_now(0);
    assert_eq!(next.len(), 12, "the rest of the second message, the window open by 16");
    assert_eq!(
        psn_of(&next[0].1),
        psn_of(&window[19].1) + 1,
        "the first packet never sent comes next"
    );
}

/// An ACK that arrives late, after a timeout moved the transmit cursor back to the oldest
/// unacknowledged packet, moves it forward again past what the ACK covers: packets the peer
/// acknowledged are not sent again.
#[test]
fn a_late_ack_after_a_timeout_moves_the_cursor_past_what_it_covers() {
    let (mut p, window) = two_writes_into_a_20_packet_window();
    p.hand(1, &window);
    let acks = p.send_now(1);
    assert_eq!(
        acks.len(),
        1,
        "one ACK, for the window's last packet (in the second message)"
    );
    assert_eq!(psn_of(&acks[0].1), psn_of(&window[19].1));
    // The ACK is late: the requester's timer fires first and goes back to the first packet.
    let late = p.ep[0]
        .qp
        .poll_timeout()
        .expect("a timer armed while packets are unacknowledged");
    p.now = late;
    p.ep[0].qp.handle_timeout(late);
    p.hand(0, &acks);
    let next = p.send_now(0);
    assert_eq!(
        psn_of(&next[0].1),
        psn_of(&window[19].1) + 1,
        "nothing the ACK covered is sent again"
    );
    assert_eq!(next.len(), 12, "the rest of the second message");
}

/// Writes longer than the in-flight window on a lossless, in-order network: every ACK that
/// opens the window lets new packets go, none is sent twice (an ACK never moves the transmit
/// cursor back while it is past the acknowledged PSN).
#[test]
fn acks_that_open_the_window_resend_nothing() {
    let mut p = Pair::new(
        &Setup {
            mtu: MTU_4096,
            ..Setup::default()
        },
        9,
    );
    p.a().qp.set_max_inflight_psns(20);
    let (sl, rk) = (p.ep[0].src_lkey, p.ep[1].dst_rkey);
    let n = 12;
    for k in 0..n {
        let mut wr = SendWr::new(k, WrOpcode::RdmaWrite);
        wr.sges = sge(SRC + k * 65536, 65536, sl);
        wr.remote_addr = DST + k * 65536;
        wr.rkey = rk;
        let now = p.now;
        p.a().qp.post_send(now, wr).unwrap();
    }
    p.run();
    assert_eq!(p.ep[0].send_cq.iter().filter(|c| c.status == 0).count(), n as usize);
    assert_eq!(
        p.sent[0],
        16 * n,
        "192 packets of 4 KiB through a 20-packet window, each once"
    );
    assert_eq!(
        p.ep[1].peek(DST, 65536 * n as usize),
        p.ep[0].peek(SRC, 65536 * n as usize)
    );
}

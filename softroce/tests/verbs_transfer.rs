//! Every RC opcode between two QPs of one softroce device, checked byte for byte.

mod verbs_util;

use rdma_sys::ibv_sge;
use verbs_util::*;

const LEN: usize = 3 * 1024 * 4 + 17; // several MTU-1024 packets plus a tail

fn pattern(seed: u8) -> impl Fn(usize) -> u8 {
    move |i| (i as u8).wrapping_mul(31).wrapping_add(seed)
}

#[test]
fn every_opcode_byte_for_byte() {
    let c = open("127.0.21.1");
    let (a, b) = pair(&c);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    let b_qpn = unsafe { (*b.qp).qp_num };
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    let a_qpn = unsafe { (*a.qp).qp_num };

    let mut src = Buf::new(&c, LEN, ACCESS_ALL);
    let dst = Buf::new(&c, LEN, ACCESS_ALL);

    // SEND -> RECV (multi-packet)
    src.fill(pattern(1));
    post_recv(&b, dst.addr(), LEN as u32, dst.lkey(), 100);
    let mut sge = ibv_sge {
        addr: src.addr(),
        length: LEN as u32,
        lkey: src.lkey(),
    };
    let mut wr = send_wr(1, 2, &mut sge, SIGNALED);
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status, s.opcode), (1, 0, 0), "{s:?}");
    let r = poll_one(b.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (100, 0, 128, LEN as u32),
        "{r:?}"
    );
    assert_eq!((r.qp_num, r.src_qp), (b_qpn, a_qpn));
    assert_eq!(dst.read(), src.read(), "SEND payload");

    // SEND_WITH_IMM
    src.fill(pattern(2));
    post_recv(&b, dst.addr(), LEN as u32, dst.lkey(), 101);
    let mut sge = ibv_sge {
        addr: src.addr(),
        length: 100,
        lkey: src.lkey(),
    };
    let mut wr = send_wr(2, 3, &mut sge, SIGNALED);
    wr.imm_data_invalidated_rkey_union.imm_data = 0x1234_5678u32.to_be();
    assert_eq!(post_send(&a, &mut wr), 0);
    assert_eq!(poll_one(a.cq).status, 0);
    let r = poll_one(b.cq);
    assert_eq!((r.wr_id, r.status, r.opcode, r.byte_len), (101, 0, 128, 100));
    assert_ne!(r.flags & 2, 0, "WITH_IMM flag");
    assert_eq!(r.imm, 0x1234_5678u32.to_be(), "imm passes through unchanged");
    assert_eq!(&dst.read()[..100], &src.read()[..100]);

    // inline SEND (copied at post time: clobber the source right after posting)
    src.fill(pattern(3));
    let expect = src.read()[..48].to_vec();
    post_recv(&b, dst.addr(), LEN as u32, dst.lkey(), 102);
    let mut sge = ibv_sge {
        addr: src.addr(),
        length: 48,
        lkey: 0,
    };
    let mut wr = send_wr(3, 2, &mut sge, SIGNALED | INLINE);
    assert_eq!(post_send(&a, &mut wr), 0);
    src.fill(|_| 0xEE);
    assert_eq!(poll_one(a.cq).status, 0);
    let r = poll_one(b.cq);
    assert_eq!((r.status, r.byte_len), (0, 48));
    assert_eq!(&dst.read()[..48], &expect[..]);

    // RDMA WRITE
    src.fill(pattern(4));
    let mut sge = ibv_sge {
        addr: src.addr(),
        length: LEN as u32,
        lkey: src.lkey(),
    };
    let mut wr = send_wr(4, 0, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.rkey();
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status, s.opcode), (4, 0, 1));
    assert_eq!(dst.read(), src.read(), "WRITE payload");

    // RDMA WRITE_WITH_IMM (consumes a receive, byte_len = message length)
    src.fill(pattern(5));
    post_recv(&b, 0, 0, 0, 103);
    let mut sge = ibv_sge {
        addr: src.addr(),
        length: 5000,
        lkey: src.lkey(),
    };
    let mut wr = send_wr(5, 1, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = dst.addr() + 7;
    wr.wr.rdma.rkey = dst.rkey();
    wr.imm_data_invalidated_rkey_union.imm_data = 0xCAFE_F00Du32.to_be();
    assert_eq!(post_send(&a, &mut wr), 0);
    assert_eq!(poll_one(a.cq).status, 0);
    let r = poll_one(b.cq);
    assert_eq!((r.wr_id, r.status, r.opcode, r.byte_len), (103, 0, 129, 5000), "{r:?}");
    assert_eq!(r.imm, 0xCAFE_F00Du32.to_be());
    assert_eq!(&dst.read()[7..5007], &src.read()[..5000]);

    // RDMA READ (b's buffer into a fresh local one)
    let mut remote = Buf::new(&c, LEN, ACCESS_ALL);
    remote.fill(pattern(6));
    let local = Buf::new(&c, LEN, ACCESS_ALL);
    let mut sge = ibv_sge {
        addr: local.addr(),
        length: LEN as u32,
        lkey: local.lkey(),
    };
    let mut wr = send_wr(6, 4, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = remote.addr();
    wr.wr.rdma.rkey = remote.rkey();
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!(
        (s.wr_id, s.status, s.opcode, s.byte_len),
        (6, 0, 2, LEN as u32),
        "{s:?}"
    );
    assert_eq!(local.read(), remote.read(), "READ payload");

    // ATOMIC CMP_SWP then FETCH_ADD on an aligned word
    let mut word = Buf::new(&c, 64, ACCESS_ALL);
    word.fill(|_| 0);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe { std::ptr::write_volatile(word.mem.as_mut_ptr().add(8) as *mut u64, 41) };
    let res = Buf::new(&c, 8, ACCESS_ALL);
    let mut sge = ibv_sge {
        addr: res.addr(),
        length: 8,
        lkey: res.lkey(),
    };
    let mut wr = send_wr(7, 5, &mut sge, SIGNALED);
    wr.wr.atomic.remote_addr = word.addr() + 8;
    wr.wr.atomic.rkey = word.rkey();
    wr.wr.atomic.compare_add = 41;
    wr.wr.atomic.swap = 1000;
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status, s.opcode), (7, 0, 3), "{s:?}");
    assert_eq!(u64::from_ne_bytes(res.read().try_into().unwrap()), 41);
    let mut wr = send_wr(8, 6, &mut sge, SIGNALED);
    wr.wr.atomic.remote_addr = word.addr() + 8;
    wr.wr.atomic.rkey = word.rkey();
    wr.wr.atomic.compare_add = 5;
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status, s.opcode), (8, 0, 4), "{s:?}");
    assert_eq!(u64::from_ne_bytes(res.read().try_into().unwrap()), 1000);
    let w = word.read();
    assert_eq!(u64::from_ne_bytes(w[8..16].try_into().unwrap()), 1005);
    assert!(
        w[..8].iter().chain(w[16..].iter()).all(|&x| x == 0),
        "neighbours untouched"
    );
}

#[test]
fn unsignaled_chain_completes_with_last_signaled() {
    // Runs in the same process as the test above: the device instance is shared.
    let c = open("127.0.21.1");
    let (a, _b) = pair(&c);
    let mut src = Buf::new(&c, 4096, ACCESS_ALL);
    src.fill(pattern(9));
    let dst = Buf::new(&c, 4096 * 8, ACCESS_ALL);
    let mut sges: Vec<ibv_sge> = (0..8)
        .map(|_| ibv_sge {
            addr: src.addr(),
            length: 4096,
            lkey: src.lkey(),
        })
        .collect();
    let mut wrs: Vec<_> = sges
        .iter_mut()
        .enumerate()
        .map(|(i, s)| {
            let mut w = send_wr(10 + i as u64, 0, s, if i == 7 { SIGNALED } else { 0 });
            w.wr.rdma.remote_addr = dst.addr() + (i * 4096) as u64;
            w.wr.rdma.rkey = dst.rkey();
            w
        })
        .collect();
    for i in 0..7 {
        let next: *mut _ = &mut wrs[i + 1];
        wrs[i].next = next;
    }
    assert_eq!(post_send(&a, &mut wrs[0]), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status), (17, 0));
    let d = dst.read();
    for i in 0..8 {
        assert_eq!(&d[i * 4096..(i + 1) * 4096], &src.read()[..]);
    }
}

#[test]
fn nccl_style_zero_length_write_imm_and_self_read_flush() {
    let c = open("127.0.21.1");
    let (a, b) = pair(&c);
    // Zero-length RDMA WRITE_WITH_IMM, no SGE, into a receive with no SGE.
    post_recv(&b, 0, 0, 0, 77);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    let mut wr: rdma_sys::ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.wr_id = 5;
    wr.opcode = 1; // WRITE_WITH_IMM
    wr.send_flags = SIGNALED;
    wr.num_sge = 0;
    wr.imm_data_invalidated_rkey_union.imm_data = 0x0102_0304u32.to_be();
    let dst = Buf::new(&c, 64, ACCESS_ALL);
    wr.wr.rdma.remote_addr = dst.addr();
    wr.wr.rdma.rkey = dst.rkey();
    assert_eq!(post_send(&a, &mut wr), 0);
    assert_eq!(poll_one(a.cq).status, 0);
    let r = poll_one(b.cq);
    assert_eq!((r.wr_id, r.status, r.opcode, r.byte_len), (77, 0, 129, 0), "{r:?}");
    assert_eq!(r.imm, 0x0102_0304u32.to_be());

    // NCCL's flush: a QP connected to itself READs a few bytes of local memory.
    let q = create_qp(&c);
    // SAFETY: test code: q.qp is a live QP.
    let qpn = unsafe { (*q.qp).qp_num };
    connect(&c, &q, qpn, 14, 7);
    let mut data = Buf::new(&c, 4096, ACCESS_ALL);
    data.fill(|i| i as u8 ^ 0x5a);
    let sink = Buf::new(&c, 4, ACCESS_ALL);
    let mut sge = ibv_sge {
        addr: sink.addr(),
        length: 4,
        lkey: sink.lkey(),
    };
    let mut wr = send_wr(6, 4, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = data.addr() + 100;
    wr.wr.rdma.rkey = data.rkey();
    assert_eq!(post_send(&q, &mut wr), 0);
    let s = poll_one(q.cq);
    assert_eq!((s.wr_id, s.status, s.opcode), (6, 0, 2), "{s:?}");
    assert_eq!(sink.read(), data.read()[100..104].to_vec());
}

#[test]
fn wr_api_every_opcode() {
    use rdma_sys::{ibv_data_buf, ibv_qp_init_attr_ex};
    use softroce::verbs::qp_ex::ibv_qp_to_qp_ex;
    let c = open("127.0.21.1");
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let vctx = (c.ctx as *mut u8).sub(320) as *mut rdma_sys::verbs_context;
        let create = (*vctx).create_qp_ex.expect("create_qp_ex op");
        let cq = softroce::verbs::cq::ibv_create_cq(c.ctx, 64, std::ptr::null_mut(), std::ptr::null_mut(), 0);
        let mut ax: ibv_qp_init_attr_ex = std::mem::zeroed();
        ax.send_cq = cq;
        ax.recv_cq = cq;
        ax.qp_type = 2;
        ax.cap.max_send_wr = 16;
        ax.cap.max_recv_wr = 16;
        ax.cap.max_send_sge = 2;
        ax.cap.max_recv_sge = 2;
        ax.comp_mask = 1 | 64; // PD | SEND_OPS_FLAGS
        ax.pd = c.pd;
        ax.send_ops_flags = 0x7f;
        let qp = create(c.ctx, &mut ax);
        assert!(!qp.is_null());
        let a = Qp { qp, cq };
        let b = create_qp(&c);
        connect(&c, &a, (*b.qp).qp_num, 14, 7);
        connect(&c, &b, (*a.qp).qp_num, 14, 7);
        let x = ibv_qp_to_qp_ex(a.qp);
        assert!(!x.is_null());
        assert!(ibv_qp_to_qp_ex(b.qp).is_null(), "plain QPs have no extension");
        // Unsupported send ops are refused at creation.
        ax.send_ops_flags = 0x7f | 0x80; // + LOCAL_INV
        assert!(create(c.ctx, &mut ax).is_null());

        let mut src = Buf::new(&c, 8192, ACCESS_ALL);
        src.fill(pattern(11));
        let dst = Buf::new(&c, 8192, ACCESS_ALL);
        let word = Buf::new(&c, 8, ACCESS_ALL);
        let res = Buf::new(&c, 8, ACCESS_ALL);
        post_recv(&b, dst.addr(), 8192, dst.lkey(), 50);
        post_recv(&b, dst.addr(), 8192, dst.lkey(), 51);
        let hdr = b"inline-";
        let body = b"list";
        let list = [
            ibv_data_buf {
                addr: hdr.as_ptr() as *mut _,
                length: hdr.len(),
            },
            ibv_data_buf {
                addr: body.as_ptr() as *mut _,
                length: body.len(),
            },
        ];
        ((*x).wr_start.unwrap())(x);
        (*x).wr_id = 1;
        (*x).wr_flags = 0; // unsignaled WRITE
        ((*x).wr_rdma_write.unwrap())(x, dst.rkey(), dst.addr() + 4096);
        ((*x).wr_set_sge.unwrap())(x, src.lkey(), src.addr(), 3000);
        (*x).wr_id = 2;
        (*x).wr_flags = SIGNALED;
        ((*x).wr_send_imm.unwrap())(x, 0xAABB_CCDDu32.to_be());
        ((*x).wr_set_inline_data_list.unwrap())(x, 2, list.as_ptr());
        (*x).wr_id = 3;
        ((*x).wr_rdma_write_imm.unwrap())(x, dst.rkey(), dst.addr() + 100, 7u32.to_be());
        let sgl = [
            ibv_sge {
                addr: src.addr() + 10,
                length: 5,
                lkey: src.lkey(),
            },
            ibv_sge {
                addr: src.addr() + 20,
                length: 5,
                lkey: src.lkey(),
            },
        ];
        ((*x).wr_set_sge_list.unwrap())(x, 2, sgl.as_ptr());
        (*x).wr_id = 4;
        ((*x).wr_atomic_fetch_add.unwrap())(x, word.rkey(), word.addr(), 5);
        ((*x).wr_set_sge.unwrap())(x, res.lkey(), res.addr(), 8);
        (*x).wr_id = 5;
        ((*x).wr_atomic_cmp_swp.unwrap())(x, word.rkey(), word.addr(), 5, 99);
        ((*x).wr_set_sge.unwrap())(x, res.lkey(), res.addr(), 8);
        assert_eq!(((*x).wr_complete.unwrap())(x), 0);
        let got: Vec<u64> = (0..4).map(|_| poll_one(cq).wr_id).collect();
        assert_eq!(got, vec![2, 3, 4, 5], "unsignaled WR 1 produces no CQE");
        assert_eq!(&dst.read()[4096..7096], &src.read()[..3000]);
        let r = poll_one(b.cq);
        assert_eq!((r.wr_id, r.byte_len, r.imm), (50, 11, 0xAABB_CCDDu32.to_be()));
        let r = poll_one(b.cq);
        assert_eq!((r.wr_id, r.opcode, r.byte_len, r.imm), (51, 129, 10, 7u32.to_be()));
        let d = dst.read();
        assert_eq!(&d[..11], b"inline-list");
        assert_eq!(&d[100..110], &[&src.read()[10..15], &src.read()[20..25]].concat()[..]);
        assert_eq!(u64::from_ne_bytes(word.read().try_into().unwrap()), 99);
        assert_eq!(u64::from_ne_bytes(res.read().try_into().unwrap()), 5);

        // RDMA READ through the builder, then an aborted batch posts nothing,
        // and a builder error fails the whole batch.
        let sink = Buf::new(&c, 64, ACCESS_ALL);
        ((*x).wr_start.unwrap())(x);
        (*x).wr_id = 6;
        ((*x).wr_rdma_read.unwrap())(x, dst.rkey(), dst.addr());
        ((*x).wr_set_sge.unwrap())(x, sink.lkey(), sink.addr(), 11);
        assert_eq!(((*x).wr_complete.unwrap())(x), 0);
        assert_eq!(poll_one(cq).wr_id, 6);
        assert_eq!(&sink.read()[..11], b"inline-list");
        ((*x).wr_start.unwrap())(x);
        ((*x).wr_send.unwrap())(x);
        ((*x).wr_abort.unwrap())(x);
        ((*x).wr_start.unwrap())(x);
        ((*x).wr_set_sge.unwrap())(x, src.lkey(), src.addr(), 8); // no WR yet
        assert_eq!(((*x).wr_complete.unwrap())(x), libc::EINVAL);
    }
}

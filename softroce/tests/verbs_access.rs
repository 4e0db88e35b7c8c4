//! A remote WRITE with a wrong rkey, or outside the target MR, completes with
//! IBV_WC_REM_ACCESS_ERR and writes nothing; the QP then flushes.

mod verbs_util;

use rdma_sys::ibv_sge;
use softroce::verbs::qp::ibv_modify_qp;
use verbs_util::*;

fn write_expecting_access_error(c: &Ctx, remote_addr: u64, rkey: u32, len: u32) {
    let (a, _b) = pair(c);
    let mut src = Buf::new(c, 8192, ACCESS_ALL);
    src.fill(|_| 0xAB);
    let mut sge = ibv_sge {
        addr: src.addr(),
        length: len,
        lkey: src.lkey(),
    };
    let mut wr = send_wr(1, 0, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status), (1, 10), "expected IBV_WC_REM_ACCESS_ERR: {s:?}");
    // The QP is now in ERR: a further WR completes with WR_FLUSH_ERR.
    let mut wr = send_wr(2, 0, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    let _ = post_send(&a, &mut wr);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status), (2, 5), "expected IBV_WC_WR_FLUSH_ERR: {s:?}");
}

#[test]
fn wrong_rkey_and_out_of_bounds_write_nothing() {
    let c = open("127.0.21.2");
    // Guard zone: the MR covers [1024, 3072) of a 4096-byte buffer.
    let mut big = vec![0u8; 4096];
    let base = big.as_mut_ptr() as u64;
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    let mr = unsafe { softroce::verbs::mr::ibv_reg_mr(c.pd, big.as_mut_ptr().add(1024) as *mut _, 2048, ACCESS_ALL) };
    assert!(!mr.is_null());
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    let rkey = unsafe { (*mr).rkey };

    // Wrong rkey.
    write_expecting_access_error(&c, base + 1024, rkey ^ 0x5500, 64);
    // Starts inside, ends 1 byte past the end.
    write_expecting_access_error(&c, base + 1024 + 2048 - 63, rkey, 64);
    // Entirely before the MR.
    write_expecting_access_error(&c, base, rkey, 64);
    // Multi-packet write running past the end (first packets are in bounds).
    write_expecting_access_error(&c, base + 1024, rkey, 4096);

    let after: Vec<u8> = (0..4096)
        // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
        .map(|i| unsafe { std::ptr::read_volatile(big.as_ptr().add(i)) })
        .collect();
    assert!(after.iter().all(|&b| b == 0), "no byte may be written");
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe { softroce::verbs::mr::ibv_dereg_mr(mr) };
}

#[test]
fn remote_write_without_mr_permission_is_rejected() {
    let c = open("127.0.21.2");
    let target = Buf::new(&c, 4096, 1 | 4); // LOCAL_WRITE | REMOTE_READ only
    write_expecting_access_error(&c, target.addr(), target.rkey(), 128);
    assert!(target.read().iter().all(|&b| b == 0));
}

#[test]
fn retry_and_rnr_exhaustion_report_their_status() {
    let c = open("127.0.21.2");
    let mut src = Buf::new(&c, 64, ACCESS_ALL);
    src.fill(|i| i as u8);

    // A peer QP number nobody owns: no ACK ever comes back.
    let a = create_qp(&c);
    connect(&c, &a, 0x00ab_cdef, 8, 2); // 4.096 us * 2^8 = 1 ms, 2 retries
    let mut sge = ibv_sge {
        addr: src.addr(),
        length: 64,
        lkey: src.lkey(),
    };
    let mut wr = send_wr(1, 2, &mut sge, SIGNALED);
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!((s.wr_id, s.status), (1, 12), "expected IBV_WC_RETRY_EXC_ERR: {s:?}");

    // A live peer without a receive WQE, and rnr_retry 0.
    let x = create_qp(&c);
    let y = create_qp(&c);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        connect_rnr0(&c, &x, (*y.qp).qp_num);
        connect(&c, &y, (*x.qp).qp_num, 14, 7);
    }
    let mut wr = send_wr(2, 2, &mut sge, SIGNALED);
    assert_eq!(post_send(&x, &mut wr), 0);
    let s = poll_one(x.cq);
    assert_eq!((s.wr_id, s.status), (2, 13), "expected IBV_WC_RNR_RETRY_EXC_ERR: {s:?}");
}

/// `ibv_query_device`'s `max_qp_rd_atom` is the limit `ibv_modify_qp`
/// enforces: `max_dest_rd_atomic` (RTR) and `max_rd_atomic` (RTS) pass at
/// it and fail with EINVAL one past it.
#[test]
fn max_rd_atomic_limit_is_what_query_device_reports() {
    let c = open("127.0.21.2");
    let q = create_qp(&c);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut dev: rdma_sys::ibv_device_attr = std::mem::zeroed();
        assert_eq!(softroce::verbs::context::ibv_query_device(c.ctx, &mut dev), 0);
        let limit = dev.max_qp_rd_atom;
        assert_eq!(limit, i32::from(softroce::driver::limits::MAX_QP_RD_ATOM));
        assert_eq!(dev.max_qp_init_rd_atom, limit);
        let limit = u8::try_from(limit).unwrap();
        let mut a: rdma_sys::ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 1;
        a.port_num = 1;
        a.qp_access_flags = 2 | 4 | 8;
        assert_eq!(ibv_modify_qp(q.qp, &mut a, 0x1 | 0x10 | 0x20 | 0x8), 0, "INIT");
        let mut a: rdma_sys::ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 2;
        a.path_mtu = 3;
        a.dest_qp_num = (*q.qp).qp_num;
        a.min_rnr_timer = 1;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = gid(&c, 3);
        a.ah_attr.grh.sgid_index = 3;
        a.ah_attr.port_num = 1;
        let rtr = 0x1 | 0x80 | 0x100 | 0x100000 | 0x1000 | 0x20000 | 0x8000;
        a.max_dest_rd_atomic = limit + 1;
        assert_eq!(ibv_modify_qp(q.qp, &mut a, rtr), libc::EINVAL, "RTR one past the limit");
        assert_eq!((*q.qp).state, 1, "a refused modify leaves the QP in INIT");
        a.max_dest_rd_atomic = limit;
        assert_eq!(ibv_modify_qp(q.qp, &mut a, rtr), 0, "RTR at the limit");
        let mut a: rdma_sys::ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 3;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        let rts = 0x1 | 0x10000 | 0x200 | 0x400 | 0x800 | 0x2000;
        a.max_rd_atomic = limit + 1;
        assert_eq!(ibv_modify_qp(q.qp, &mut a, rts), libc::EINVAL, "RTS one past the limit");
        assert_eq!((*q.qp).state, 2, "a refused modify leaves the QP in RTR");
        a.max_rd_atomic = limit;
        assert_eq!(ibv_modify_qp(q.qp, &mut a, rts), 0, "RTS at the limit");
    }
}

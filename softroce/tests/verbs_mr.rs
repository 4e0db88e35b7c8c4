//! Memory-region flavours (IOVA ≠ address, dmabuf from a memfd), completion
//! channels and async events, through the exported ABI.

mod verbs_util;

use std::ptr::null_mut;

use rdma_sys::{ibv_async_event, ibv_sge};
use softroce::verbs::context::{ibv_ack_async_event, ibv_get_async_event};
use softroce::verbs::cq::{
    ibv_ack_cq_events, ibv_create_comp_channel, ibv_create_cq, ibv_destroy_cq, ibv_get_cq_event,
};
use softroce::verbs::mr::{ibv_dereg_mr, ibv_reg_dmabuf_mr, ibv_reg_mr_iova2};
use softroce::verbs::qp::ibv_destroy_qp;
use verbs_util::*;

const ADDR: &str = "127.0.21.3";

#[test]
fn iova_differs_from_address() {
    let c = open(ADDR);
    let (a, b) = pair(&c);
    let _ = &b;
    let mut target = vec![0u8; 4096];
    let iova = 0x5000_0000u64;
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    let mr = unsafe {
        ibv_reg_mr_iova2(
            c.pd,
            target.as_mut_ptr() as *mut _,
            4096,
            iova,
            (ACCESS_ALL | 0x100000) as u32,
        )
    };
    assert!(!mr.is_null(), "optional-range access bits must be accepted");
    // Local SGEs of an IOVA MR are in IOVA space too: send from it.
    let mut src = vec![0u8; 4096];
    for (i, b) in src.iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    let smr = unsafe { ibv_reg_mr_iova2(c.pd, src.as_mut_ptr() as *mut _, 4096, 0x7000_0000, ACCESS_ALL as u32) };
    assert!(!smr.is_null());
    let mut sge = ibv_sge {
        addr: 0x7000_0000 + 8,
        length: 1000,
        // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
        lkey: unsafe { (*smr).lkey },
    };
    let mut wr = send_wr(1, 0, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = iova + 16;
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    wr.wr.rdma.rkey = unsafe { (*mr).rkey };
    assert_eq!(post_send(&a, &mut wr), 0);
    let s = poll_one(a.cq);
    assert_eq!(s.status, 0, "{s:?}");
    let got: Vec<u8> = (0..4096)
        // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
        .map(|i| unsafe { std::ptr::read_volatile(target.as_ptr().add(i)) })
        .collect();
    assert_eq!(&got[16..1016], &src[8..1008]);
    assert!(got[..16].iter().chain(got[1016..].iter()).all(|&x| x == 0));
    // The host address is not a valid remote address for this MR.
    let (a2, _b2) = pair(&c);
    let mut wr = send_wr(2, 0, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = target.as_ptr() as u64;
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    wr.wr.rdma.rkey = unsafe { (*mr).rkey };
    assert_eq!(post_send(&a2, &mut wr), 0);
    assert_eq!(poll_one(a2.cq).status, 10);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        ibv_dereg_mr(mr);
        ibv_dereg_mr(smr);
    }
}

#[test]
fn dmabuf_mr_maps_the_fd() {
    let c = open(ADDR);
    let (a, _b) = pair(&c);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let fd = libc::memfd_create(c"softroce-test".as_ptr(), 0);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, 3 * 4096), 0);
        let view = libc::mmap(
            null_mut(),
            3 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        ) as *mut u8;
        assert_ne!(view as *mut libc::c_void, libc::MAP_FAILED);
        let iova = 0x9000_0000u64;
        let mr = ibv_reg_dmabuf_mr(c.pd, 4096 + 512, 4096, iova, fd, ACCESS_ALL);
        assert!(
            !mr.is_null(),
            "reg_dmabuf_mr failed: errno {}",
            *libc::__errno_location()
        );
        assert_eq!((*mr).length, 4096);
        libc::close(fd); // the MR must not depend on the fd
        let mut src = Buf::new(&c, 256, ACCESS_ALL);
        src.fill(|i| 255 - i as u8);
        let mut sge = ibv_sge {
            addr: src.addr(),
            length: 256,
            lkey: src.lkey(),
        };
        let mut wr = send_wr(1, 0, &mut sge, SIGNALED);
        wr.wr.rdma.remote_addr = iova + 100;
        wr.wr.rdma.rkey = (*mr).rkey;
        assert_eq!(post_send(&a, &mut wr), 0);
        assert_eq!(poll_one(a.cq).status, 0);
        let at = |o: usize| std::ptr::read_volatile(view.add(o));
        for i in 0..256 {
            assert_eq!(at(4096 + 512 + 100 + i), 255 - i as u8);
        }
        assert_eq!(at(4096 + 512 + 99), 0);
        assert_eq!(at(4096 + 512 + 356), 0);
        assert_eq!(ibv_dereg_mr(mr), 0);
        libc::munmap(view as *mut _, 3 * 4096);
    }
}

/// Like the kernel, registration fails with EFAULT for memory the process cannot use as the
/// access asks (a reserved range such as a GPU pointer without peer memory, a freed mapping, a
/// read-only page the NIC would write), instead of faulting later in the engine.
#[test]
fn memory_that_is_not_there_or_not_writable_is_refused_with_efault() {
    let c = open(ADDR);
    // SAFETY: test code: fresh anonymous mappings, registered and unmapped here only.
    unsafe {
        let page = |prot| libc::mmap(null_mut(), 4096, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        let errno = || *libc::__errno_location();
        let reserved = page(libc::PROT_NONE);
        assert!(ibv_reg_mr_iova2(c.pd, reserved, 4096, reserved as u64, 0).is_null());
        assert_eq!(errno(), libc::EFAULT, "PROT_NONE");
        libc::munmap(reserved, 4096);
        // Not the page just unmapped, which another test thread's mmap may take at once: a
        // low page no mmap without MAP_FIXED ever returns.
        let unmapped = 0x1000 as *mut libc::c_void;
        assert!(ibv_reg_mr_iova2(c.pd, unmapped, 4096, unmapped as u64, 0).is_null());
        assert_eq!(errno(), libc::EFAULT, "unmapped");
        let read_only = page(libc::PROT_READ);
        assert!(ibv_reg_mr_iova2(c.pd, read_only, 4096, read_only as u64, ACCESS_ALL as u32).is_null());
        assert_eq!(errno(), libc::EFAULT, "read-only memory registered for writing");
        let mr = ibv_reg_mr_iova2(c.pd, read_only, 4096, read_only as u64, 4 /* REMOTE_READ */);
        assert!(!mr.is_null(), "read-only memory for remote reads: errno {}", errno());
        assert_eq!(ibv_dereg_mr(mr), 0);
        libc::munmap(read_only, 4096);
    }
}

#[test]
fn completion_channel_and_async_event() {
    let c = open(ADDR);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let ch = ibv_create_comp_channel(c.ctx);
        assert!(!ch.is_null());
        let cq = ibv_create_cq(c.ctx, 16, 0x1234 as *mut _, ch, 0);
        assert!(!cq.is_null());
        // QP `a` sends on the channel CQ; `b` is its peer with its own CQ.
        let a = create_qp_on(&c, cq);
        let b = create_qp(&c);
        connect(&c, &a, (*b.qp).qp_num, 14, 7);
        connect(&c, &b, (*a.qp).qp_num, 14, 7);
        let arm = (*c.ctx).ops.req_notify_cq.unwrap();
        assert_eq!(arm(cq, 0), 0);
        let src = Buf::new(&c, 64, ACCESS_ALL);
        let dst = Buf::new(&c, 64, ACCESS_ALL);
        let mut sge = ibv_sge {
            addr: src.addr(),
            length: 64,
            lkey: src.lkey(),
        };
        let mut wr = send_wr(9, 0, &mut sge, SIGNALED);
        wr.wr.rdma.remote_addr = dst.addr();
        wr.wr.rdma.rkey = dst.rkey();
        assert_eq!(post_send(&a, &mut wr), 0);
        let mut pfd = libc::pollfd {
            fd: (*ch).fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut pfd, 1, 5000), 1, "channel fd must become readable");
        let mut ev_cq = null_mut();
        let mut ev_ctx = null_mut();
        assert_eq!(ibv_get_cq_event(ch, &mut ev_cq, &mut ev_ctx), 0);
        assert_eq!((ev_cq, ev_ctx as usize), (cq, 0x1234));
        ibv_ack_cq_events(cq, 1);
        assert_eq!(poll_one(cq).wr_id, 9);

        // A remote access violation: the responder QP `b` reports an async event.
        let mut wr = send_wr(10, 0, &mut sge, SIGNALED);
        wr.wr.rdma.remote_addr = dst.addr();
        wr.wr.rdma.rkey = dst.rkey() ^ 0x4400;
        assert_eq!(post_send(&a, &mut wr), 0);
        assert_eq!(poll_one(cq).status, 10);
        let mut pfd = libc::pollfd {
            fd: (*c.ctx).async_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        assert_eq!(libc::poll(&mut pfd, 1, 5000), 1, "async fd must become readable");
        let mut ev: ibv_async_event = std::mem::zeroed();
        let mut seen = Vec::new();
        while libc::poll(&mut pfd, 1, 200) == 1 {
            assert_eq!(ibv_get_async_event(c.ctx, &mut ev), 0);
            seen.push((ev.event_type as u32, ev.element.qp));
            ibv_ack_async_event(&mut ev);
        }
        assert!(
            seen.iter().any(|&(t, q)| t == 3 && q == b.qp),
            "expected IBV_EVENT_QP_ACCESS_ERR on the responder QP, got {seen:?}"
        );
    }
}

/// A CQ of 2 entries that QP `a` overruns with 4 signaled 64-byte writes to QP `b` (the CQ
/// raises IBV_EVENT_CQ_ERR); the buffers are returned so they outlive the writes.
///
/// # Safety
/// Test code: `c` is open; the returned objects are used only while `c` is.
unsafe fn overrun_cq(c: &Ctx) -> (*mut rdma_sys::ibv_cq, Qp, Qp, (Buf, Buf)) {
    // SAFETY: per the contract; every pointer comes from the verbs calls here.
    unsafe {
        let cq = ibv_create_cq(c.ctx, 2, null_mut(), null_mut(), 0);
        assert!(!cq.is_null());
        let a = create_qp_on(c, cq);
        let b = create_qp(c);
        connect(c, &a, (*b.qp).qp_num, 14, 7);
        connect(c, &b, (*a.qp).qp_num, 14, 7);
        let src = Buf::new(c, 64, ACCESS_ALL);
        let dst = Buf::new(c, 64, ACCESS_ALL);
        for i in 0..4 {
            let mut sge = ibv_sge {
                addr: src.addr(),
                length: 64,
                lkey: src.lkey(),
            };
            let mut wr = send_wr(i, 0, &mut sge, SIGNALED);
            wr.wr.rdma.remote_addr = dst.addr();
            wr.wr.rdma.rkey = dst.rkey();
            assert_eq!(post_send(&a, &mut wr), 0);
        }
        (cq, a, b, (src, dst))
    }
}

#[test]
fn cq_overrun_raises_cq_err() {
    let c = open(ADDR);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let (cq, _a, _b, _bufs) = overrun_cq(&c);
        let mut pfd = libc::pollfd {
            fd: (*c.ctx).async_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut seen = Vec::new();
        while libc::poll(&mut pfd, 1, 2000) == 1 {
            let mut ev: ibv_async_event = std::mem::zeroed();
            assert_eq!(ibv_get_async_event(c.ctx, &mut ev), 0);
            seen.push((ev.event_type as u32, ev.element.cq));
            ibv_ack_async_event(&mut ev);
            if seen.iter().any(|&(t, q)| t == 0 && q == cq) {
                break;
            }
        }
        assert!(
            seen.iter().any(|&(t, q)| t == 0 && q == cq),
            "expected IBV_EVENT_CQ_ERR, got {seen:?}"
        );
        // Nothing was lost: all four completions can still be polled.
        for i in 0..4 {
            assert_eq!(poll_one(cq).wr_id, i);
        }
    }
}

/// The event an application holds, handed to the thread that acknowledges it.
struct HeldEvent(ibv_async_event);
// SAFETY: the event's element pointer is only passed back to softroce (ibv_ack_async_event),
// which is thread-safe; the test never dereferences it.
unsafe impl Send for HeldEvent {}

/// `ibv_destroy_cq` waits until the application acknowledged the IBV_EVENT_CQ_ERR it holds
/// (as rdma-core does, and as ibv_destroy_qp does for QP events): the CQ is not freed under an
/// acknowledgement that still writes to it (a data race ThreadSanitizer found in the plugin's
/// event thread against a close).
#[test]
fn destroy_cq_waits_for_its_cq_err_to_be_acknowledged() {
    let c = open(ADDR);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let (cq, a, _b, _bufs) = overrun_cq(&c);
        let mut pfd = libc::pollfd {
            fd: (*c.ctx).async_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut held = None;
        while held.is_none() && libc::poll(&mut pfd, 1, 2000) == 1 {
            let mut ev: ibv_async_event = std::mem::zeroed();
            assert_eq!(ibv_get_async_event(c.ctx, &mut ev), 0);
            if ev.event_type as u32 == 0 && ev.element.cq == cq {
                held = Some(HeldEvent(ev));
            } else {
                ibv_ack_async_event(&mut ev);
            }
        }
        let held = held.expect("IBV_EVENT_CQ_ERR");
        assert_eq!(ibv_destroy_qp(a.qp), 0);
        let acked = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acker = {
            let acked = acked.clone();
            std::thread::spawn(move || {
                let mut held = held;
                std::thread::sleep(std::time::Duration::from_millis(300));
                acked.store(true, std::sync::atomic::Ordering::SeqCst);
                // (Inside the test's unsafe block: the event came from ibv_get_async_event and
                // is acked once.)
                ibv_ack_async_event(&mut held.0);
            })
        };
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert!(
            acked.load(std::sync::atomic::Ordering::SeqCst),
            "ibv_destroy_cq returned before its CQ_ERR was acknowledged"
        );
        acker.join().unwrap();
    }
}

#[test]
fn solicited_only_arming_ignores_unsolicited_sends() {
    let c = open(ADDR);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let ch = ibv_create_comp_channel(c.ctx);
        let rcq = ibv_create_cq(c.ctx, 16, null_mut(), ch, 0);
        assert!(!rcq.is_null());
        let a = create_qp(&c);
        let b = create_qp_on(&c, rcq);
        connect(&c, &a, (*b.qp).qp_num, 14, 7);
        connect(&c, &b, (*a.qp).qp_num, 14, 7);
        let src = Buf::new(&c, 64, ACCESS_ALL);
        let dst = Buf::new(&c, 64, ACCESS_ALL);
        post_recv(&b, dst.addr(), 64, dst.lkey(), 1);
        post_recv(&b, dst.addr(), 64, dst.lkey(), 2);
        let arm = (*c.ctx).ops.req_notify_cq.unwrap();
        assert_eq!(arm(rcq, 1), 0);
        let mut pfd = libc::pollfd {
            fd: (*ch).fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut sge = ibv_sge {
            addr: src.addr(),
            length: 64,
            lkey: src.lkey(),
        };
        let mut wr = send_wr(10, 2, &mut sge, SIGNALED);
        assert_eq!(post_send(&a, &mut wr), 0);
        assert_eq!(poll_one(a.cq).status, 0);
        assert_eq!(poll_one(rcq).wr_id, 1);
        assert_eq!(libc::poll(&mut pfd, 1, 100), 0, "unsolicited SEND must not fire");
        let mut wr = send_wr(11, 2, &mut sge, SIGNALED | 4); // IBV_SEND_SOLICITED
        assert_eq!(post_send(&a, &mut wr), 0);
        assert_eq!(libc::poll(&mut pfd, 1, 5000), 1, "solicited SEND must fire");
        let (mut ev_cq, mut ev_ctx) = (null_mut(), null_mut());
        assert_eq!(ibv_get_cq_event(ch, &mut ev_cq, &mut ev_ctx), 0);
        assert_eq!(ev_cq, rcq);
        ibv_ack_cq_events(rcq, 1);
        assert_eq!(poll_one(rcq).wr_id, 2);
    }
}

#[test]
fn cq_ex_poll_api_with_timestamps() {
    let c = open(ADDR);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let vctx = (c.ctx as *mut u8).sub(320) as *mut rdma_sys::verbs_context;
        let create = (*vctx).create_cq_ex.expect("create_cq_ex op");
        let mut attr: rdma_sys::ibv_cq_init_attr_ex = std::mem::zeroed();
        attr.cqe = 16;
        attr.wc_flags = 1 | 128; // BYTE_LEN | COMPLETION_TIMESTAMP
        let cqx = create(c.ctx, &mut attr);
        assert!(!cqx.is_null());
        let cq = cqx as *mut rdma_sys::ibv_cq;
        let a = create_qp_on(&c, cq);
        let b = create_qp(&c);
        connect(&c, &a, (*b.qp).qp_num, 14, 7);
        connect(&c, &b, (*a.qp).qp_num, 14, 7);
        let src = Buf::new(&c, 4096, ACCESS_ALL);
        let dst = Buf::new(&c, 4096, ACCESS_ALL);
        for i in 0..2u64 {
            let mut sge = ibv_sge {
                addr: src.addr(),
                length: 1000 + i as u32,
                lkey: src.lkey(),
            };
            let mut wr = send_wr(40 + i, 0, &mut sge, SIGNALED);
            wr.wr.rdma.remote_addr = dst.addr();
            wr.wr.rdma.rkey = dst.rkey();
            assert_eq!(post_send(&a, &mut wr), 0);
        }
        let x = &*cqx;
        let mut pattr = rdma_sys::ibv_poll_cq_attr { comp_mask: 0 };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut rc = (x.start_poll.unwrap())(cqx, &mut pattr);
        while rc == libc::ENOENT {
            assert!(std::time::Instant::now() < deadline);
            rc = (x.start_poll.unwrap())(cqx, &mut pattr);
        }
        assert_eq!(rc, 0);
        assert_eq!(((*cqx).wr_id, (*cqx).status), (40, 0));
        assert_eq!((x.read_opcode.unwrap())(cqx), 1); // IBV_WC_RDMA_WRITE
        let t0 = (x.read_completion_ts.unwrap())(cqx);
        let mut rc = (x.next_poll.unwrap())(cqx);
        while rc == libc::ENOENT {
            assert!(std::time::Instant::now() < deadline);
            rc = (x.next_poll.unwrap())(cqx);
        }
        assert_eq!(((*cqx).wr_id, (*cqx).status), (41, 0));
        let t1 = (x.read_completion_ts.unwrap())(cqx);
        assert!(t0 > 0 && t1 >= t0, "timestamps {t0} {t1}");
        assert_eq!((x.next_poll.unwrap())(cqx), libc::ENOENT);
        (x.end_poll.unwrap())(cqx);
    }
}

#[test]
fn srq_shared_by_two_qps() {
    use softroce::verbs::srq::{ibv_create_srq, ibv_destroy_srq, ibv_modify_srq};
    let c = open(ADDR);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut sa: rdma_sys::ibv_srq_init_attr = std::mem::zeroed();
        sa.attr.max_wr = 8;
        sa.attr.max_sge = 1;
        let srq = ibv_create_srq(c.pd, &mut sa);
        assert!(!srq.is_null());
        let rcq = ibv_create_cq(c.ctx, 16, null_mut(), null_mut(), 0);
        // Two receivers on the SRQ, two senders.
        let mk = |srq: *mut rdma_sys::ibv_srq| {
            let mut ia: rdma_sys::ibv_qp_init_attr = std::mem::zeroed();
            ia.send_cq = rcq;
            ia.recv_cq = rcq;
            ia.srq = srq;
            ia.qp_type = 2;
            ia.cap.max_send_wr = 4;
            ia.cap.max_send_sge = 1;
            let qp = softroce::verbs::qp::ibv_create_qp(c.pd, &mut ia);
            assert!(!qp.is_null());
            Qp { qp, cq: rcq }
        };
        let r1 = mk(srq);
        let r2 = mk(srq);
        assert_eq!((*r1.qp).srq, srq);
        let s1 = create_qp(&c);
        let s2 = create_qp(&c);
        connect(&c, &s1, (*r1.qp).qp_num, 14, 7);
        connect(&c, &r1, (*s1.qp).qp_num, 14, 7);
        connect(&c, &s2, (*r2.qp).qp_num, 14, 7);
        connect(&c, &r2, (*s2.qp).qp_num, 14, 7);
        let dst = Buf::new(&c, 4 * 256, ACCESS_ALL);
        let post = |id: u64| {
            let mut sge = ibv_sge {
                addr: dst.addr() + id * 256,
                length: 256,
                lkey: dst.lkey(),
            };
            let mut wr: rdma_sys::ibv_recv_wr = std::mem::zeroed();
            wr.wr_id = id;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            let mut bad = null_mut();
            ((*c.ctx).ops.post_srq_recv.unwrap())(srq, &mut wr, &mut bad)
        };
        for id in 0..3 {
            assert_eq!(post(id), 0);
        }
        // Arm the limit at 2: taking a WQE that leaves fewer than 2 fires it.
        let mut lim: rdma_sys::ibv_srq_attr = std::mem::zeroed();
        lim.srq_limit = 2;
        assert_eq!(ibv_modify_srq(srq, &mut lim, 2), 0);
        // post_recv on an SRQ-attached QP is invalid.
        let mut rw: rdma_sys::ibv_recv_wr = std::mem::zeroed();
        let mut bad = null_mut();
        assert_eq!(
            ((*c.ctx).ops.post_recv.unwrap())(r1.qp, &mut rw, &mut bad),
            libc::EINVAL
        );

        let mut src = Buf::new(&c, 64, ACCESS_ALL);
        src.fill(|i| i as u8 + 1);
        for (n, s) in [&s1, &s2].into_iter().enumerate() {
            let mut sge = ibv_sge {
                addr: src.addr(),
                length: 10 + n as u32,
                lkey: src.lkey(),
            };
            let mut wr = send_wr(100 + n as u64, 2, &mut sge, SIGNALED);
            assert_eq!(post_send(s, &mut wr), 0);
            assert_eq!(poll_one(s.cq).status, 0);
        }
        let mut got: Vec<(u64, u32, u32)> = (0..2)
            .map(|_| {
                let w = poll_one(rcq);
                assert_eq!(w.status, 0);
                (w.wr_id, w.byte_len, w.qp_num)
            })
            .collect();
        got.sort();
        assert_eq!(got[0].0, 0, "WQEs are consumed in order");
        assert_eq!(got[1].0, 1);
        let mut lens: Vec<u32> = got.iter().map(|g| g.1).collect();
        lens.sort();
        assert_eq!(lens, vec![10, 11]);
        let qps: std::collections::HashSet<u32> = got.iter().map(|g| g.2).collect();
        assert_eq!(qps.len(), 2, "both SRQ QPs received");
        // The second take left 1 < 2 WQEs: IBV_EVENT_SRQ_LIMIT_REACHED for this SRQ.
        let mut pfd = libc::pollfd {
            fd: (*c.ctx).async_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut seen = Vec::new();
        while libc::poll(&mut pfd, 1, 1000) == 1 {
            let mut ev: ibv_async_event = std::mem::zeroed();
            assert_eq!(ibv_get_async_event(c.ctx, &mut ev), 0);
            seen.push((ev.event_type as u32, ev.element.srq));
            ibv_ack_async_event(&mut ev);
            if seen.iter().any(|&(t, s)| t == 15 && s == srq) {
                break;
            }
        }
        assert!(
            seen.iter().any(|&(t, s)| t == 15 && s == srq),
            "expected SRQ_LIMIT_REACHED, got {seen:?}"
        );
        assert_eq!(ibv_destroy_srq(srq), libc::EBUSY, "QPs still attached");
        softroce::verbs::qp::ibv_destroy_qp(r1.qp);
        softroce::verbs::qp::ibv_destroy_qp(r2.qp);
        assert_eq!(ibv_destroy_srq(srq), 0);
    }
}

/// A dma-buf registration fails as the kernel's does: EINVAL for a range past the buffer's end
/// (mapped, the engine would fault on it), EBADF for no file, EOPNOTSUPP for a file the CPU
/// cannot map (a GPU's dma-buf: softroce reaches memory only with the CPU).
#[test]
fn dmabuf_registrations_softroce_cannot_serve_fail_with_the_kernels_errno() {
    let c = open(ADDR);
    // SAFETY: test code: a fresh memfd and an eventfd, closed here, and an fd number never open.
    unsafe {
        let errno = || *libc::__errno_location();
        let fd = libc::memfd_create(c"softroce-test".as_ptr(), 0);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, 2 * 4096), 0);
        assert!(ibv_reg_dmabuf_mr(c.pd, 4096, 4097, 0x9000_0000, fd, ACCESS_ALL).is_null());
        assert_eq!(errno(), libc::EINVAL, "a range past the end");
        assert!(ibv_reg_dmabuf_mr(c.pd, u64::MAX - 10, 4096, 0x9000_0000, fd, ACCESS_ALL).is_null());
        assert_eq!(errno(), libc::EINVAL, "a range that wraps");
        let mr = ibv_reg_dmabuf_mr(c.pd, 4096, 4096, 0x9000_0000, fd, ACCESS_ALL);
        assert!(!mr.is_null(), "the last page fits: errno {}", errno());
        assert_eq!(ibv_dereg_mr(mr), 0);
        libc::close(fd);
        // Not the number just closed: another test thread's open may take it at once.
        let not_open = i32::MAX;
        assert!(ibv_reg_dmabuf_mr(c.pd, 0, 4096, 0x9000_0000, not_open, ACCESS_ALL).is_null());
        assert_eq!(errno(), libc::EBADF, "an fd that is not open");
        // A file the CPU cannot map, as a GPU's dma-buf.
        let efd = libc::eventfd(0, 0);
        assert!(efd >= 0);
        assert!(ibv_reg_dmabuf_mr(c.pd, 0, 4096, 0x9000_0000, efd, ACCESS_ALL).is_null());
        assert_eq!(errno(), libc::EOPNOTSUPP, "a file the CPU cannot map");
        libc::close(efd);
    }
}

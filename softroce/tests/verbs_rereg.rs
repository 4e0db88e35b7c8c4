//! `ibv_rereg_mr` (new translation, new PD, new access, and the error codes of libibverbs and the
//! kernel) and the cleaning of a QP's completions when it moves to RESET, through the exported
//! ABI (docs/softroce-pyverbs.md).

mod verbs_util;

use std::ptr::null_mut;

use rdma_sys::ibv_qp_attr;
use softroce::verbs::mr::{ibv_alloc_pd, ibv_dealloc_pd, ibv_reg_dmabuf_mr, ibv_rereg_mr};
use softroce::verbs::qp::ibv_modify_qp;
use verbs_util::*;

const ADDR: &str = "127.0.21.41";

const TRANSLATION: i32 = 1;
const CHANGE_PD: i32 = 2;
const ACCESS: i32 = 4;
const ERR_INPUT: i32 = -1;
const ERR_CMD: i32 = -4;
const WR_RDMA_WRITE: u32 = 0;
const WC_REM_ACCESS_ERR: u32 = 10;
const WC_WR_FLUSH_ERR: u32 = 5;

fn errno() -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// RDMA WRITE of `len` bytes of `src` to `raddr`/`rkey` through `q`; the completion's status.
fn write_to(q: &Qp, src: &Buf, len: usize, raddr: u64, rkey: u32) -> u32 {
    let mut sge = src.sge(len);
    let mut wr = send_wr(1, WR_RDMA_WRITE, &mut sge, SIGNALED);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    assert_eq!(post_send(q, &mut wr), 0);
    poll_one(q.cq).status
}

fn modify_state(q: &Qp, state: u32) {
    // SAFETY: test code: q.qp is a live QP; attr is a local.
    unsafe {
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = state;
        assert_eq!(ibv_modify_qp(q.qp, &mut a, 1 /* IBV_QP_STATE */), 0);
    }
}

/// Pending completions of `q.cq`, polled without waiting.
fn drain(q: &Qp) -> Vec<Wc> {
    let mut out = Vec::new();
    // SAFETY: test code: the CQ is live; poll_cq through ctx->ops as rdma-core's inline does.
    unsafe {
        let f = (*(*q.cq).context).ops.poll_cq.unwrap();
        loop {
            let mut wc: rdma_sys::ibv_wc = std::mem::zeroed();
            if f(q.cq, 1, &mut wc) != 1 {
                return out;
            }
            out.push(Wc {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                imm: 0,
                flags: wc.wc_flags,
                qp_num: wc.qp_num,
                src_qp: wc.src_qp,
            });
        }
    }
}

#[test]
fn new_translation_moves_the_mr_and_keeps_its_keys() {
    let c = open(ADDR);
    let (a, _b) = pair(&c);
    let mut src = Buf::new(&c, 4096, ACCESS_ALL);
    src.fill(|i| (i * 3) as u8);
    let target = Buf::new(&c, 4096, ACCESS_ALL);
    let mut other = vec![0u8; 8192];
    let (lkey, rkey) = (target.lkey(), target.rkey());
    let new_addr = other.as_mut_ptr() as usize + 4096;
    // SAFETY: test code: target.mr is live; `other` outlives the registration (target drops first).
    unsafe {
        assert_eq!(
            ibv_rereg_mr(target.mr, TRANSLATION, null_mut(), new_addr as *mut _, 4096, 0),
            0
        );
        assert_eq!((*target.mr).addr as usize, new_addr);
        assert_eq!((*target.mr).length, 4096);
        assert_eq!(((*target.mr).lkey, (*target.mr).rkey), (lkey, rkey));
    }
    assert_eq!(write_to(&a, &src, 1000, new_addr as u64 + 8, rkey), 0);
    // SAFETY: test code: volatile reads of `other`, which the engine wrote.
    let got: Vec<u8> = (0..8192)
        .map(|i| unsafe { std::ptr::read_volatile(other.as_ptr().add(i)) })
        .collect();
    assert_eq!(&got[4096 + 8..4096 + 1008], &src.read()[..1000]);
    assert!(got[..4096 + 8].iter().all(|&x| x == 0));
    // The old range is no longer part of the MR.
    let (a2, _b2) = pair(&c);
    assert_eq!(write_to(&a2, &src, 16, target.addr(), rkey), WC_REM_ACCESS_ERR);
    assert!(target.read().iter().all(|&x| x == 0));
    drop(target);
    drop(other);
}

#[test]
fn new_pd_takes_the_mr_out_of_the_qps_reach_and_back() {
    let c = open(ADDR);
    let src = Buf::new(&c, 256, ACCESS_ALL);
    let target = Buf::new(&c, 256, ACCESS_ALL);
    // SAFETY: test code: every pointer comes from the verbs calls here.
    unsafe {
        let pd2 = ibv_alloc_pd(c.ctx);
        assert!(!pd2.is_null());
        let (a, _b) = pair(&c);
        assert_eq!(write_to(&a, &src, 64, target.addr(), target.rkey()), 0);
        assert_eq!(ibv_rereg_mr(target.mr, CHANGE_PD, pd2, null_mut(), 0, 0), 0);
        assert_eq!((*target.mr).pd, pd2);
        // The QPs are on c.pd: the MR is now out of their protection domain.
        assert_eq!(write_to(&a, &src, 64, target.addr(), target.rkey()), WC_REM_ACCESS_ERR);
        assert_eq!(ibv_dealloc_pd(pd2), libc::EBUSY, "pd2 holds the MR");
        assert_eq!(ibv_rereg_mr(target.mr, CHANGE_PD, c.pd, null_mut(), 0, 0), 0);
        let (a2, _b2) = pair(&c);
        assert_eq!(write_to(&a2, &src, 64, target.addr(), target.rkey()), 0);
        assert_eq!(ibv_dealloc_pd(pd2), 0);
        // A PD deallocated, or of a context that does not share this one's command file.
        assert_eq!(
            ibv_rereg_mr(target.mr, CHANGE_PD, null_mut(), null_mut(), 0, 0),
            ERR_CMD
        );
        assert_eq!(errno(), libc::EINVAL);
        let c2 = reopen();
        assert_eq!(ibv_rereg_mr(target.mr, CHANGE_PD, c2.pd, null_mut(), 0, 0), ERR_CMD);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!((*target.mr).pd, c.pd, "a failed rereg changes nothing");
    }
}

#[test]
fn new_access_is_checked_and_enforced() {
    let c = open(ADDR);
    let (a, _b) = pair(&c);
    let src = Buf::new(&c, 256, ACCESS_ALL);
    let target = Buf::new(&c, 256, 1 /* LOCAL_WRITE */);
    // SAFETY: test code: every pointer comes from the verbs calls here.
    unsafe {
        assert_eq!(ibv_rereg_mr(target.mr, ACCESS, null_mut(), null_mut(), 0, 2), ERR_CMD);
        assert_eq!(errno(), libc::EINVAL, "REMOTE_WRITE without LOCAL_WRITE");
        assert_eq!(ibv_rereg_mr(target.mr, ACCESS, null_mut(), null_mut(), 0, 1 | 2), 0);
    }
    assert_eq!(write_to(&a, &src, 64, target.addr(), target.rkey()), 0);
    // SAFETY: as above.
    unsafe { assert_eq!(ibv_rereg_mr(target.mr, ACCESS, null_mut(), null_mut(), 0, 1), 0) };
    let (a2, _b2) = pair(&c);
    assert_eq!(write_to(&a2, &src, 64, target.addr(), target.rkey()), WC_REM_ACCESS_ERR);
    // A page the NIC could only read cannot become writable through a new access.
    // SAFETY: test code: a fresh read-only anonymous page, registered and unmapped here only.
    unsafe {
        let ro = libc::mmap(
            null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(ro, libc::MAP_FAILED);
        let mr = softroce::verbs::mr::ibv_reg_mr(c.pd, ro, 4096, 4 /* REMOTE_READ */);
        assert!(!mr.is_null());
        assert_eq!(ibv_rereg_mr(mr, ACCESS, null_mut(), null_mut(), 0, ACCESS_ALL), ERR_CMD);
        assert_eq!(errno(), libc::EFAULT);
        assert_eq!(softroce::verbs::mr::ibv_dereg_mr(mr), 0);
        libc::munmap(ro, 4096);
    }
}

/// The return codes are libibverbs' `enum ibv_rereg_mr_err_code`: its own argument checks give
/// IBV_REREG_MR_ERR_INPUT, what the kernel refuses IBV_REREG_MR_ERR_CMD.
#[test]
fn errors_are_libibverbs_codes() {
    let c = open(ADDR);
    let target = Buf::new(&c, 4096, ACCESS_ALL);
    let addr = target.addr() as *mut libc::c_void;
    // SAFETY: test code: every pointer comes from the verbs calls here or is NULL.
    unsafe {
        for (flags, a, len, access, code, e, what) in [
            (8, addr, 4096, 0, ERR_INPUT, libc::EINVAL, "unknown flag"),
            (
                TRANSLATION,
                null_mut(),
                4096,
                0,
                ERR_INPUT,
                libc::EINVAL,
                "NULL address",
            ),
            (TRANSLATION, addr, 0, 0, ERR_INPUT, libc::EINVAL, "length 0"),
            (
                TRANSLATION,
                addr,
                4096,
                1,
                ERR_INPUT,
                libc::EINVAL,
                "access without CHANGE_ACCESS",
            ),
            (0, null_mut(), 0, 0, ERR_CMD, libc::EINVAL, "no flag"),
        ] {
            assert_eq!(
                ibv_rereg_mr(target.mr, flags, null_mut(), a, len, access),
                code,
                "{what}"
            );
            assert_eq!(errno(), e, "{what}");
        }
        // Unmapped memory: a low page no mmap without MAP_FIXED ever returns (not a page just
        // unmapped, which another test thread's mmap may take at once).
        let gone = 0x1000 as *mut libc::c_void;
        assert_eq!(ibv_rereg_mr(target.mr, TRANSLATION, null_mut(), gone, 4096, 0), ERR_CMD);
        assert_eq!(errno(), libc::EFAULT);
        assert_eq!((*target.mr).addr, addr, "a failed rereg changes nothing");
        // A dmabuf MR is no IBV_MR_TYPE_MR.
        let fd = libc::memfd_create(c"softroce-rereg".as_ptr(), 0);
        assert!(fd >= 0 && libc::ftruncate(fd, 4096) == 0);
        let dmr = ibv_reg_dmabuf_mr(c.pd, 0, 4096, 0x1000_0000, fd, ACCESS_ALL);
        assert!(!dmr.is_null());
        assert_eq!(ibv_rereg_mr(dmr, ACCESS, null_mut(), null_mut(), 0, 1), ERR_INPUT);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(softroce::verbs::mr::ibv_dereg_mr(dmr), 0);
        libc::close(fd);
    }
    // The MR still works after all these refusals.
    let (a, _b) = pair(&c);
    let src = Buf::new(&c, 64, ACCESS_ALL);
    assert_eq!(write_to(&a, &src, 64, target.addr(), target.rkey()), 0);
}

/// As rdma-core's mlx4/mlx5 providers: moving a QP to RESET removes its completions not yet
/// polled from its CQs (a QP brought back from ERR must not hand its flushed WRs to the next
/// poll), and only its own.
#[test]
fn reset_removes_the_qps_unpolled_completions() {
    let c = open(ADDR);
    // SAFETY: test code: a CQ of this context, shared by the two QPs below.
    let cq = unsafe { softroce::verbs::cq::ibv_create_cq(c.ctx, 64, null_mut(), null_mut(), 0) };
    assert!(!cq.is_null());
    let (x, y) = (create_qp_on(&c, cq), create_qp_on(&c, cq));
    let buf = Buf::new(&c, 64, ACCESS_ALL);
    // SAFETY: test code: both QPs are live.
    let (xn, yn) = unsafe { ((*x.qp).qp_num, (*y.qp).qp_num) };
    connect(&c, &x, yn, 14, 7);
    connect(&c, &y, xn, 14, 7);
    for i in 0..3 {
        post_recv(&x, buf.addr(), 64, buf.lkey(), 100 + i);
        post_recv(&y, buf.addr(), 64, buf.lkey(), 200 + i);
    }
    modify_state(&x, 6 /* ERR */);
    modify_state(&y, 6);
    modify_state(&x, 0 /* RESET */);
    let left = drain(&x);
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(
        left.iter().all(|w| w.qp_num == yn && w.status == WC_WR_FLUSH_ERR),
        "{left:?}"
    );
    // Back to RTS: the first completion is the new work's.
    modify_state(&y, 0);
    connect(&c, &x, yn, 14, 7);
    connect(&c, &y, xn, 14, 7);
    post_recv(&y, buf.addr(), 64, buf.lkey(), 7);
    let src = Buf::new(&c, 64, ACCESS_ALL);
    let mut sge = src.sge(64);
    let mut wr = send_wr(8, 2 /* SEND */, &mut sge, SIGNALED);
    assert_eq!(post_send(&x, &mut wr), 0);
    let mut ids = [poll_one(cq), poll_one(cq)].map(|w| (w.wr_id, w.status));
    ids.sort();
    assert_eq!(ids, [(7, 0), (8, 0)]);
}

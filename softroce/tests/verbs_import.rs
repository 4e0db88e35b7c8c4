//! Sharing PDs and MRs between contexts of one process through a command fd
//! (`ibv_import_device`, `ibv_import_pd`, `ibv_import_mr` and their unimports), through the
//! exported ABI (docs/softroce-pyverbs.md#shared-pd).

mod verbs_util;

use std::ptr::null_mut;

use rdma_sys::{ibv_context, ibv_qp_init_attr};
use softroce::verbs::context::ibv_close_device;
use softroce::verbs::cq::ibv_create_cq;
use softroce::verbs::misc::{ibv_import_device, ibv_import_mr, ibv_import_pd, ibv_unimport_mr, ibv_unimport_pd};
use softroce::verbs::mr::{ibv_alloc_pd, ibv_dealloc_pd, ibv_dereg_mr, ibv_reg_mr};
use softroce::verbs::qp::ibv_create_qp;
use verbs_util::*;

const ADDR: &str = "127.0.21.42";
const WR_RDMA_WRITE: u32 = 0;
const WC_REM_ACCESS_ERR: u32 = 10;

fn errno() -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// A context imported from a dup of `c`'s command fd.
fn import(c: &Ctx) -> *mut ibv_context {
    // SAFETY: test code: c.ctx is live; the dup is handed to the new context.
    unsafe {
        let fd = libc::dup((*c.ctx).cmd_fd);
        assert!(fd >= 0, "cmd_fd must be a real fd (pyverbs dups it)");
        let ctx = ibv_import_device(fd);
        assert!(!ctx.is_null(), "import_device: errno {}", errno());
        ctx
    }
}

fn fd_is_open(fd: i32) -> bool {
    // SAFETY: F_GETFD only inspects the descriptor.
    unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
}

/// The file `fd` names (device and inode), if it is open. A closed fd's number may be taken at
/// once by another test thread's open, so "closed" is checked as "no longer names that file".
fn file_of(fd: i32) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid out-parameter; fstat only writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st outlives the call; fstat fails cleanly on a closed fd.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

#[test]
fn imported_pd_and_mr_are_the_originals() {
    let c = open(ADDR);
    let mut target = Buf::new(&c, 256, ACCESS_ALL);
    target.fill(|_| 0);
    // SAFETY: test code: every pointer comes from the verbs calls here.
    unsafe {
        let ctx2 = import(&c);
        assert_eq!((*ctx2).device, (*c.ctx).device);
        assert_ne!((*ctx2).cmd_fd, (*c.ctx).cmd_fd);
        let pd2 = ibv_import_pd(ctx2, (*c.pd).handle);
        assert!(!pd2.is_null(), "import_pd: errno {}", errno());
        assert_eq!(((*pd2).context, (*pd2).handle), (ctx2, (*c.pd).handle));
        let mr2 = ibv_import_mr(pd2, (*target.mr).handle);
        assert!(!mr2.is_null(), "import_mr: errno {}", errno());
        assert_eq!(
            ((*mr2).lkey, (*mr2).rkey, (*mr2).length),
            (target.lkey(), target.rkey(), 256)
        );
        assert!((*mr2).addr.is_null(), "rdma-core leaves an imported MR's addr NULL");
        assert_eq!(((*mr2).pd, (*mr2).context), (pd2, ctx2));

        // A QP of the imported context on the imported PD writes into the original MR, from a
        // buffer registered on the imported PD: one PD, two pointers.
        let cq = ibv_create_cq(ctx2, 16, null_mut(), null_mut(), 0);
        assert!(!cq.is_null());
        let mut ia: ibv_qp_init_attr = std::mem::zeroed();
        ia.send_cq = cq;
        ia.recv_cq = cq;
        ia.qp_type = 2; // RC
        ia.cap.max_send_wr = 8;
        ia.cap.max_recv_wr = 8;
        ia.cap.max_send_sge = 1;
        ia.cap.max_recv_sge = 1;
        let qp = ibv_create_qp(pd2, &mut ia);
        assert!(!qp.is_null(), "create_qp on the imported PD: errno {}", errno());
        let a = Qp { qp, cq };
        let b = create_qp(&c);
        connect(&c, &a, (*b.qp).qp_num, 14, 7);
        connect(&c, &b, (*a.qp).qp_num, 14, 7);
        let mut src = vec![0x5au8; 64];
        let smr = ibv_reg_mr(pd2, src.as_mut_ptr() as *mut _, 64, ACCESS_ALL);
        assert!(!smr.is_null());
        let mut sge = rdma_sys::ibv_sge {
            addr: src.as_ptr() as u64,
            length: 64,
            lkey: (*smr).lkey,
        };
        let mut wr = send_wr(1, WR_RDMA_WRITE, &mut sge, SIGNALED);
        wr.wr.rdma.remote_addr = target.addr();
        wr.wr.rdma.rkey = (*mr2).rkey;
        assert_eq!(post_send(&a, &mut wr), 0);
        assert_eq!(poll_one(cq).status, 0);
        assert_eq!(target.read_range(0, 64), vec![0x5a; 64]);
        assert_eq!(ibv_dealloc_pd(c.pd), libc::EBUSY, "the imported PD's MR and QP use it");

        // Unimporting frees the pointers only: the original MR and PD live on.
        ibv_unimport_mr(mr2);
        ibv_unimport_pd(pd2);
        let (x, _y) = pair(&c);
        let mut sge = target.sge(64);
        let mut wr = send_wr(2, WR_RDMA_WRITE, &mut sge, SIGNALED);
        wr.wr.rdma.remote_addr = target.addr() + 128;
        wr.wr.rdma.rkey = target.rkey();
        assert_eq!(post_send(&x, &mut wr), 0);
        assert_eq!(poll_one(x.cq).status, 0);

        // The imported context owns its fd: closing it closes the fd, and the original goes on.
        let fd2 = (*ctx2).cmd_fd;
        let file2 = file_of(fd2).expect("the imported context's fd is open");
        assert_eq!(ibv_close_device(ctx2), 0);
        assert_ne!(file_of(fd2), Some(file2), "closing the imported context closes its fd");
        assert!(fd_is_open((*c.ctx).cmd_fd));
        assert_eq!(ibv_dereg_mr(smr), 0);
        drop(src);
    }
}

#[test]
fn only_handles_of_the_shared_command_file_import() {
    let c = open(ADDR);
    let other = reopen(); // another context of the same device: its own command file
    let mr = Buf::new(&other, 64, ACCESS_ALL);
    // SAFETY: test code: every pointer comes from the verbs calls here.
    unsafe {
        assert!(ibv_import_device(-1).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut p = [0; 2];
        assert_eq!(libc::pipe(p.as_mut_ptr()), 0);
        assert!(ibv_import_device(p[0]).is_null(), "a pipe is no command fd");
        assert_eq!(errno(), libc::EINVAL);
        assert!(fd_is_open(p[0]), "a failed import leaves the fd to the caller");
        libc::close(p[0]);
        libc::close(p[1]);

        let ctx2 = import(&c);
        assert!(
            ibv_import_pd(ctx2, (*other.pd).handle).is_null(),
            "PD of another command file"
        );
        assert_eq!(errno(), libc::EINVAL);
        assert!(ibv_import_pd(ctx2, 0xdead_beef).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let pd2 = ibv_import_pd(ctx2, (*c.pd).handle);
        assert!(!pd2.is_null());
        assert!(
            ibv_import_mr(pd2, (*mr.mr).handle).is_null(),
            "MR of another command file"
        );
        assert_eq!(errno(), libc::EINVAL);
        ibv_unimport_pd(pd2);

        // A PD allocated through the imported context imports into the original one.
        let pd3 = ibv_alloc_pd(ctx2);
        assert!(!pd3.is_null());
        let pd3_orig = ibv_import_pd(c.ctx, (*pd3).handle);
        assert!(!pd3_orig.is_null(), "import_pd: errno {}", errno());
        ibv_unimport_pd(pd3_orig);
        // Deallocated through one pointer, the PD is gone for every context of the file: a
        // pointer imported before is refused by every verb (as the kernel refuses its handle)
        // and freed by ibv_unimport_pd alone.
        let pd3_stale = ibv_import_pd(c.ctx, (*pd3).handle);
        assert!(!pd3_stale.is_null(), "import_pd: errno {}", errno());
        assert_eq!(ibv_dealloc_pd(pd3), 0);
        let mut buf = vec![0u8; 64];
        assert!(
            ibv_reg_mr(pd3_stale, buf.as_mut_ptr().cast(), buf.len(), ACCESS_ALL).is_null(),
            "an MR on a deallocated PD"
        );
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ibv_dealloc_pd(pd3_stale), libc::EINVAL, "deallocated already");
        ibv_unimport_pd(pd3_stale);
        let h3 = {
            let pd = ibv_alloc_pd(ctx2);
            let h = (*pd).handle;
            assert_eq!(ibv_dealloc_pd(pd), 0);
            h
        };
        assert!(ibv_import_pd(c.ctx, h3).is_null(), "a deallocated PD");
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(ibv_close_device(ctx2), 0);
    }
}

#[test]
fn dereg_through_an_imported_mr_ends_the_registration() {
    let c = open(ADDR);
    let src = Buf::new(&c, 64, ACCESS_ALL);
    let mut mem = vec![0u8; 64];
    // SAFETY: test code: every pointer comes from the verbs calls here.
    unsafe {
        let mr = ibv_reg_mr(c.pd, mem.as_mut_ptr() as *mut _, 64, ACCESS_ALL);
        assert!(!mr.is_null());
        let ctx2 = import(&c);
        let pd2 = ibv_import_pd(ctx2, (*c.pd).handle);
        let mr2 = ibv_import_mr(pd2, (*mr).handle);
        assert!(!mr2.is_null());
        // The rereg verbs take only MRs of ibv_reg_mr (rdma-core: IBV_MR_TYPE_MR).
        assert_eq!(
            softroce::verbs::mr::ibv_rereg_mr(mr2, 4, null_mut(), null_mut(), 0, 1),
            -1
        );
        assert_eq!(ibv_dereg_mr(mr2), 0);
        assert!(ibv_import_mr(pd2, (*mr).handle).is_null(), "deregistered");
        let (a, _b) = pair(&c);
        let mut sge = src.sge(64);
        let mut wr = send_wr(1, WR_RDMA_WRITE, &mut sge, SIGNALED);
        wr.wr.rdma.remote_addr = mem.as_ptr() as u64;
        wr.wr.rdma.rkey = (*mr).rkey;
        assert_eq!(post_send(&a, &mut wr), 0);
        assert_eq!(poll_one(a.cq).status, WC_REM_ACCESS_ERR);
        // The original pointer still frees (and gives back what it pinned).
        assert_eq!(ibv_dereg_mr(mr), 0);
        ibv_unimport_pd(pd2);
        assert_eq!(ibv_close_device(ctx2), 0);
    }
    drop(mem);
}

#[test]
fn the_file_ends_with_its_last_context() {
    let c = open(ADDR);
    // SAFETY: test code: every pointer comes from the verbs calls here.
    unsafe {
        let ctx2 = import(&c);
        let dup = libc::dup((*ctx2).cmd_fd);
        assert_eq!(ibv_dealloc_pd(c.pd), 0);
        assert_eq!(ibv_close_device(c.ctx), 0);
        std::mem::forget(c); // both released above
        let ctx3 = ibv_import_device(dup);
        assert!(!ctx3.is_null(), "ctx2 keeps the file open: errno {}", errno());
        assert_eq!(ibv_close_device(ctx2), 0);
        let dup2 = libc::dup((*ctx3).cmd_fd);
        assert_eq!(ibv_close_device(ctx3), 0);
        assert!(ibv_import_device(dup2).is_null(), "no context left on the file");
        assert_eq!(errno(), libc::EINVAL);
        libc::close(dup2);
    }
}

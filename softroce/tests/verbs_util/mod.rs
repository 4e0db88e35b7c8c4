//! Shared helpers of the in-process verbs tests: open softroce0 through the
//! exported C ABI, connect two RC QPs of the same device to each other, post
//! through `ctx->ops` exactly as rdma-core's inline wrappers do.

#![allow(dead_code)]

use std::ptr::null_mut;
use std::time::{Duration, Instant};

use rdma_sys::{
    ibv_context, ibv_cq, ibv_gid, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr,
    ibv_sge, ibv_wc,
};
use softroce::verbs::context::*;
use softroce::verbs::cq::*;
use softroce::verbs::mr::*;
use softroce::verbs::port::*;
use softroce::verbs::qp::*;

pub const ACCESS_ALL: i32 = 1 | 2 | 4 | 8;

pub struct Ctx {
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
}

impl Drop for Ctx {
    /// Gives the protection domain and the context back, as an application does (without it
    /// LeakSanitizer reports them in ci/tests/80-sanitizers.sh). A verbs object still using
    /// them makes the call fail (EBUSY), which leaves them in place.
    fn drop(&mut self) {
        // SAFETY: test code: both pointers came from ibv_alloc_pd / ibv_open_device of this
        // Ctx and are released once, here.
        unsafe {
            ibv_dealloc_pd(self.pd);
            ibv_close_device(self.ctx);
        }
    }
}

/// Opens softroce0 bound to `addr` (must be called before anything else in the process).
pub fn open(addr: &str) -> Ctx {
    if std::env::var("SOFTROCE_ADDR").ok().as_deref() != Some(addr) {
        std::env::set_var("SOFTROCE_ADDR", addr);
    }
    reopen()
}

/// Opens another context on softroce0 (the address is already configured).
pub fn reopen() -> Ctx {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut n = 0;
        let list = ibv_get_device_list(&mut n);
        assert!(!list.is_null() && n >= 1);
        let ctx = ibv_open_device(*list);
        assert!(!ctx.is_null(), "open_device failed");
        ibv_free_device_list(list);
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null());
        Ctx { ctx, pd }
    }
}

pub struct Buf {
    pub mem: Vec<u8>,
    pub mr: *mut ibv_mr,
}

impl Buf {
    pub fn new(c: &Ctx, len: usize, access: i32) -> Buf {
        let mut mem = vec![0u8; len];
        // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
        let mr = unsafe { ibv_reg_mr(c.pd, mem.as_mut_ptr() as *mut _, len, access) };
        assert!(!mr.is_null(), "reg_mr failed");
        Buf { mem, mr }
    }
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
    pub fn lkey(&self) -> u32 {
        // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
        unsafe { (*self.mr).rkey }
    }
    /// One SGE over the first `len` bytes.
    pub fn sge(&self, len: usize) -> ibv_sge {
        ibv_sge {
            addr: self.addr(),
            length: len as u32,
            lkey: self.lkey(),
        }
    }
    /// Volatile read (the engine thread writes it).
    pub fn read(&self) -> Vec<u8> {
        (0..self.mem.len())
            // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
            .map(|i| unsafe { std::ptr::read_volatile(self.mem.as_ptr().add(i)) })
            .collect()
    }
    /// Volatile read of `len` bytes at `off`.
    pub fn read_range(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.mem.len());
        (off..off + len)
            // SAFETY: test code: in bounds (checked above), the buffer is alive.
            .map(|i| unsafe { std::ptr::read_volatile(self.mem.as_ptr().add(i)) })
            .collect()
    }
    /// Volatile write of `f(0..len)` at `off`.
    pub fn fill_range(&mut self, off: usize, len: usize, f: impl Fn(usize) -> u8) {
        assert!(off + len <= self.mem.len());
        for i in 0..len {
            // SAFETY: test code: in bounds (checked above), the buffer is alive.
            unsafe { std::ptr::write_volatile(self.mem.as_mut_ptr().add(off + i), f(i)) };
        }
    }
    pub fn fill(&mut self, f: impl Fn(usize) -> u8) {
        for i in 0..self.mem.len() {
            // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
            unsafe { std::ptr::write_volatile(self.mem.as_mut_ptr().add(i), f(i)) };
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
        unsafe { ibv_dereg_mr(self.mr) };
    }
}

pub struct Qp {
    pub qp: *mut ibv_qp,
    pub cq: *mut ibv_cq,
}

pub fn create_qp(c: &Ctx) -> Qp {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    let cq = unsafe { ibv_create_cq(c.ctx, 256, null_mut(), null_mut(), 0) };
    assert!(!cq.is_null());
    create_qp_on(c, cq)
}

/// An RC QP whose send and receive CQ is `cq`.
pub fn create_qp_on(c: &Ctx, cq: *mut ibv_cq) -> Qp {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut ia: ibv_qp_init_attr = std::mem::zeroed();
        ia.send_cq = cq;
        ia.recv_cq = cq;
        ia.qp_type = 2; // RC
        ia.cap.max_send_wr = 64;
        ia.cap.max_recv_wr = 64;
        ia.cap.max_send_sge = 4;
        ia.cap.max_recv_sge = 4;
        ia.cap.max_inline_data = 64;
        let qp = ibv_create_qp(c.pd, &mut ia);
        assert!(!qp.is_null(), "create_qp failed");
        Qp { qp, cq }
    }
}

pub fn gid(c: &Ctx, idx: i32) -> ibv_gid {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut g: ibv_gid = std::mem::zeroed();
        assert_eq!(ibv_query_gid(c.ctx, 1, idx, &mut g), 0);
        g
    }
}

/// RESET -> INIT -> RTR -> RTS towards `remote_qpn`, path MTU 1024, GID index 3.
pub fn connect(c: &Ctx, q: &Qp, remote_qpn: u32, timeout: u8, retry: u8) {
    connect_with(c, q, remote_qpn, timeout, retry, 7)
}

/// As [`connect`] with rnr_retry 0 (the first RNR NAK is fatal).
pub fn connect_rnr0(c: &Ctx, q: &Qp, remote_qpn: u32) {
    connect_with(c, q, remote_qpn, 14, 7, 0)
}

pub fn connect_with(c: &Ctx, q: &Qp, remote_qpn: u32, timeout: u8, retry: u8, rnr_retry: u8) {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 1;
        a.pkey_index = 0;
        a.port_num = 1;
        a.qp_access_flags = 2 | 4 | 8;
        assert_eq!(ibv_modify_qp(q.qp, &mut a, 0x1 | 0x10 | 0x20 | 0x8), 0, "INIT");
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 2;
        a.path_mtu = 3;
        a.dest_qp_num = remote_qpn;
        a.rq_psn = 0x100;
        a.max_dest_rd_atomic = 4;
        a.min_rnr_timer = 1;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = gid(c, 3);
        a.ah_attr.grh.sgid_index = 3;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.port_num = 1;
        assert_eq!(
            ibv_modify_qp(q.qp, &mut a, 0x1 | 0x80 | 0x100 | 0x100000 | 0x1000 | 0x20000 | 0x8000),
            0,
            "RTR"
        );
        let mut a: ibv_qp_attr = std::mem::zeroed();
        a.qp_state = 3;
        a.sq_psn = 0x100;
        a.timeout = timeout;
        a.retry_cnt = retry;
        a.rnr_retry = rnr_retry;
        a.max_rd_atomic = 4;
        assert_eq!(
            ibv_modify_qp(q.qp, &mut a, 0x1 | 0x10000 | 0x200 | 0x400 | 0x800 | 0x2000),
            0,
            "RTS"
        );
    }
}

/// Two connected QPs of one device (loopback through the device's socket).
pub fn pair(c: &Ctx) -> (Qp, Qp) {
    let a = create_qp(c);
    let b = create_qp(c);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        connect(c, &a, (*b.qp).qp_num, 14, 7);
        connect(c, &b, (*a.qp).qp_num, 14, 7);
    }
    (a, b)
}

pub fn post_send(q: &Qp, wr: &mut ibv_send_wr) -> i32 {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut bad = null_mut();
        let f = (*(*q.qp).context).ops.post_send.unwrap();
        f(q.qp, wr, &mut bad)
    }
}

pub fn post_recv(q: &Qp, addr: u64, len: u32, lkey: u32, wr_id: u64) {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut sge = ibv_sge {
            addr,
            length: len,
            lkey,
        };
        let mut wr: ibv_recv_wr = std::mem::zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad = null_mut();
        let f = (*(*q.qp).context).ops.post_recv.unwrap();
        assert_eq!(f(q.qp, &mut wr, &mut bad), 0, "post_recv");
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    pub imm: u32,
    pub flags: u32,
    pub qp_num: u32,
    pub src_qp: u32,
}

/// Polls `cq` through ctx->ops until one completion arrives (10 s limit).
pub fn poll_one(cq: *mut ibv_cq) -> Wc {
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let f = (*(*cq).context).ops.poll_cq.unwrap();
        loop {
            let mut wc: ibv_wc = std::mem::zeroed();
            let n = f(cq, 1, &mut wc);
            assert!(n >= 0);
            if n == 1 {
                return Wc {
                    wr_id: wc.wr_id,
                    status: wc.status,
                    opcode: wc.opcode,
                    byte_len: wc.byte_len,
                    imm: wc.imm_data_invalidated_rkey_union.imm_data,
                    flags: wc.wc_flags,
                    qp_num: wc.qp_num,
                    src_qp: wc.src_qp,
                };
            }
            assert!(Instant::now() < deadline, "no completion within 10 s");
            std::thread::yield_now();
        }
    }
}

/// A send WR with one SGE.
pub fn send_wr(wr_id: u64, opcode: u32, sge: &mut ibv_sge, flags: u32) -> ibv_send_wr {
    // SAFETY: test code: every pointer comes from the verbs calls above and its buffer is alive.
    unsafe {
        let mut wr: ibv_send_wr = std::mem::zeroed();
        wr.wr_id = wr_id;
        wr.opcode = opcode;
        wr.sg_list = sge;
        wr.num_sge = 1;
        wr.send_flags = flags;
        wr
    }
}

/// An RDMA WRITE or READ (`opcode`) with one SGE, at the start of `remote`.
pub fn rdma_wr(wr_id: u64, opcode: u32, sge: &mut ibv_sge, flags: u32, remote: &Buf) -> ibv_send_wr {
    let mut wr = send_wr(wr_id, opcode, sge, flags);
    wr.wr.rdma.remote_addr = remote.addr();
    wr.wr.rdma.rkey = remote.rkey();
    wr
}

pub const SIGNALED: u32 = 2;
pub const INLINE: u32 = 8;

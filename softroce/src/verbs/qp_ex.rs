//! The extended QP API: `ibv_create_qp_ex` (through `verbs_context.create_qp_ex`),
//! `ibv_qp_to_qp_ex` and the `ibv_wr_*` work-request builders that the
//! header's inline functions call through `struct ibv_qp_ex`.
//!
//! Between `wr_start` and `wr_complete` the builders collect [`SendWr`]s in
//! the QP's [`WrBatch`]; `wr_complete` posts them in order (none if a builder
//! call was invalid: its errno is returned), `wr_abort` drops them. Only the
//! RC operations softroce implements can be requested in `send_ops_flags`
//! (RDMA WRITE/+imm, SEND/+imm, RDMA READ, CMP_SWP, FETCH_ADD); others fail
//! the creation with EOPNOTSUPP, so no builder slot is ever NULL for an
//! operation the application asked for.

use std::ffi::{c_int, c_void};

use rdma_sys::{
    ibv_context, ibv_data_buf, ibv_qp, ibv_qp_create_send_ops_flags, ibv_qp_ex, ibv_qp_init_attr, ibv_qp_init_attr_ex,
    ibv_qp_init_attr_mask, ibv_send_flags, ibv_sge,
};

use super::qp::{create_rc_qp, post_send_wrs, send_flag, Qp, WrBatch};
use super::{ffi_guard, null_err};
use crate::driver::limits;
use crate::proto::{SendWr, Sge, WrOpcode};

const WITH_RDMA_WRITE: u64 = ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE.0 as u64;
const WITH_RDMA_WRITE_WITH_IMM: u64 = ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM.0 as u64;
const WITH_SEND: u64 = ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND.0 as u64;
const WITH_SEND_WITH_IMM: u64 = ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_SEND_WITH_IMM.0 as u64;
const WITH_RDMA_READ: u64 = ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_READ.0 as u64;
const WITH_ATOMIC_CMP_AND_SWP: u64 = ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP.0 as u64;
const WITH_ATOMIC_FETCH_AND_ADD: u64 = ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD.0 as u64;
/// `ibv_qp_create_send_ops_flags` softroce supports.
pub const SUPPORTED_SEND_OPS: u64 = WITH_RDMA_WRITE
    | WITH_RDMA_WRITE_WITH_IMM
    | WITH_SEND
    | WITH_SEND_WITH_IMM
    | WITH_RDMA_READ
    | WITH_ATOMIC_CMP_AND_SWP
    | WITH_ATOMIC_FETCH_AND_ADD;

const INIT_ATTR_PD: u32 = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
const INIT_ATTR_CREATE_FLAGS: u32 = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_CREATE_FLAGS.0;
const INIT_ATTR_SEND_OPS_FLAGS: u32 = ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;

/// Fills the builder slots for the requested operations.
pub fn fill_ops(ex: &mut ibv_qp_ex, ops: u64) {
    if ops & WITH_RDMA_WRITE != 0 {
        ex.wr_rdma_write = Some(wr_rdma_write);
    }
    if ops & WITH_RDMA_WRITE_WITH_IMM != 0 {
        ex.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    }
    if ops & WITH_SEND != 0 {
        ex.wr_send = Some(wr_send);
    }
    if ops & WITH_SEND_WITH_IMM != 0 {
        ex.wr_send_imm = Some(wr_send_imm);
    }
    if ops & WITH_RDMA_READ != 0 {
        ex.wr_rdma_read = Some(wr_rdma_read);
    }
    if ops & WITH_ATOMIC_CMP_AND_SWP != 0 {
        ex.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    }
    if ops & WITH_ATOMIC_FETCH_AND_ADD != 0 {
        ex.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    }
    ex.wr_set_sge = Some(wr_set_sge);
    ex.wr_set_sge_list = Some(wr_set_sge_list);
    ex.wr_set_inline_data = Some(wr_set_inline_data);
    ex.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    ex.wr_start = Some(wr_start);
    ex.wr_complete = Some(wr_complete);
    ex.wr_abort = Some(wr_abort);
}

/// `verbs_context.create_qp_ex`.
///
/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `attr` must be NULL or valid for reads and writes of one `ibv_qp_init_attr_ex`.
pub unsafe extern "C" fn create_qp_ex(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    ffi_guard!(std::ptr::null_mut(), {
        if ctx.is_null() || attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: attr is a valid in/out pointer per the API contract.
        let a = unsafe { &mut *attr };
        if a.comp_mask & !(INIT_ATTR_PD | INIT_ATTR_CREATE_FLAGS | INIT_ATTR_SEND_OPS_FLAGS) != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & INIT_ATTR_PD == 0 || a.pd.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: a.pd is the caller's PD; it must belong to ctx.
        if unsafe { (*a.pd).context } != ctx {
            return null_err(libc::EINVAL);
        }
        if a.comp_mask & INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        let send_ops = if a.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0 {
            if a.send_ops_flags & !SUPPORTED_SEND_OPS != 0 {
                return null_err(libc::EOPNOTSUPP);
            }
            Some(a.send_ops_flags)
        } else {
            None
        };
        let mut basic = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        match create_rc_qp(a.pd, &mut basic, send_ops.is_some()) {
            Ok(q) => {
                if let Some(ops) = send_ops {
                    // SAFETY: q is the QP just created, not yet visible to the application.
                    fill_ops(unsafe { &mut (*q).ex }, ops);
                }
                a.cap = basic.cap;
                q as *mut ibv_qp
            }
            Err(e) => null_err(e),
        }
    })
}

/// Returns the extension of a QP created with send_ops_flags, else NULL.
///
/// # Safety
/// `qp` must be NULL or a live QP of ours (`ibv_create_qp` / `ibv_create_qp_ex`).
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    ffi_guard!(std::ptr::null_mut(), {
        // SAFETY: qp is ours per the API contract.
        match unsafe { Qp::from_ibv(qp) } {
            Some(q) if q.is_ex => qp as *mut ibv_qp_ex,
            _ => std::ptr::null_mut(),
        }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours.
unsafe fn qp_of<'a>(qpx: *mut ibv_qp_ex) -> &'a Qp {
    // SAFETY: per the contract; the ibv_qp_ex is at offset 0 of Qp.
    unsafe { &*(qpx as *const Qp) }
}

/// Starts a new WR of `opcode` with the QP's current `wr_id` / `wr_flags`.
///
/// # Safety
/// As [`qp_of`].
unsafe fn begin(qpx: *mut ibv_qp_ex, opcode: WrOpcode, f: impl FnOnce(&mut SendWr)) {
    // SAFETY: per the contract.
    let q = unsafe { qp_of(qpx) };
    let (wr_id, flags) = (q.ex.wr_id, q.ex.wr_flags);
    let mut w = SendWr::new(wr_id, opcode);
    w.signaled = send_flag(flags, ibv_send_flags::IBV_SEND_SIGNALED);
    w.solicited = send_flag(flags, ibv_send_flags::IBV_SEND_SOLICITED);
    w.fence = send_flag(flags, ibv_send_flags::IBV_SEND_FENCE);
    f(&mut w);
    q.batch.lock().unwrap().wrs.push(w);
}

/// Applies `f` to the WR being built (EINVAL at completion if there is none).
///
/// # Safety
/// As [`qp_of`].
unsafe fn with_last(qpx: *mut ibv_qp_ex, f: impl FnOnce(&Qp, &mut SendWr) -> Result<(), i32>) {
    // SAFETY: per the contract.
    let q = unsafe { qp_of(qpx) };
    let mut b = q.batch.lock().unwrap();
    let r = match b.wrs.last_mut() {
        Some(w) => f(q, w),
        None => Err(libc::EINVAL),
    };
    if let Err(e) = r {
        if b.err == 0 {
            b.err = e;
        }
    }
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        let q = unsafe { qp_of(qpx) };
        *q.batch.lock().unwrap() = WrBatch::default();
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        let q = unsafe { qp_of(qpx) };
        *q.batch.lock().unwrap() = WrBatch::default();
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: qpx is ours (header contract).
        let q = unsafe { qp_of(qpx) };
        let b = std::mem::take(&mut *q.batch.lock().unwrap());
        if b.err != 0 {
            return b.err;
        }
        post_send_wrs(q, b.wrs.into_iter().map(Ok)).0
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe {
            begin(qpx, WrOpcode::RdmaWrite, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
            })
        }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, imm: u32) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe {
            begin(qpx, WrOpcode::RdmaWriteWithImm, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
                w.imm_data = imm;
            })
        }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe { begin(qpx, WrOpcode::Send, |_| {}) }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe { begin(qpx, WrOpcode::SendWithImm, |w| w.imm_data = imm) }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe {
            begin(qpx, WrOpcode::RdmaRead, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
            })
        }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_atomic_cmp_swp(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, compare: u64, swap: u64) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe {
            begin(qpx, WrOpcode::AtomicCmpSwp, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
                w.compare_add = compare;
                w.swap = swap;
            })
        }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_atomic_fetch_add(qpx: *mut ibv_qp_ex, rkey: u32, remote_addr: u64, add: u64) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe {
            begin(qpx, WrOpcode::AtomicFetchAdd, |w| {
                w.rkey = rkey;
                w.remote_addr = remote_addr;
                w.compare_add = add;
            })
        }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe {
            with_last(qpx, |_, w| {
                w.inline_data = None;
                w.sges = vec![Sge { addr, length, lkey }];
                Ok(())
            })
        }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
/// `list` must be valid for reading `n` `ibv_sge`s.
unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    ffi_guard!((), {
        // SAFETY: qpx is ours (header contract).
        unsafe {
            with_last(qpx, |q, w| {
                if n > q.caps.max_send_sge as usize || (n > 0 && list.is_null()) {
                    return Err(libc::EINVAL);
                }
                let s = if n == 0 {
                    &[][..]
                } else {
                    // SAFETY: the caller passes n valid SGEs.
                    std::slice::from_raw_parts(list, n)
                };
                w.inline_data = None;
                w.sges = s
                    .iter()
                    .map(|e| Sge {
                        addr: e.addr,
                        length: e.length,
                        lkey: e.lkey,
                    })
                    .collect();
                Ok(())
            })
        }
    })
}

/// Copies inline payload pieces now (the buffers may be reused at once).
///
/// # Safety
/// Every `(addr, len)` must be readable.
unsafe fn set_inline(w: &mut SendWr, pieces: &[(*const u8, usize)]) -> Result<(), i32> {
    let total: usize = pieces.iter().map(|p| p.1).sum();
    if total > limits::MAX_INLINE as usize || w.opcode.is_read_or_atomic() {
        return Err(libc::EINVAL);
    }
    let mut v = Vec::with_capacity(total);
    for &(p, n) in pieces {
        if n > 0 {
            // SAFETY: per the contract.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(p, n) });
        }
    }
    w.sges.clear();
    w.inline_data = Some(v);
    Ok(())
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
/// `addr` must be readable for `length` bytes.
unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, length: usize) {
    ffi_guard!((), {
        // SAFETY: qpx is ours; addr/length readable (header contract).
        unsafe { with_last(qpx, |_, w| set_inline(w, &[(addr as *const u8, length)])) }
    })
}

/// # Safety
/// `qpx` must be the extension of a live QP of ours created with send_ops_flags (the header dispatches through it).
/// `list` must be valid for reading `n` `ibv_data_buf`s, each readable for its length.
unsafe extern "C" fn wr_set_inline_data_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_data_buf) {
    ffi_guard!((), {
        // SAFETY: qpx is ours; the n buffers are readable (header contract).
        unsafe {
            with_last(qpx, |_, w| {
                if n > 0 && list.is_null() {
                    return Err(libc::EINVAL);
                }
                let bufs = if n == 0 {
                    &[][..]
                } else {
                    std::slice::from_raw_parts(list, n)
                };
                let pieces: Vec<_> = bufs.iter().map(|b| (b.addr as *const u8, b.length)).collect();
                set_inline(w, &pieces)
            })
        }
    })
}

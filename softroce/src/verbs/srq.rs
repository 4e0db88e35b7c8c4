//! Shared receive queues: the `ibv_srq` object over the driver's
//! [`SrqInner`].

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdma_sys::{ibv_pd, ibv_recv_wr, ibv_srq, ibv_srq_attr, ibv_srq_init_attr};

use super::ctx::Context;
use super::mr::Pd;
use super::{ffi_guard, int_err, null_err};
use crate::driver::counters;
use crate::driver::srq::SrqInner;
use crate::proto::{RecvWr, Sge};

const SRQ_MAX_WR: c_int = rdma_sys::ibv_srq_attr_mask::IBV_SRQ_MAX_WR.0 as c_int;
const SRQ_LIMIT: c_int = rdma_sys::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as c_int;

/// `struct ibv_srq` and our state.
#[repr(C)]
pub struct Srq {
    pub ibv: ibv_srq,
    pub inner: Arc<SrqInner>,
}

impl Srq {
    /// # Safety
    /// `srq` must be NULL or a live SRQ created by us.
    pub unsafe fn from_ibv<'a>(srq: *mut ibv_srq) -> Option<&'a Srq> {
        // SAFETY: per the contract.
        unsafe { (srq as *const Srq).as_ref() }
    }
}

/// # Safety
/// `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`).
/// `attr` must be NULL or valid for reads and writes of one `ibv_srq_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    ffi_guard!(std::ptr::null_mut(), {
        // SAFETY: pd is ours per the API contract.
        let Some(p) = (unsafe { Pd::from_ibv(pd) }) else {
            return null_err(libc::EINVAL);
        };
        if attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: attr is a valid in/out pointer per the API contract.
        let a = unsafe { &mut *attr };
        let at = &mut a.attr;
        // SAFETY: the PD's context pointer is our live context.
        let Some(ctx) = (unsafe { Context::from_ibv(p.ibv.context) }) else {
            return null_err(libc::EINVAL);
        };
        let inner = match SrqInner::new(at.max_wr, at.max_sge, at.srq_limit, p.ibv.handle, ctx.async_q.clone()) {
            Ok(i) => Arc::new(i),
            Err(e) => return null_err(e),
        };
        // SAFETY: ibv_srq is plain data; zeroed mutex/cond are static initialisers.
        let mut ibv: ibv_srq = unsafe { std::mem::zeroed() };
        ibv.context = p.ibv.context;
        ibv.srq_context = a.srq_context;
        ibv.pd = pd;
        ibv.handle = p.dev.alloc_handle();
        let shared = inner.clone();
        let s = Box::into_raw(Box::new(Srq { ibv, inner }));
        shared.set_ibv_ptr(s as usize);
        // Granted attributes go back to the caller (srq_limit is not armed at creation).
        at.max_sge = shared.max_sge;
        s as *mut ibv_srq
    })
}

/// # Safety
/// `srq` must be NULL or a live SRQ of ours (`ibv_create_srq`).
/// `attr` must be NULL or valid for reads and writes of one `ibv_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: srq is ours per the API contract.
        let Some(s) = (unsafe { Srq::from_ibv(srq) }) else {
            return int_err(libc::EINVAL);
        };
        if attr.is_null() || mask & !(SRQ_MAX_WR | SRQ_LIMIT) != 0 {
            return int_err(libc::EINVAL);
        }
        // SAFETY: attr is valid for reading.
        let a = unsafe { &*attr };
        let max_wr = (mask & SRQ_MAX_WR != 0).then_some(a.max_wr);
        let limit = (mask & SRQ_LIMIT != 0).then_some(a.srq_limit);
        match s.inner.modify(max_wr, limit) {
            Ok(()) => 0,
            Err(e) => int_err(e),
        }
    })
}

/// # Safety
/// `srq` must be NULL or a live SRQ of ours (`ibv_create_srq`).
/// `attr` must be NULL or valid for reads and writes of one `ibv_srq_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: srq is ours per the API contract.
        let Some(s) = (unsafe { Srq::from_ibv(srq) }) else {
            return int_err(libc::EINVAL);
        };
        if attr.is_null() {
            return int_err(libc::EINVAL);
        }
        let (max_wr, srq_limit) = s.inner.query();
        // SAFETY: attr is a valid out-pointer.
        unsafe {
            *attr = ibv_srq_attr {
                max_wr,
                max_sge: s.inner.max_sge,
                srq_limit,
            }
        };
        0
    })
}

/// # Safety
/// `srq` must be NULL or a live SRQ of ours (`ibv_create_srq`).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: srq is ours per the API contract.
        let Some(s) = (unsafe { Srq::from_ibv(srq) }) else {
            return int_err(libc::EINVAL);
        };
        if s.inner.users.load(Ordering::Acquire) > 0 {
            return int_err(libc::EBUSY);
        }
        // SAFETY: freed once.
        drop(unsafe { Box::from_raw(srq as *mut Srq) });
        0
    })
}

/// `ops.post_srq_recv`.
///
/// # Safety
/// `srq` must be NULL or a live SRQ of ours (`ibv_create_srq`).
/// `wr` must be NULL or the head of a chain of valid `ibv_recv_wr`s (each `next` NULL or valid), each `sg_list` holding `num_sge` valid SGEs.
/// `bad_wr` must be NULL or valid for writing one pointer.
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: srq is ours per the API contract.
        let Some(s) = (unsafe { Srq::from_ibv(srq) }) else {
            return libc::EINVAL;
        };
        let max_sge = s.inner.max_sge;
        // `last` is the WR most recently handed out, i.e. the refused one
        // when posting stops with an error.
        let last = std::cell::Cell::new(std::ptr::null_mut::<ibv_recv_wr>());
        let mut cur = wr;
        let chain = std::iter::from_fn(|| {
            if cur.is_null() {
                return None;
            }
            last.set(cur);
            // SAFETY: the WR chain is valid per the API contract.
            let w = unsafe { &*cur };
            cur = w.next;
            if w.num_sge < 0 || w.num_sge as u32 > max_sge {
                return Some(Err(libc::EINVAL));
            }
            // SAFETY: num_sge valid SGEs per the API contract.
            let sges = unsafe { sges(w.sg_list, w.num_sge) };
            Some(Ok(RecvWr { wr_id: w.wr_id, sges }))
        });
        let mut wrs = 0;
        let (err, _) = s.inner.post(chain.inspect(|w| wrs += u64::from(w.is_ok())));
        counters::srq_recv_posted(wrs);
        if err != 0 && !bad_wr.is_null() {
            // SAFETY: valid out-pointer.
            unsafe { *bad_wr = last.get() };
        }
        err
    })
}

/// The SGEs of a WR.
///
/// # Safety
/// `sg` must point to `n` valid `ibv_sge`s (or n <= 0, or NULL).
pub(crate) unsafe fn sges(sg: *const rdma_sys::ibv_sge, n: c_int) -> Vec<Sge> {
    if n <= 0 || sg.is_null() {
        return Vec::new();
    }
    // SAFETY: per the contract.
    let s = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    s.iter()
        .map(|e| Sge {
            addr: e.addr,
            length: e.length,
            lkey: e.lkey,
        })
        .collect()
}

//! Shared receive queues: receive WQEs that any QP attached to the SRQ may
//! consume. The core's responder asks for one through
//! `MemoryAccess::take_srq_recv` when it needs a receive WQE; an empty SRQ
//! makes it answer with an RNR NAK (the requester retries). The SRQ limit
//! event fires once when a WQE is taken while fewer than `srq_limit` remain.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rdma_sys::{ibv_pd, ibv_recv_wr, ibv_srq, ibv_srq_attr, ibv_srq_init_attr};

use super::context::{AsyncQueue, Context};
use super::mr::Pd;
use super::{ffi_guard, int_err, null_err};
use crate::device;
use crate::proto::{RecvWr, Sge};

const SRQ_MAX_WR: c_int = 1;
const SRQ_LIMIT: c_int = 2;

/// SRQ state shared with the engine (through the attached QPs).
pub struct SrqInner {
    queue: Mutex<VecDeque<RecvWr>>,
    max_wr: AtomicU32,
    pub max_sge: u32,
    /// Armed limit (0 = not armed).
    limit: AtomicU32,
    pub pd: u32,
    /// QPs attached (destroy fails with EBUSY while non-zero).
    pub users: AtomicUsize,
    async_q: Arc<AsyncQueue>,
    ibv_ptr: AtomicUsize,
}

impl SrqInner {
    /// Takes the oldest receive WQE (for the responder of an attached QP).
    pub fn take(&self) -> Option<RecvWr> {
        let (w, left) = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let w = q.pop_front()?;
            (w, q.len() as u32)
        };
        let lim = self.limit.load(Ordering::Acquire);
        if lim != 0
            && left < lim
            && self
                .limit
                .compare_exchange(lim, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.async_q.push(
                rdma_sys::ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED,
                self.ibv_ptr.load(Ordering::Relaxed),
            );
        }
        Some(w)
    }
}

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
        if at.max_wr == 0 || at.max_wr > device::MAX_SRQ_WR || at.max_sge > device::MAX_SGE || at.srq_limit > at.max_wr
        {
            return null_err(libc::EINVAL);
        }
        // SAFETY: the PD's context pointer is our live context.
        let Some(ctx) = (unsafe { Context::from_ibv(p.ibv.context) }) else {
            return null_err(libc::EINVAL);
        };
        let inner = Arc::new(SrqInner {
            queue: Mutex::new(VecDeque::with_capacity(at.max_wr as usize)),
            max_wr: AtomicU32::new(at.max_wr),
            max_sge: at.max_sge.max(1),
            limit: AtomicU32::new(0),
            pd: p.ibv.handle,
            users: AtomicUsize::new(0),
            async_q: ctx.async_q.clone(),
            ibv_ptr: AtomicUsize::new(0),
        });
        // SAFETY: ibv_srq is plain data; zeroed mutex/cond are static initialisers.
        let mut ibv: ibv_srq = unsafe { std::mem::zeroed() };
        ibv.context = p.ibv.context;
        ibv.srq_context = a.srq_context;
        ibv.pd = pd;
        ibv.handle = p.dev.alloc_handle();
        let shared = inner.clone();
        let s = Box::into_raw(Box::new(Srq { ibv, inner }));
        shared.ibv_ptr.store(s as usize, Ordering::Relaxed);
        // Granted attributes go back to the caller (srq_limit is not armed at creation).
        at.max_sge = shared.max_sge;
        s as *mut ibv_srq
    })
}

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
        let i = &s.inner;
        let max_wr = if mask & SRQ_MAX_WR != 0 {
            let queued = i.queue.lock().unwrap_or_else(|e| e.into_inner()).len() as u32;
            if a.max_wr == 0 || a.max_wr > device::MAX_SRQ_WR || a.max_wr < queued {
                return int_err(libc::EINVAL);
            }
            a.max_wr
        } else {
            i.max_wr.load(Ordering::Relaxed)
        };
        if mask & SRQ_LIMIT != 0 && a.srq_limit > max_wr {
            return int_err(libc::EINVAL);
        }
        i.max_wr.store(max_wr, Ordering::Relaxed);
        if mask & SRQ_LIMIT != 0 {
            i.limit.store(a.srq_limit, Ordering::Release);
        }
        0
    })
}

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
        // SAFETY: attr is a valid out-pointer.
        unsafe {
            *attr = ibv_srq_attr {
                max_wr: s.inner.max_wr.load(Ordering::Relaxed),
                max_sge: s.inner.max_sge,
                srq_limit: s.inner.limit.load(Ordering::Acquire),
            }
        };
        0
    })
}

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
        let i = &s.inner;
        let mut q = i.queue.lock().unwrap_or_else(|e| e.into_inner());
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the WR chain is valid per the API contract.
            let w = unsafe { &*cur };
            let err = if w.num_sge < 0 || w.num_sge as u32 > i.max_sge {
                libc::EINVAL
            } else if q.len() as u32 >= i.max_wr.load(Ordering::Relaxed) {
                libc::ENOMEM
            } else {
                0
            };
            if err != 0 {
                if !bad_wr.is_null() {
                    // SAFETY: valid out-pointer.
                    unsafe { *bad_wr = cur };
                }
                return err;
            }
            let sges = if w.num_sge == 0 || w.sg_list.is_null() {
                Vec::new()
            } else {
                // SAFETY: num_sge valid SGEs per the API contract.
                unsafe { std::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }
                    .iter()
                    .map(|e| Sge {
                        addr: e.addr,
                        length: e.length,
                        lkey: e.lkey,
                    })
                    .collect()
            };
            q.push_back(RecvWr { wr_id: w.wr_id, sges });
            cur = w.next;
        }
        0
    })
}

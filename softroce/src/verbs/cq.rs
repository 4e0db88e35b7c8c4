//! Completion queues and completion channels: the `ibv_cq_ex` /
//! `ibv_comp_channel` objects over the driver's [`CqInner`] and
//! [`CompletionChannel`], the poll API, and what an empty poll does.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rdma_sys::{ibv_comp_channel, ibv_context, ibv_cq, ibv_wc};

use super::ctx::Context;
use super::{ffi_guard, int_err, minus_one, null_err};
use crate::driver::activity;
use crate::driver::counters;
use crate::driver::cq::{CompletionChannel, CqInner, Wc};
use crate::driver::engine;
use crate::driver::idle;
use crate::driver::limits;

/// `struct ibv_cq_ex` (whose first 128 bytes are the `struct ibv_cq` every
/// CQ hands out; the poll API slots are filled for `ibv_create_cq_ex` CQs)
/// and our state.
#[repr(C)]
pub struct Cq {
    pub ibv: rdma_sys::ibv_cq_ex,
    pub inner: Arc<CqInner>,
    /// The completion the `ibv_start_poll` / `ibv_next_poll` API is on.
    cur: Mutex<Wc>,
    /// Events handed out by ibv_get_cq_event and events acknowledged.
    events: Mutex<(u64, u64)>,
    events_cv: Condvar,
}

impl Cq {
    /// # Safety
    /// `cq` must be NULL or a live CQ created by our `ibv_create_cq`.
    pub unsafe fn from_ibv<'a>(cq: *mut ibv_cq) -> Option<&'a Cq> {
        // SAFETY: per the contract.
        unsafe { (cq as *const Cq).as_ref() }
    }
}

/// Handle -> CQ pointer of live CQs, so that an event read after the CQ was
/// destroyed is dropped instead of handing out a dangling pointer.
static LIVE_CQS: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);
static NEXT_CQ_HANDLE: AtomicUsize = AtomicUsize::new(1);

/// Serialises updates of `ibv_comp_channel.refcnt` (rdma-core uses the
/// context mutex for this).
static CHANNEL_REFS: Mutex<()> = Mutex::new(());

/// `struct ibv_comp_channel` and its pipe.
#[repr(C)]
pub struct Channel {
    pub ibv: ibv_comp_channel,
    fds: Arc<CompletionChannel>,
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    ffi_guard!(std::ptr::null_mut(), {
        // SAFETY: ctx is ours.
        if unsafe { Context::from_ibv(ctx) }.is_none() {
            return null_err(libc::EINVAL);
        }
        let fds = match CompletionChannel::new() {
            Ok(f) => Arc::new(f),
            Err(e) => return null_err(e.raw_os_error().unwrap_or(libc::EMFILE)),
        };
        let ch = Box::new(Channel {
            ibv: ibv_comp_channel {
                context: ctx,
                fd: fds.fd(),
                refcnt: 0,
            },
            fds,
        });
        Box::into_raw(ch) as *mut ibv_comp_channel
    })
}

/// # Safety
/// `ch` must be NULL or a live completion channel of ours (`ibv_create_comp_channel`).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    ffi_guard!(-1, {
        if ch.is_null() {
            return minus_one(libc::EINVAL);
        }
        let _g = CHANNEL_REFS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: ch is ours; its refcnt is only touched under CHANNEL_REFS.
        if unsafe { (*ch).refcnt } != 0 {
            return minus_one(libc::EBUSY);
        }
        // SAFETY: freed once.
        drop(unsafe { Box::from_raw(ch as *mut Channel) });
        0
    })
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `channel` must be NULL or a live completion channel of ours (`ibv_create_comp_channel`).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ffi_guard!(std::ptr::null_mut(), {
        match create_cq(ctx, cqe, cq_context, channel, comp_vector) {
            Ok(p) => p as *mut ibv_cq,
            Err(e) => null_err(e),
        }
    })
}

fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut Cq, i32> {
    // SAFETY: ctx is ours per the API contract.
    let c = unsafe { Context::from_ibv(ctx) }.ok_or(libc::EINVAL)?;
    if cqe < 1 || cqe as u32 > limits::MAX_CQE || !(0..1).contains(&comp_vector) {
        return Err(libc::EINVAL);
    }
    let ch_fds = if channel.is_null() {
        None
    } else {
        let _g = CHANNEL_REFS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: channel is ours per the API contract; refcnt only under CHANNEL_REFS.
        unsafe { (*channel).refcnt += 1 };
        // SAFETY: as above; the fds field is never written after creation.
        Some(unsafe { &(*(channel as *const Channel)).fds }.clone())
    };
    let handle = NEXT_CQ_HANDLE.fetch_add(1, Ordering::Relaxed) as u64;
    let inner = Arc::new(CqInner::new(cqe, handle, ch_fds, c.async_q.clone()));
    // SAFETY: ibv_cq_ex is plain data (pointers, ints, Option<fn>, opaque
    // mutex/cond whose all-zero value is the static initialiser).
    let mut ibv: rdma_sys::ibv_cq_ex = unsafe { std::mem::zeroed() };
    ibv.context = ctx;
    ibv.channel = channel;
    ibv.cq_context = cq_context;
    ibv.handle = handle as u32;
    ibv.cqe = cqe;
    let shared = inner.clone();
    let p = Box::into_raw(Box::new(Cq {
        ibv,
        inner,
        cur: Mutex::new(Wc::default()),
        events: Mutex::new((0, 0)),
        events_cv: Condvar::new(),
    }));
    shared.set_ibv_ptr(p as usize);
    LIVE_CQS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .insert(handle, p as usize);
    Ok(p)
}

/// `ibv_create_cq_wc_flags` we can report: byte_len, imm, qp_num, src_qp,
/// slid, sl, dlid_path_bits (all but the first four read as 0) and the
/// completion timestamp (nanoseconds; `hca_core_clock` is 1 GHz).
const SUPPORTED_WC_FLAGS: u64 = {
    use rdma_sys::ibv_create_cq_wc_flags as f;
    (f::IBV_WC_EX_WITH_BYTE_LEN.0
        | f::IBV_WC_EX_WITH_IMM.0
        | f::IBV_WC_EX_WITH_QP_NUM.0
        | f::IBV_WC_EX_WITH_SRC_QP.0
        | f::IBV_WC_EX_WITH_SLID.0
        | f::IBV_WC_EX_WITH_SL.0
        | f::IBV_WC_EX_WITH_DLID_PATH_BITS.0
        | f::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0) as u64
};
const CQ_INIT_ATTR_MASK_FLAGS: u32 = rdma_sys::ibv_cq_init_attr_mask::IBV_CQ_INIT_ATTR_MASK_FLAGS.0;
/// Hints we may ignore.
const CQ_CREATE_FLAGS: u32 = rdma_sys::ibv_create_cq_attr_flags::IBV_CREATE_CQ_ATTR_SINGLE_THREADED.0
    | rdma_sys::ibv_create_cq_attr_flags::IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN.0;

/// `verbs_context.create_cq_ex`.
///
/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `attr` must be NULL or valid for reads and writes of one `ibv_cq_init_attr_ex`.
pub unsafe extern "C" fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut rdma_sys::ibv_cq_init_attr_ex,
) -> *mut rdma_sys::ibv_cq_ex {
    ffi_guard!(std::ptr::null_mut(), {
        if attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: attr is valid for reading per the API contract.
        let a = unsafe { &*attr };
        if a.comp_mask & !CQ_INIT_ATTR_MASK_FLAGS != 0 || a.wc_flags & !SUPPORTED_WC_FLAGS != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & CQ_INIT_ATTR_MASK_FLAGS != 0 && a.flags & !CQ_CREATE_FLAGS != 0 {
            return null_err(libc::EOPNOTSUPP);
        }
        if a.cqe > i32::MAX as u32 {
            return null_err(libc::EINVAL);
        }
        let p = match create_cq(ctx, a.cqe as c_int, a.cq_context, a.channel, a.comp_vector as c_int) {
            Ok(p) => p,
            Err(e) => return null_err(e),
        };
        // SAFETY: p is the CQ just created, not yet visible to the application.
        let x = unsafe { &mut (*p).ibv };
        x.start_poll = Some(ex_start_poll);
        x.next_poll = Some(ex_next_poll);
        x.end_poll = Some(ex_end_poll);
        x.read_opcode = Some(ex_read_opcode);
        x.read_vendor_err = Some(ex_read_vendor_err);
        x.read_byte_len = Some(ex_read_byte_len);
        x.read_imm_data = Some(ex_read_imm_data);
        x.read_qp_num = Some(ex_read_qp_num);
        x.read_src_qp = Some(ex_read_src_qp);
        x.read_wc_flags = Some(ex_read_wc_flags);
        x.read_slid = Some(ex_read_slid);
        x.read_sl = Some(ex_read_sl);
        x.read_dlid_path_bits = Some(ex_read_dlid_path_bits);
        x.read_completion_ts = Some(ex_read_completion_ts);
        p as *mut rdma_sys::ibv_cq_ex
    })
}

/// Loads the next completion into the poll-API cursor (ENOENT when empty).
///
/// # Safety
/// `cq` must be a live extended CQ of ours.
unsafe fn ex_load(cq: *mut rdma_sys::ibv_cq_ex) -> c_int {
    let p = cq as *mut Cq;
    // SAFETY: per the contract; only the `inner` and `cur` fields are borrowed.
    let (inner, cur) = unsafe { (&(*p).inner, &(*p).cur) };
    let mut one = [Wc::default()];
    let seen = activity::snapshot();
    if inner.poll(&mut one) == 0 && !(idle_poll(cq as *mut ibv_cq, seen) && inner.poll(&mut one) == 1) {
        return libc::ENOENT;
    }
    idle::poll_found_work();
    *cur.lock().unwrap() = one[0];
    // SAFETY: the public fields of the caller's ibv_cq_ex, written through the raw pointer.
    unsafe {
        std::ptr::addr_of_mut!((*cq).wr_id).write(one[0].wr_id);
        std::ptr::addr_of_mut!((*cq).status).write(one[0].status);
    }
    0
}

/// # Safety
/// `cq` must be a live CQ of ours created by `ibv_create_cq_ex` (the header dispatches through it).
/// `attr` must be NULL or valid for reads and writes of one `ibv_poll_cq_attr`.
unsafe extern "C" fn ex_start_poll(cq: *mut rdma_sys::ibv_cq_ex, attr: *mut rdma_sys::ibv_poll_cq_attr) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: attr is NULL or valid per the API contract.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        // SAFETY: cq is our extended CQ (the header dispatches through it).
        let r = unsafe { ex_load(cq) };
        counters::cq_polled(usize::from(r == 0));
        r
    })
}

/// # Safety
/// `cq` must be a live CQ of ours created by `ibv_create_cq_ex` (the header dispatches through it).
unsafe extern "C" fn ex_next_poll(cq: *mut rdma_sys::ibv_cq_ex) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: cq is our extended CQ (the header dispatches through it).
        let r = unsafe { ex_load(cq) };
        if r == 0 {
            counters::cqe_read();
        }
        r
    })
}

/// # Safety
/// No requirements: no argument is dereferenced.
unsafe extern "C" fn ex_end_poll(_cq: *mut rdma_sys::ibv_cq_ex) {}

/// The completion under the poll-API cursor.
///
/// # Safety
/// `cq` must be a live extended CQ of ours.
unsafe fn ex_cur(cq: *mut rdma_sys::ibv_cq_ex) -> Wc {
    // SAFETY: per the contract; only the `cur` field is borrowed.
    unsafe { *(*(cq as *mut Cq)).cur.lock().unwrap() }
}

macro_rules! ex_reader {
    ($name:ident, $ty:ty, |$w:ident| $e:expr) => {
        /// # Safety
        /// `cq` must be a live CQ of ours created by `ibv_create_cq_ex` (the header dispatches through it).
        unsafe extern "C" fn $name(cq: *mut rdma_sys::ibv_cq_ex) -> $ty {
            ffi_guard!(Default::default(), {
                // SAFETY: cq is our extended CQ (the header dispatches through it).
                let $w = unsafe { ex_cur(cq) };
                $e
            })
        }
    };
}

ex_reader!(ex_read_opcode, u32, |w| w.opcode);
ex_reader!(ex_read_vendor_err, u32, |w| w.vendor_err);
ex_reader!(ex_read_byte_len, u32, |w| w.byte_len);
ex_reader!(ex_read_imm_data, u32, |w| w.imm_data);
ex_reader!(ex_read_qp_num, u32, |w| w.qp_num);
ex_reader!(ex_read_src_qp, u32, |w| w.src_qp);
ex_reader!(ex_read_wc_flags, u32, |w| w.wc_flags);
ex_reader!(ex_read_slid, u32, |_w| 0);
ex_reader!(ex_read_sl, u8, |_w| 0);
ex_reader!(ex_read_dlid_path_bits, u8, |_w| 0);
ex_reader!(ex_read_completion_ts, u64, |w| w.ts);

/// # Safety
/// `cq` must be NULL or a live CQ of ours (`ibv_create_cq` / `ibv_create_cq_ex`).
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    ffi_guard!(libc::EIO, {
        if cq.is_null() || cqe < 1 || cqe as u32 > limits::MAX_CQE {
            return int_err(libc::EINVAL);
        }
        // SAFETY: cq is ours; only the `inner` field is borrowed (other
        // threads may be polling the CQ).
        let inner = unsafe { &(*(cq as *const Cq)).inner };
        if let Err(e) = inner.resize(cqe) {
            return int_err(e);
        }
        // SAFETY: the public `cqe` field, written through the raw pointer.
        unsafe { std::ptr::addr_of_mut!((*cq).cqe).write(cqe) };
        0
    })
}

/// # Safety
/// `cq` must be NULL or a live CQ of ours (`ibv_create_cq` / `ibv_create_cq_ex`).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    ffi_guard!(libc::EIO, {
        if cq.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: cq is ours.
        let c = unsafe { &*(cq as *const Cq) };
        if c.inner.users.load(Ordering::Acquire) > 0 {
            // still used by a QP
            return int_err(libc::EBUSY);
        }
        // Its async events (IBV_EVENT_CQ_ERR) too: the application reads the CQ pointer of
        // one until it acknowledges it.
        c.inner.forget_events(cq as usize, std::time::Duration::from_secs(2));
        // Wait until every event handed out was acknowledged (as rdma-core does).
        {
            let mut ev = c.events.lock().unwrap();
            while ev.1 < ev.0 {
                ev = c.events_cv.wait(ev).unwrap();
            }
        }
        if let Some(m) = LIVE_CQS.lock().unwrap().as_mut() {
            m.remove(&c.inner.handle);
        }
        if !c.ibv.channel.is_null() {
            let _g = CHANNEL_REFS.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the channel outlives its CQs (destroy_comp_channel checks
            // refcnt); refcnt is only touched under CHANNEL_REFS.
            unsafe { (*c.ibv.channel).refcnt -= 1 };
        }
        // SAFETY: freed once.
        drop(unsafe { Box::from_raw(cq as *mut Cq) });
        0
    })
}

/// `ops.poll_cq`.
///
/// # Safety
/// `cq` must be NULL or a live CQ of ours (`ibv_create_cq` / `ibv_create_cq_ex`).
/// `wc` must be NULL or valid for writing `num` `ibv_wc`s.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num: c_int, wc: *mut ibv_wc) -> c_int {
    ffi_guard!(-1, {
        // SAFETY: cq is ours.
        let Some(c) = (unsafe { Cq::from_ibv(cq) }) else {
            return -1;
        };
        if num <= 0 || wc.is_null() {
            return 0;
        }
        let seen = activity::snapshot();
        if c.inner.is_empty() && (!idle_poll(cq, seen) || c.inner.is_empty()) {
            counters::cq_polled(0);
            return 0;
        }
        idle::poll_found_work();
        let mut buf = [Wc::default(); 32];
        let mut total = 0usize;
        let want = num as usize;
        while total < want {
            let k = (want - total).min(buf.len());
            let n = c.inner.poll(&mut buf[..k]);
            for (i, w) in buf[..n].iter().enumerate() {
                // SAFETY: wc has room for `num` entries; total + i < num.
                unsafe { write_wc(wc.add(total + i), w) };
            }
            total += n;
            if n < k {
                break;
            }
        }
        counters::cq_polled(total);
        total as c_int
    })
}

/// An empty poll of `cq` by this thread: see [`idle::idle_poll`]; the
/// thread may do the NIC's receive work for `cq`'s device.
fn idle_poll(cq: *mut ibv_cq, seen: u32) -> bool {
    idle::idle_poll(seen, || {
        // SAFETY: `cq` is a live CQ of ours (the caller checked), so its
        // context pointer is the live context it was created on.
        let Some(ctx) = (unsafe { Context::from_ibv((*cq).context) }) else {
            return false;
        };
        engine::receive_inline(&ctx.dev)
    })
}

/// # Safety
/// `dst` must be valid for writing one `ibv_wc`.
unsafe fn write_wc(dst: *mut ibv_wc, w: &Wc) {
    // SAFETY: per the contract; every field is written.
    unsafe {
        let d = &mut *dst;
        d.wr_id = w.wr_id;
        d.status = w.status;
        d.opcode = w.opcode;
        d.vendor_err = w.vendor_err;
        d.byte_len = w.byte_len;
        d.imm_data_invalidated_rkey_union.imm_data = w.imm_data;
        d.qp_num = w.qp_num;
        d.src_qp = w.src_qp;
        d.wc_flags = w.wc_flags;
        d.pkey_index = 0;
        d.slid = 0;
        d.sl = 0;
        d.dlid_path_bits = 0;
    }
}

/// `ops.req_notify_cq`.
///
/// # Safety
/// `cq` must be NULL or a live CQ of ours (`ibv_create_cq` / `ibv_create_cq_ex`).
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: cq is ours.
        let Some(c) = (unsafe { Cq::from_ibv(cq) }) else {
            return libc::EINVAL;
        };
        // Arming works without a channel too; nothing will be delivered.
        c.inner.arm(solicited_only != 0);
        0
    })
}

/// # Safety
/// `ch` must be NULL or a live completion channel of ours (`ibv_create_comp_channel`).
/// `cq` and `cq_context` must be NULL or valid for writing one pointer each.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi_guard!(-1, {
        if ch.is_null() || cq.is_null() || cq_context.is_null() {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: ch is ours.
        let fd = unsafe { (*ch).fd };
        loop {
            let mut h: u64 = 0;
            // SAFETY: reads 8 bytes into a live u64 (pipe writes of 8 bytes are atomic).
            let r = unsafe { libc::read(fd, &mut h as *mut u64 as *mut c_void, 8) };
            if r != 8 {
                return -1;
            }
            let p = LIVE_CQS.lock().unwrap().as_ref().and_then(|m| m.get(&h).copied());
            let Some(p) = p else { continue };
            let c = p as *mut Cq;
            // SAFETY: the CQ is live (it is in LIVE_CQS); outputs are valid pointers.
            unsafe {
                let cqr = &*c;
                cqr.events.lock().unwrap().0 += 1;
                *cq = c as *mut ibv_cq;
                *cq_context = cqr.ibv.cq_context;
            }
            return 0;
        }
    })
}

/// # Safety
/// `cq` must be NULL or a live CQ of ours (`ibv_create_cq` / `ibv_create_cq_ex`).
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    ffi_guard!((), {
        if cq.is_null() {
            return;
        }
        // SAFETY: cq is ours; only the event counters are borrowed (other
        // threads may be polling the CQ).
        let (events, events_cv) = unsafe { (&(*(cq as *const Cq)).events, &(*(cq as *const Cq)).events_cv) };
        let mut ev = events.lock().unwrap_or_else(|e| e.into_inner());
        ev.1 += nevents as u64;
        // SAFETY: the public counter, updated through the raw pointer under the events lock.
        unsafe {
            let p = std::ptr::addr_of_mut!((*cq).comp_events_completed);
            p.write(p.read().wrapping_add(nevents));
        }
        events_cv.notify_all();
    })
}

/// Acknowledges an async event whose element is this CQ.
///
/// # Safety
/// `cq` must be NULL or our live CQ.
pub unsafe fn ack_async(cq: *mut ibv_cq) {
    if !cq.is_null() {
        // SAFETY: per the contract.
        unsafe { (*cq).async_events_completed += 1 };
        // SAFETY: as above; its destroy waits for this (CqInner::forget_events), so the CQ is
        // not freed before the acknowledgement is done with it.
        unsafe { &*(cq as *const Cq) }.inner.event_acked(cq as usize);
    }
}

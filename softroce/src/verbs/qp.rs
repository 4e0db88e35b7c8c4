//! RC queue pairs: the `ibv_qp_ex` object over the driver's [`QpShared`]
//! (whose [`QpCore`] runs the protocol), and the conversion of attributes
//! and work requests.

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use rdma_sys::{ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_recv_wr, ibv_send_flags, ibv_send_wr};

use super::cq::Cq;
use super::ctx::Context;
use super::mr::Pd;
use super::srq::{sges, Srq};
use super::{ffi_guard, int_err, null_err};
use crate::driver::addr::gid_to_ipv4;
use crate::driver::device::Device;
use crate::driver::engine;
use crate::driver::limits;
use crate::driver::link::LinkLayer;
use crate::driver::qp::QpShared;
use crate::proto::{attr_mask, AddressVector, ModifyAttrs, QpCaps, QpCore, QpState, RecvWr, SendWr, WrOpcode};
use crate::wire::lrh::MAX_UNICAST_LID;

/// `struct ibv_qp_ex` (whose first member is the `struct ibv_qp` every QP
/// hands out) and our state. Only QPs created through `ibv_create_qp_ex`
/// with send_ops_flags expose the extension (`ibv_qp_to_qp_ex`).
#[repr(C)]
pub struct Qp {
    pub ex: rdma_sys::ibv_qp_ex,
    pub shared: Arc<QpShared>,
    pub dev: Arc<Device>,
    pub caps: QpCaps,
    /// Created with send_ops_flags: the `ibv_wr_*` API is available.
    pub is_ex: bool,
    /// WRs built between `wr_start` and `wr_complete` (the `ibv_wr_*` API).
    pub batch: Mutex<WrBatch>,
}

/// Work requests being built between `wr_start` and `wr_complete`.
#[derive(Debug, Default)]
pub struct WrBatch {
    pub wrs: Vec<SendWr>,
    /// First error of a builder call (reported by `wr_complete`).
    pub err: i32,
}

impl Qp {
    /// # Safety
    /// `qp` must be NULL or a live QP created by us.
    pub unsafe fn from_ibv<'a>(qp: *mut ibv_qp) -> Option<&'a Qp> {
        // SAFETY: per the contract (the ibv_qp is at offset 0 of Qp).
        unsafe { (qp as *const Qp).as_ref() }
    }
}

const IBV_QPT_RC: u32 = rdma_sys::ibv_qp_type::IBV_QPT_RC;

/// `flags` (`ibv_send_wr.send_flags` / `ibv_qp_ex.wr_flags`) has `bit`.
pub(crate) fn send_flag(flags: u32, bit: ibv_send_flags) -> bool {
    flags & bit.0 != 0
}

/// # Safety
/// `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`).
/// `attr` must be NULL or valid for reads and writes of one `ibv_qp_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut rdma_sys::ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ffi_guard!(std::ptr::null_mut(), {
        if attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: attr is a valid in/out pointer per the API contract.
        match create_rc_qp(pd, unsafe { &mut *attr }, false) {
            Ok(q) => q as *mut ibv_qp,
            Err(e) => null_err(e),
        }
    })
}

/// A new QP's core: whether it takes receives from an SRQ, and the adaptive retransmission floor
/// of `SOFTROCE_PROBE_FLOOR_US` (0: no probe).
fn new_core(qpn: u32, caps: QpCaps, has_srq: bool) -> QpCore {
    let mut core = QpCore::new(qpn, caps);
    core.set_srq(has_srq);
    let floor = crate::config::probe_floor();
    core.set_adaptive_retransmit(
        (!floor.is_zero())
            .then(|| crate::proto::Duration::from_nanos(u64::try_from(floor.as_nanos()).unwrap_or(u64::MAX))),
    );
    core
}

/// Creates an RC QP; `is_ex`: created by `ibv_create_qp_ex` with
/// send_ops_flags (the caller fills the builder slots of the `ibv_qp_ex`
/// extension). Writes the granted caps back.
pub(crate) fn create_rc_qp(pd: *mut rdma_sys::ibv_pd, a: &mut ibv_qp_init_attr, is_ex: bool) -> Result<*mut Qp, i32> {
    // SAFETY: pd is ours per the API contract.
    let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
    if a.qp_type != IBV_QPT_RC {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: a.srq is NULL or an SRQ of ours per the API contract.
    let srq = unsafe { Srq::from_ibv(a.srq) }.map(|s| s.inner.clone());
    if let Some(s) = &srq {
        if s.pd != p.ibv.handle {
            return Err(libc::EINVAL);
        }
    }
    // SAFETY: CQ pointers are ours or NULL.
    let (Some(scq), Some(rcq)) = (unsafe { Cq::from_ibv(a.send_cq) }, unsafe { Cq::from_ibv(a.recv_cq) }) else {
        return Err(libc::EINVAL);
    };
    let c = &a.cap;
    if c.max_send_wr > limits::MAX_QP_WR
        || c.max_recv_wr > limits::MAX_QP_WR
        || c.max_send_sge > limits::MAX_SGE
        || c.max_recv_sge > limits::MAX_SGE
        || c.max_inline_data > limits::MAX_INLINE
    {
        return Err(libc::EINVAL);
    }
    let caps = QpCaps {
        max_send_wr: c.max_send_wr.max(1),
        max_recv_wr: c.max_recv_wr.max(1),
        max_send_sge: c.max_send_sge.max(1),
        max_recv_sge: c.max_recv_sge.max(1),
        max_inline_data: limits::MAX_INLINE,
        sq_sig_all: a.sq_sig_all != 0,
    };
    let dev = p.dev.clone();
    // SAFETY: the PD's context pointer is our live context.
    let ctx = unsafe { Context::from_ibv(p.ibv.context) }.ok_or(libc::EINVAL)?;
    let qpn = dev.alloc_qpn();
    let core = new_core(qpn, caps, srq.is_some());
    let shared = Arc::new(QpShared::new(
        core,
        p.ibv.handle,
        srq.clone(),
        scq.inner.clone(),
        rcq.inner.clone(),
        ctx.async_q.clone(),
    ));
    // SAFETY: ibv_qp_ex is plain data (pointers, ints, Option<fn>, opaque
    // mutex/cond whose all-zero value is the static initialiser).
    let mut ex: rdma_sys::ibv_qp_ex = unsafe { std::mem::zeroed() };
    let ibv = &mut ex.qp_base;
    ibv.context = p.ibv.context;
    ibv.qp_context = a.qp_context;
    ibv.pd = pd;
    ibv.send_cq = a.send_cq;
    ibv.recv_cq = a.recv_cq;
    ibv.srq = if srq.is_some() { a.srq } else { std::ptr::null_mut() };
    ibv.handle = dev.alloc_handle();
    ibv.qp_num = qpn;
    ibv.state = QpState::Reset as u32;
    ibv.qp_type = IBV_QPT_RC;
    let q = Box::into_raw(Box::new(Qp {
        ex,
        shared: shared.clone(),
        dev: dev.clone(),
        caps,
        is_ex,
        batch: Mutex::new(Default::default()),
    }));
    shared.ibv_ptr.store(q as usize, Ordering::Relaxed);
    dev.engine.add_qp(shared);
    // Granted capabilities go back to the caller.
    a.cap.max_send_wr = caps.max_send_wr;
    a.cap.max_recv_wr = caps.max_recv_wr;
    a.cap.max_send_sge = caps.max_send_sge;
    a.cap.max_recv_sge = caps.max_recv_sge;
    a.cap.max_inline_data = caps.max_inline_data;
    Ok(q)
}

/// # Safety
/// `qp` must be NULL or a live QP of ours (`ibv_create_qp` / `ibv_create_qp_ex`).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    ffi_guard!(libc::EIO, {
        if qp.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: qp came from ibv_create_qp and is live until the Box below frees it.
        let shared = &unsafe { &*(qp as *const Qp) }.shared;
        // First no new event may name it (the engine pushes QP events under the core lock and
        // skips a cleared pointer), then its queued ones go and the held ones are waited for:
        // otherwise an event raised while it is destroyed would hand out a freed QP.
        {
            let _core = shared.lock_core();
            shared.ibv_ptr.store(0, std::sync::atomic::Ordering::Release);
        }
        shared.async_q.forget(qp as usize, std::time::Duration::from_secs(2));
        // SAFETY: qp came from ibv_create_qp; freed once.
        let q = unsafe { Box::from_raw(qp as *mut Qp) };
        q.dev.engine.remove_qp(q.shared.qpn);
        if crate::config::debug() {
            let st = q.shared.lock_core().stats();
            eprintln!("softroce: {} QP {:#x} destroyed: {st:?}", q.dev.name, q.shared.qpn);
        }
        q.shared.detach();
        0
    })
}

fn state_of(v: u32) -> Result<QpState, i32> {
    QpState::from_ibv(v).ok_or(libc::EINVAL)
}

/// Converts `ibv_qp_attr` + mask into the core's attributes, with the checks
/// that need device knowledge (port, GID index, MTU, address family).
/// The address vector of an `ibv_ah_attr`, checked by the rules of the port's link layer
/// (docs/softroce.md#infiniband-mode): RoCE needs a GRH whose DGID routes to an IPv4 address
/// (rc_pingpong without -g fails here, as on real RoCE); InfiniBand routes by the DLID (a
/// unicast LID, or 0 beside a GRH) and carries a GRH from a valid source GID only when
/// `is_global`.
pub(crate) fn address_vector(dev: &Device, ah: &rdma_sys::ibv_ah_attr) -> Result<AddressVector, i32> {
    if ah.port_num != 0 && ah.port_num != 1 {
        return Err(libc::EINVAL);
    }
    // SAFETY: reading the raw bytes of a 16-byte union.
    let dgid = unsafe { ah.grh.dgid.raw };
    let global = ah.is_global != 0;
    if global && dev.gid(ah.grh.sgid_index as usize).is_none() {
        return Err(libc::EINVAL);
    }
    let dlid = match dev.link {
        LinkLayer::Ethernet => {
            // IPv6 / link-local destinations are not routable by this device.
            if !global || gid_to_ipv4(&dgid).is_none() {
                return Err(libc::EINVAL);
            }
            0
        }
        LinkLayer::Infiniband => {
            // Multicast DLIDs are for UD; without a GRH the DLID is all that names the peer.
            // (With a GRH a DLID of 0 is taken, as by hardware: it routes nowhere, so the
            // packets are lost.)
            if ah.dlid > MAX_UNICAST_LID || (ah.dlid == 0 && !global) {
                return Err(libc::EINVAL);
            }
            ah.dlid
        }
    };
    Ok(AddressVector {
        dgid: if global { dgid } else { [0; 16] },
        sgid_index: if global { ah.grh.sgid_index } else { 0 },
        hop_limit: if global { ah.grh.hop_limit } else { 0 },
        traffic_class: if global { ah.grh.traffic_class } else { 0 },
        flow_label: if global { ah.grh.flow_label } else { 0 },
        is_global: global,
        port_num: 1,
        sl: ah.sl & 0xF,
        dlid,
    })
}

fn to_modify_attrs(dev: &Device, a: &ibv_qp_attr, mask: u32) -> Result<ModifyAttrs, i32> {
    let mut m = ModifyAttrs {
        mask,
        ..Default::default()
    };
    if mask & attr_mask::STATE != 0 {
        m.qp_state = state_of(a.qp_state)?;
    }
    if mask & attr_mask::CUR_STATE != 0 {
        m.cur_qp_state = state_of(a.cur_qp_state)?;
    }
    if mask & attr_mask::PATH_MTU != 0 {
        let max = dev.active_mtu;
        if a.path_mtu < 1 || a.path_mtu > max {
            return Err(libc::EINVAL);
        }
        m.path_mtu = a.path_mtu as u8;
    }
    if mask & attr_mask::PORT != 0 && a.port_num != 1 {
        return Err(libc::EINVAL);
    }
    if mask & attr_mask::PKEY_INDEX != 0 && usize::from(a.pkey_index) >= crate::config::pkeys().len() {
        return Err(libc::EINVAL);
    }
    if mask & attr_mask::AV != 0 {
        m.ah = address_vector(dev, &a.ah_attr)?;
    }
    if mask & attr_mask::ALT_PATH != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if mask & attr_mask::MAX_QP_RD_ATOMIC != 0 && a.max_rd_atomic > limits::MAX_QP_RD_ATOM {
        return Err(libc::EINVAL);
    }
    if mask & attr_mask::MAX_DEST_RD_ATOMIC != 0 && a.max_dest_rd_atomic > limits::MAX_QP_RD_ATOM {
        return Err(libc::EINVAL);
    }
    m.qkey = a.qkey;
    m.rq_psn = a.rq_psn;
    m.sq_psn = a.sq_psn;
    m.dest_qp_num = a.dest_qp_num;
    m.qp_access_flags = a.qp_access_flags;
    m.pkey_index = a.pkey_index;
    m.port_num = a.port_num;
    m.en_sqd_async_notify = a.en_sqd_async_notify;
    m.max_rd_atomic = a.max_rd_atomic;
    m.max_dest_rd_atomic = a.max_dest_rd_atomic;
    m.min_rnr_timer = a.min_rnr_timer;
    m.timeout = a.timeout;
    m.retry_cnt = a.retry_cnt;
    m.rnr_retry = a.rnr_retry;
    Ok(m)
}

/// # Safety
/// `qp` must be NULL or a live QP of ours (`ibv_create_qp` / `ibv_create_qp_ex`).
/// `attr` must be NULL or valid for reads and writes of one `ibv_qp_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    ffi_guard!(libc::EIO, {
        if qp.is_null() || attr.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: qp is ours; attr is valid for reading. Shared borrow only:
        // other threads may be posting on the QP.
        let (q, a) = unsafe { (&*(qp as *const Qp), &*attr) };
        let mask = mask as u32;
        // RATE_LIMIT and bits we do not know.
        if mask & !0x1f_ffff != 0 {
            return int_err(libc::EOPNOTSUPP);
        }
        let m = match to_modify_attrs(&q.dev, a, mask) {
            Ok(m) => m,
            Err(e) => return int_err(e),
        };
        let set_state = |state: QpState| {
            // SAFETY: the public `state` field, written through the raw
            // pointer while the core lock serialises modify calls.
            unsafe { std::ptr::addr_of_mut!((*qp).state).write(state as u32) };
        };
        match engine::modify_qp(&q.dev, &q.shared, &m, set_state) {
            Ok(()) => 0,
            Err(e) => int_err(e.0),
        }
    })
}

/// # Safety
/// `qp` must be NULL or a live QP of ours (`ibv_create_qp` / `ibv_create_qp_ex`).
/// `attr` must be NULL or valid for reads and writes of one `ibv_qp_attr`.
/// `init_attr` must be NULL or valid for reads and writes of one `ibv_qp_init_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi_guard!(libc::EIO, {
        if qp.is_null() || attr.is_null() || init_attr.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: qp is ours.
        let q = unsafe { &*(qp as *const Qp) };
        let s = q.shared.lock_core().query();
        // SAFETY: plain data.
        let mut o: ibv_qp_attr = unsafe { std::mem::zeroed() };
        o.qp_state = s.qp_state as u32;
        o.cur_qp_state = s.qp_state as u32;
        o.path_mtu = s.path_mtu as u32;
        o.path_mig_state = 0; // IBV_MIG_MIGRATED
        o.qkey = s.qkey;
        o.rq_psn = s.rq_psn;
        o.sq_psn = s.sq_psn;
        o.dest_qp_num = s.dest_qp_num;
        o.qp_access_flags = s.qp_access_flags;
        o.cap.max_send_wr = q.caps.max_send_wr;
        o.cap.max_recv_wr = q.caps.max_recv_wr;
        o.cap.max_send_sge = q.caps.max_send_sge;
        o.cap.max_recv_sge = q.caps.max_recv_sge;
        o.cap.max_inline_data = q.caps.max_inline_data;
        o.ah_attr.grh.dgid.raw = s.ah.dgid;
        o.ah_attr.grh.flow_label = s.ah.flow_label;
        o.ah_attr.grh.sgid_index = s.ah.sgid_index;
        o.ah_attr.grh.hop_limit = s.ah.hop_limit;
        o.ah_attr.grh.traffic_class = s.ah.traffic_class;
        o.ah_attr.is_global = s.ah.is_global as u8;
        o.ah_attr.port_num = 1;
        o.ah_attr.sl = s.ah.sl;
        o.ah_attr.dlid = s.ah.dlid;
        o.pkey_index = s.pkey_index;
        o.en_sqd_async_notify = s.en_sqd_async_notify;
        o.sq_draining = 0;
        o.max_rd_atomic = s.max_rd_atomic;
        o.max_dest_rd_atomic = s.max_dest_rd_atomic;
        o.min_rnr_timer = s.min_rnr_timer;
        o.port_num = 1;
        o.timeout = s.timeout;
        o.retry_cnt = s.retry_cnt;
        o.rnr_retry = s.rnr_retry;
        // SAFETY: both out-pointers are valid per the API contract.
        unsafe {
            let cap = o.cap;
            *attr = o;
            let ia = &mut *init_attr;
            ia.qp_context = q.ex.qp_base.qp_context;
            ia.send_cq = q.ex.qp_base.send_cq;
            ia.recv_cq = q.ex.qp_base.recv_cq;
            ia.srq = q.ex.qp_base.srq;
            ia.cap = cap;
            ia.qp_type = IBV_QPT_RC;
            ia.sq_sig_all = q.caps.sq_sig_all as c_int;
        }
        0
    })
}

/// Converts one `ibv_send_wr` (inline payload copied now).
///
/// # Safety
/// `w` must be a valid WR whose SGEs are valid; for INLINE their addresses
/// must be readable for their lengths.
unsafe fn to_send_wr(w: &ibv_send_wr, max_sge: u32) -> Result<SendWr, i32> {
    let opcode = WrOpcode::from_ibv(w.opcode).ok_or(libc::EINVAL)?;
    if w.num_sge < 0 || w.num_sge as u32 > max_sge {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let sg = unsafe { sges(w.sg_list, w.num_sge) };
    let inline = send_flag(w.send_flags, ibv_send_flags::IBV_SEND_INLINE)
        && matches!(
            opcode,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm
        );
    let inline_data = if inline {
        let total: u64 = sg.iter().map(|s| s.length as u64).sum();
        if total > limits::MAX_INLINE as u64 {
            return Err(libc::EINVAL);
        }
        let mut v = Vec::with_capacity(total as usize);
        for s in &sg {
            if s.length > 0 {
                // SAFETY: inline SGEs are plain readable buffers (no lkey check, as on HW).
                v.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                });
            }
        }
        Some(v)
    } else {
        None
    };
    // SAFETY: reading the union members that match the opcode.
    let (remote_addr, rkey, compare_add, swap) = unsafe {
        if opcode.is_atomic() {
            let at = w.wr.atomic;
            (at.remote_addr, at.rkey, at.compare_add, at.swap)
        } else {
            let r = w.wr.rdma;
            (r.remote_addr, r.rkey, 0, 0)
        }
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        opcode,
        sges: if inline { Vec::new() } else { sg },
        inline_data,
        remote_addr,
        rkey,
        // SAFETY: the union's imm_data member (raw u32, network order).
        imm_data: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
        compare_add,
        swap,
        signaled: send_flag(w.send_flags, ibv_send_flags::IBV_SEND_SIGNALED),
        solicited: send_flag(w.send_flags, ibv_send_flags::IBV_SEND_SOLICITED),
        fence: send_flag(w.send_flags, ibv_send_flags::IBV_SEND_FENCE),
    })
}

/// Posts converted WRs in order, stopping at the first the core refuses.
/// Returns 0 or the errno and the index of the refused WR.
pub(crate) fn post_send_wrs(q: &Qp, wrs: impl IntoIterator<Item = Result<SendWr, i32>>) -> (i32, usize) {
    let counted = q.shared.counters.post_send_called(q.caps.sq_sig_all);
    engine::post_send(&q.dev, &q.shared, wrs.into_iter().inspect(|w| counted.wr(w)))
}

/// `ops.post_send`.
///
/// # Safety
/// `qp` must be NULL or a live QP of ours (`ibv_create_qp` / `ibv_create_qp_ex`).
/// `wr` must be NULL or the head of a chain of valid `ibv_send_wr`s (each `next` NULL or valid), each `sg_list` holding `num_sge` valid SGEs; the buffers of an INLINE WR must be readable for their lengths.
/// `bad_wr` must be NULL or valid for writing one pointer.
pub unsafe extern "C" fn post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: qp is ours.
        let Some(q) = (unsafe { Qp::from_ibv(qp) }) else {
            return libc::EINVAL;
        };
        // Walk the chain lazily, converting each WR as it is posted (inline
        // data is copied here); `last` is the WR most recently handed out,
        // i.e. the refused one when posting stops with an error.
        let max_sge = q.caps.max_send_sge;
        let last = std::cell::Cell::new(std::ptr::null_mut::<ibv_send_wr>());
        let mut cur = wr;
        let chain = std::iter::from_fn(|| {
            if cur.is_null() {
                return None;
            }
            let w = cur;
            last.set(w);
            // SAFETY: the WR chain is valid per the API contract.
            let w = unsafe { &*w };
            cur = w.next;
            // SAFETY: as above (SGEs / inline buffers valid per the contract).
            Some(unsafe { to_send_wr(w, max_sge) })
        });
        let (err, _) = post_send_wrs(q, chain);
        if err != 0 && !bad_wr.is_null() {
            // SAFETY: valid out-pointer.
            unsafe { *bad_wr = last.get() };
        }
        err
    })
}

/// `ops.post_recv`.
///
/// # Safety
/// `qp` must be NULL or a live QP of ours (`ibv_create_qp` / `ibv_create_qp_ex`).
/// `wr` must be NULL or the head of a chain of valid `ibv_recv_wr`s (each `next` NULL or valid), each `sg_list` holding `num_sge` valid SGEs.
/// `bad_wr` must be NULL or valid for writing one pointer.
pub unsafe extern "C" fn post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    ffi_guard!(libc::EIO, {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: qp is ours.
        let q = unsafe { &*(qp as *const Qp) };
        let max_sge = q.caps.max_recv_sge;
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
            // SAFETY: SGE list valid per the contract.
            let sges = unsafe { sges(w.sg_list, w.num_sge) };
            Some(Ok(RecvWr { wr_id: w.wr_id, sges }))
        });
        let mut wrs = 0;
        let (err, _) = engine::post_recv(&q.dev, &q.shared, chain.inspect(|w| wrs += u64::from(w.is_ok())));
        q.shared.counters.post_recv_called(wrs);
        if err != 0 && !bad_wr.is_null() {
            // SAFETY: valid out-pointer.
            unsafe { *bad_wr = last.get() };
        }
        err
    })
}

/// Acknowledges an async event whose element is this QP.
///
/// # Safety
/// `qp` must be NULL or our live QP.
pub unsafe fn ack_async(qp: *mut ibv_qp) {
    if !qp.is_null() {
        // SAFETY: per the contract.
        unsafe { (*qp).events_completed += 1 };
        // SAFETY: as above; its destroy waits for this (AsyncQueue::forget).
        unsafe { &*(qp as *const Qp) }.shared.async_q.acked(qp as usize);
    }
}

/// `ibv_query_qp_data_in_order`: we guarantee nothing beyond the verbs
/// ordering rules, like a provider without the op (returns 0).
///
/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: u32, _flags: u32) -> c_int {
    ffi_guard!(0, { 0 })
}

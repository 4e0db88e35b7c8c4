//! RAII RC queue pair with the state transitions of docs/nccl-net-abi.md#qp-attributes.
//!
//! ```text
//! RESET --to_init--> INIT --to_rtr--> RTR --to_rts--> RTS
//!   any --to_error--> ERR   (flushes outstanding WRs with IBV_WC_WR_FLUSH_ERR)
//! ```
//! Posting is `unsafe`: the buffers a WR names must stay alive until its completion is polled
//! or the QP is destroyed.

use super::cq::CompletionQueue;
use super::{sys, ProtectionDomain};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Live objects of this type in the process (leak tests compare before/after).
pub static LIVE_QPS: AtomicUsize = AtomicUsize::new(0);

/// Queue sizes requested at creation.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_inline_data: u32,
    /// SGEs per send WR: 2 where an eager write gathers its inline header and its payload.
    pub max_send_sge: u32,
}

/// Everything RTR needs about the path to the peer QP.
#[derive(Debug, Clone, Copy)]
pub struct RtrAttrs {
    /// `ibv_mtu` value.
    pub path_mtu: u32,
    pub dest_qpn: u32,
    /// RoCE (and routed IB): carry a GRH.
    pub global: bool,
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub traffic_class: u8,
    pub dlid: u16,
    pub sl: u8,
    pub port_num: u8,
}

/// What the retry loop of `ibv_modify_qp` does (NCCL_IB_MQP_RETRY_*).
#[derive(Debug, Clone, Copy)]
pub struct ModifyRetry {
    pub count: u32,
    pub sleep_ms: u64,
    pub all_errors: bool,
}

pub struct QueuePair {
    pub pd: Arc<ProtectionDomain>,
    pub send_cq: Arc<CompletionQueue>,
    pub recv_cq: Arc<CompletionQueue>,
    raw: *mut sys::ibv_qp,
    /// Inline bytes actually granted.
    pub max_inline_data: u32,
    retry: ModifyRetry,
}

// SAFETY: ibv_qp calls are thread-safe per rdma-core; the pointer is owned by this object.
unsafe impl Send for QueuePair {}
// SAFETY: see Send.
unsafe impl Sync for QueuePair {}

impl QueuePair {
    /// An RC QP with one SGE per WR.
    pub fn new_rc(
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        caps: QpCaps,
        retry: ModifyRetry,
    ) -> Result<QueuePair> {
        let max_wr = pd.context.info.max_qp_wr.max(1) as u32;
        // SAFETY: zeroed ibv_qp_init_attr is valid (pointers NULL, integers 0).
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.as_ptr();
        init.recv_cq = recv_cq.as_ptr();
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = caps.max_send_wr.clamp(1, max_wr);
        init.cap.max_recv_wr = caps.max_recv_wr.min(max_wr);
        // Two: an eager write gathers its header (inline) and its payload.
        init.cap.max_send_sge = 2;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = caps.max_inline_data;
        // SAFETY: live PD and CQs; init is a valid in/out struct.
        let raw = unsafe { (pd.context.verbs.ibv_create_qp)(pd.as_ptr(), &mut init) };
        if raw.is_null() {
            return Err(Error::last_os(&format!(
                "ibv_create_qp({}, RC, {} send / {} recv WRs, {} inline bytes)",
                pd.context.info.name, init.cap.max_send_wr, init.cap.max_recv_wr, caps.max_inline_data
            )));
        }
        LIVE_QPS.fetch_add(1, Ordering::Relaxed);
        Ok(QueuePair {
            pd,
            send_cq,
            recv_cq,
            raw,
            max_inline_data: init.cap.max_inline_data,
            retry,
        })
    }

    pub fn qpn(&self) -> u32 {
        // SAFETY: raw is a live QP owned by self.
        unsafe { (*self.raw).qp_num }
    }

    pub fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.raw
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: u32, what: &str) -> Result<()> {
        let mut attempt = 0u32;
        loop {
            // SAFETY: live QP; attr is a valid, fully initialised struct.
            let rc = unsafe { (self.pd.context.verbs.ibv_modify_qp)(self.raw, attr, mask as i32) };
            if rc == 0 {
                return Ok(());
            }
            let errno = if rc < 0 {
                std::io::Error::last_os_error().raw_os_error().unwrap_or(-rc)
            } else {
                rc
            };
            let retryable = errno == libc::ETIMEDOUT || self.retry.all_errors;
            if !retryable || attempt >= self.retry.count {
                return Err(Error::system(format!(
                    "ibv_modify_qp({}, QP {:#x}, {what}) failed: {}",
                    self.pd.context.info.name,
                    self.qpn(),
                    std::io::Error::from_raw_os_error(errno)
                )));
            }
            attempt += 1;
            std::thread::sleep(std::time::Duration::from_millis(
                self.retry.sleep_ms.saturating_mul(attempt as u64),
            ));
        }
    }

    /// RESET → INIT.
    pub fn to_init(&self, port: u8, pkey_index: u16, access: u32) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: zeroed ibv_qp_attr is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = pkey_index;
        a.port_num = port;
        a.qp_access_flags = access;
        let mask = M::IBV_QP_STATE.0 | M::IBV_QP_PKEY_INDEX.0 | M::IBV_QP_PORT.0 | M::IBV_QP_ACCESS_FLAGS.0;
        self.modify(&mut a, mask, "INIT")
    }

    /// INIT → RTR.
    pub fn to_rtr(&self, r: &RtrAttrs) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: zeroed ibv_qp_attr is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = r.path_mtu;
        a.dest_qp_num = r.dest_qpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        if r.global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = sys::ibv_gid { raw: r.dgid };
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.sgid_index = r.sgid_index;
            a.ah_attr.grh.hop_limit = 255;
            a.ah_attr.grh.traffic_class = r.traffic_class;
        }
        a.ah_attr.dlid = r.dlid;
        a.ah_attr.sl = r.sl;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = r.port_num;
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_AV.0
            | M::IBV_QP_PATH_MTU.0
            | M::IBV_QP_DEST_QPN.0
            | M::IBV_QP_RQ_PSN.0
            | M::IBV_QP_MAX_DEST_RD_ATOMIC.0
            | M::IBV_QP_MIN_RNR_TIMER.0;
        self.modify(&mut a, mask, "RTR")
    }

    /// RTR → RTS.
    pub fn to_rts(&self, timeout: u8, retry_cnt: u8) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: zeroed ibv_qp_attr is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.timeout = timeout;
        a.retry_cnt = retry_cnt;
        a.rnr_retry = 7;
        a.sq_psn = 0;
        a.max_rd_atomic = 1;
        let mask = M::IBV_QP_STATE.0
            | M::IBV_QP_SQ_PSN.0
            | M::IBV_QP_TIMEOUT.0
            | M::IBV_QP_RETRY_CNT.0
            | M::IBV_QP_RNR_RETRY.0
            | M::IBV_QP_MAX_QP_RD_ATOMIC.0;
        self.modify(&mut a, mask, "RTS")
    }

    /// The P_Key index the QP uses, as the device reports it (`ibv_query_qp`).
    pub fn pkey_index(&self) -> Result<u16> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: zeroed ibv_qp_attr and ibv_qp_init_attr are valid out-parameters.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: raw is a live QP owned by self; both out-parameters outlive the call.
        let rc =
            unsafe { (self.pd.context.verbs.ibv_query_qp)(self.raw, &mut a, M::IBV_QP_PKEY_INDEX.0 as i32, &mut init) };
        if rc != 0 {
            return Err(Error::system(format!(
                "ibv_query_qp({}, QP {:#x}, P_Key index) failed: {}",
                self.pd.context.info.name,
                self.qpn(),
                std::io::Error::from_raw_os_error(rc.abs())
            )));
        }
        Ok(a.pkey_index)
    }

    /// Any state → ERR, flushing outstanding work (used at close).
    pub fn to_error(&self) -> Result<()> {
        // SAFETY: zeroed ibv_qp_attr is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: live QP; valid attr.
        let rc = unsafe {
            (self.pd.context.verbs.ibv_modify_qp)(self.raw, &mut a, sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32)
        };
        super::check_rc(rc, || format!("ibv_modify_qp(QP {:#x}, ERR)", self.qpn()))
    }

    /// Post a chain of send WRs.
    ///
    /// # Safety
    /// `wr` is a valid chain; every SGE names memory registered with an lkey of this PD's
    /// device (or inline data) and every remote address/rkey pair is the peer's; the local
    /// buffers stay alive until the completion of the chain's last signaled WR is polled or the
    /// QP is destroyed.
    pub unsafe fn post_send(&self, wr: *mut sys::ibv_send_wr) -> Result<()> {
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; the caller guarantees the chain.
        let rc = unsafe { super::post_send(self.raw, wr, &mut bad) };
        super::check_rc(rc, || format!("ibv_post_send(QP {:#x})", self.qpn()))
    }

    /// Post a chain of receive WRs.
    ///
    /// # Safety
    /// As [`QueuePair::post_send`] for the buffers the receive WRs name (none for zero-SGE WRs).
    pub unsafe fn post_recv(&self, wr: *mut sys::ibv_recv_wr) -> Result<()> {
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; the caller guarantees the chain.
        let rc = unsafe { super::post_recv(self.raw, wr, &mut bad) };
        super::check_rc(rc, || format!("ibv_post_recv(QP {:#x})", self.qpn()))
    }
}

impl QueuePair {
    /// The QP's ACK timeouts, retransmissions and RNR NAKs received, where the NIC counts them
    /// per QP (softroce's `softroce_qp_transport_get`); `None` on a NIC that does not.
    pub fn transport_events(&self) -> Option<crate::transport::proto::hang::QpEvents> {
        let get = self.pd.context.verbs.softroce_qp_transport_get?;
        let mut r = super::QpTransportRepr::default();
        // SAFETY: live QP of this library; `r` is a writable struct of the size passed.
        let rc = unsafe { get(self.raw, &mut r, std::mem::size_of::<super::QpTransportRepr>()) };
        // Fields up to rnr_naks_received filled (version 1 fills them all).
        (rc == 0 && r.size as usize >= 32).then_some(crate::transport::proto::hang::QpEvents {
            timeouts: r.timeouts,
            retransmits: r.retransmits,
            rnr_naks: r.rnr_naks_received,
        })
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        LIVE_QPS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: raw is owned and destroyed once; its CQs and PD outlive it (Arcs held).
        let rc = unsafe { (self.pd.context.verbs.ibv_destroy_qp)(self.raw) };
        if rc != 0 {
            crate::log_warn!(
                "ibv_destroy_qp({}) failed: {}",
                self.pd.context.info.name,
                std::io::Error::from_raw_os_error(rc.abs())
            );
        }
    }
}

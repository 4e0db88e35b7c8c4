//! RAII completion queue and a work-completion view that forces a status check.
//!
//! `ibv_wc` fields other than `wr_id`, `status`, `qp_num` and `vendor_err` are undefined when
//! the status is an error, so [`WorkCompletion`] only hands out opcode, length and immediate
//! through [`WorkCompletion::result`]'s `Ok` branch.

use super::{sys, Context};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Live objects of this type in the process (leak tests compare before/after).
pub static LIVE_CQS: AtomicUsize = AtomicUsize::new(0);

/// A completion queue on one device context.
pub struct CompletionQueue {
    pub context: Arc<Context>,
    raw: *mut sys::ibv_cq,
    /// Entries actually granted.
    pub cqe: i32,
}

// SAFETY: ibv_cq is thread-safe per rdma-core; the pointer is owned by this object.
unsafe impl Send for CompletionQueue {}
// SAFETY: see Send.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A CQ with at least `cqe` entries (capped at the device maximum).
    pub fn new(context: Arc<Context>, cqe: i32) -> Result<Arc<CompletionQueue>> {
        let want = cqe.clamp(1, context.info.max_cqe.max(1));
        // SAFETY: live context; no completion channel, vector 0, no cq_context.
        let raw = unsafe {
            (context.verbs.ibv_create_cq)(context.as_ptr(), want, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        };
        if raw.is_null() {
            return Err(Error::last_os(&format!(
                "ibv_create_cq({}, {want} entries)",
                context.info.name
            )));
        }
        // SAFETY: raw is the CQ just created.
        let cqe = unsafe { (*raw).cqe };
        LIVE_CQS.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(CompletionQueue { context, raw, cqe }))
    }

    pub fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.raw
    }

    /// Non-blocking poll into `out`; returns the filled prefix.
    pub fn poll<'a>(&self, out: &'a mut [WorkCompletion]) -> Result<&'a [WorkCompletion]> {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: the CQ is live (owned); `out` has room for n entries and WorkCompletion is
        // repr(transparent) over ibv_wc.
        let got = unsafe { super::poll_cq(self.raw, n, out.as_mut_ptr().cast()) };
        if got < 0 {
            return Err(Error::system(format!(
                "ibv_poll_cq({}) failed: {}",
                self.context.info.name,
                std::io::Error::from_raw_os_error(-got)
            )));
        }
        Ok(&out[..got as usize])
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        LIVE_CQS.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: every QP using this CQ holds an Arc to it, so none is alive; raw is owned.
        let rc = unsafe { (self.context.verbs.ibv_destroy_cq)(self.raw) };
        if rc != 0 {
            crate::log_warn!(
                "ibv_destroy_cq({}) failed: {}",
                self.context.info.name,
                std::io::Error::from_raw_os_error(rc.abs())
            );
        }
    }
}

/// One `ibv_wc`, readable only through status-checking accessors.
#[repr(transparent)]
pub struct WorkCompletion(sys::ibv_wc);

impl Default for WorkCompletion {
    fn default() -> Self {
        // SAFETY: ibv_wc is plain integers and a union of integers; all-zero is valid.
        WorkCompletion(unsafe { std::mem::zeroed() })
    }
}

/// A successful completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completed {
    pub opcode: u32,
    pub byte_len: u32,
    /// The immediate in host order, when the completion carries one.
    pub imm: Option<u32>,
}

/// A failed completion: only these fields are defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    pub status: u32,
    pub vendor_err: u32,
    pub qp_num: u32,
}

/// `IBV_WC_WITH_IMM`.
const WC_WITH_IMM: u32 = 1 << 1;

impl WorkCompletion {
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    pub fn result(&self) -> std::result::Result<Completed, Failed> {
        if self.0.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
            return Err(Failed {
                status: self.0.status,
                vendor_err: self.0.vendor_err,
                qp_num: self.0.qp_num,
            });
        }
        let imm = (self.0.wc_flags & WC_WITH_IMM != 0).then(|| {
            // SAFETY: with IBV_WC_WITH_IMM set the union holds imm_data (network order).
            u32::from_be(unsafe { self.0.imm_data_invalidated_rkey_union.imm_data })
        });
        Ok(Completed {
            opcode: self.0.opcode,
            byte_len: self.0.byte_len,
            imm,
        })
    }

    /// Build a completion, for tests of the dispatch logic.
    pub fn synthetic(wr_id: u64, status: u32, opcode: u32, imm: Option<u32>, qp_num: u32) -> Self {
        let mut wc = WorkCompletion::default();
        wc.0.wr_id = wr_id;
        wc.0.status = status;
        wc.0.opcode = opcode;
        wc.0.qp_num = qp_num;
        if let Some(v) = imm {
            wc.0.wc_flags |= WC_WITH_IMM;
            wc.0.imm_data_invalidated_rkey_union.imm_data = v.to_be();
        }
        wc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_checked_before_fields() {
        let ok = WorkCompletion::synthetic(7, 0, sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM, Some(4096), 3);
        assert_eq!(ok.wr_id(), 7);
        let c = ok.result().unwrap();
        assert_eq!(c.imm, Some(4096));
        assert_eq!(c.opcode, sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM);
        let bad = WorkCompletion::synthetic(8, sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR, 0, None, 5);
        let f = bad.result().unwrap_err();
        assert_eq!(f.status, sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR);
        assert_eq!(f.qp_num, 5);
        assert_eq!(
            std::mem::size_of::<WorkCompletion>(),
            std::mem::size_of::<sys::ibv_wc>()
        );
    }
}

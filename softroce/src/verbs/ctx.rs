//! The `ibv_context` we hand out: rdma-core's `verbs_context` followed by
//! our state.

use std::sync::Arc;

use rdma_sys::{ibv_context, verbs_context};

use crate::driver::device::Device;
use crate::driver::event::AsyncQueue;

/// What we allocate for `ibv_open_device`: the 648-byte `verbs_context`
/// (whose embedded `ibv_context` is what the application sees) and our state.
#[repr(C)]
pub struct Context {
    pub vctx: verbs_context,
    pub dev: Arc<Device>,
    pub async_q: Arc<AsyncQueue>,
    /// The command file behind `vctx.context.cmd_fd` (shared with the contexts imported from it).
    pub file: super::cmdfile::FileId,
}

impl Context {
    /// Recovers our context from the application's `ibv_context` pointer.
    ///
    /// # Safety
    /// `ctx` must be NULL or a pointer returned by our `ibv_open_device` and not yet closed.
    pub unsafe fn from_ibv<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
        if ctx.is_null() {
            return None;
        }
        let off = std::mem::offset_of!(verbs_context, context);
        // SAFETY: per the contract, ctx points `off` bytes into a live Context
        // whose first field is the verbs_context.
        Some(unsafe { &*((ctx as *mut u8).sub(off) as *const Context) })
    }
}

//! `closeSend`, `closeRecv`, `closeListen`: each comm freed once.

use crate::abi::call_trace::Line;
use crate::abi::ffi;
use crate::abi::types::*;
use crate::api::{ListenHandle, RecvHandle, SendHandle};
use std::ffi::c_void;

/// Closes a comm of ours whose handle is a `Box<T>`, for the exported function `name`.
///
/// # Safety
/// `comm` is NULL or a live `T` of ours, closed once and not used after or during the call.
unsafe fn close_comm<T>(name: &str, comm: *mut c_void) -> NcclResult {
    ffi::call_traced(
        name,
        || {
            if !comm.is_null() {
                // SAFETY: NCCL closes each comm of ours once, with no call in flight on it.
                drop(unsafe { Box::from_raw(comm.cast::<T>()) });
            }
            Ok(())
        },
        || Line::of(format!("comm {comm:p}")),
    )
}

/// # Safety
/// `comm` is NULL or a live send comm of ours, closed once and not used after or during the call.
pub(crate) unsafe extern "C" fn close_send(comm: *mut c_void) -> NcclResult {
    // SAFETY: per the contract.
    unsafe { close_comm::<SendHandle>("closeSend", comm) }
}

/// # Safety
/// `comm` is NULL or a live receive comm of ours, closed once and not used after or during the
/// call.
pub(crate) unsafe extern "C" fn close_recv(comm: *mut c_void) -> NcclResult {
    // SAFETY: per the contract.
    unsafe { close_comm::<RecvHandle>("closeRecv", comm) }
}

/// # Safety
/// `comm` is NULL or a live listen comm of ours, closed once and not used after or during the call.
pub(crate) unsafe extern "C" fn close_listen(comm: *mut c_void) -> NcclResult {
    // SAFETY: per the contract.
    unsafe { close_comm::<ListenHandle>("closeListen", comm) }
}

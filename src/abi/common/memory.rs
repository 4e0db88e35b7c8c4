//! Memory registration: `regMr` (int and size_t sizes), `regMrDmaBuf`, `deregMr`.

use crate::abi::call_trace::{out_ptr, Line};
use crate::abi::ffi::{self, non_null};
use crate::abi::types::*;
use crate::api::{self, MemHandle};
use crate::error::Error;
use std::ffi::{c_int, c_void};

fn reg(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    dmabuf: Option<(i32, u64)>,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    let describe = || {
        let kind = match ptr_type {
            NCCL_PTR_HOST => "HOST".to_string(),
            NCCL_PTR_CUDA => "CUDA".to_string(),
            other => other.to_string(),
        };
        let dmabuf = dmabuf.map_or_else(|| "none".into(), |(fd, offset)| format!("fd {fd} offset {offset}"));
        // SAFETY: NCCL's out-pointer, NULL or writable.
        let out = unsafe { out_ptr(mhandle) };
        Line::of(format!(
            "comm {comm:p}, data {data:p}, size {size}, type {kind}, dmabuf {dmabuf}, mhandle -> {out}"
        ))
    };
    let body = || {
        let out = non_null(mhandle, "mhandle")?;
        let comm = non_null(comm, "comm")?;
        // SAFETY: NCCL passes a live send or receive comm of ours.
        let device = unsafe { api::comm_device(comm) };
        let kind = match ptr_type {
            NCCL_PTR_HOST => api::MemKind::Host,
            NCCL_PTR_CUDA => api::MemKind::Cuda,
            other => return Err(Error::internal(format!("regMr: unknown memory type {other}"))),
        };
        let mh = api::reg_mr(device, data as usize, size, kind, dmabuf)?;
        // SAFETY: non-NULL out-pointer.
        unsafe { *out = Box::into_raw(mh).cast() };
        Ok(())
    };
    ffi::call_traced("regMr", body, describe)
}

/// # Safety
/// `comm` is NULL (an error) or a live send or receive comm of ours; `[data, data + size)` stays
/// allocated until [`dereg_mr`] of the handle; `mhandle` is NULL (an error) or writable.
pub(crate) unsafe extern "C" fn reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    reg(comm, data, size, ptr_type, None, mhandle)
}

/// # Safety
/// As [`reg_mr`].
pub(crate) unsafe extern "C" fn reg_mr_int(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    ffi::guard("regMr", || match ffi::int_size(size, "regMr size") {
        Ok(size) => reg(comm, data, size, ptr_type, None, mhandle),
        Err(e) => ffi::call("regMr", || Err(e)),
    })
}

/// # Safety
/// As [`reg_mr`]; `fd` is a DMA-BUF file descriptor whose byte `offset` is mapped at `data`, for
/// `size` bytes.
pub(crate) unsafe extern "C" fn reg_mr_dma_buf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    ptr_type: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    reg(comm, data, size, ptr_type, Some((fd, offset)), mhandle)
}

/// # Safety
/// `mhandle` is NULL (an error) or a handle from regMr, deregistered once, that no request in
/// flight uses.
pub(crate) unsafe extern "C" fn dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
    ffi::call_traced(
        "deregMr",
        || {
            if mhandle.is_null() {
                return Ok(());
            }
            // SAFETY: NCCL passes each mhandle from our regMr to deregMr exactly once.
            api::dereg_mr(unsafe { Box::from_raw(mhandle.cast::<MemHandle>()) })
        },
        || Line::of(format!("comm {_comm:p}, mhandle {mhandle:p}")),
    )
}

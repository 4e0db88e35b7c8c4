//! NCCL's pointers as ours: the connection handle buffer, memory handles, the context.

use crate::abi::ffi::{self, non_null};
use crate::abi::types::*;
use crate::api::{self, CommContext, MemHandle};
use crate::error::Error;
use std::ffi::{c_int, c_void};

/// Converts NCCL's handle buffer (NCCL_NET_HANDLE_MAXSIZE bytes) into an array reference.
///
/// # Safety
/// `handle` points at 128 writable bytes that live for the call.
pub(super) unsafe fn handle_bytes<'a>(handle: *mut c_void) -> Result<&'a mut [u8; NCCL_NET_HANDLE_MAXSIZE], Error> {
    let p = non_null(handle, "handle")?;
    // SAFETY: NCCL passes a buffer of NCCL_NET_HANDLE_MAXSIZE bytes
    // (docs/nccl-net-abi.md#connection-setup); u8 has align 1.
    Ok(unsafe { &mut *(p as *mut [u8; NCCL_NET_HANDLE_MAXSIZE]) })
}

/// # Safety
/// `mhandle` is a live handle of ours.
pub(super) unsafe fn mem_handle<'a>(mhandle: *mut c_void) -> Result<&'a MemHandle, Error> {
    let p = non_null(mhandle.cast::<MemHandle>(), "mhandle")?;
    // SAFETY: per the contract.
    Ok(unsafe { &*p })
}

/// The `n` (1..=8) handles of a grouped call as references in a fixed array: no allocation on
/// the data path. Entries past `n` repeat the first and are never used.
///
/// # Safety
/// Every pointer is a live handle of ours.
pub(super) unsafe fn handle_array<'a>(mhs: &[*mut c_void]) -> Result<([&'a MemHandle; api::MAX_RECVS], usize), Error> {
    let n = mhs.len();
    if n == 0 || n > api::MAX_RECVS {
        return Err(Error::internal(format!(
            "grouped call with n={n} (1..={} allowed)",
            api::MAX_RECVS
        )));
    }
    // SAFETY: per the contract.
    let first = unsafe { mem_handle(mhs[0])? };
    let mut handles = [first; api::MAX_RECVS];
    for (slot, &p) in handles.iter_mut().zip(mhs).skip(1) {
        // SAFETY: per the contract.
        *slot = unsafe { mem_handle(p)? };
    }
    Ok((handles, n))
}

/// # Safety
/// `sizes` has `n` entries or `n` is invalid (then an error is returned first).
pub(super) unsafe fn size_t_sizes<'a>(n: c_int, sizes: *mut usize) -> Result<&'a [usize], Error> {
    let n = ffi::int_size(n, "irecv n")?;
    // SAFETY: NCCL passes n sizes.
    Ok(unsafe { std::slice::from_raw_parts(non_null(sizes, "sizes")?, n) })
}

/// # Safety
/// `ctx` is NULL or a context from `init_v11`.
pub(super) unsafe fn context<'a>(ctx: *mut c_void) -> &'a CommContext {
    if ctx.is_null() {
        &api::LEGACY_CONTEXT
    } else {
        // SAFETY: per the contract.
        unsafe { &*ctx.cast::<CommContext>() }
    }
}

//! The data path: `isend`, `irecv` (int and size_t sizes, with and without profiler handles),
//! `iflush`, `test`.

use super::handles::{handle_array, mem_handle, size_t_sizes};
use crate::abi::call_trace::{out_ptr, read, shown, Line};
use crate::abi::ffi::{self, non_null};
use crate::abi::types::*;
use crate::api::{self, RecvHandle, Request, SendHandle};
use crate::error::Error;
use std::ffi::{c_int, c_void};

/// # Safety
/// NCCL's isend contract; `size` already widened.
pub(crate) unsafe fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded contract; no profiler handle before v10.
    unsafe { isend_with(send_comm, data, size, tag, mhandle, std::ptr::null_mut(), request) }
}

/// # Safety
/// As [`isend`]; `phandle` is NULL or NCCL's profiler handle for this send.
pub(crate) unsafe fn isend_with(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    ffi::call_traced(
        "isend",
        || {
            let out = non_null(request, "request")?;
            let comm = non_null(send_comm.cast::<SendHandle>(), "sendComm")?;
            // SAFETY: live handles from NCCL; isend runs on the comm's progress thread.
            let req = unsafe { api::isend_profiled(&*comm, data as usize, size, tag, mem_handle(mhandle)?, phandle)? };
            // SAFETY: non-NULL out-pointer; NULL = retry later.
            unsafe { *out = req.map_or(std::ptr::null_mut(), |r| r.cast()) };
            Ok(())
        },
        || {
            // SAFETY: NCCL's out-pointer, NULL or writable.
            let req = unsafe { read(request) };
            Line {
                text: format!(
                    "comm {send_comm:p}, data {data:p}, size {size}, tag {tag}, mhandle {mhandle:p}, phandle {phandle:p}, request -> {}",
                    shown(req)
                ),
                quiet: req.is_some_and(|r| r.is_null()),
            }
        },
    )
}

/// # Safety
/// `comm` is a live send comm of ours, driven by this thread only (NCCL's progress thread); `[data,
/// data + size)` lies in the registration `mh` and stays valid until the request is reported done;
/// `request` is NULL (an error) or writable.
pub(crate) unsafe extern "C" fn isend_int(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mh: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    ffi::guard("isend", || match ffi::int_size(size, "isend size") {
        // SAFETY: NCCL's contract.
        Ok(size) => unsafe { isend(comm, data, size, tag, mh, request) },
        Err(e) => ffi::call("isend", || Err(e)),
    })
}

/// # Safety
/// As [`isend_int`].
pub(crate) unsafe extern "C" fn isend_v9(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract.
    unsafe { isend(comm, data, size, tag, mh, request) }
}

/// # Safety
/// As [`isend_int`]; `_phandle` (the profiler's) is not touched.
pub(crate) unsafe extern "C" fn isend_v10(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mh: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract.
    unsafe { isend_with(comm, data, size, tag, mh, phandle, request) }
}

/// # Safety
/// NCCL's irecv contract: the arrays have `n` entries; `sizes` already widened.
/// `hint_allowed`: v9+ NCCL may pass NCCL_NET_OPTIONAL_RECV_COMPLETION in `*request` (docs/nccl-net-abi.md#rules-ferroce-keeps, rule 10).
#[allow(clippy::too_many_arguments)] // NCCL's irecv has these arguments.
pub(crate) unsafe fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: &[usize],
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
    hint_allowed: bool,
) -> NcclResult {
    // NCCL's hint in *request (v9+), read before the call overwrites it.
    // SAFETY: NCCL's out-pointer, NULL or readable.
    let hint =
        hint_allowed && unsafe { read(request) }.is_some_and(|r| r as usize == NCCL_NET_OPTIONAL_RECV_COMPLETION);
    let describe = || {
        // SAFETY: NCCL's out-pointer, NULL or writable.
        let req = unsafe { read(request) };
        let entries = if n >= 0 && n as usize == sizes.len() && !data.is_null() && !tags.is_null() {
            (0..sizes.len())
                .map(|i| {
                    // SAFETY: NCCL passes arrays of n entries.
                    let (d, t) = unsafe { (*data.add(i), *tags.add(i)) };
                    format!("{{data {d:p}, size {}, tag {t}}}", sizes[i])
                })
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            "(arrays not read)".into()
        };
        Line {
            text: format!(
                "comm {recv_comm:p}, n {n}, {entries}, optional-completion hint {}, request -> {}",
                hint,
                shown(req)
            ),
            quiet: req.is_some_and(|r| r.is_null()),
        }
    };
    let body = || {
        let out = non_null(request, "request")?;
        let comm = non_null(recv_comm.cast::<RecvHandle>(), "recvComm")?;
        let n = ffi::int_size(n, "irecv n")?;
        if n != sizes.len() {
            return Err(Error::internal("irecv: size array length mismatch"));
        }
        // SAFETY: NCCL passes arrays of n entries.
        let (data, tags, mhs) = unsafe {
            (
                std::slice::from_raw_parts(non_null(data, "data")?.cast::<usize>(), n),
                std::slice::from_raw_parts(non_null(tags, "tags")?, n),
                std::slice::from_raw_parts(non_null(mhandles, "mhandles")?, n),
            )
        };
        // SAFETY: live handles from our regMr.
        let handles = unsafe { handle_array(mhs)? };
        let phandles: &[*mut c_void] = if phandles.is_null() {
            &[]
        } else {
            // SAFETY: NCCL passes NULL or n profiler handles (v10+).
            unsafe { std::slice::from_raw_parts(phandles, n) }
        };
        // SAFETY: live comm; irecv runs on the comm's progress thread.
        let req = unsafe { api::irecv_profiled(&*comm, data, sizes, tags, &handles.0[..handles.1], hint, phandles)? };
        // SAFETY: non-NULL out-pointer; always overwritten, a 0x1 hint must never stay.
        unsafe { *out = req.map_or(std::ptr::null_mut(), |r| r.cast()) };
        Ok(())
    };
    let rc = ffi::call_traced("irecv", body, describe);
    if rc != 0 && !request.is_null() {
        // SAFETY: non-NULL out-pointer. Never leave NCCL's 0x1 hint behind, even on error.
        unsafe { *request = std::ptr::null_mut() };
    }
    rc
}

/// # Safety
/// `recv_comm` is a live receive comm of ours, driven by this thread only (NCCL's progress thread);
/// `data`, `sizes`, `tags` and `mhandles` have `n` entries each; every buffer lies in its
/// registration and stays valid until the request is reported done; `request` is NULL (an error) or
/// writable.
pub(crate) unsafe extern "C" fn irecv_int(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    ffi::guard("irecv", || {
        let mut wide = [0usize; api::MAX_RECVS];
        let widened = (|| {
            let n = ffi::int_size(n, "irecv n")?;
            if n > wide.len() {
                return Err(Error::internal(format!(
                    "irecv with n={n} (at most {} allowed)",
                    api::MAX_RECVS
                )));
            }
            // SAFETY: NCCL passes n sizes.
            let s = unsafe { std::slice::from_raw_parts(non_null(sizes, "sizes")?, n) };
            for (w, &v) in wide.iter_mut().zip(s) {
                *w = ffi::int_size(v, "irecv size")?;
            }
            Ok(n)
        })();
        match widened {
            // SAFETY: NCCL's contract; v6–v8 NCCL clears the hint itself.
            Ok(n) => unsafe {
                irecv(
                    comm,
                    n as c_int,
                    data,
                    &wide[..n],
                    tags,
                    mhandles,
                    std::ptr::null_mut(),
                    request,
                    false,
                )
            },
            Err(e) => ffi::call("irecv", || Err(e)),
        }
    })
}

/// # Safety
/// As [`irecv_int`]; `*request` may carry NCCL_NET_OPTIONAL_RECV_COMPLETION.
pub(crate) unsafe extern "C" fn irecv_v9(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract.
    ffi::guard("irecv", || match unsafe { size_t_sizes(n, sizes) } {
        // SAFETY: NCCL's contract.
        Ok(s) => unsafe { irecv(comm, n, data, s, tags, mhandles, std::ptr::null_mut(), request, true) },
        Err(e) => ffi::call("irecv", || Err(e)),
    })
}

/// # Safety
/// As [`irecv_v9`]; `phandles` is NULL or NCCL's n profiler handles.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn irecv_v10(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract.
    ffi::guard("irecv", || match unsafe { size_t_sizes(n, sizes) } {
        // SAFETY: NCCL's contract.
        Ok(s) => unsafe { irecv(comm, n, data, s, tags, mhandles, phandles, request, true) },
        Err(e) => ffi::call("irecv", || Err(e)),
    })
}

/// # Safety
/// As [`irecv_int`] for the receive comm, its buffers and `request`.
pub(crate) unsafe extern "C" fn iflush(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    let describe = || {
        let entries = if (1..=api::MAX_RECVS as c_int).contains(&n) && !data.is_null() && !sizes.is_null() {
            (0..n as usize)
                .map(|i| {
                    // SAFETY: NCCL passes arrays of n entries.
                    let (d, s) = unsafe { (*data.add(i), *sizes.add(i)) };
                    format!("{{data {d:p}, size {s}}}")
                })
                .collect::<Vec<_>>()
                .join(" ")
        } else {
            "(arrays not read)".into()
        };
        // SAFETY: NCCL's out-pointer, NULL or writable.
        Line::of(format!("comm {recv_comm:p}, n {n}, {entries}, request -> {}", unsafe {
            out_ptr(request)
        }))
    };
    let body = || {
        let out = non_null(request, "request")?;
        let comm = non_null(recv_comm.cast::<RecvHandle>(), "recvComm")?;
        let n = ffi::int_size(n, "iflush n")?;
        if n == 0 || n > api::MAX_RECVS {
            return Err(Error::internal(format!("iflush with n={n}")));
        }
        // SAFETY: NCCL passes arrays of n entries.
        let (data, sizes, mhs) = unsafe {
            (
                std::slice::from_raw_parts(non_null(data, "data")?.cast::<usize>(), n),
                std::slice::from_raw_parts(non_null(sizes, "sizes")?, n),
                std::slice::from_raw_parts(non_null(mhandles, "mhandles")?, n),
            )
        };
        // SAFETY: live handles from our regMr.
        let handles = unsafe { handle_array(mhs)? };
        // SAFETY: live comm on its progress thread.
        let req = unsafe { api::iflush(&*comm, data, sizes, &handles.0[..handles.1])? };
        // SAFETY: non-NULL out-pointer; NULL = nothing to flush.
        unsafe { *out = req.map_or(std::ptr::null_mut(), |r| r.cast()) };
        Ok(())
    };
    ffi::call_traced("iflush", body, describe)
}

/// # Safety
/// `request` came from isend, irecv or iflush of a comm that is still open and has not been
/// reported done; `done` is NULL (an error) or writable; `sizes` is NULL or has room for the
/// request's count.
pub(crate) unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
    ffi::call_traced(
        "test",
        || {
            let out = non_null(done, "done")?;
            let req = non_null(request.cast::<Request>(), "request")?;
            // SAFETY: a request of ours not yet reported done; sizes is NULL or has room for its count.
            let finished = unsafe { api::test(req, sizes)? };
            // SAFETY: non-NULL out-pointer.
            unsafe { *out = finished as c_int };
            Ok(())
        },
        || {
            // SAFETY: NCCL's out-pointers, NULL or writable; sizes has room for at least one entry.
            let (finished, first_size) = unsafe { (read(done), read(sizes)) };
            let sizes = match finished {
                Some(1) => format!(", sizes[0] -> {}", shown(first_size)),
                _ => String::new(),
            };
            Line {
                text: format!("request {request:p}, done -> {}{sizes}", shown(finished)),
                quiet: finished == Some(0),
            }
        },
    )
}

//! Slots shared by several table versions, written against the newest ABI.
//!
//! Every function body runs inside [`ffi::call`]: no panic crosses into NCCL, errors are logged
//! once and mapped to `ncclResult_t`, and out-pointers are written only on success.

use super::call_trace::{out_ptr, read, shown, Line};
use super::ffi::{self, non_null};
use super::types::*;
use crate::api::{self, CommContext, ListenHandle, MemHandle, RecvHandle, Request, SendHandle};
use crate::error::Error;
use std::ffi::{c_int, c_void};

/// Converts NCCL's handle buffer (NCCL_NET_HANDLE_MAXSIZE bytes) into an array reference.
///
/// # Safety
/// `handle` points at 128 writable bytes that live for the call.
unsafe fn handle_bytes<'a>(handle: *mut c_void) -> Result<&'a mut [u8; NCCL_NET_HANDLE_MAXSIZE], Error> {
    let p = non_null(handle, "handle")?;
    // SAFETY: NCCL passes a buffer of NCCL_NET_HANDLE_MAXSIZE bytes
    // (docs/nccl-net-abi.md#connection-setup); u8 has align 1.
    Ok(unsafe { &mut *(p as *mut [u8; NCCL_NET_HANDLE_MAXSIZE]) })
}

/// `init` of v6–v9 (and v10 without the profiler): once per load, one implicit context.
pub fn init_legacy(logger: NcclLogger) -> NcclResult {
    ffi::call_traced(
        "init",
        || api::init(logger, -1, true).map(drop),
        || Line::of("table v6-v10: one implicit context".into()),
    )
}

/// # Safety
/// `logger` is NULL or NCCL's logger, callable from any thread while the library is loaded.
pub unsafe extern "C" fn init_v6(logger: NcclLogger) -> NcclResult {
    init_legacy(logger)
}

/// # Safety
/// `ndev` is NULL (an error) or writable.
pub unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
    ffi::call_traced(
        "devices",
        || {
            let out = non_null(ndev, "ndev")?;
            let n = api::devices()?;
            // SAFETY: non-NULL out-pointer from NCCL.
            unsafe { *out = n };
            Ok(())
        },
        // SAFETY: NCCL's out-pointer, NULL or writable (hence readable).
        || Line::of(format!("ndev -> {}", shown(unsafe { read(ndev) }))),
    )
}

/// Fills any version's properties struct from the newest form.
pub fn get_properties<P>(
    name: &str,
    dev: c_int,
    props: *mut P,
    convert: impl FnOnce(&api::Properties) -> P,
) -> NcclResult {
    ffi::call_traced(
        name,
        || {
            let out = non_null(props, "props")?;
            let p = api::properties(dev)?;
            // SAFETY: NCCL passes a (possibly uninitialized) struct of this version's layout; we
            // write it whole without reading it.
            unsafe { out.write(convert(&p)) };
            Ok(())
        },
        || Line::of(format!("dev {dev}, props {props:p}")),
    )
}

/// `ptrSupport` of a device.
pub fn ptr_support(p: &api::Properties) -> c_int {
    let mut bits = NCCL_PTR_HOST;
    if p.memory.cuda {
        bits |= NCCL_PTR_CUDA;
    }
    if p.memory.dmabuf {
        bits |= NCCL_PTR_DMABUF;
    }
    bits
}

/// The member list of a device in a fixed-size vProps array.
pub fn vprops<const N: usize>(p: &api::Properties) -> (c_int, [c_int; N]) {
    let mut devs = [0; N];
    for (d, s) in devs.iter_mut().zip(&p.vdevs) {
        *d = *s;
    }
    (p.vdevs.len().min(N) as c_int, devs)
}

/// # Safety
/// As NCCL's `listen`: `handle` has 128 bytes, `listen_comm` is an out-pointer.
pub unsafe fn listen(ctx: &CommContext, dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    ffi::call_traced(
        "listen",
        || {
            let out = non_null(listen_comm, "listenComm")?;
            // SAFETY: forwarded contract.
            let bytes = unsafe { handle_bytes(handle)? };
            let comm = api::listen(ctx, dev, bytes)?;
            // SAFETY: non-NULL out-pointer.
            unsafe { *out = Box::into_raw(comm).cast() };
            Ok(())
        },
        || {
            // SAFETY: NCCL's out-pointer, NULL or writable.
            Line::of(format!("dev {dev}, handle {handle:p}, listenComm -> {}", unsafe {
                out_ptr(listen_comm)
            }))
        },
    )
}

/// # Safety
/// `handle` points at NCCL_NET_HANDLE_MAXSIZE writable bytes; `listen_comm` is NULL (an error) or
/// writable.
pub unsafe extern "C" fn listen_v6(dev: c_int, handle: *mut c_void, listen_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: NCCL's contract for listen.
    unsafe { listen(&api::LEGACY_CONTEXT, dev, handle, listen_comm) }
}

/// # Safety
/// As NCCL's `connect`; `dev_comm` may be NULL or point at NULL, and is left untouched (HOST plugin).
pub unsafe fn connect(ctx: &CommContext, dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void) -> NcclResult {
    ffi::call_traced(
        "connect",
        || {
            let out = non_null(send_comm, "sendComm")?;
            // SAFETY: forwarded contract; the same handle address comes back on every retry.
            let bytes = unsafe { handle_bytes(handle)? };
            let comm = api::connect(ctx, dev, bytes)?;
            // SAFETY: non-NULL out-pointer; NULL means "not connected yet, call again".
            unsafe { *out = comm.map_or(std::ptr::null_mut(), |c| Box::into_raw(c).cast()) };
            Ok(())
        },
        || {
            // SAFETY: NCCL's out-pointer, NULL or writable.
            let comm = unsafe { read(send_comm) };
            Line {
                text: format!(
                    "dev {dev}, trafficClass {}, handle {handle:p}, sendComm -> {}",
                    ctx.traffic_class,
                    shown(comm)
                ),
                quiet: comm.is_some_and(|c| c.is_null()),
            }
        },
    )
}

/// # Safety
/// `handle` is the NCCL_NET_HANDLE_MAXSIZE-byte buffer `listen` wrote, the same one on every retry
/// of this connect; `send_comm` is NULL (an error) or writable.
pub unsafe extern "C" fn connect_v6(dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: NCCL's contract for connect.
    unsafe { connect(&api::LEGACY_CONTEXT, dev, handle, send_comm) }
}

/// # Safety
/// As [`connect_v6`]; `dev_comm` is not touched.
pub unsafe extern "C" fn connect_v7(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: NCCL's contract for connect.
    unsafe { connect(&api::LEGACY_CONTEXT, dev, handle, send_comm) }
}

/// # Safety
/// `listen_comm` is NULL (an error) or a live listen comm of ours that no other thread uses during
/// the call; `recv_comm` is NULL (an error) or writable.
pub unsafe extern "C" fn accept_v6(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> NcclResult {
    ffi::call_traced(
        "accept",
        || {
            let out = non_null(recv_comm, "recvComm")?;
            let listen = non_null(listen_comm.cast::<ListenHandle>(), "listenComm")?;
            // SAFETY: a live listenComm from our listen; NCCL drives one accept at a time.
            let comm = api::accept(unsafe { &mut *listen })?;
            // SAFETY: non-NULL out-pointer.
            unsafe { *out = comm.map_or(std::ptr::null_mut(), |c| Box::into_raw(c).cast()) };
            Ok(())
        },
        || {
            // SAFETY: NCCL's out-pointer, NULL or writable.
            let comm = unsafe { read(recv_comm) };
            Line {
                text: format!("listenComm {listen_comm:p}, recvComm -> {}", shown(comm)),
                quiet: comm.is_some_and(|c| c.is_null()),
            }
        },
    )
}

/// # Safety
/// As [`accept_v6`]; `dev_comm` is not touched.
pub unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: NCCL's contract for accept.
    unsafe { accept_v6(listen_comm, recv_comm) }
}

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
pub unsafe extern "C" fn reg_mr(
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
pub unsafe extern "C" fn reg_mr_int(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    ptr_type: c_int,
    mhandle: *mut *mut c_void,
) -> NcclResult {
    match ffi::int_size(size, "regMr size") {
        Ok(size) => reg(comm, data, size, ptr_type, None, mhandle),
        Err(e) => ffi::call("regMr", || Err(e)),
    }
}

/// # Safety
/// As [`reg_mr`]; `fd` is a DMA-BUF file descriptor whose byte `offset` is mapped at `data`, for
/// `size` bytes.
pub unsafe extern "C" fn reg_mr_dma_buf(
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
pub unsafe extern "C" fn dereg_mr(_comm: *mut c_void, mhandle: *mut c_void) -> NcclResult {
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

/// # Safety
/// `mhandle` is a live handle of ours.
unsafe fn mem_handle<'a>(mhandle: *mut c_void) -> Result<&'a MemHandle, Error> {
    let p = non_null(mhandle.cast::<MemHandle>(), "mhandle")?;
    // SAFETY: per the contract.
    Ok(unsafe { &*p })
}

/// # Safety
/// NCCL's isend contract; `size` already widened.
pub unsafe fn isend(
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
pub unsafe fn isend_with(
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
pub unsafe extern "C" fn isend_int(
    comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mh: *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    match ffi::int_size(size, "isend size") {
        // SAFETY: NCCL's contract.
        Ok(size) => unsafe { isend(comm, data, size, tag, mh, request) },
        Err(e) => ffi::call("isend", || Err(e)),
    }
}

/// # Safety
/// As [`isend_int`].
pub unsafe extern "C" fn isend_v9(
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
pub unsafe extern "C" fn isend_v10(
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
pub unsafe fn irecv(
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

/// The `n` (1..=8) handles of a grouped call as references in a fixed array: no allocation on
/// the data path. Entries past `n` repeat the first and are never used.
///
/// # Safety
/// Every pointer is a live handle of ours.
unsafe fn handle_array<'a>(mhs: &[*mut c_void]) -> Result<([&'a MemHandle; api::MAX_RECVS], usize), Error> {
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
/// `recv_comm` is a live receive comm of ours, driven by this thread only (NCCL's progress thread);
/// `data`, `sizes`, `tags` and `mhandles` have `n` entries each; every buffer lies in its
/// registration and stays valid until the request is reported done; `request` is NULL (an error) or
/// writable.
pub unsafe extern "C" fn irecv_int(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
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
}

/// # Safety
/// `sizes` has `n` entries or `n` is invalid (then an error is returned first).
unsafe fn size_t_sizes<'a>(n: c_int, sizes: *mut usize) -> Result<&'a [usize], Error> {
    let n = ffi::int_size(n, "irecv n")?;
    // SAFETY: NCCL passes n sizes.
    Ok(unsafe { std::slice::from_raw_parts(non_null(sizes, "sizes")?, n) })
}

/// # Safety
/// As [`irecv_int`]; `*request` may carry NCCL_NET_OPTIONAL_RECV_COMPLETION.
pub unsafe extern "C" fn irecv_v9(
    comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract.
    match unsafe { size_t_sizes(n, sizes) } {
        // SAFETY: NCCL's contract.
        Ok(s) => unsafe { irecv(comm, n, data, s, tags, mhandles, std::ptr::null_mut(), request, true) },
        Err(e) => ffi::call("irecv", || Err(e)),
    }
}

/// # Safety
/// As [`irecv_v9`]; `phandles` is NULL or NCCL's n profiler handles.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn irecv_v10(
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
    match unsafe { size_t_sizes(n, sizes) } {
        // SAFETY: NCCL's contract.
        Ok(s) => unsafe { irecv(comm, n, data, s, tags, mhandles, phandles, request, true) },
        Err(e) => ffi::call("irecv", || Err(e)),
    }
}

/// # Safety
/// As [`irecv_int`] for the receive comm, its buffers and `request`.
pub unsafe extern "C" fn iflush(
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
pub unsafe extern "C" fn test(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
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
pub unsafe extern "C" fn close_send(comm: *mut c_void) -> NcclResult {
    // SAFETY: per the contract.
    unsafe { close_comm::<SendHandle>("closeSend", comm) }
}

/// # Safety
/// `comm` is NULL or a live receive comm of ours, closed once and not used after or during the
/// call.
pub unsafe extern "C" fn close_recv(comm: *mut c_void) -> NcclResult {
    // SAFETY: per the contract.
    unsafe { close_comm::<RecvHandle>("closeRecv", comm) }
}

/// # Safety
/// `comm` is NULL or a live listen comm of ours, closed once and not used after or during the call.
pub unsafe extern "C" fn close_listen(comm: *mut c_void) -> NcclResult {
    // SAFETY: per the contract.
    unsafe { close_comm::<ListenHandle>("closeListen", comm) }
}

/// `makeVDevice` for a vProps type with `N` member slots.
pub fn make_vdevice(d: *mut c_int, ndevs: c_int, devs: &[c_int], max: usize) -> NcclResult {
    ffi::call_traced(
        "makeVDevice",
        || {
            let out = non_null(d, "d")?;
            let n = ffi::int_size(ndevs, "vProps.ndevs")?;
            if n > devs.len() {
                return Err(Error::internal(format!("makeVDevice with ndevs={n} (at most {max})")));
            }
            let idx = api::make_vdevice(&devs[..n], max)?;
            // SAFETY: non-NULL out-pointer.
            unsafe { *out = idx };
            Ok(())
        },
        || {
            let members = &devs[..usize::try_from(ndevs).unwrap_or(0).min(devs.len())];
            // SAFETY: NCCL's out-pointer, NULL or writable.
            Line::of(format!("devs {members:?}, d -> {}", shown(unsafe { read(d) })))
        },
    )
}

/// # Safety
/// `d` is NULL (an error) or writable; `props` is NULL (an error) or a valid v9 vProps.
pub unsafe extern "C" fn make_vdevice_v9(d: *mut c_int, props: *mut NcclNetVDevicePropsV9) -> NcclResult {
    match non_null(props, "vProps") {
        // SAFETY: NCCL passes a valid vProps struct.
        Ok(p) => unsafe { make_vdevice(d, (*p).ndevs, &(*p).devs, NCCL_NET_MAX_DEVS_PER_NIC_V9) },
        Err(e) => ffi::call("makeVDevice", || Err(e)),
    }
}

/// v11+ `init`: one context per communicator.
///
/// # Safety
/// `ctx` is NULL (an error) or writable; `config` is NULL or valid for the call; `logger` is NULL
/// or NCCL's logger, callable from any thread until the last `finalize`.
pub unsafe extern "C" fn init_v11(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut NcclNetCommConfig,
    logger: NcclLogger,
    profiler: NcclProfilerCallback,
) -> NcclResult {
    api::set_profiler(profiler);
    let describe = || {
        // SAFETY: NULL-checked; NCCL's config is valid for the call; ctx is NCCL's out-pointer.
        let traffic_class = unsafe { read(config) }.map_or(-1, |c| c.traffic_class);
        Line::of(format!(
            "commId {comm_id:#x}, trafficClass {traffic_class}, profiler {}, ctx -> {}",
            profiler.is_some(),
            // SAFETY: as above.
            unsafe { out_ptr(ctx) }
        ))
    };
    let body = || {
        let out = non_null(ctx, "ctx")?;
        // The config lives on NCCL's stack: copy the value, keep no pointer.
        let traffic_class = if config.is_null() {
            -1
        } else {
            // SAFETY: NULL-checked; NCCL passes a valid config for the call's duration.
            unsafe { (*config).traffic_class }
        };
        let context = api::init(logger, traffic_class, false)?;
        // SAFETY: non-NULL out-pointer.
        unsafe { *out = Box::into_raw(context).cast() };
        Ok(())
    };
    ffi::call_traced("init", body, describe)
}

/// # Safety
/// `ctx` is NULL or a context from `init_v11`.
pub unsafe fn context<'a>(ctx: *mut c_void) -> &'a CommContext {
    if ctx.is_null() {
        &api::LEGACY_CONTEXT
    } else {
        // SAFETY: per the contract.
        unsafe { &*ctx.cast::<CommContext>() }
    }
}

/// # Safety
/// As [`listen_v6`]; `ctx` is NULL or a context from [`init_v11`] not finalized yet.
pub unsafe extern "C" fn listen_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL passes back the ctx of init; other arguments as listen.
    unsafe { listen(context(ctx), dev, handle, listen_comm) }
}

/// # Safety
/// As [`connect_v6`]; `ctx` is NULL or a context from [`init_v11`] not finalized yet; `dev_comm` is
/// not touched.
pub unsafe extern "C" fn connect_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: as listen_v11.
    unsafe { connect(context(ctx), dev, handle, send_comm) }
}

/// # Safety
/// `ctx` is NULL (an error) or a context from [`init_v11`], finalized once and not used after.
pub unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    // The counts before the last finalize forgets NCCL's logger.
    super::call_trace::log_counts();
    ffi::call_traced(
        "finalize",
        || {
            let ctx = non_null(ctx.cast::<CommContext>(), "ctx")?;
            // SAFETY: the ctx from init_v11, finalized once by NCCL.
            api::finalize(unsafe { Box::from_raw(ctx) })
        },
        || Line::of(format!("ctx {ctx:p}")),
    )
}

/// `setNetAttr` hints are advisory (docs/nccl-net-abi.md#other-calls); ferroce's QP layout does
/// not depend on them.
/// NCCL 2.28 calls it before every connect, accept, isend and irecv, so it must cost nothing.
///
/// # Safety
/// `attr` is NULL or valid for the call; it is read only for `FERROCE_CALL_TRACE`.
pub unsafe extern "C" fn set_net_attr(ctx: *mut c_void, attr: *mut NcclNetAttr) -> NcclResult {
    ffi::call_traced(
        "setNetAttr",
        || Ok(()),
        || {
            // SAFETY: NCCL passes NULL or an attribute struct valid for the call.
            let text = match unsafe { read(attr) } {
                Some(a) => format!(
                    "ctx {ctx:p}, op {}, algo {}, proto {}, send {:?}, recv {:?}",
                    a.op, a.algo, a.proto, a.send_comm_attr, a.recv_comm_attr
                ),
                None => format!("ctx {ctx:p}, attr NULL"),
            };
            Line::of(text)
        },
    )
}

/// Stops the plugin's threads when the library is unloaded without `finalize` (v6–v10 NCCL):
/// no code of ours may run after `dlclose` unmaps it.
extern "C" fn on_unload() {
    let _ = std::panic::catch_unwind(api::stop_threads_for_unload);
}

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

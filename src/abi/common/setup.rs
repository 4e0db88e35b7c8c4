//! Setup and teardown: `init` (implicit or per-communicator context), `devices`, `listen`,
//! `connect`, `accept`, `finalize`, `setNetAttr`, and the unload hook.

use super::handles::{context, handle_bytes};
use crate::abi::call_trace::{out_ptr, read, shown, Line};
use crate::abi::ffi::{self, non_null};
use crate::abi::types::*;
use crate::api::{self, CommContext, ListenHandle};
use std::ffi::{c_int, c_void};

/// `init` of v6–v10: once per load, one implicit context; v10 brings NCCL's profiler callback.
pub(crate) fn init_legacy(logger: NcclLogger, profiler: Option<NcclProfilerCallback>) -> NcclResult {
    ffi::call_traced(
        "init",
        || {
            if let Some(profiler) = profiler {
                api::set_profiler(profiler);
            }
            api::init(logger, -1, true).map(drop)
        },
        || Line::of("table v6-v10: one implicit context".into()),
    )
}

/// # Safety
/// `logger` is NULL or NCCL's logger, callable from any thread while the library is loaded.
pub(crate) unsafe extern "C" fn init_v6(logger: NcclLogger) -> NcclResult {
    init_legacy(logger, None)
}

/// # Safety
/// `ndev` is NULL (an error) or writable.
pub(crate) unsafe extern "C" fn devices(ndev: *mut c_int) -> NcclResult {
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

/// # Safety
/// As NCCL's `listen`: `handle` has 128 bytes, `listen_comm` is an out-pointer.
pub(crate) unsafe fn listen(
    ctx: &CommContext,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
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
pub(crate) unsafe extern "C" fn listen_v6(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: NCCL's contract for listen.
    unsafe { listen(&api::LEGACY_CONTEXT, dev, handle, listen_comm) }
}

/// # Safety
/// As NCCL's `connect`; `dev_comm` may be NULL or point at NULL, and is left untouched (HOST plugin).
pub(crate) unsafe fn connect(
    ctx: &CommContext,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
) -> NcclResult {
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
pub(crate) unsafe extern "C" fn connect_v6(dev: c_int, handle: *mut c_void, send_comm: *mut *mut c_void) -> NcclResult {
    // SAFETY: NCCL's contract for connect.
    unsafe { connect(&api::LEGACY_CONTEXT, dev, handle, send_comm) }
}

/// # Safety
/// As [`connect_v6`]; `dev_comm` is not touched.
pub(crate) unsafe extern "C" fn connect_v7(
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
pub(crate) unsafe extern "C" fn accept_v6(listen_comm: *mut c_void, recv_comm: *mut *mut c_void) -> NcclResult {
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
pub(crate) unsafe extern "C" fn accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: NCCL's contract for accept.
    unsafe { accept_v6(listen_comm, recv_comm) }
}

/// v11+ `init`: one context per communicator.
///
/// # Safety
/// `ctx` is NULL (an error) or writable; `config` is NULL or valid for the call; `logger` is NULL
/// or NCCL's logger, callable from any thread until the last `finalize`.
pub(crate) unsafe extern "C" fn init_v11(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut NcclNetCommConfig,
    logger: NcclLogger,
    profiler: NcclProfilerCallback,
) -> NcclResult {
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
        api::set_profiler(profiler);
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
/// As [`listen_v6`]; `ctx` is NULL or a context from [`init_v11`] not finalized yet.
pub(crate) unsafe extern "C" fn listen_v11(
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
pub(crate) unsafe extern "C" fn connect_v11(
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
pub(crate) unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    ffi::call_traced(
        "finalize",
        || {
            // The counts while this context is still alive.
            crate::abi::call_trace::log_counts();
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
pub(crate) unsafe extern "C" fn set_net_attr(ctx: *mut c_void, attr: *mut NcclNetAttr) -> NcclResult {
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

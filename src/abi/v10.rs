//! The `ncclNetPlugin_v10` table (NCCL 2.26–2.27): profiler callback, per-connect traffic class.

#![allow(non_upper_case_globals)]

use super::common::*;
use super::types::*;

/// # Safety
/// `logger` is NULL or NCCL's logger, callable from any thread while the library is loaded;
/// `profiler` is NULL or NCCL's profiler callback, callable from the proxy progress thread.
unsafe extern "C" fn init_v10(logger: NcclLogger, profiler: NcclProfilerCallback) -> NcclResult {
    init_legacy(logger, Some(profiler))
}

/// v10 passes the communicator's traffic class with every connect instead of a context.
///
/// # Safety
/// As `connect_v6`; `config` is NULL or valid for the call; `dev_comm` is not touched.
unsafe extern "C" fn connect_v10(
    dev: std::ffi::c_int,
    config: *mut NcclNetCommConfig,
    handle: *mut std::ffi::c_void,
    send_comm: *mut *mut std::ffi::c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    super::ffi::guard("connect", || {
        let traffic_class = if config.is_null() {
            -1
        } else {
            // SAFETY: NULL-checked; NCCL's config is valid for the call.
            unsafe { (*config).traffic_class }
        };
        let ctx = crate::api::CommContext { traffic_class };
        // SAFETY: NCCL's contract for connect.
        unsafe { connect(&ctx, dev, handle, send_comm) }
    })
}

/// Exported data symbol NCCL finds with `dlsym` (docs/nccl-net-abi.md#abi-versions).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v10: NcclNetV10 = NcclNetV10 {
    name: PLUGIN_NAME,
    init: Some(init_v10),
    // v10 properties have the v9 layout.
    get_properties: Some(super::v9::get_properties_v9),
    listen: Some(listen_v6),
    connect: Some(connect_v10),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    isend: Some(isend_v10),
    irecv: Some(irecv_v10),
    devices: Some(devices),
    reg_mr_dma_buf: Some(reg_mr_dma_buf),
    dereg_mr: Some(dereg_mr),
    iflush: Some(iflush),
    test: Some(test),
    close_send: Some(close_send),
    close_recv: Some(close_recv),
    close_listen: Some(close_listen),
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: Some(make_vdevice_v9),
};

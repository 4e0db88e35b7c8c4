//! The `ncclNetPlugin_v10` table (NCCL 2.26–2.27): profiler callback, per-connect traffic class.

#![allow(non_upper_case_globals)]

use super::common::*;
use super::types::*;

unsafe extern "C" fn init_v10(logger: NcclLogger, _profiler: NcclProfilerCallback) -> NcclResult {
    init_legacy(logger)
}

/// v10 passes the communicator's traffic class with every connect instead of a context.
unsafe extern "C" fn connect_v10(
    dev: std::ffi::c_int,
    config: *mut NcclNetCommConfig,
    handle: *mut std::ffi::c_void,
    send_comm: *mut *mut std::ffi::c_void,
    _dev_comm: *mut *mut NcclNetDeviceHandle,
) -> NcclResult {
    // SAFETY: NULL-checked; NCCL's config is valid for the call.
    let traffic_class = if config.is_null() {
        -1
    } else {
        unsafe { (*config).traffic_class }
    };
    let ctx = crate::api::CommContext { traffic_class };
    // SAFETY: NCCL's contract for connect.
    unsafe { connect(&ctx, dev, handle, send_comm) }
}

unsafe extern "C" fn get_properties_v10(dev: std::ffi::c_int, props: *mut NcclNetPropertiesV9) -> NcclResult {
    get_properties("getProperties", dev, props, |p| {
        let (ndevs, devs) = vprops::<NCCL_NET_MAX_DEVS_PER_NIC_V9>(p);
        NcclNetPropertiesV9 {
            name: p.name,
            pci_path: p.pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            reg_is_global: p.reg_is_global,
            force_flush: p.force_flush,
            net_device_type: p.net_device_type,
            net_device_version: p.net_device_version,
            v_props: NcclNetVDevicePropsV9 { ndevs, devs },
            max_p2p_bytes: p.max_p2p_bytes,
            max_coll_bytes: p.max_coll_bytes,
        }
    })
}

/// Exported data symbol NCCL finds with `dlsym` (spec §2).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v10: NcclNetV10 = NcclNetV10 {
    name: PLUGIN_NAME,
    init: Some(init_v10),
    get_properties: Some(get_properties_v10),
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

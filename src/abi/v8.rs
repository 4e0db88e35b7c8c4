//! The `ncclNetPlugin_v8` table (NCCL 2.20–2.23): size_t registration, int transfer sizes.

#![allow(non_upper_case_globals)]

use super::common::*;
use super::types::*;

/// # Safety
/// `props` is NULL (an error) or writable for the v8 properties layout.
unsafe extern "C" fn get_properties_v8(dev: std::ffi::c_int, props: *mut NcclNetPropertiesV8) -> NcclResult {
    get_properties("getProperties", dev, props, |p| NcclNetPropertiesV8 {
        name: p.name,
        pci_path: p.pci_path,
        guid: p.guid,
        ptr_support: ptr_support(p),
        speed: p.speed,
        port: p.port,
        latency: p.latency,
        max_comms: p.max_comms,
        max_recvs: p.max_recvs,
        reg_is_global: p.reg_is_global,
        net_device_type: NCCL_NET_DEVICE_HOST,
        net_device_version: p.net_device_version,
    })
}

/// Exported data symbol NCCL finds with `dlsym` (docs/nccl-net-abi.md#abi-versions).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v8: NcclNetV8 = NcclNetV8 {
    name: PLUGIN_NAME,
    init: Some(init_v6),
    get_properties: Some(get_properties_v8),
    listen: Some(listen_v6),
    connect: Some(connect_v7),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    isend: Some(isend_int),
    irecv: Some(irecv_int),
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
};

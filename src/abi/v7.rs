//! The `ncclNetPlugin_v7` table (NCCL 2.19): device-handle arguments, int sizes.

#![allow(non_upper_case_globals)]

use super::common::*;
use super::types::*;

/// # Safety
/// `props` is NULL (an error) or writable for the v7 properties layout.
unsafe extern "C" fn get_properties_v7(dev: std::ffi::c_int, props: *mut NcclNetPropertiesV7) -> NcclResult {
    get_properties("getProperties", dev, props, |p| NcclNetPropertiesV7 {
        name: p.name,
        pci_path: p.pci_path,
        guid: p.guid,
        ptr_support: ptr_support(p),
        speed: p.speed,
        port: p.port,
        latency: p.latency,
        max_comms: p.max_comms,
        max_recvs: p.max_recvs,
        net_device_type: NCCL_NET_DEVICE_HOST,
        net_device_version: p.net_device_version,
    })
}

/// Exported data symbol NCCL finds with `dlsym` (docs/nccl-net-abi.md#abi-versions).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v7: NcclNetV7 = NcclNetV7 {
    name: PLUGIN_NAME,
    init: Some(init_v6),
    get_properties: Some(get_properties_v7),
    listen: Some(listen_v6),
    connect: Some(connect_v7),
    accept: Some(accept),
    reg_mr: Some(reg_mr_int),
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

//! The `ncclNetPlugin_v9` table (NCCL 2.24–2.25): size_t transfers, NIC fusion, the irecv hint.

#![allow(non_upper_case_globals)]

use super::common::*;
use super::types::*;

/// # Safety
/// `props` is NULL (an error) or writable for the v9 properties layout (v10 shares it).
pub(super) unsafe extern "C" fn get_properties_v9(dev: std::ffi::c_int, props: *mut NcclNetPropertiesV9) -> NcclResult {
    get_properties("getProperties", dev, props, |p| {
        let (ndevs, devs) = vprops::<NCCL_NET_MAX_DEVS_PER_NIC_V9>(p);
        NcclNetPropertiesV9 {
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
            force_flush: p.force_flush,
            net_device_type: NCCL_NET_DEVICE_HOST,
            net_device_version: p.net_device_version,
            v_props: NcclNetVDevicePropsV9 { ndevs, devs },
            max_p2p_bytes: p.max_p2p_bytes,
            max_coll_bytes: p.max_coll_bytes,
        }
    })
}

/// Exported data symbol NCCL finds with `dlsym` (docs/nccl-net-abi.md#abi-versions).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v9: NcclNetV9 = NcclNetV9 {
    name: PLUGIN_NAME,
    init: Some(init_v6),
    get_properties: Some(get_properties_v9),
    listen: Some(listen_v6),
    connect: Some(connect_v7),
    accept: Some(accept),
    reg_mr: Some(reg_mr),
    isend: Some(isend_v9),
    irecv: Some(irecv_v9),
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

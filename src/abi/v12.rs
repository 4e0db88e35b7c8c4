//! The `ncclNetPlugin_v12` table (NCCL 2.30, newest): rail and plane, 8 fused devices.

#![allow(non_upper_case_globals)]

use super::common::*;
use super::types::*;

/// # Safety
/// `d` is NULL (an error) or writable; `props` is NULL (an error) or a valid v12 vProps.
unsafe extern "C" fn make_vdevice_v12(d: *mut std::ffi::c_int, props: *mut NcclNetVDevicePropsV12) -> NcclResult {
    // SAFETY: NCCL passes NULL or a valid vProps struct.
    unsafe { make_vdevice_from(d, props, NCCL_NET_MAX_DEVS_PER_NIC_V12, |p| (p.ndevs, &p.devs[..])) }
}

/// # Safety
/// `props` is NULL (an error) or writable for the v12 properties layout.
unsafe extern "C" fn get_properties_v12(dev: std::ffi::c_int, props: *mut NcclNetPropertiesV12) -> NcclResult {
    get_properties("getProperties", dev, props, |p| {
        let (ndevs, devs) = vprops::<NCCL_NET_MAX_DEVS_PER_NIC_V12>(p);
        NcclNetPropertiesV12 {
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
            v_props: NcclNetVDevicePropsV12 { ndevs, devs },
            max_p2p_bytes: p.max_p2p_bytes,
            max_coll_bytes: p.max_coll_bytes,
            max_multi_request_size: p.max_multi_request_size,
            rail_id: p.rail_id,
            plane_id: p.plane_id,
        }
    })
}

/// Exported data symbol NCCL finds with `dlsym` (docs/nccl-net-abi.md#abi-versions).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v12: NcclNetV12 = NcclNetV12 {
    name: PLUGIN_NAME,
    init: Some(init_v11),
    get_properties: Some(get_properties_v12),
    listen: Some(listen_v11),
    connect: Some(connect_v11),
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
    make_vdevice: Some(make_vdevice_v12),
    finalize: Some(finalize),
    set_net_attr: Some(set_net_attr),
};

//! The `ncclNetPlugin_v11` table (NCCL 2.28–2.29): per-communicator init and finalize.

#![allow(non_upper_case_globals)]

use super::common::*;
use super::types::*;

/// # Safety
/// `props` is NULL (an error) or writable for the v11 properties layout.
unsafe extern "C" fn get_properties_v11(dev: std::ffi::c_int, props: *mut NcclNetPropertiesV11) -> NcclResult {
    get_properties("getProperties", dev, props, |p| {
        let (ndevs, devs) = vprops::<NCCL_NET_MAX_DEVS_PER_NIC_V9>(p);
        NcclNetPropertiesV11 {
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
            max_multi_request_size: p.max_multi_request_size,
        }
    })
}

/// Exported data symbol NCCL finds with `dlsym` (docs/nccl-net-abi.md#abi-versions).
#[no_mangle]
#[used]
pub static ncclNetPlugin_v11: NcclNetV11 = NcclNetV11 {
    name: PLUGIN_NAME,
    init: Some(init_v11),
    get_properties: Some(get_properties_v11),
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
    make_vdevice: Some(make_vdevice_v9),
    finalize: Some(finalize),
    set_net_attr: Some(set_net_attr),
};

//! The NCCL net plugin ABI, declared from the layout tables of
//! docs/nccl-net-abi.md#types-and-constants, #the-function-table, #properties (never from
//! NCCL's headers). `include/ferroce/nccl_net.h` declares the same layouts for C; both sides
//! assert every size and offset the spec gives.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

/// `ncclResult_t`.
pub type NcclResult = c_int;

/// `ncclDebugLogger_t`, declared by the logger that calls it.
pub use crate::log::NcclLogger;

/// `ncclProfilerCallback_t`, declared by the profiler module that calls it.
pub use crate::profiler::NcclProfilerCallback;

pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
pub const NCCL_PTR_HOST: c_int = 0x1;
pub const NCCL_PTR_CUDA: c_int = 0x2;
pub const NCCL_PTR_DMABUF: c_int = 0x4;
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
pub const NCCL_NET_MAX_DEVS_PER_NIC_V9: usize = 4;
pub const NCCL_NET_MAX_DEVS_PER_NIC_V12: usize = 8;

/// `ncclNetDeviceHandle_v7..v12` (docs/nccl-net-abi.md#types-and-constants).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetDeviceHandle {
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

/// `ncclNetVDeviceProps_v9..v11` (4 members).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NcclNetVDevicePropsV9 {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V9],
}

/// `ncclNetVDeviceProps_v12` (8 members).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NcclNetVDevicePropsV12 {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V12],
}

/// `ncclNetCommConfig_v10..v12`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetCommConfig {
    pub traffic_class: c_int,
}

/// `ncclNetCommAttr` (v11+).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetCommAttr {
    pub max_concurrent_peers: i32,
    pub min_concurrent_peers: i32,
    pub max_flows_per_peer: i32,
    pub min_flows_per_peer: i32,
}

/// `ncclNetAttr` (v11+), hints for `setNetAttr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetAttr {
    pub send_comm_attr: NcclNetCommAttr,
    pub recv_comm_attr: NcclNetCommAttr,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

/// `ncclNetProperties_v6` (48 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV6 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

/// `ncclNetProperties_v7` (56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV7 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v8` (64 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV8 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v9` and `_v10` (104 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV9 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: NcclNetVDevicePropsV9,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// `ncclNetProperties_v11` (112 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV11 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: NcclNetVDevicePropsV9,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNetProperties_v12` (128 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclNetPropertiesV12 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: NcclNetVDevicePropsV12,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

type Comm = *mut c_void;
type Out = *mut *mut c_void;

// Slot types: nullable function pointers (NULL = absent). Parameters follow
// docs/nccl-net-abi.md#the-function-table.
pub type InitV6 = Option<unsafe extern "C" fn(NcclLogger) -> NcclResult>;
pub type InitV10 = Option<unsafe extern "C" fn(NcclLogger, NcclProfilerCallback) -> NcclResult>;
pub type InitV11 =
    Option<unsafe extern "C" fn(Out, u64, *mut NcclNetCommConfig, NcclLogger, NcclProfilerCallback) -> NcclResult>;
pub type Devices = Option<unsafe extern "C" fn(*mut c_int) -> NcclResult>;
pub type GetProperties<P> = Option<unsafe extern "C" fn(c_int, *mut P) -> NcclResult>;
pub type ListenV6 = Option<unsafe extern "C" fn(c_int, *mut c_void, Out) -> NcclResult>;
pub type ListenV11 = Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, Out) -> NcclResult>;
pub type ConnectV6 = Option<unsafe extern "C" fn(c_int, *mut c_void, Out) -> NcclResult>;
pub type ConnectV7 = Option<unsafe extern "C" fn(c_int, *mut c_void, Out, *mut *mut NcclNetDeviceHandle) -> NcclResult>;
pub type ConnectV10 = Option<
    unsafe extern "C" fn(c_int, *mut NcclNetCommConfig, *mut c_void, Out, *mut *mut NcclNetDeviceHandle) -> NcclResult,
>;
pub type ConnectV11 =
    Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, Out, *mut *mut NcclNetDeviceHandle) -> NcclResult>;
pub type AcceptV6 = Option<unsafe extern "C" fn(Comm, Out) -> NcclResult>;
pub type AcceptV7 = Option<unsafe extern "C" fn(Comm, Out, *mut *mut NcclNetDeviceHandle) -> NcclResult>;
pub type RegMrV6 = Option<unsafe extern "C" fn(Comm, *mut c_void, c_int, c_int, Out) -> NcclResult>;
pub type RegMrV8 = Option<unsafe extern "C" fn(Comm, *mut c_void, usize, c_int, Out) -> NcclResult>;
pub type RegMrDmaBuf = Option<unsafe extern "C" fn(Comm, *mut c_void, usize, c_int, u64, c_int, Out) -> NcclResult>;
pub type DeregMr = Option<unsafe extern "C" fn(Comm, *mut c_void) -> NcclResult>;
pub type IsendV6 = Option<unsafe extern "C" fn(Comm, *mut c_void, c_int, c_int, *mut c_void, Out) -> NcclResult>;
pub type IsendV9 = Option<unsafe extern "C" fn(Comm, *mut c_void, usize, c_int, *mut c_void, Out) -> NcclResult>;
pub type IsendV10 =
    Option<unsafe extern "C" fn(Comm, *mut c_void, usize, c_int, *mut c_void, *mut c_void, Out) -> NcclResult>;
pub type IrecvV6 = Option<
    unsafe extern "C" fn(Comm, c_int, *mut *mut c_void, *mut c_int, *mut c_int, *mut *mut c_void, Out) -> NcclResult,
>;
pub type IrecvV9 = Option<
    unsafe extern "C" fn(Comm, c_int, *mut *mut c_void, *mut usize, *mut c_int, *mut *mut c_void, Out) -> NcclResult,
>;
pub type IrecvV10 = Option<
    unsafe extern "C" fn(
        Comm,
        c_int,
        *mut *mut c_void,
        *mut usize,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
        Out,
    ) -> NcclResult,
>;
pub type Iflush =
    Option<unsafe extern "C" fn(Comm, c_int, *mut *mut c_void, *mut c_int, *mut *mut c_void, Out) -> NcclResult>;
pub type Test = Option<unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> NcclResult>;
pub type Close = Option<unsafe extern "C" fn(Comm) -> NcclResult>;
pub type GetDeviceMr = Option<unsafe extern "C" fn(Comm, *mut c_void, Out) -> NcclResult>;
pub type IrecvConsumed = Option<unsafe extern "C" fn(Comm, c_int, *mut c_void) -> NcclResult>;
pub type MakeVDevice<VP> = Option<unsafe extern "C" fn(*mut c_int, *mut VP) -> NcclResult>;
pub type Finalize = Option<unsafe extern "C" fn(*mut c_void) -> NcclResult>;
pub type SetNetAttr = Option<unsafe extern "C" fn(*mut c_void, *mut NcclNetAttr) -> NcclResult>;

/// The plugin name, a static C string valid for as long as the library is mapped.
#[repr(transparent)]
pub struct NamePtr(pub *const c_char);
// SAFETY: points at a 'static, immutable C string literal.
unsafe impl Sync for NamePtr {}

pub const PLUGIN_NAME: NamePtr = NamePtr(c"ferroce".as_ptr());

/// `ncclNet_v6` (136 bytes).
#[repr(C)]
pub struct NcclNetV6 {
    pub name: NamePtr,
    pub init: InitV6,
    pub devices: Devices,
    pub get_properties: GetProperties<NcclNetPropertiesV6>,
    pub listen: ListenV6,
    pub connect: ConnectV6,
    pub accept: AcceptV6,
    pub reg_mr: RegMrV6,
    pub reg_mr_dma_buf: RegMrDmaBuf,
    pub dereg_mr: DeregMr,
    pub isend: IsendV6,
    pub irecv: IrecvV6,
    pub iflush: Iflush,
    pub test: Test,
    pub close_send: Close,
    pub close_recv: Close,
    pub close_listen: Close,
}

/// `ncclNet_v7` (152 bytes).
#[repr(C)]
pub struct NcclNetV7 {
    pub name: NamePtr,
    pub init: InitV6,
    pub devices: Devices,
    pub get_properties: GetProperties<NcclNetPropertiesV7>,
    pub listen: ListenV6,
    pub connect: ConnectV7,
    pub accept: AcceptV7,
    pub reg_mr: RegMrV6,
    pub reg_mr_dma_buf: RegMrDmaBuf,
    pub dereg_mr: DeregMr,
    pub isend: IsendV6,
    pub irecv: IrecvV6,
    pub iflush: Iflush,
    pub test: Test,
    pub close_send: Close,
    pub close_recv: Close,
    pub close_listen: Close,
    pub get_device_mr: GetDeviceMr,
    pub irecv_consumed: IrecvConsumed,
}

/// `ncclNet_v8` (152 bytes).
#[repr(C)]
pub struct NcclNetV8 {
    pub name: NamePtr,
    pub init: InitV6,
    pub devices: Devices,
    pub get_properties: GetProperties<NcclNetPropertiesV8>,
    pub listen: ListenV6,
    pub connect: ConnectV7,
    pub accept: AcceptV7,
    pub reg_mr: RegMrV8,
    pub reg_mr_dma_buf: RegMrDmaBuf,
    pub dereg_mr: DeregMr,
    pub isend: IsendV6,
    pub irecv: IrecvV6,
    pub iflush: Iflush,
    pub test: Test,
    pub close_send: Close,
    pub close_recv: Close,
    pub close_listen: Close,
    pub get_device_mr: GetDeviceMr,
    pub irecv_consumed: IrecvConsumed,
}

/// `ncclNet_v9` (160 bytes).
#[repr(C)]
pub struct NcclNetV9 {
    pub name: NamePtr,
    pub init: InitV6,
    pub devices: Devices,
    pub get_properties: GetProperties<NcclNetPropertiesV9>,
    pub listen: ListenV6,
    pub connect: ConnectV7,
    pub accept: AcceptV7,
    pub reg_mr: RegMrV8,
    pub reg_mr_dma_buf: RegMrDmaBuf,
    pub dereg_mr: DeregMr,
    pub isend: IsendV9,
    pub irecv: IrecvV9,
    pub iflush: Iflush,
    pub test: Test,
    pub close_send: Close,
    pub close_recv: Close,
    pub close_listen: Close,
    pub get_device_mr: GetDeviceMr,
    pub irecv_consumed: IrecvConsumed,
    pub make_vdevice: MakeVDevice<NcclNetVDevicePropsV9>,
}

/// `ncclNet_v10` (160 bytes).
#[repr(C)]
pub struct NcclNetV10 {
    pub name: NamePtr,
    pub init: InitV10,
    pub devices: Devices,
    pub get_properties: GetProperties<NcclNetPropertiesV9>,
    pub listen: ListenV6,
    pub connect: ConnectV10,
    pub accept: AcceptV7,
    pub reg_mr: RegMrV8,
    pub reg_mr_dma_buf: RegMrDmaBuf,
    pub dereg_mr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub close_send: Close,
    pub close_recv: Close,
    pub close_listen: Close,
    pub get_device_mr: GetDeviceMr,
    pub irecv_consumed: IrecvConsumed,
    pub make_vdevice: MakeVDevice<NcclNetVDevicePropsV9>,
}

/// `ncclNet_v11` (176 bytes).
#[repr(C)]
pub struct NcclNetV11 {
    pub name: NamePtr,
    pub init: InitV11,
    pub devices: Devices,
    pub get_properties: GetProperties<NcclNetPropertiesV11>,
    pub listen: ListenV11,
    pub connect: ConnectV11,
    pub accept: AcceptV7,
    pub reg_mr: RegMrV8,
    pub reg_mr_dma_buf: RegMrDmaBuf,
    pub dereg_mr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub close_send: Close,
    pub close_recv: Close,
    pub close_listen: Close,
    pub get_device_mr: GetDeviceMr,
    pub irecv_consumed: IrecvConsumed,
    pub make_vdevice: MakeVDevice<NcclNetVDevicePropsV9>,
    pub finalize: Finalize,
    pub set_net_attr: SetNetAttr,
}

/// `ncclNet_v12` (176 bytes).
#[repr(C)]
pub struct NcclNetV12 {
    pub name: NamePtr,
    pub init: InitV11,
    pub devices: Devices,
    pub get_properties: GetProperties<NcclNetPropertiesV12>,
    pub listen: ListenV11,
    pub connect: ConnectV11,
    pub accept: AcceptV7,
    pub reg_mr: RegMrV8,
    pub reg_mr_dma_buf: RegMrDmaBuf,
    pub dereg_mr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub close_send: Close,
    pub close_recv: Close,
    pub close_listen: Close,
    pub get_device_mr: GetDeviceMr,
    pub irecv_consumed: IrecvConsumed,
    pub make_vdevice: MakeVDevice<NcclNetVDevicePropsV12>,
    pub finalize: Finalize,
    pub set_net_attr: SetNetAttr,
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn small_structs() {
        assert_eq!(size_of::<NcclNetDeviceHandle>(), 32);
        assert_eq!(align_of::<NcclNetDeviceHandle>(), 8);
        assert_eq!(offset_of!(NcclNetDeviceHandle, net_device_version), 4);
        assert_eq!(offset_of!(NcclNetDeviceHandle, handle), 8);
        assert_eq!(offset_of!(NcclNetDeviceHandle, size), 16);
        assert_eq!(offset_of!(NcclNetDeviceHandle, needs_proxy_progress), 24);
        assert_eq!(size_of::<NcclNetVDevicePropsV9>(), 20);
        assert_eq!(size_of::<NcclNetVDevicePropsV12>(), 36);
        assert_eq!(offset_of!(NcclNetVDevicePropsV12, devs), 4);
        assert_eq!(size_of::<NcclNetCommConfig>(), 4);
        assert_eq!(size_of::<NcclNetCommAttr>(), 16);
        assert_eq!(size_of::<NcclNetAttr>(), 44);
        assert_eq!(offset_of!(NcclNetAttr, recv_comm_attr), 16);
        assert_eq!(offset_of!(NcclNetAttr, op), 32);
        assert_eq!(offset_of!(NcclNetAttr, algo), 36);
        assert_eq!(offset_of!(NcclNetAttr, proto), 40);
    }

    /// (field, v6, v7, v8, v9/v10, v11, v12) offsets from docs/nccl-net-abi.md#properties; -1 =
    /// absent.
    const PROPS: &[(&str, [i64; 6])] = &[
        ("name", [0, 0, 0, 0, 0, 0]),
        ("pci_path", [8, 8, 8, 8, 8, 8]),
        ("guid", [16, 16, 16, 16, 16, 16]),
        ("ptr_support", [24, 24, 24, 24, 24, 24]),
        ("reg_is_global", [-1, -1, 28, 28, 28, 28]),
        ("force_flush", [-1, -1, -1, 32, 32, 32]),
        ("speed", [28, 28, 32, 36, 36, 36]),
        ("port", [32, 32, 36, 40, 40, 40]),
        ("latency", [36, 36, 40, 44, 44, 44]),
        ("max_comms", [40, 40, 44, 48, 48, 48]),
        ("max_recvs", [44, 44, 48, 52, 52, 52]),
        ("net_device_type", [-1, 48, 52, 56, 56, 56]),
        ("net_device_version", [-1, 52, 56, 60, 60, 60]),
        ("v_props", [-1, -1, -1, 64, 64, 64]),
        ("max_p2p_bytes", [-1, -1, -1, 88, 88, 104]),
        ("max_coll_bytes", [-1, -1, -1, 96, 96, 112]),
        ("max_multi_request_size", [-1, -1, -1, -1, 104, 120]),
        ("rail_id", [-1, -1, -1, -1, -1, 124]),
        ("plane_id", [-1, -1, -1, -1, -1, 126]),
    ];

    macro_rules! offsets {
        ($t:ty, $($f:ident),*) => {{
            let mut v: Vec<(&str, i64)> = Vec::new();
            $( v.push((stringify!($f), offset_of!($t, $f) as i64)); )*
            v
        }};
    }

    fn check(version: usize, actual: Vec<(&str, i64)>, size: usize, want_size: usize) {
        assert_eq!(size, want_size, "sizeof properties column {version}");
        for (field, offsets) in PROPS {
            let want = offsets[version];
            let got = actual.iter().find(|(f, _)| f == field).map(|x| x.1).unwrap_or(-1);
            assert_eq!(got, want, "field {field} in properties column {version}");
        }
    }

    #[test]
    fn properties_match_spec_table() {
        check(
            0,
            offsets!(
                NcclNetPropertiesV6,
                name,
                pci_path,
                guid,
                ptr_support,
                speed,
                port,
                latency,
                max_comms,
                max_recvs
            ),
            size_of::<NcclNetPropertiesV6>(),
            48,
        );
        check(
            1,
            offsets!(
                NcclNetPropertiesV7,
                name,
                pci_path,
                guid,
                ptr_support,
                speed,
                port,
                latency,
                max_comms,
                max_recvs,
                net_device_type,
                net_device_version
            ),
            size_of::<NcclNetPropertiesV7>(),
            56,
        );
        check(
            2,
            offsets!(
                NcclNetPropertiesV8,
                name,
                pci_path,
                guid,
                ptr_support,
                reg_is_global,
                speed,
                port,
                latency,
                max_comms,
                max_recvs,
                net_device_type,
                net_device_version
            ),
            size_of::<NcclNetPropertiesV8>(),
            64,
        );
        check(
            3,
            offsets!(
                NcclNetPropertiesV9,
                name,
                pci_path,
                guid,
                ptr_support,
                reg_is_global,
                force_flush,
                speed,
                port,
                latency,
                max_comms,
                max_recvs,
                net_device_type,
                net_device_version,
                v_props,
                max_p2p_bytes,
                max_coll_bytes
            ),
            size_of::<NcclNetPropertiesV9>(),
            104,
        );
        check(
            4,
            offsets!(
                NcclNetPropertiesV11,
                name,
                pci_path,
                guid,
                ptr_support,
                reg_is_global,
                force_flush,
                speed,
                port,
                latency,
                max_comms,
                max_recvs,
                net_device_type,
                net_device_version,
                v_props,
                max_p2p_bytes,
                max_coll_bytes,
                max_multi_request_size
            ),
            size_of::<NcclNetPropertiesV11>(),
            112,
        );
        check(
            5,
            offsets!(
                NcclNetPropertiesV12,
                name,
                pci_path,
                guid,
                ptr_support,
                reg_is_global,
                force_flush,
                speed,
                port,
                latency,
                max_comms,
                max_recvs,
                net_device_type,
                net_device_version,
                v_props,
                max_p2p_bytes,
                max_coll_bytes,
                max_multi_request_size,
                rail_id,
                plane_id
            ),
            size_of::<NcclNetPropertiesV12>(),
            128,
        );
    }

    #[test]
    fn tables_match_spec_slots() {
        assert_eq!(size_of::<NcclNetV6>(), 136);
        assert_eq!(size_of::<NcclNetV7>(), 152);
        assert_eq!(size_of::<NcclNetV8>(), 152);
        assert_eq!(size_of::<NcclNetV9>(), 160);
        assert_eq!(size_of::<NcclNetV10>(), 160);
        assert_eq!(size_of::<NcclNetV11>(), 176);
        assert_eq!(size_of::<NcclNetV12>(), 176);
        // Slot k at offset 8k (docs/nccl-net-abi.md#the-function-table).
        assert_eq!(offset_of!(NcclNetV12, init), 8);
        assert_eq!(offset_of!(NcclNetV12, reg_mr_dma_buf), 64);
        assert_eq!(offset_of!(NcclNetV12, iflush), 96);
        assert_eq!(offset_of!(NcclNetV12, close_listen), 128);
        assert_eq!(offset_of!(NcclNetV12, get_device_mr), 136);
        assert_eq!(offset_of!(NcclNetV12, make_vdevice), 152);
        assert_eq!(offset_of!(NcclNetV12, finalize), 160);
        assert_eq!(offset_of!(NcclNetV12, set_net_attr), 168);
        assert_eq!(offset_of!(NcclNetV6, close_listen), 128);
        assert_eq!(offset_of!(NcclNetV9, make_vdevice), 152);
        assert_eq!(offset_of!(NcclNetV10, make_vdevice), 152);
        assert_eq!(offset_of!(NcclNetV7, irecv_consumed), 144);
    }
}

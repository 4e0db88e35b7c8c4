//! Self-contained helpers: string tables, rate conversions, fork support,
//! address handles, the import verbs (`ibv_import_*`, over [`super::cmdfile`]), and the verbs
//! that fail because the device lacks the feature.

use std::ffi::{c_char, c_int, c_void, CStr};

use rdma_sys::{ibv_ah, ibv_ah_attr, ibv_context, ibv_gid, ibv_grh, ibv_pd, ibv_qp, ibv_wc};

use super::cmdfile::{cmd_file_attach, cmd_file_detach, file_has_pd, file_mr};
use super::ctx::Context;
use super::mr::Pd;
use super::{ffi_guard, int_err, minus_one, null_err};
use crate::driver::link::LinkLayer;

fn cstr(s: &'static CStr) -> *const c_char {
    s.as_ptr()
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    ffi_guard!(std::ptr::null(), {
        cstr(match status {
            0 => c"success",
            1 => c"local length error",
            2 => c"local QP operation error",
            3 => c"local EE context operation error",
            4 => c"local protection error",
            5 => c"Work Request Flushed Error",
            6 => c"memory management operation error",
            7 => c"bad response error",
            8 => c"local access error",
            9 => c"remote invalid request error",
            10 => c"remote access error",
            11 => c"remote operation error",
            12 => c"transport retry counter exceeded",
            13 => c"RNR retry counter exceeded",
            14 => c"local RDD violation error",
            15 => c"remote invalid RD request",
            16 => c"aborted error",
            17 => c"invalid EE context number",
            18 => c"invalid EE context state",
            19 => c"fatal error",
            20 => c"response timeout error",
            21 => c"general error",
            22 => c"TM error",
            23 => c"TM software rendezvous",
            _ => c"unknown",
        })
    })
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: u32) -> *const c_char {
    ffi_guard!(std::ptr::null(), {
        cstr(match t {
            1 => c"InfiniBand channel adapter",
            2 => c"InfiniBand switch",
            3 => c"InfiniBand router",
            4 => c"iWARP NIC",
            5 => c"usNIC",
            6 => c"usNIC UDP",
            7 => c"unspecified",
            _ => c"unknown",
        })
    })
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: u32) -> *const c_char {
    ffi_guard!(std::ptr::null(), {
        cstr(match s {
            0 => c"no state change (NOP)",
            1 => c"down",
            2 => c"init",
            3 => c"armed",
            4 => c"active",
            5 => c"active defer",
            _ => c"unknown",
        })
    })
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: u32) -> *const c_char {
    ffi_guard!(std::ptr::null(), {
        cstr(match e {
            0 => c"CQ error",
            1 => c"local work queue catastrophic error",
            2 => c"invalid request local work queue error",
            3 => c"local access violation work queue error",
            4 => c"communication established",
            5 => c"send queue drained",
            6 => c"path migrated",
            7 => c"path migration request error",
            8 => c"local catastrophic error",
            9 => c"port active",
            10 => c"port error",
            11 => c"LID change",
            12 => c"P_Key change",
            13 => c"SM change",
            14 => c"SRQ catastrophic error",
            15 => c"SRQ limit reached",
            16 => c"last WQE reached",
            17 => c"client reregistration",
            18 => c"GID table change",
            19 => c"WQ fatal",
            _ => c"unknown",
        })
    })
}

/// (enum ibv_rate, multiple of 2.5 Gb/s, Mb/s)
const RATES: &[(c_int, c_int, c_int)] = &[
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, -1, 28125),
    (20, -1, 53125),
    (21, -1, 425000),
    (22, -1, 637500),
];

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    ffi_guard!(-1, {
        RATES.iter().find(|r| r.0 == rate && r.1 > 0).map(|r| r.1).unwrap_or(-1)
    })
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    ffi_guard!(0, {
        RATES.iter().find(|r| r.1 == mult && mult > 0).map(|r| r.0).unwrap_or(0)
    })
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    ffi_guard!(-1, { RATES.iter().find(|r| r.0 == rate).map(|r| r.2).unwrap_or(-1) })
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    ffi_guard!(0, { RATES.iter().find(|r| r.2 == mbps).map(|r| r.0).unwrap_or(0) })
}

/// Memory is never pinned, so fork needs no preparation.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    ffi_guard!(-1, { 0 })
}

/// `IBV_FORK_UNNEEDED`: nothing is pinned, a forked child sees ordinary memory.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> u32 {
    ffi_guard!(rdma_sys::IBV_FORK_UNNEEDED, { rdma_sys::IBV_FORK_UNNEEDED })
}

#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    ffi_guard!(-1, { 0 })
}

#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    ffi_guard!(-1, { 0 })
}

/// An address handle: a validated copy of the attributes (used only by UD,
/// which this device does not offer, but creating one is legal).
#[repr(C)]
pub struct Ah {
    pub ibv: ibv_ah,
    pub attr: ibv_ah_attr,
}

/// # Safety
/// `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`).
/// `attr` must be NULL or valid for reads and writes of one `ibv_ah_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ffi_guard!(std::ptr::null_mut(), {
        // SAFETY: pd is ours.
        let Some(p) = (unsafe { Pd::from_ibv(pd) }) else {
            return null_err(libc::EINVAL);
        };
        if attr.is_null() {
            return null_err(libc::EINVAL);
        }
        // SAFETY: attr is valid for reading.
        let a = unsafe { *attr };
        // An InfiniBand port takes what RTR takes (a DLID, a GRH only when global); a RoCE
        // AH needs a GRH from a valid source GID (docs/softroce.md#infiniband-mode).
        let valid = match p.dev.link {
            LinkLayer::Infiniband => super::qp::address_vector(&p.dev, &a).is_ok(),
            LinkLayer::Ethernet => {
                a.is_global != 0
                    && (a.port_num == 1 || a.port_num == 0)
                    && p.dev.gid(a.grh.sgid_index as usize).is_some()
            }
        };
        if !valid {
            return null_err(libc::EINVAL);
        }
        Box::into_raw(Box::new(Ah {
            ibv: ibv_ah {
                context: p.ibv.context,
                pd,
                handle: p.dev.alloc_handle(),
            },
            attr: a,
        })) as *mut ibv_ah
    })
}

/// # Safety
/// `ah` must be NULL or a live AH of ours (`ibv_create_ah`).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    ffi_guard!(libc::EIO, {
        if ah.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: ah is ours; freed once.
        drop(unsafe { Box::from_raw(ah as *mut Ah) });
        0
    })
}

/// Needs a GRH in the receive buffer, which only UD receives carry.
///
/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    _ctx: *mut ibv_context,
    _port: u8,
    _wc: *mut ibv_wc,
    _grh: *mut ibv_grh,
    _ah_attr: *mut ibv_ah_attr,
) -> c_int {
    ffi_guard!(-1, { minus_one(libc::EOPNOTSUPP) })
}

/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    _pd: *mut ibv_pd,
    _wc: *mut ibv_wc,
    _grh: *mut ibv_grh,
    _port: u8,
) -> *mut ibv_ah {
    ffi_guard!(std::ptr::null_mut(), { null_err(libc::EOPNOTSUPP) })
}

/// Multicast needs UD QPs, which this device does not offer.
///
/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    ffi_guard!(libc::EIO, { int_err(libc::EOPNOTSUPP) })
}

/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    ffi_guard!(libc::EIO, { int_err(libc::EOPNOTSUPP) })
}

/// The kernel resolves L2 for our UDP socket; there is no MAC to report.
///
/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_resolve_eth_l2_from_gid(
    _ctx: *mut ibv_context,
    _attr: *mut ibv_ah_attr,
    _eth_mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    ffi_guard!(libc::EIO, { int_err(libc::EOPNOTSUPP) })
}

/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    ffi_guard!(libc::EIO, { int_err(libc::EOPNOTSUPP) })
}

/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_set_ece(_qp: *mut ibv_qp, _ece: *mut c_void) -> c_int {
    ffi_guard!(libc::EIO, { int_err(libc::EOPNOTSUPP) })
}

/// Opens a second context on the command file behind `cmd_fd` (a dup of another context's
/// `cmd_fd`), sharing its PDs and MRs. The new context owns `cmd_fd` (closed by
/// `ibv_close_device`); on failure it stays the caller's. NULL with errno EINVAL when `cmd_fd`
/// is no command fd of an open softroce context.
///
/// # Safety
/// No requirements: `cmd_fd` is only inspected with fstat.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_device(cmd_fd: c_int) -> *mut ibv_context {
    ffi_guard!(std::ptr::null_mut(), {
        let (id, device) = match cmd_file_attach(cmd_fd) {
            Ok(x) => x,
            Err(e) => return null_err(e),
        };
        match super::context::new_context(device, cmd_fd, id) {
            Ok(c) => c,
            Err(e) => {
                // Detach again without closing the caller's fd.
                cmd_file_detach(id);
                null_err(e)
            }
        }
    })
}

/// A new `ibv_pd` on `ctx` for the PD `handle` of `ctx`'s command file (allocated through this
/// context or one sharing its file). The PD is the same: MRs and QPs of either pointer protect
/// each other. Free it with `ibv_unimport_pd` (the PD lives on) or `ibv_dealloc_pd` (the PD is
/// gone for every pointer). NULL with errno EINVAL for an unknown handle.
///
/// # Safety
/// `ctx` must be NULL or a live context of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_pd(ctx: *mut ibv_context, handle: u32) -> *mut ibv_pd {
    ffi_guard!(std::ptr::null_mut(), {
        // SAFETY: ctx is ours per the contract.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return null_err(libc::EINVAL);
        };
        if !file_has_pd(c.file, handle) {
            return null_err(libc::EINVAL);
        }
        Pd::new_raw(ctx, c, handle)
    })
}

/// A new `ibv_mr` on `pd` for the MR `handle` of `pd`'s command file, as rdma-core makes it:
/// keys and length of the MR, `addr` NULL. `ibv_unimport_mr` frees it (the MR lives on);
/// `ibv_dereg_mr` deregisters the MR for every pointer. NULL with errno EINVAL for an unknown
/// handle.
///
/// # Safety
/// `pd` must be NULL or a live PD of ours.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_mr(pd: *mut ibv_pd, handle: u32) -> *mut rdma_sys::ibv_mr {
    ffi_guard!(std::ptr::null_mut(), {
        // SAFETY: pd is ours per the contract.
        let Some(p) = (unsafe { Pd::from_ibv(pd) }) else {
            return null_err(libc::EINVAL);
        };
        match file_mr(p.file, handle) {
            Some(m) => super::mr::Mr::new_imported(pd, p, handle, m),
            None => null_err(libc::EINVAL),
        }
    })
}

/// No device memory exists (`ibv_alloc_dm` fails), so none can be imported.
///
/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_import_dm(_ctx: *mut ibv_context, _h: u32) -> *mut rdma_sys::ibv_dm {
    ffi_guard!(std::ptr::null_mut(), { null_err(libc::EOPNOTSUPP) })
}

/// Frees an `ibv_pd` without deallocating the PD (other pointers to it stay valid).
///
/// # Safety
/// `pd` must be NULL or a live PD of ours; it is freed.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_pd(pd: *mut ibv_pd) {
    ffi_guard!((), {
        if !pd.is_null() {
            // SAFETY: pd came from ibv_alloc_pd or ibv_import_pd (a Box); freed once.
            drop(unsafe { Box::from_raw(pd as *mut Pd) });
        }
    })
}

/// Frees an `ibv_mr` without deregistering the MR (other pointers to it stay valid).
///
/// # Safety
/// `mr` must be NULL or a live MR of ours; it is freed.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_mr(mr: *mut rdma_sys::ibv_mr) {
    ffi_guard!((), {
        if !mr.is_null() {
            // SAFETY: per the contract.
            unsafe { super::mr::Mr::unimport(mr) };
        }
    })
}

/// Nothing to release: no device memory can have been imported.
///
/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_unimport_dm(_dm: *mut rdma_sys::ibv_dm) {
    ffi_guard!((), {})
}

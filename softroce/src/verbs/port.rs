//! Port queries: port attributes, the GID table (with its types and the
//! extended `_ibv_query_gid_ex`/`_ibv_query_gid_table` forms) and the P_Key table.

use std::ffi::c_int;

use rdma_sys::{ibv_context, ibv_gid, ibv_gid_entry, ibv_port_attr};

use super::ctx::Context;
use super::{ffi_guard, int_err, minus_one};
use crate::driver::device::{self, Device};
use crate::driver::limits::{self, GID_TABLE_LEN};
use crate::driver::link::{LinkLayer, SM_LID};

fn fill_port_attr(dev: &Device, a: &mut ibv_port_attr) {
    // SAFETY: plain data.
    *a = unsafe { std::mem::zeroed() };
    let ib = dev.link == LinkLayer::Infiniband;
    a.state = if crate::config::port_down() || dev.sock.faults.is_down() {
        rdma_sys::ibv_port_state::IBV_PORT_DOWN
    } else if ib && !dev.ib_active() {
        // No subnet manager (or no LID for this address): the link is up, the port
        // unconfigured (docs/softroce.md#infiniband-mode).
        rdma_sys::ibv_port_state::IBV_PORT_INIT
    } else {
        rdma_sys::ibv_port_state::IBV_PORT_ACTIVE
    };
    // Path MTUs up to this are accepted (as rxe checks against max_mtu).
    a.max_mtu = dev.active_mtu;
    a.active_mtu = dev.active_mtu;
    a.gid_tbl_len = GID_TABLE_LEN as c_int;
    // No IBV_PORT_CM_SUP: there is no rdma_cm for this device (librdmacm needs
    // the kernel's /dev/infiniband/rdma_cm), so connections are set up out of band.
    a.port_cap_flags = 0;
    a.max_msg_sz = limits::MAX_MSG_SZ;
    a.pkey_tbl_len = crate::config::pkeys().len() as u16;
    a.lid = dev.lid;
    a.sm_lid = if dev.sm { SM_LID } else { 0 };
    a.lmc = 0;
    a.max_vl_num = 1;
    a.active_width = 2; // 4X
    a.active_speed = 32; // 25 Gb/s (EDR)
    a.phys_state = if crate::config::port_down() || dev.sock.faults.is_down() {
        3
    } else {
        5
    }; // Disabled / LinkUp
    a.link_layer = if ib {
        1 // IBV_LINK_LAYER_INFINIBAND
    } else {
        2 // IBV_LINK_LAYER_ETHERNET
    };
}

/// `verbs_context.query_port` (the path of the `ibv_query_port` inline).
///
/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `attr` must be NULL or valid for writing `attr_len` bytes.
pub(super) unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    attr_len: usize,
) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: ctx is ours.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return int_err(libc::EINVAL);
        };
        if port != 1 || attr.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: plain data.
        let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
        fill_port_attr(&c.dev, &mut a);
        let n = attr_len.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller's buffer holds attr_len bytes; we write at most that.
        unsafe { std::ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, n) };
        0
    })
}

/// `sizeof(struct _compat_ibv_port_attr)`: `ibv_port_attr` up to and
/// including `flags` (the header only forward-declares it).
pub const COMPAT_PORT_ATTR_LEN: usize = 48;

/// Exported compat `ibv_query_port@1.1`: writes the 48-byte `_compat_ibv_port_attr`.
///
/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `attr` must be NULL or valid for writing one `_compat_ibv_port_attr` (48 bytes).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut rdma_sys::_compat_ibv_port_attr,
) -> c_int {
    // SAFETY: forwards the caller's pointers; size limits the write.
    unsafe { query_port_ex(ctx, port, attr as *mut ibv_port_attr, COMPAT_PORT_ATTR_LEN) }
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `gid` must be NULL or valid for reads and writes of one `ibv_gid`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(ctx: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int {
    ffi_guard!(-1, {
        // SAFETY: ctx is ours.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return minus_one(libc::EINVAL);
        };
        if port != 1 || gid.is_null() || index < 0 || index as usize >= GID_TABLE_LEN {
            return minus_one(libc::EINVAL);
        }
        let raw = c.dev.gid(index as usize).unwrap_or([0; 16]);
        // SAFETY: gid is a valid out-pointer.
        unsafe { (*gid).raw = raw };
        0
    })
}

/// `ibv_query_gid_type` (PRIVATE): 0 = IB/RoCE v1, 1 = RoCE v2 (sysfs numbering).
///
/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `ty` must be NULL or valid for reads and writes of one `u32`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(ctx: *mut ibv_context, port: u8, index: u32, ty: *mut u32) -> c_int {
    ffi_guard!(-1, {
        // SAFETY: ctx is ours.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return minus_one(libc::EINVAL);
        };
        if port != 1 || ty.is_null() || index as usize >= GID_TABLE_LEN {
            return minus_one(libc::EINVAL);
        }
        // rdma-core reads sysfs; an empty slot there still reads as "IB/RoCE v1".
        let t = match c.dev.gid_type(index as usize) {
            Some(device::GID_TYPE_ROCE_V2) => device::GID_TYPE_SYSFS_ROCE_V2,
            _ => device::GID_TYPE_SYSFS_ROCE_V1,
        };
        // SAFETY: ty is a valid out-pointer.
        unsafe { *ty = t };
        0
    })
}

fn gid_entry(dev: &Device, index: usize) -> Option<ibv_gid_entry> {
    let gid = dev.gid(index)?;
    // SAFETY: plain data.
    let mut e: ibv_gid_entry = unsafe { std::mem::zeroed() };
    e.gid.raw = gid;
    e.gid_index = index as u32;
    e.port_num = 1;
    e.gid_type = dev.gid_type(index)?;
    // An IB GID belongs to no network interface.
    e.ndev_ifindex = if dev.link == LinkLayer::Infiniband {
        0
    } else {
        dev.ifindex
    };
    Some(e)
}

/// `_ibv_query_gid_ex` (what the `ibv_query_gid_ex` macro calls).
///
/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `entry` must be NULL or valid for writing `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: ctx is ours.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return int_err(libc::EINVAL);
        };
        if flags != 0 || entry.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return int_err(libc::EINVAL);
        }
        if port != 1 || index as usize >= GID_TABLE_LEN {
            return int_err(libc::EINVAL);
        }
        match gid_entry(&c.dev, index as usize) {
            Some(e) => {
                // SAFETY: entry holds at least one ibv_gid_entry.
                unsafe { *entry = e };
                0
            }
            None => int_err(libc::ENODATA),
        }
    })
}

/// `_ibv_query_gid_table`: returns the number of valid entries written.
///
/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `entries` must be NULL or valid for writing `max_entries` records of `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    ffi_guard!(-(libc::EIO as isize), {
        // SAFETY: ctx is ours.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return -(libc::EINVAL as isize);
        };
        if flags != 0 || entries.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as isize);
        }
        let mut n = 0usize;
        for i in 0..GID_TABLE_LEN {
            if let Some(e) = gid_entry(&c.dev, i) {
                if n == max_entries {
                    return -(libc::EINVAL as isize);
                }
                // SAFETY: entries holds max_entries records of entry_size bytes.
                unsafe {
                    let dst = (entries as *mut u8).add(n * entry_size) as *mut ibv_gid_entry;
                    std::ptr::write_unaligned(dst, e);
                }
                n += 1;
            }
        }
        n as isize
    })
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `pkey` must be NULL or valid for reads and writes of one `u16`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(ctx: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    ffi_guard!(-1, {
        // SAFETY: ctx is ours.
        if unsafe { Context::from_ibv(ctx) }.is_none() || pkey.is_null() || port != 1 {
            return minus_one(libc::EINVAL);
        }
        let Some(key) = usize::try_from(index)
            .ok()
            .and_then(|i| crate::config::pkeys().get(i).copied())
        else {
            return minus_one(libc::EINVAL);
        };
        // SAFETY: valid out-pointer.
        unsafe { *pkey = key.to_be() };
        0
    })
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    ffi_guard!(-libc::EIO, {
        // SAFETY: ctx is ours.
        if unsafe { Context::from_ibv(ctx) }.is_none() || port != 1 {
            return -libc::EINVAL;
        }
        // As the kernel's table lookup: the key's partition (its low 15 bits) decides.
        let want = u16::from_be(pkey) & 0x7fff;
        match crate::config::pkeys().iter().position(|k| k & 0x7fff == want) {
            Some(i) => i as c_int,
            None => -libc::ENOENT,
        }
    })
}

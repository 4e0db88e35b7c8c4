//! Protection domains and memory regions.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use rdma_sys::{ibv_access_flags, ibv_context, ibv_mr, ibv_pd};

use super::cmdfile::{self, FileId, SharedMr};
use super::ctx::Context;
use super::{ffi_guard, int_err, null_err};
use crate::driver::device::Device;
use crate::driver::mem::MrInfo;
use crate::driver::pinned;
use crate::proto::mem::access as ibv_access;

/// `struct ibv_pd` plus the device and the command file it belongs to.
#[repr(C)]
pub struct Pd {
    pub ibv: ibv_pd,
    pub dev: Arc<Device>,
    /// Command file of the context it was allocated or imported through (never read through
    /// `ibv.context`, which may be closed before the PD is freed).
    pub file: FileId,
}

impl Pd {
    /// The PD behind `pd`; `None` for NULL, and for a pointer whose PD was deallocated through
    /// another pointer to it (`ibv_import_pd`): as with a kernel's PD, every use of it then
    /// fails (EINVAL), and only `ibv_unimport_pd` frees it.
    ///
    /// # Safety
    /// `pd` must be NULL or a live PD returned by our `ibv_alloc_pd` or `ibv_import_pd`.
    pub unsafe fn from_ibv<'a>(pd: *mut ibv_pd) -> Option<&'a Pd> {
        // SAFETY: per the contract.
        let p = unsafe { (pd as *const Pd).as_ref() }?;
        (!cmdfile::file_dropped_pd(p.file, p.ibv.handle)).then_some(p)
    }

    /// A new `ibv_pd` of `ctx` (whose context is `c`) for PD `handle`.
    pub(crate) fn new_raw(ctx: *mut ibv_context, c: &Context, handle: u32) -> *mut ibv_pd {
        let pd = Box::new(Pd {
            ibv: ibv_pd { context: ctx, handle },
            dev: c.dev.clone(),
            file: c.file,
        });
        Box::into_raw(pd) as *mut ibv_pd
    }
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    ffi_guard!(std::ptr::null_mut(), {
        // SAFETY: ctx is ours.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return null_err(libc::EINVAL);
        };
        let handle = c.dev.alloc_handle();
        cmdfile::file_add_pd(c.file, handle);
        Pd::new_raw(ctx, c, handle)
    })
}

/// Deallocates the PD, for every `ibv_pd` of it (`ibv_import_pd`), and frees this one.
/// EBUSY while an MR or QP uses it.
///
/// # Safety
/// `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`, `ibv_import_pd`).
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    ffi_guard!(libc::EIO, {
        if pd.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: pd came from ibv_alloc_pd or ibv_import_pd.
        let Some(p) = (unsafe { Pd::from_ibv(pd) }) else {
            // Deallocated through another pointer already: this one stays for ibv_unimport_pd.
            return int_err(libc::EINVAL);
        };
        let h = p.ibv.handle;
        if p.dev.pd_in_use(h) {
            return int_err(libc::EBUSY);
        }
        cmdfile::file_remove_pd(p.file, h);
        // SAFETY: freed once.
        drop(unsafe { Box::from_raw(pd as *mut Pd) });
        0
    })
}

/// `struct ibv_mr` plus the mapping we own for a dmabuf MR.
#[repr(C)]
pub struct Mr {
    pub ibv: ibv_mr,
    dev: Arc<Device>,
    /// (base, len) of an mmap of a dmabuf fd, unmapped at deregistration.
    map: Option<(usize, usize)>,
    /// Locked-memory bytes this registration counts (user memory only; given back at dereg).
    pinned: u64,
    /// rdma-core's `verbs_mr.mr_type` (`ibv_rereg_mr` takes only `IBV_MR_TYPE_MR`).
    kind: MrKind,
    /// Shared with the `ibv_mr`s imported from this one.
    shared: Arc<SharedMr>,
    file: FileId,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum MrKind {
    /// `ibv_reg_mr*`.
    User,
    /// `ibv_reg_dmabuf_mr`.
    DmaBuf,
    /// `ibv_import_mr`.
    Imported,
}

impl Mr {
    /// The `ibv_mr` of `ibv_import_mr`: on `pd` (ours, `p`), MR `handle` of its file.
    pub(crate) fn new_imported(pd: *mut ibv_pd, p: &Pd, handle: u32, shared: Arc<SharedMr>) -> *mut ibv_mr {
        let mr = Box::new(Mr {
            ibv: ibv_mr {
                context: p.ibv.context,
                pd,
                addr: std::ptr::null_mut(),
                length: shared.length.load(Ordering::Relaxed),
                handle,
                lkey: shared.lkey,
                rkey: shared.rkey,
            },
            dev: p.dev.clone(),
            map: None,
            pinned: 0,
            kind: MrKind::Imported,
            shared,
            file: p.file,
        });
        Box::into_raw(mr) as *mut ibv_mr
    }

    /// `ibv_unimport_mr`: frees this `ibv_mr` and nothing else (`Mr` has no `Drop`). Called on
    /// the original `ibv_mr` of a registration, the MR stays registered, with its pinned count
    /// and its mapping, as a provider's unimport leaves the kernel object: the application can
    /// still import it and deregister it through that pointer.
    ///
    /// # Safety
    /// `mr` must be a live MR of ours; it is freed.
    pub(crate) unsafe fn unimport(mr: *mut ibv_mr) {
        // SAFETY: per the contract; freed once.
        drop(unsafe { Box::from_raw(mr as *mut Mr) });
    }
}

const ACCESS_MW_BIND: u32 = ibv_access_flags::IBV_ACCESS_MW_BIND.0;
const ACCESS_ZERO_BASED: u32 = ibv_access_flags::IBV_ACCESS_ZERO_BASED.0;
const ACCESS_ON_DEMAND: u32 = ibv_access_flags::IBV_ACCESS_ON_DEMAND.0;
const ACCESS_HUGETLB: u32 = ibv_access_flags::IBV_ACCESS_HUGETLB.0;
/// Flags a provider may ignore, such as RELAXED_ORDERING (verbs.h defines
/// `IBV_ACCESS_OPTIONAL_RANGE` as the kernel's value).
const ACCESS_OPTIONAL_RANGE: u32 = rdma_sys::ib_uverbs_access_flags::IB_UVERBS_ACCESS_OPTIONAL_RANGE.0;

/// Whether `access` lets the NIC write the memory (the kernel then pins it for writing).
fn writable(access: u32) -> bool {
    access & (ibv_access::LOCAL_WRITE | ibv_access::REMOTE_WRITE | ibv_access::REMOTE_ATOMIC | ACCESS_MW_BIND) != 0
}

/// Validates access flags the way a real provider does; returns the flags kept.
fn check_access(access: c_int) -> Result<u32, i32> {
    let a = access as u32 & !ACCESS_OPTIONAL_RANGE;
    let known = ibv_access::LOCAL_WRITE
        | ibv_access::REMOTE_WRITE
        | ibv_access::REMOTE_READ
        | ibv_access::REMOTE_ATOMIC
        | ACCESS_MW_BIND
        | ACCESS_HUGETLB;
    if a & (ACCESS_ZERO_BASED | ACCESS_ON_DEMAND) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if a & !known != 0 {
        return Err(libc::EINVAL);
    }
    // IBTA: remote write / atomic need local write.
    if a & (ibv_access::REMOTE_WRITE | ibv_access::REMOTE_ATOMIC) != 0 && a & ibv_access::LOCAL_WRITE == 0 {
        return Err(libc::EINVAL);
    }
    Ok(a)
}

fn register(
    pd: *mut ibv_pd,
    host: usize,
    len: usize,
    iova: u64,
    access: c_int,
    map: Option<(usize, usize)>,
) -> Result<*mut ibv_mr, i32> {
    // SAFETY: pd is ours per the API contract.
    let p = unsafe { Pd::from_ibv(pd) }.ok_or(libc::EINVAL)?;
    let access = check_access(access)?;
    if (host as u64).checked_add(len as u64).is_none() || iova.checked_add(len as u64).is_none() {
        return Err(libc::EINVAL);
    }
    // User memory must be there to pin (EFAULT, as the kernel), and is pinned against
    // RLIMIT_MEMLOCK; a DMA-BUF is neither.
    let pinned = if map.is_none() {
        pinned::check_mapped(host, len, writable(access))?;
        pinned::page_bytes(host, len)
    } else {
        0
    };
    pinned::pin(pinned)?;
    let dev = &p.dev;
    let key = dev.alloc_key();
    let handle = dev.alloc_handle();
    let shared = Arc::new(SharedMr {
        lkey: key,
        rkey: key,
        length: AtomicUsize::new(len),
        live: AtomicBool::new(true),
    });
    let mr = Box::new(Mr {
        ibv: ibv_mr {
            context: p.ibv.context,
            pd,
            addr: host as *mut c_void,
            length: len,
            handle,
            lkey: key,
            rkey: key,
        },
        dev: dev.clone(),
        kind: if map.is_some() { MrKind::DmaBuf } else { MrKind::User },
        map,
        pinned,
        shared: shared.clone(),
        file: p.file,
    });
    cmdfile::file_add_mr(p.file, handle, shared);
    dev.mrs.write().insert(
        key,
        MrInfo {
            addr: host,
            len,
            iova,
            access,
            pd: p.ibv.handle,
        },
    );
    Ok(Box::into_raw(mr) as *mut ibv_mr)
}

/// # Safety
/// `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`).
/// `addr .. addr + length` must stay mapped while the MR is registered: the NIC reads and writes it from its engine threads.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr {
    ffi_guard!(std::ptr::null_mut(), {
        match register(pd, addr as usize, length, addr as u64, access, None) {
            Ok(m) => m,
            Err(e) => null_err(e),
        }
    })
}

/// # Safety
/// `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`).
/// `addr .. addr + length` must stay mapped while the MR is registered: the NIC reads and writes it from its engine threads.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ffi_guard!(std::ptr::null_mut(), {
        match register(pd, addr as usize, length, iova, access, None) {
            Ok(m) => m,
            Err(e) => null_err(e),
        }
    })
}

/// # Safety
/// `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`).
/// `addr .. addr + length` must stay mapped while the MR is registered: the NIC reads and writes it from its engine threads.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    ffi_guard!(std::ptr::null_mut(), {
        match register(pd, addr as usize, length, iova, access as c_int, None) {
            Ok(m) => m,
            Err(e) => null_err(e),
        }
    })
}

/// dmabuf MR: we map `[offset, offset+length)` of the fd and do not keep the fd.
/// As in rdma-core, `mr->addr` reports `offset`; the data path uses the mapping,
/// addressed through `iova`.
///
/// Errors as the kernel's: EINVAL for a range past the dma-buf's end (mapped, it would fault in
/// the engine), EOPNOTSUPP for a dma-buf this NIC cannot reach — here one the CPU cannot map,
/// such as a GPU's (softroce moves bytes with the CPU; a real NIC imports it for DMA).
///
/// # Safety
/// `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`).
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    ffi_guard!(std::ptr::null_mut(), {
        if length == 0 || fd < 0 {
            return null_err(libc::EINVAL);
        }
        if let Err(e) = check_access(access) {
            return null_err(e);
        }
        // SAFETY: `stat` is plain data, valid all-zero; fstat writes only into it.
        let st = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            (libc::fstat(fd, &mut st) == 0).then_some(st)
        };
        let Some(st) = st else {
            return null_err(super::errno());
        };
        // A dma-buf's size is its inode's, as a memfd's (a file of size 0 that is not a regular
        // file has none to check, and mapping it decides).
        let sized = st.st_mode & libc::S_IFMT == libc::S_IFREG || st.st_size > 0;
        if sized
            && offset
                .checked_add(length as u64)
                .is_none_or(|end| end > st.st_size as u64)
        {
            return null_err(libc::EINVAL);
        }
        // SAFETY: sysconf is always safe.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        let base_off = offset & !(page - 1);
        let skew = (offset - base_off) as usize;
        let map_len = length + skew;
        // SAFETY: maps a shared view of the caller's fd; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                base_off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return null_err(match super::errno() {
                e @ (libc::ENOMEM | libc::EACCES | libc::EPERM | libc::EAGAIN) => e,
                // The exporter refuses the CPU a mapping (a GPU driver's answers ENOTSUPP,
                // EINVAL or ENODEV; a file that is no buffer, ENODEV): this NIC cannot reach it.
                _ => libc::EOPNOTSUPP,
            });
        }
        let host = p as usize + skew;
        match register(pd, host, length, iova, access, Some((p as usize, map_len))) {
            Ok(m) => {
                // SAFETY: m is the MR just created.
                unsafe { (*m).addr = offset as usize as *mut c_void };
                m
            }
            Err(e) => {
                // SAFETY: unmaps what we mapped above.
                unsafe { libc::munmap(p, map_len) };
                null_err(e)
            }
        }
    })
}

/// # Safety
/// `mr` must be NULL or a live MR of ours (one of the `ibv_reg_*mr` verbs).
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    ffi_guard!(libc::EIO, {
        if mr.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: mr came from one of our registration functions or ibv_import_mr; freed once.
        let m = unsafe { Box::from_raw(mr as *mut Mr) };
        // The first ibv_dereg_mr of any ibv_mr of the registration ends it; through another one
        // afterwards only frees that ibv_mr (its key may belong to a newer MR by then).
        if m.shared.live.swap(false, Ordering::AcqRel) {
            m.dev.mrs.write().remove(&m.ibv.lkey);
            cmdfile::file_remove_mr(m.file, m.ibv.handle);
        }
        pinned::unpin(m.pinned);
        if let Some((base, len)) = m.map {
            // SAFETY: unmaps the mapping this MR owns.
            unsafe { libc::munmap(base as *mut c_void, len) };
        }
        0
    })
}

/// `ibv_rereg_mr` flags (verbs.h `enum ibv_rereg_mr_flags`).
const REREG_TRANSLATION: c_int = 1;
const REREG_PD: c_int = 2;
const REREG_ACCESS: c_int = 4;
/// `enum ibv_rereg_mr_err_code`: the argument checks of libibverbs' own wrapper, and the
/// command (what the kernel refuses).
const REREG_ERR_INPUT: c_int = -1;
const REREG_ERR_CMD: c_int = -4;

/// Changes an MR in place, as libibverbs and the kernel do (docs/softroce-pyverbs.md#rereg-mr):
/// the keys stay (rdma-core reads them back from the kernel, which may keep or replace them; an
/// application must use `mr->lkey`/`rkey` after the call), `addr`/`length` follow
/// IBV_REREG_MR_CHANGE_TRANSLATION (the IOVA becomes `addr`), `pd` and `context` follow
/// IBV_REREG_MR_CHANGE_PD. Work requests already posted with the old translation or PD fail
/// with a protection error when they execute, as on hardware.
///
/// Errors (0 on success, else with errno set):
/// * `IBV_REREG_MR_ERR_INPUT` (-1), EINVAL: an MR not made by `ibv_reg_mr*` (dmabuf,
///   imported), unknown flags, CHANGE_TRANSLATION with a NULL `addr` or 0 `length`, `access`
///   without CHANGE_ACCESS — libibverbs' checks;
/// * `IBV_REREG_MR_ERR_CMD` (-4): no flag, an MR already deregistered, a PD of another command
///   file or deallocated (EINVAL), access flags `ibv_reg_mr` refuses (its errno), a new range
///   not mapped (or not writable for a writable access: EFAULT) or over RLIMIT_MEMLOCK
///   (ENOMEM) — the kernel's. Nothing changes on error.
///
/// # Safety
/// `mr` must be NULL or a live MR of ours (one of the `ibv_reg_*mr` verbs, `ibv_import_mr`).
/// With CHANGE_PD, `pd` must be NULL or a live PD of ours (`ibv_alloc_pd`, `ibv_import_pd`).
/// With CHANGE_TRANSLATION, `addr .. addr + length` must stay mapped while the MR is registered.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    ffi_guard!(REREG_ERR_CMD, {
        if mr.is_null() {
            super::set_errno(libc::EINVAL);
            return REREG_ERR_INPUT;
        }
        // SAFETY: mr is ours per the contract; the verbs contract lets no other thread use an
        // MR while it is re-registered.
        let m = unsafe { &mut *(mr as *mut Mr) };
        match rereg(m, flags, pd, addr as usize, length, access) {
            Ok(()) => 0,
            Err((code, e)) => {
                super::set_errno(e);
                code
            }
        }
    })
}

fn rereg(
    m: &mut Mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: usize,
    length: usize,
    access: c_int,
) -> Result<(), (c_int, i32)> {
    let input = |e| (REREG_ERR_INPUT, e);
    let cmd = |e| (REREG_ERR_CMD, e);
    // libibverbs' checks, in its order.
    if m.kind != MrKind::User || flags & !(REREG_TRANSLATION | REREG_PD | REREG_ACCESS) != 0 {
        return Err(input(libc::EINVAL));
    }
    if flags & REREG_TRANSLATION != 0 && (length == 0 || addr == 0) {
        return Err(input(libc::EINVAL));
    }
    if access != 0 && flags & REREG_ACCESS == 0 {
        return Err(input(libc::EINVAL));
    }
    // The kernel's.
    if flags == 0 {
        return Err(cmd(libc::EINVAL));
    }
    let mut guard = m.dev.mrs.write();
    let info = match guard.get(&m.ibv.lkey) {
        Some(i) if m.shared.live.load(Ordering::Acquire) => *i,
        _ => return Err(cmd(libc::EINVAL)),
    };
    let mut ni = info;
    if flags & REREG_ACCESS != 0 {
        ni.access = check_access(access).map_err(cmd)?;
    }
    if flags & REREG_PD != 0 {
        // SAFETY: pd is NULL or ours per the contract.
        let p = unsafe { Pd::from_ibv(pd) }.ok_or(cmd(libc::EINVAL))?;
        if p.file != m.file || !cmdfile::file_has_pd(p.file, p.ibv.handle) {
            return Err(cmd(libc::EINVAL));
        }
        ni.pd = p.ibv.handle;
    }
    if flags & REREG_TRANSLATION != 0 {
        if (addr as u64).checked_add(length as u64).is_none() {
            return Err(cmd(libc::EINVAL));
        }
        ni.addr = addr;
        ni.len = length;
        ni.iova = addr as u64;
    }
    // The engine moves the bytes with the CPU: memory it may now write must be mapped writable
    // (a new range, or the old one when the access became writable).
    if flags & REREG_TRANSLATION != 0 || writable(ni.access) && !writable(info.access) {
        pinned::check_mapped(ni.addr, ni.len, writable(ni.access)).map_err(cmd)?;
    }
    if flags & REREG_TRANSLATION != 0 {
        // The new range is pinned before the old one is let go, as the kernel does.
        let bytes = pinned::page_bytes(addr, length);
        pinned::pin(bytes).map_err(cmd)?;
        pinned::unpin(m.pinned);
        m.pinned = bytes;
        m.ibv.addr = addr as *mut c_void;
        m.ibv.length = length;
        m.shared.length.store(length, Ordering::Relaxed);
    }
    if flags & REREG_PD != 0 {
        m.ibv.pd = pd;
        // SAFETY: checked above (a live PD of ours).
        m.ibv.context = unsafe { (*pd).context };
    }
    guard.insert(m.ibv.lkey, ni);
    Ok(())
}

//! Command files: what the kernel's uverbs file is to the contexts sharing it, so that PDs and
//! MRs can be imported between contexts of this process (`ibv_import_*` in `misc.rs`).
//!
//! A leaf module: contexts (`context.rs`), PDs and MRs (`mr.rs`) register here, and the
//! import verbs look up here, without those files depending on each other.

//= docs/softroce-pyverbs.md#shared-pd
//# A context's `cmd_fd` is a memfd of its own; a context imported from a dup of it shares
//# its command file, so PD and MR handles allocated through either resolve in both.

use std::collections::{HashMap, HashSet};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Identity of a command file: `(st_dev, st_ino)` of the memfd behind `cmd_fd` (a dup has the
/// same; every memfd has its own inode while open).
pub type FileId = (u64, u64);

/// What the kernel's `ib_uverbs_file` is to the contexts sharing it: the device and the handles
/// of the PDs and MRs allocated through any of them.
struct CmdFile {
    /// Index of the device in the device list (`context.rs`).
    device: usize,
    /// Contexts open on this file (the one of `ibv_open_device` and its imports).
    contexts: usize,
    pds: HashSet<u32>,
    mrs: HashMap<u32, Arc<SharedMr>>,
}

/// The state of a registered MR that its original `ibv_mr` and every imported one share.
pub struct SharedMr {
    pub lkey: u32,
    pub rkey: u32,
    /// Changes with `ibv_rereg_mr(IBV_REREG_MR_CHANGE_TRANSLATION)`.
    pub length: AtomicUsize,
    /// Cleared by the first `ibv_dereg_mr` of any of its `ibv_mr`s, which alone removes the key
    /// from the device (a later one through another `ibv_mr` must not remove a reused key).
    pub live: AtomicBool,
}

fn files() -> MutexGuard<'static, HashMap<FileId, CmdFile>> {
    static FILES: OnceLock<Mutex<HashMap<FileId, CmdFile>>> = OnceLock::new();
    FILES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn file_id_of(fd: c_int) -> Result<FileId, i32> {
    // SAFETY: `stat` is plain data, valid all-zero; fstat writes only into it.
    let st = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st)
    };
    st.map(|st| (st.st_dev, st.st_ino)).ok_or(libc::EINVAL)
}

/// A new command file for a context opened on device `device`: its fd (close-on-exec, owned by
/// the context) and identity.
pub(crate) fn cmd_file_new(device: usize) -> Result<(c_int, FileId), i32> {
    // SAFETY: the name is a NUL-terminated literal.
    let fd = unsafe { libc::memfd_create(c"softroce-cmd".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(super::errno());
    }
    let id = match file_id_of(fd) {
        Ok(id) => id,
        Err(e) => {
            // SAFETY: fd is the memfd just created, closed once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
    };
    files().insert(
        id,
        CmdFile {
            device,
            contexts: 1,
            pds: HashSet::new(),
            mrs: HashMap::new(),
        },
    );
    Ok((fd, id))
}

/// Attaches one more context to the command file behind `fd` (`ibv_import_device`): its
/// identity and device index. EINVAL when `fd` is no command fd of ours, as rdma-core answers
/// for a file that is no uverbs device.
pub(crate) fn cmd_file_attach(fd: c_int) -> Result<(FileId, usize), i32> {
    let id = file_id_of(fd)?;
    let mut f = files();
    let file = f.get_mut(&id).ok_or(libc::EINVAL)?;
    file.contexts += 1;
    Ok((id, file.device))
}

/// One context fewer on file `id`; the last one forgets the file's handles.
pub(crate) fn cmd_file_detach(id: FileId) {
    let mut f = files();
    if let Some(file) = f.get_mut(&id) {
        file.contexts -= 1;
        if file.contexts == 0 {
            f.remove(&id);
        }
    }
}

/// A context of file `id` closes, and with it its `fd`.
pub(crate) fn cmd_file_close(id: FileId, fd: c_int) {
    cmd_file_detach(id);
    // SAFETY: the context owns fd; it is closed once, here.
    unsafe { libc::close(fd) };
}

pub(crate) fn file_add_pd(id: FileId, handle: u32) {
    if let Some(file) = files().get_mut(&id) {
        file.pds.insert(handle);
    }
}

pub(crate) fn file_remove_pd(id: FileId, handle: u32) {
    if let Some(file) = files().get_mut(&id) {
        file.pds.remove(&handle);
    }
}

pub(crate) fn file_add_mr(id: FileId, handle: u32, mr: Arc<SharedMr>) {
    if let Some(file) = files().get_mut(&id) {
        file.mrs.insert(handle, mr);
    }
}

pub(crate) fn file_remove_mr(id: FileId, handle: u32) {
    if let Some(file) = files().get_mut(&id) {
        file.mrs.remove(&handle);
    }
}

/// Whether PD `handle` was allocated through a context of file `id` and is not deallocated.
pub(crate) fn file_has_pd(id: FileId, handle: u32) -> bool {
    files().get(&id).is_some_and(|f| f.pds.contains(&handle))
}

/// Whether PD `handle` was deallocated while the command file `id` lives on (a PD of a file
/// that is gone, or was never listed, is not reported: its context closed first).
pub(crate) fn file_dropped_pd(id: FileId, handle: u32) -> bool {
    files().get(&id).is_some_and(|f| !f.pds.contains(&handle))
}

pub(crate) fn file_mr(id: FileId, handle: u32) -> Option<Arc<SharedMr>> {
    files().get(&id).and_then(|f| f.mrs.get(&handle).cloned())
}

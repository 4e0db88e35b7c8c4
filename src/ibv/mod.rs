//! libibverbs, loaded at run time.
//!
//! The plugin has no DT_NEEDED on libibverbs: [`Verbs::load`] dlopens it (NCCL_IBVERBS_LIB, then
//! `libibverbs.so.1`, then `libibverbs.so`) and resolves every function the plugin
//! calls, by version node first (`dlvsym`), so a missing library or symbol is one clear error at
//! init instead of a crash later. `rdma-sys` supplies the struct layouts only.
//!
//! The data-path verbs (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) are `static inline` in
//! `verbs.h` and dispatch through the context's ops table; [`post_send`], [`post_recv`] and
//! [`poll_cq`] do the same.

use crate::error::{Error, Result};
pub use rdma_sys as sys;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

pub use rdma_sys;

mod context;
pub use context::{check_rc, Context, DeviceInfo, ElementFailures, PortInfo, ProtectionDomain};

#[cfg(feature = "testing")]
pub mod cq;
#[cfg(not(feature = "testing"))]
pub(crate) mod cq;
#[cfg(feature = "testing")]
pub mod mr;
#[cfg(not(feature = "testing"))]
pub(crate) mod mr;
#[cfg(feature = "testing")]
pub mod qp;
#[cfg(not(feature = "testing"))]
pub(crate) mod qp;
pub use cq::{CompletionQueue, WorkCompletion};
pub use mr::MemoryRegion;
pub use qp::QueuePair;

/// softroce's `struct softroce_qp_transport` (softroce/include/softroce_counters.h, version 1):
/// one QP's transport events since it was created.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct QpTransportRepr {
    pub version: u32,
    pub size: u32,
    pub timeouts: u64,
    pub retransmits: u64,
    pub rnr_naks_received: u64,
    pub seq_naks_received: u64,
}

/// Declares the function table: each entry is `name: fn type = "version node"`.
macro_rules! verbs_table {
    (
        required { $( $name:ident : fn($($arg:ty),*) -> $ret:ty = $ver:literal; )* }
        optional { $( $oname:ident : fn($($oarg:ty),*) -> $oret:ty = $over:literal; )* }
    ) => {
        /// Every libibverbs function the plugin calls, resolved once.
        pub struct Verbs {
            /// Where the library came from, for log lines.
            pub path: String,
            handle: *mut c_void,
            $( pub $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
            $( pub $oname: Option<unsafe extern "C" fn($($oarg),*) -> $oret>, )*
        }

        impl Verbs {
            fn resolve(handle: *mut c_void, path: String) -> Result<Verbs> {
                Ok(Verbs {
                    $( $name: {
                        let p = lookup(handle, stringify!($name), $ver).ok_or_else(|| Error::system(format!(
                            "{path} has no {}@{}: is it libibverbs from rdma-core? (set NCCL_IBVERBS_LIB to the right library)",
                            stringify!($name), $ver)))?;
                        // SAFETY: the symbol has this C signature in every rdma-core release
                        // that defines the version node we looked it up under.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                    }, )*
                    $( $oname: lookup(handle, stringify!($oname), $over).map(|p| {
                        // SAFETY: as above; optional symbols are newer additions of known signature.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($oarg),*) -> $oret>(p) }
                    }), )*
                    handle,
                    path,
                })
            }
        }
    };
}

verbs_table! {
    required {
        ibv_get_device_list: fn(*mut c_int) -> *mut *mut sys::ibv_device = "IBVERBS_1.1";
        ibv_free_device_list: fn(*mut *mut sys::ibv_device) -> () = "IBVERBS_1.1";
        ibv_get_device_name: fn(*mut sys::ibv_device) -> *const c_char = "IBVERBS_1.1";
        ibv_open_device: fn(*mut sys::ibv_device) -> *mut sys::ibv_context = "IBVERBS_1.1";
        ibv_close_device: fn(*mut sys::ibv_context) -> c_int = "IBVERBS_1.1";
        ibv_query_device: fn(*mut sys::ibv_context, *mut sys::ibv_device_attr) -> c_int = "IBVERBS_1.1";
        ibv_query_port: fn(*mut sys::ibv_context, u8, *mut sys::_compat_ibv_port_attr) -> c_int = "IBVERBS_1.1";
        ibv_query_gid: fn(*mut sys::ibv_context, u8, c_int, *mut sys::ibv_gid) -> c_int = "IBVERBS_1.1";
        ibv_query_pkey: fn(*mut sys::ibv_context, u8, c_int, *mut u16) -> c_int = "IBVERBS_1.1";
        ibv_alloc_pd: fn(*mut sys::ibv_context) -> *mut sys::ibv_pd = "IBVERBS_1.1";
        ibv_dealloc_pd: fn(*mut sys::ibv_pd) -> c_int = "IBVERBS_1.1";
        ibv_reg_mr: fn(*mut sys::ibv_pd, *mut c_void, usize, c_int) -> *mut sys::ibv_mr = "IBVERBS_1.1";
        ibv_dereg_mr: fn(*mut sys::ibv_mr) -> c_int = "IBVERBS_1.1";
        ibv_create_cq: fn(*mut sys::ibv_context, c_int, *mut c_void, *mut sys::ibv_comp_channel, c_int) -> *mut sys::ibv_cq = "IBVERBS_1.1";
        ibv_destroy_cq: fn(*mut sys::ibv_cq) -> c_int = "IBVERBS_1.1";
        ibv_create_qp: fn(*mut sys::ibv_pd, *mut sys::ibv_qp_init_attr) -> *mut sys::ibv_qp = "IBVERBS_1.1";
        ibv_modify_qp: fn(*mut sys::ibv_qp, *mut sys::ibv_qp_attr, c_int) -> c_int = "IBVERBS_1.1";
        ibv_query_qp: fn(*mut sys::ibv_qp, *mut sys::ibv_qp_attr, c_int, *mut sys::ibv_qp_init_attr) -> c_int = "IBVERBS_1.1";
        ibv_destroy_qp: fn(*mut sys::ibv_qp) -> c_int = "IBVERBS_1.1";
        ibv_get_async_event: fn(*mut sys::ibv_context, *mut sys::ibv_async_event) -> c_int = "IBVERBS_1.1";
        ibv_ack_async_event: fn(*mut sys::ibv_async_event) -> () = "IBVERBS_1.1";
        ibv_wc_status_str: fn(c_int) -> *const c_char = "IBVERBS_1.1";
        ibv_event_type_str: fn(c_int) -> *const c_char = "IBVERBS_1.1";
    }
    optional {
        ibv_reg_mr_iova2: fn(*mut sys::ibv_pd, *mut c_void, usize, u64, u32) -> *mut sys::ibv_mr = "IBVERBS_1.8";
        ibv_reg_dmabuf_mr: fn(*mut sys::ibv_pd, u64, usize, u64, c_int, c_int) -> *mut sys::ibv_mr = "IBVERBS_1.12";
        _ibv_query_gid_ex: fn(*mut sys::ibv_context, u32, u32, *mut sys::ibv_gid_entry, u32, usize) -> c_int = "IBVERBS_1.11";
        ibv_query_ece: fn(*mut sys::ibv_qp, *mut sys::ibv_ece) -> c_int = "IBVERBS_1.10";
        ibv_set_ece: fn(*mut sys::ibv_qp, *mut sys::ibv_ece) -> c_int = "IBVERBS_1.10";
        // softroce's own: why ibv_get_device_list failed with EINVAL (docs/softroce-variables.md).
        softroce_config_error: fn() -> *const c_char = "SOFTROCE_2";
        // softroce's own: one QP's ACK timeouts, retransmissions and RNR NAKs (the hang report's
        // facts, docs/observability.md#hang-reports); a real NIC counts them per port only.
        softroce_qp_transport_get: fn(*mut sys::ibv_qp, *mut QpTransportRepr, usize) -> c_int = "SOFTROCE_3";
    }
}

// SAFETY: the table holds only function pointers and the dlopen handle, all immutable after
// load; libibverbs functions are thread-safe per rdma-core's documentation.
unsafe impl Send for Verbs {}
// SAFETY: see Send.
unsafe impl Sync for Verbs {}

fn lookup(handle: *mut c_void, name: &str, version: &str) -> Option<*mut c_void> {
    let cname = CString::new(name).ok()?;
    let cver = CString::new(version).ok()?;
    // SAFETY: handle is a live dlopen handle; both strings are NUL-terminated.
    let p = unsafe { libc::dlvsym(handle, cname.as_ptr(), cver.as_ptr()) };
    if !p.is_null() {
        return Some(p);
    }
    // An unversioned build (or a drop-in linked without symbol versions) still works.
    // SAFETY: as above.
    let p = unsafe { libc::dlsym(handle, cname.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libdl.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (checked above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl Verbs {
    /// Opens libibverbs and resolves the table. The error says what is missing and what to do.
    pub fn load(explicit: Option<&str>) -> Result<Verbs> {
        let candidates: Vec<&str> = match explicit {
            Some(p) => vec![p],
            // The runtime SONAME first: `libibverbs.so` is only the -dev package's link, and a
            // drop-in (softroce) on LD_LIBRARY_PATH provides the SONAME.
            None => vec!["libibverbs.so.1", "libibverbs.so"],
        };
        let mut tried = Vec::new();
        for name in candidates {
            let cname =
                CString::new(name).map_err(|_| Error::usage(format!("NCCL_IBVERBS_LIB={name:?} is not a path")))?;
            // SAFETY: cname is NUL-terminated; RTLD_NOW makes missing symbols fail here, not later.
            let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if handle.is_null() {
                tried.push(format!("{name}: {}", dlerror_text()));
                continue;
            }
            return match Verbs::resolve(handle, name.to_string()) {
                Ok(v) => Ok(v),
                Err(e) => {
                    // SAFETY: handle came from dlopen above and nothing from it is kept.
                    unsafe { libc::dlclose(handle) };
                    Err(e)
                }
            };
        }
        Err(Error::system(format!(
            "libibverbs not found ({}) — install rdma-core (Debian: apt-get install libibverbs1 ibverbs-providers), or set NCCL_IBVERBS_LIB; see docs/errors.md",
            tried.join("; ")
        )))
    }

    /// The text of an `ibv_wc_status`.
    pub fn wc_status_str(&self, status: u32) -> String {
        // SAFETY: ibv_wc_status_str accepts any value and returns a static string.
        let s = unsafe { (self.ibv_wc_status_str)(status as c_int) };
        if s.is_null() {
            format!("status {status}")
        } else {
            // SAFETY: non-NULL static NUL-terminated string.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        }
    }

    /// The text of an `ibv_event_type`.
    pub fn event_type_str(&self, event: u32) -> String {
        // SAFETY: accepts any value, returns a static string.
        let s = unsafe { (self.ibv_event_type_str)(event as c_int) };
        if s.is_null() {
            format!("event {event}")
        } else {
            // SAFETY: non-NULL static NUL-terminated string.
            unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
        }
    }
}

impl Drop for Verbs {
    fn drop(&mut self) {
        // SAFETY: every object created through this table is gone (they hold an Arc<Verbs>).
        unsafe { libc::dlclose(self.handle) };
    }
}

/// `ibv_post_send`, as the inline in `verbs.h`: through the context's ops table.
///
/// # Safety
/// `qp` is a live QP; every buffer named by `wr` stays registered and alive until its completion
/// is polled (or the QP is destroyed).
pub unsafe fn post_send(qp: *mut sys::ibv_qp, wr: *mut sys::ibv_send_wr, bad: *mut *mut sys::ibv_send_wr) -> c_int {
    // SAFETY: caller guarantees qp is live; a live QP's context is live.
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: provider function with the verbs.h signature.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv` through the ops table.
///
/// # Safety
/// As [`post_send`].
pub unsafe fn post_recv(qp: *mut sys::ibv_qp, wr: *mut sys::ibv_recv_wr, bad: *mut *mut sys::ibv_recv_wr) -> c_int {
    // SAFETY: caller guarantees qp is live.
    match unsafe { (*(*qp).context).ops.post_recv } {
        // SAFETY: provider function with the verbs.h signature.
        Some(f) => unsafe { f(qp, wr, bad) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_poll_cq` through the ops table; returns the number of completions or a negative value.
///
/// # Safety
/// `cq` is live and `wc` has room for `n` entries.
pub unsafe fn poll_cq(cq: *mut sys::ibv_cq, n: c_int, wc: *mut sys::ibv_wc) -> c_int {
    // SAFETY: caller guarantees cq is live.
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: provider function with the verbs.h signature.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

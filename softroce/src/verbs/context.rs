//! Device list, contexts, device queries and async events (port, GID and P_Key
//! queries: `port.rs`).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, OnceLock};

use rdma_sys::{
    ibv_async_event, ibv_context, ibv_device, ibv_device_attr, ibv_device_attr_ex, ibv_event_type,
    ibv_query_device_ex_input, verbs_context,
};

use super::ctx::Context;
use super::port::query_port_ex;
use super::{ffi_guard, int_err, minus_one, null_err, set_errno};
use crate::config;
use crate::driver::device::Device;
use crate::driver::event::AsyncQueue;
use crate::driver::instances;
use crate::driver::limits;

/// `__VERBS_ABI_IS_EXTENDED`.
const ABI_IS_EXTENDED: usize = usize::MAX;

/// The `struct ibv_device` we hand out, plus our index.
#[repr(C)]
pub struct IbvDevice {
    pub ibv: ibv_device,
    pub index: usize,
}

// SAFETY: the struct holds only plain data and two unused (None) fn pointers;
// it is written once before being published and never mutated afterwards.
unsafe impl Sync for IbvDevice {}
// SAFETY: as above.
unsafe impl Send for IbvDevice {}

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// The static device list (one allocation per device: the pointers handed
/// out stay valid for the life of the process).
#[allow(clippy::vec_box)]
pub fn device_list() -> &'static [Box<IbvDevice>] {
    static LIST: OnceLock<Vec<Box<IbvDevice>>> = OnceLock::new();
    LIST.get_or_init(|| {
        (0..config::num_devices())
            .map(|i| {
                // SAFETY: ibv_device is plain data (integers, char arrays, nullable
                // fn pointers) for which all-zero is a valid value.
                let mut ibv: ibv_device = unsafe { std::mem::zeroed() };
                ibv.node_type = rdma_sys::ibv_node_type::IBV_NODE_CA;
                ibv.transport_type = rdma_sys::ibv_transport_type::IBV_TRANSPORT_IB;
                let name = format!("softroce{i}");
                copy_cstr(&mut ibv.name, &name);
                copy_cstr(&mut ibv.dev_name, &format!("uverbs{i}"));
                copy_cstr(&mut ibv.dev_path, &format!("/sys/class/infiniband_verbs/uverbs{i}"));
                copy_cstr(&mut ibv.ibdev_path, &format!("/sys/class/infiniband/{name}"));
                Box::new(IbvDevice { ibv, index: i })
            })
            .collect()
    })
}

fn device_of(dev: *mut ibv_device) -> Option<&'static IbvDevice> {
    device_list()
        .iter()
        .find(|d| std::ptr::eq(&d.ibv, dev as *const ibv_device))
        .map(|d| &**d)
}

/// # Safety
/// `num_devices` must be NULL or valid for writing one `int`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    ffi_guard!(std::ptr::null_mut(), {
        // A variable that does not parse: its line is on stderr, and there is no device.
        if instances::check_config().is_err() {
            return null_err(libc::EINVAL);
        }
        let list = device_list();
        let n = list.len();
        // SAFETY: calloc of n+1 pointers; freed by ibv_free_device_list.
        let arr = unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ibv_device>()) } as *mut *mut ibv_device;
        if arr.is_null() {
            return null_err(libc::ENOMEM);
        }
        for (i, d) in list.iter().enumerate() {
            // SAFETY: arr has n+1 slots.
            unsafe { *arr.add(i) = &d.ibv as *const ibv_device as *mut ibv_device };
        }
        if !num_devices.is_null() {
            // SAFETY: caller passes a valid int pointer or NULL.
            unsafe { *num_devices = n as c_int };
        }
        arr
    })
}

/// `softroce_config_error`: NULL when every softroce variable parses, else the line softroce
/// printed for the first that does not (`config::BadValue::line`), NUL-terminated and valid for
/// the life of the process. softroce's own export (`SOFTROCE_1`), absent from a real
/// libibverbs: an application (the ferroce plugin) looks it up with `dlsym` after
/// `ibv_get_device_list` failed with EINVAL, to give the reason in its own log.
#[no_mangle]
pub extern "C" fn softroce_config_error() -> *const c_char {
    ffi_guard!(std::ptr::null(), {
        static LINE: OnceLock<Option<std::ffi::CString>> = OnceLock::new();
        LINE.get_or_init(|| {
            let bad = instances::check_config().err()?;
            // A NUL cannot be in an environment value; replace it anyway rather than fail.
            std::ffi::CString::new(bad.line().replace('\0', "\\0")).ok()
        })
        .as_ref()
        .map_or(std::ptr::null(), |l| l.as_ptr())
    })
}

/// # Safety
/// `list` must be NULL or a list returned by `ibv_get_device_list`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    ffi_guard!((), {
        // SAFETY: list came from ibv_get_device_list (calloc) or is NULL.
        unsafe { libc::free(list as *mut c_void) };
    })
}

/// # Safety
/// `dev` may be any value: it is only compared with the devices of our list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    ffi_guard!(std::ptr::null(), {
        match device_of(dev) {
            Some(d) => d.ibv.name.as_ptr(),
            None => null_err::<c_char>(libc::EINVAL) as *const c_char,
        }
    })
}

/// # Safety
/// `dev` may be any value: it is only compared with the devices of our list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    ffi_guard!(-1, {
        match device_of(dev) {
            Some(d) => d.index as c_int,
            None => minus_one(libc::EINVAL),
        }
    })
}

/// Node GUID of device `index` without binding its socket (big-endian value).
fn guid_of_index(index: usize) -> u64 {
    match instances::instance(index) {
        Ok(d) => d.guid.to_be(),
        Err(_) => 0,
    }
}

/// # Safety
/// `dev` may be any value: it is only compared with the devices of our list.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    ffi_guard!(0, {
        match device_of(dev) {
            Some(d) => guid_of_index(d.index),
            None => {
                set_errno(libc::EINVAL);
                0
            }
        }
    })
}

/// # Safety
/// `dev` may be any value: it is only compared with the devices of our list.
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    ffi_guard!(std::ptr::null_mut(), {
        let Some(d) = device_of(dev) else {
            return null_err(libc::ENODEV);
        };
        let (fd, file) = match super::cmdfile::cmd_file_new(d.index) {
            Ok(x) => x,
            Err(e) => return null_err(e),
        };
        match new_context(d.index, fd, file) {
            Ok(c) => c,
            Err(e) => {
                super::cmdfile::cmd_file_close(file, fd);
                null_err(e)
            }
        }
    })
}

/// A context on device `index` whose `cmd_fd` is `cmd_fd`, of command file `file`
/// (`ibv_open_device` and `ibv_import_device`). Err: the errno.
pub(crate) fn new_context(index: usize, cmd_fd: c_int, file: super::cmdfile::FileId) -> Result<*mut ibv_context, i32> {
    let d = device_list().get(index).ok_or(libc::ENODEV)?;
    let inst = match instances::instance(index) {
        Ok(i) => i,
        Err(e) => {
            eprintln!(
                "softroce: cannot bind {index} (port {}): {e}; set SOFTROCE_ADDR",
                crate::wire::ROCEV2_UDP_PORT
            );
            return Err(e.raw_os_error().unwrap_or(libc::EADDRNOTAVAIL));
        }
    };
    let async_q = match AsyncQueue::new() {
        Ok(q) => Arc::new(q),
        Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EMFILE)),
    };
    inst.watch_events(&async_q);
    // SAFETY: verbs_context is plain data (pointers, Option<fn>, ints,
    // an opaque pthread mutex) for which all-zero is valid (and is
    // PTHREAD_MUTEX_INITIALIZER on glibc).
    let mut vctx: verbs_context = unsafe { std::mem::zeroed() };
    vctx.sz = std::mem::size_of::<verbs_context>();
    vctx.query_port = Some(query_port_ex);
    vctx.query_device_ex = Some(query_device_ex);
    vctx.create_qp_ex = Some(super::qp_ex::create_qp_ex);
    vctx.create_cq_ex = Some(super::cq::create_cq_ex);
    let c = &mut vctx.context;
    c.device = &d.ibv as *const ibv_device as *mut ibv_device;
    c.cmd_fd = cmd_fd;
    c.async_fd = async_q.fd;
    c.num_comp_vectors = 1;
    c.abi_compat = ABI_IS_EXTENDED as *mut c_void;
    c.ops.poll_cq = Some(super::cq::poll_cq);
    c.ops.req_notify_cq = Some(super::cq::req_notify_cq);
    c.ops.post_send = Some(super::qp::post_send);
    c.ops.post_recv = Some(super::qp::post_recv);
    c.ops.post_srq_recv = Some(super::srq::post_srq_recv);
    let b = Box::new(Context {
        vctx,
        dev: inst,
        async_q,
        file,
    });
    let p = Box::into_raw(b);
    // SAFETY: p is a live, uniquely owned Context.
    Ok(unsafe { &mut (*p).vctx.context as *mut ibv_context })
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    ffi_guard!(-1, {
        if ctx.is_null() {
            return minus_one(libc::EINVAL);
        }
        let off = std::mem::offset_of!(verbs_context, context);
        // SAFETY: ctx came from ibv_open_device or ibv_import_device; the Box is freed exactly
        // once here.
        let c = unsafe { Box::from_raw((ctx as *mut u8).sub(off) as *mut Context) };
        super::cmdfile::cmd_file_close(c.file, c.vctx.context.cmd_fd);
        drop(c);
        0
    })
}

/// Fills the device attributes we advertise.
pub fn fill_device_attr(dev: &Device, a: &mut ibv_device_attr) {
    // SAFETY: ibv_device_attr is plain data.
    *a = unsafe { std::mem::zeroed() };
    let fw = b"softroce 0.1.0\0";
    for (d, s) in a.fw_ver.iter_mut().zip(fw.iter()) {
        *d = *s as c_char;
    }
    a.node_guid = dev.guid.to_be();
    a.sys_image_guid = dev.guid.to_be();
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 0xffff_f000;
    a.vendor_id = limits::VENDOR_ID;
    a.vendor_part_id = limits::VENDOR_PART_ID;
    a.hw_ver = 1;
    a.max_qp = limits::MAX_QP as c_int;
    a.max_qp_wr = limits::MAX_QP_WR as c_int;
    // RC_RNR_NAK_GEN (1<<12) | PORT_ACTIVE_EVENT (1<<14)
    a.device_cap_flags = (1 << 12) | (1 << 14);
    a.max_sge = limits::MAX_SGE as c_int;
    a.max_sge_rd = limits::MAX_SGE as c_int;
    a.max_cq = limits::MAX_QP as c_int;
    a.max_cqe = limits::MAX_CQE as c_int;
    a.max_mr = limits::MAX_MR as c_int;
    a.max_pd = limits::MAX_PD as c_int;
    a.max_qp_rd_atom = limits::MAX_QP_RD_ATOM.into();
    a.max_res_rd_atom = limits::MAX_RES_RD_ATOM as c_int;
    a.max_qp_init_rd_atom = limits::MAX_QP_RD_ATOM.into();
    a.atomic_cap = rdma_sys::ibv_atomic_cap::IBV_ATOMIC_HCA;
    a.max_ah = 1 << 16;
    a.max_srq = limits::MAX_SRQ as c_int;
    a.max_srq_wr = limits::MAX_SRQ_WR as c_int;
    a.max_srq_sge = limits::MAX_SGE as c_int;
    a.max_pkeys = crate::config::pkeys().len() as u16;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `attr` must be NULL or valid for reads and writes of one `ibv_device_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: ctx is ours per the API contract.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return int_err(libc::EINVAL);
        };
        if attr.is_null() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: attr is a valid out-pointer per the API contract.
        fill_device_attr(&c.dev, unsafe { &mut *attr });
        0
    })
}

/// `verbs_context.query_device_ex`: fills `attr_size` bytes of `ibv_device_attr_ex`.
///
/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `input` must be NULL or valid for reading one `ibv_query_device_ex_input`.
/// `attr` must be NULL or valid for writing `attr_size` bytes.
unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi_guard!(libc::EIO, {
        // SAFETY: ctx is ours.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return int_err(libc::EINVAL);
        };
        if attr.is_null() || attr_size < std::mem::size_of::<ibv_device_attr>() {
            return int_err(libc::EINVAL);
        }
        // SAFETY: input is NULL or a valid pointer.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return int_err(libc::EINVAL);
        }
        // SAFETY: ibv_device_attr_ex is plain data.
        let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        fill_device_attr(&c.dev, &mut ex.orig_attr);
        ex.phys_port_cnt_ex = 1;
        // Completion timestamps are nanoseconds of a 64-bit clock.
        ex.completion_timestamp_mask = u64::MAX;
        ex.hca_core_clock = 1_000_000; // kHz
        let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer holds attr_size bytes; we copy at most that.
        unsafe {
            std::ptr::write_bytes(attr as *mut u8, 0, attr_size);
            std::ptr::copy_nonoverlapping(&ex as *const _ as *const u8, attr as *mut u8, n);
        }
        0
    })
}

/// # Safety
/// `ctx` must be NULL or a context returned by our `ibv_open_device` and not yet closed.
/// `event` must be NULL or valid for writing one `ibv_async_event`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(ctx: *mut ibv_context, event: *mut ibv_async_event) -> c_int {
    ffi_guard!(-1, {
        // SAFETY: ctx is ours.
        let Some(c) = (unsafe { Context::from_ibv(ctx) }) else {
            return minus_one(libc::EINVAL);
        };
        if event.is_null() {
            return minus_one(libc::EINVAL);
        }
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 (blocks unless O_NONBLOCK was set by the app).
        let r = unsafe { libc::read(c.async_q.fd, &mut v as *mut u64 as *mut c_void, 8) };
        if r != 8 {
            return -1;
        }
        let Some((ty, elem)) = c.async_q.pop_counted(is_held_event) else {
            return minus_one(libc::EAGAIN);
        };
        // SAFETY: event is a valid out-pointer; the union member we write
        // matches the event type (pointer or port number).
        unsafe {
            (*event).event_type = ty;
            match ty {
                ibv_event_type::IBV_EVENT_PORT_ACTIVE
                | ibv_event_type::IBV_EVENT_PORT_ERR
                | ibv_event_type::IBV_EVENT_LID_CHANGE
                | ibv_event_type::IBV_EVENT_PKEY_CHANGE
                | ibv_event_type::IBV_EVENT_SM_CHANGE
                | ibv_event_type::IBV_EVENT_CLIENT_REREGISTER
                | ibv_event_type::IBV_EVENT_GID_CHANGE => (*event).element.port_num = elem as c_int,
                ibv_event_type::IBV_EVENT_DEVICE_FATAL => (*event).element.port_num = 0,
                _ => (*event).element.qp = elem as *mut rdma_sys::ibv_qp,
            }
        }
        0
    })
}

/// QP and CQ events: the application holds the QP or CQ pointer until it acknowledges them,
/// and the element's destroy waits for that.
fn is_held_event(ty: ibv_event_type) -> bool {
    matches!(
        ty,
        ibv_event_type::IBV_EVENT_CQ_ERR
            | ibv_event_type::IBV_EVENT_QP_FATAL
            | ibv_event_type::IBV_EVENT_QP_REQ_ERR
            | ibv_event_type::IBV_EVENT_QP_ACCESS_ERR
            | ibv_event_type::IBV_EVENT_COMM_EST
            | ibv_event_type::IBV_EVENT_SQ_DRAINED
            | ibv_event_type::IBV_EVENT_PATH_MIG
            | ibv_event_type::IBV_EVENT_PATH_MIG_ERR
            | ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED
    )
}

/// # Safety
/// `event` must be NULL or an event filled by our `ibv_get_async_event`, whose element is still alive.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    ffi_guard!((), {
        if event.is_null() {
            return;
        }
        // SAFETY: event came from ibv_get_async_event.
        let ev = unsafe { &*event };
        match ev.event_type {
            ibv_event_type::IBV_EVENT_CQ_ERR => {
                // SAFETY: the element of a CQ event is our CQ.
                unsafe { super::cq::ack_async(ev.element.cq) }
            }
            ibv_event_type::IBV_EVENT_SRQ_ERR | ibv_event_type::IBV_EVENT_SRQ_LIMIT_REACHED => {
                // SAFETY: the element of an SRQ event is our SRQ.
                unsafe {
                    let srq = ev.element.srq;
                    if !srq.is_null() {
                        (*srq).events_completed += 1;
                    }
                }
            }
            ibv_event_type::IBV_EVENT_QP_FATAL
            | ibv_event_type::IBV_EVENT_QP_REQ_ERR
            | ibv_event_type::IBV_EVENT_QP_ACCESS_ERR
            | ibv_event_type::IBV_EVENT_COMM_EST
            | ibv_event_type::IBV_EVENT_SQ_DRAINED
            | ibv_event_type::IBV_EVENT_PATH_MIG
            | ibv_event_type::IBV_EVENT_PATH_MIG_ERR
            | ibv_event_type::IBV_EVENT_QP_LAST_WQE_REACHED => {
                // SAFETY: the element of a QP event is our QP.
                unsafe { super::qp::ack_async(ev.element.qp) }
            }
            _ => {}
        }
    })
}

/// # Safety
/// `dir` and `file` must be NULL or NUL-terminated strings; `buf` must be NULL or valid for writing `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    ffi_guard!(-1, {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return minus_one(libc::EINVAL);
        }
        // SAFETY: NUL-terminated strings from the caller.
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
        match std::fs::read(&path) {
            Ok(mut data) => {
                data.truncate(size - 1);
                if data.last() == Some(&b'\n') {
                    data.pop();
                }
                // SAFETY: buf holds size bytes; we write data.len()+1 <= size.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), buf as *mut u8, data.len());
                    *buf.add(data.len()) = 0;
                }
                data.len() as c_int
            }
            Err(e) => minus_one(e.raw_os_error().unwrap_or(libc::ENOENT)),
        }
    })
}

/// # Safety
/// No requirements: no argument is dereferenced.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    ffi_guard!(std::ptr::null(), { c"/sys".as_ptr() })
}

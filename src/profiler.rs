//! NCCL's profiler callback (docs/nccl-net-abi.md#profiler-events, net ABI v10+): per work
//! request, a Start event when it
//! is posted and a Stop event when its request is reported done, with NCCL's IB plugin id and
//! the IB event-descriptor layout (device, wr_id, opcode, QP number, length), so NCCL's
//! existing profiler plugins decode ferroce's events as IB ones.
//!
//! No callback (pre-v10 NCCL, or NULL): nothing is stored per request and the data path tests
//! one atomic load per posted group. A NULL `phandle` (bootstrap traffic) never gets a Start.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `ncclProfilerCallback_t` (nullable; NULL on Windows builds): event handle (written on
/// Start), operation, NCCL's phandle, plugin id, the plugin's event descriptor.
pub type NcclProfilerCallback =
    Option<unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> c_int>;

/// Operations of the callback.
pub const START: c_int = 0;
pub const STOP: c_int = 1;
/// NCCL's network plugin type IB (bits 16 and up) with event-descriptor version 1.
pub const IB_PLUGIN_ID: i64 = (1 << 16) | 1;
/// The descriptor's event type: a QP work request.
pub const EVENT_QP: u8 = 1;

/// The work request a QP event describes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpEvent {
    /// Local member device index of the QP.
    pub device: c_int,
    pub wr_id: u64,
    /// `ibv_wr_opcode` (sends) or `ibv_wc_opcode` (receives).
    pub opcode: c_int,
    pub qp_num: c_int,
    pub length: usize,
}

/// NCCL's IB event descriptor, version 1: a type byte and (in a union of one member) the QP
/// event, which starts at offset 8.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbEventDescr {
    pub event_type: u8,
    pub qp: QpEvent,
}

const _: () = assert!(std::mem::offset_of!(IbEventDescr, qp) == 8);
const _: () = assert!(std::mem::size_of::<IbEventDescr>() == 40);

static CALLBACK: AtomicUsize = AtomicUsize::new(0);

/// Store NCCL's callback (`init` of v10+); NULL turns profiling off.
pub fn set(cb: NcclProfilerCallback) {
    CALLBACK.store(cb.map_or(0, |f| f as usize), Ordering::Release);
}

/// The stored callback.
pub fn get() -> NcclProfilerCallback {
    let p = CALLBACK.load(Ordering::Acquire);
    if p == 0 {
        return None;
    }
    // SAFETY: a non-zero value was stored by `set` from a function pointer of this exact type.
    Some(unsafe {
        std::mem::transmute::<
            usize,
            unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> c_int,
        >(p)
    })
}

/// Whether a callback is set.
pub fn enabled() -> bool {
    CALLBACK.load(Ordering::Relaxed) != 0
}

/// A Start event for `qp` under NCCL's `phandle`; the event handle to stop later (None: no
/// callback, a NULL phandle, or the profiler gave no handle).
// `phandle` is NCCL's opaque handle: never dereferenced here, only handed back to NCCL.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn start(phandle: *mut c_void, qp: QpEvent) -> Option<*mut c_void> {
    let cb = get()?;
    if phandle.is_null() {
        return None;
    }
    let mut descr = IbEventDescr {
        event_type: EVENT_QP,
        qp,
    };
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: NCCL's callback with a writable handle slot, its own non-NULL phandle, and a
    // descriptor that lives for the call (NCCL copies what it keeps).
    unsafe {
        cb(
            &mut handle,
            START,
            phandle,
            IB_PLUGIN_ID,
            (&mut descr as *mut IbEventDescr).cast(),
        )
    };
    (!handle.is_null()).then_some(handle)
}

/// The Stop event of a handle `start` returned.
pub fn stop(handle: *mut c_void) {
    let Some(cb) = get() else { return };
    let mut h = handle;
    // SAFETY: NCCL's callback with the handle its Start gave; phandle and descriptor are not
    // read on Stop.
    unsafe { cb(&mut h, STOP, std::ptr::null_mut(), IB_PLUGIN_ID, std::ptr::null_mut()) };
}

/// The open events of one comm: (request index, event handle), reserved once, so profiling
/// does not allocate per message in the steady state.
#[derive(Default)]
pub struct OpenEvents {
    events: Vec<(u16, *mut c_void)>,
}

impl OpenEvents {
    pub fn new() -> OpenEvents {
        OpenEvents {
            events: Vec::with_capacity(256),
        }
    }

    /// Start an event of request `req` (no-op without callback or with a NULL phandle).
    pub fn start(&mut self, req: u16, phandle: *mut c_void, qp: QpEvent) {
        if let Some(h) = start(phandle, qp) {
            self.events.push((req, h));
        }
    }

    /// Stop every event of request `req` (it was reported done).
    pub fn stop_request(&mut self, req: u16) {
        self.events.retain(|&(r, h)| {
            if r == req {
                stop(h);
            }
            r != req
        });
    }

    /// Stop everything still open (the comm closes with requests in flight).
    pub fn stop_all(&mut self) {
        for (_, h) in self.events.drain(..) {
            stop(h);
        }
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_has_ncclls_ib_v1_layout() {
        assert_eq!(std::mem::offset_of!(QpEvent, device), 0);
        assert_eq!(std::mem::offset_of!(QpEvent, wr_id), 8);
        assert_eq!(std::mem::offset_of!(QpEvent, opcode), 16);
        assert_eq!(std::mem::offset_of!(QpEvent, qp_num), 20);
        assert_eq!(std::mem::offset_of!(QpEvent, length), 24);
        assert_eq!(IB_PLUGIN_ID >> 16, 1, "NCCL_PROFILER_NET_TYPE_IB");
        assert_eq!(IB_PLUGIN_ID & 0xffff, 1, "descriptor version 1");
    }
}

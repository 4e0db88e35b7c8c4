//! RAII verbs device context and protection domain, plus the queries discovery needs.
//!
//! Each object holds an `Arc` to its parent (PD → context → library), so a parent can never be
//! freed under a child. Drop errors are logged, never panicked on.

use super::{sys, Verbs};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::ffi::{c_int, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// `verbs_context.query_port`: the extended op with the caller's struct size.
type QueryPortFn = unsafe extern "C" fn(*mut sys::ibv_context, u8, *mut sys::ibv_port_attr, usize) -> c_int;

/// What discovery needs from `ibv_query_device`.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    /// `/sys/class/infiniband/<name>` as the library reports it.
    pub ibdev_path: String,
    pub sys_image_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub max_qp: i32,
    pub max_qp_wr: i32,
    pub max_cqe: i32,
    pub phys_port_cnt: u8,
}

/// What discovery needs from `ibv_query_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortInfo {
    pub state: u32,
    pub active_mtu: u32,
    /// Largest message one WR carries on this port.
    pub max_msg_sz: u32,
    pub gid_tbl_len: i32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    /// LID of the subnet manager that configured the port (0: none did; InfiniBand only).
    pub sm_lid: u16,
    pub active_width: u8,
    pub active_speed: u8,
    pub link_layer: u8,
}

/// Elements named by fatal affiliated async events — QP numbers (QP fatal, request and access
/// errors) or CQ addresses (CQ error) — so only the comm owning the element fails.
#[derive(Default)]
pub struct ElementFailures {
    /// Bumped after each recorded element; comms compare it with the value they started with.
    pub count: AtomicU32,
    /// (sequence number = `count` before the record, element), oldest first.
    elements: Mutex<std::collections::VecDeque<(u32, u64)>>,
}

impl ElementFailures {
    /// Keeps the newest this many elements; a comm checks on every test() and within its probe
    /// interval, long before that many other elements of one device could fail.
    const KEPT: usize = 4096;

    pub fn record(&self, element: u64) {
        let mut q = self.elements.lock();
        if q.len() == Self::KEPT {
            q.pop_front();
        }
        let seq = self.count.load(Ordering::Acquire);
        q.push_back((seq, element));
        self.count.store(seq.wrapping_add(1), Ordering::Release);
    }

    /// Whether a fatal event recorded since `count` was `since` (a comm's start) named any
    /// of `elements`. An older failure of a QP number (or CQ address) that a new comm reuses
    /// does not count.
    pub fn any_of_since(&self, since: u32, elements: impl IntoIterator<Item = u64>) -> bool {
        if self.count.load(Ordering::Acquire) == since {
            return false;
        }
        let q = self.elements.lock();
        let recent: Vec<u64> = q
            .iter()
            .filter(|(seq, _)| seq.wrapping_sub(since) < u32::MAX / 2)
            .map(|&(_, n)| n)
            .collect();
        elements.into_iter().any(|n| recent.contains(&n))
    }
}

/// Ports per device whose events are counted one by one (a NIC has 1 or 2).
pub(super) const MAX_PORTS: usize = 8;

/// What a non-fatal async event means, in words.
fn event_words(kind: sys::ibv_event_type, text: &str) -> String {
    use sys::ibv_event_type::*;
    match kind {
        IBV_EVENT_PORT_ACTIVE => format!("the port is up ('{text}'); new connections can use it"),
        IBV_EVENT_GID_CHANGE => format!("the GID table changed ('{text}'): an address was added to or removed from the interface; connections made before keep the GID they have; new connections and recoveries select the port's GID again"),
        IBV_EVENT_LID_CHANGE | IBV_EVENT_SM_CHANGE | IBV_EVENT_CLIENT_REREGISTER => format!("the subnet manager changed the port's addressing ('{text}')"),
        _ => format!("async event '{text}'"),
    }
}

/// An open device (`ibv_context`) with its async-event thread.
pub struct Context {
    pub verbs: Arc<Verbs>,
    raw: *mut sys::ibv_context,
    pub info: DeviceInfo,
    /// Device-level fatal async events seen (device fatal, SRQ error): every comm on the
    /// device fails once this moves.
    pub fatal_events: Arc<AtomicU32>,
    /// Per port (index = port number, up to [`MAX_PORTS`]): `IBV_EVENT_PORT_ERR`s seen. A comm
    /// fails when the count of the port it uses moves; the device's other ports go on.
    pub port_errors: Arc<[AtomicU32; MAX_PORTS + 1]>,
    /// Per port: `IBV_EVENT_PORT_ACTIVE`s seen. A fused comm that moved its QPs off a port
    /// moves them back (fails back) when this count of that port moves.
    pub port_actives: Arc<[AtomicU32; MAX_PORTS + 1]>,
    /// Per port: `IBV_EVENT_GID_CHANGE`s seen. The port's cached GID is resolved again when this
    /// count moves (`device::GidCache`).
    pub gid_changes: Arc<[AtomicU32; MAX_PORTS + 1]>,
    /// QP-level fatal events (QP fatal, request error, access error), attributed to QP numbers.
    pub qp_failures: Arc<ElementFailures>,
    /// `IBV_EVENT_CQ_ERR` (a CQ overran), attributed to the CQ's address.
    pub cq_failures: Arc<ElementFailures>,
    /// Bumped (Release) after any of the five above moved: the data path loads only this on
    /// every test() and looks closer when it changed.
    pub fatal_generation: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    events_thread: Mutex<Option<JoinHandle<()>>>,
}

// SAFETY: ibv_context is thread-safe per rdma-core; the raw pointer is owned by this object.
unsafe impl Send for Context {}
// SAFETY: see Send.
unsafe impl Sync for Context {}

struct SendPtr(*mut sys::ibv_context);
// SAFETY: the context outlives the event thread (Drop joins it before closing the device).
unsafe impl Send for SendPtr {}

impl Context {
    /// Opens `device` (from `ibv_get_device_list`) and queries it.
    ///
    /// # Safety
    /// `device` is an entry of a device list from `verbs` that has not been freed yet.
    pub unsafe fn open(verbs: Arc<Verbs>, device: *mut sys::ibv_device) -> Result<Arc<Context>> {
        // SAFETY: caller guarantees `device` is a live list entry.
        let name = unsafe { CStr::from_ptr((verbs.ibv_get_device_name)(device)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ibdev_path is a NUL-terminated array inside the live ibv_device.
        let ibdev_path = unsafe { CStr::from_ptr((*device).ibdev_path.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: as above.
        let raw = unsafe { (verbs.ibv_open_device)(device) };
        if raw.is_null() {
            return Err(Error::last_os(&format!("ibv_open_device({name})")));
        }
        // SAFETY: zeroed ibv_device_attr is a valid out-buffer (plain integers and arrays).
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: raw is the live context just opened; attr is a valid out-pointer.
        let rc = unsafe { (verbs.ibv_query_device)(raw, &mut attr) };
        if rc != 0 {
            // SAFETY: raw is live and owned here.
            unsafe { (verbs.ibv_close_device)(raw) };
            return Err(Error::system(format!(
                "ibv_query_device({name}) failed: {}",
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        let info = DeviceInfo {
            name,
            ibdev_path,
            sys_image_guid: u64::from_be(attr.sys_image_guid),
            vendor_id: attr.vendor_id,
            vendor_part_id: attr.vendor_part_id,
            max_qp: attr.max_qp,
            max_qp_wr: attr.max_qp_wr,
            max_cqe: attr.max_cqe,
            phys_port_cnt: attr.phys_port_cnt,
        };
        let ctx = Arc::new(Context {
            verbs,
            raw,
            info,
            fatal_events: Arc::new(AtomicU32::new(0)),
            port_errors: Arc::new(std::array::from_fn(|_| AtomicU32::new(0))),
            port_actives: Arc::new(std::array::from_fn(|_| AtomicU32::new(0))),
            gid_changes: Arc::new(std::array::from_fn(|_| AtomicU32::new(0))),
            qp_failures: Arc::new(ElementFailures::default()),
            cq_failures: Arc::new(ElementFailures::default()),
            fatal_generation: Arc::new(AtomicU32::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
            events_thread: Mutex::new(None),
        });
        ctx.start_event_thread();
        Ok(ctx)
    }

    /// The raw context, for creating children.
    pub fn as_ptr(&self) -> *mut sys::ibv_context {
        self.raw
    }

    /// `ibv_query_port` as the `verbs.h` inline does it: the extended op when the provider has
    /// one (it knows the full struct size), else the exported compat function.
    pub fn query_port(&self, port: u8) -> Result<PortInfo> {
        // SAFETY: zeroed ibv_port_attr is a valid out-buffer.
        let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        let rc = match self.extended_query_port() {
            // SAFETY: live context; attr is a valid out-buffer of the size we pass.
            Some(f) => unsafe { f(self.raw, port, &mut attr, std::mem::size_of::<sys::ibv_port_attr>()) },
            // SAFETY: the compat struct is a prefix of ibv_port_attr, so the buffer is big enough.
            None => unsafe {
                (self.verbs.ibv_query_port)(self.raw, port, (&mut attr as *mut sys::ibv_port_attr).cast())
            },
        };
        if rc != 0 {
            return Err(Error::system(format!(
                "ibv_query_port({}, port {port}) failed: {}",
                self.info.name,
                std::io::Error::from_raw_os_error(rc.abs())
            )));
        }
        Ok(PortInfo {
            state: attr.state,
            active_mtu: attr.active_mtu,
            max_msg_sz: attr.max_msg_sz,
            gid_tbl_len: attr.gid_tbl_len,
            pkey_tbl_len: attr.pkey_tbl_len,
            lid: attr.lid,
            sm_lid: attr.sm_lid,
            active_width: attr.active_width,
            active_speed: attr.active_speed,
            link_layer: attr.link_layer,
        })
    }

    fn extended_query_port(&self) -> Option<QueryPortFn> {
        // SAFETY: raw is live. `abi_compat == UINTPTR_MAX` marks an ibv_context embedded at the
        // end of a verbs_context (verbs.h `verbs_get_ctx`); only then is the container read,
        // and `sz` says how much of it the provider filled (verbs_get_ctx_op).
        unsafe {
            if (*self.raw).abi_compat as usize != usize::MAX {
                return None;
            }
            let offset = std::mem::offset_of!(sys::verbs_context, context);
            let vctx = (self.raw as *mut u8).sub(offset) as *const sys::verbs_context;
            let needed =
                std::mem::size_of::<sys::verbs_context>() - std::mem::offset_of!(sys::verbs_context, query_port);
            if (*vctx).sz < needed {
                return None;
            }
            (*vctx).query_port
        }
    }

    /// P_Key `index` of `port` (host order; bit 15 set: full member).
    pub fn query_pkey(&self, port: u8, index: u16) -> Result<u16> {
        let mut pkey: u16 = 0;
        // SAFETY: live context, valid out-pointer.
        let rc = unsafe { (self.verbs.ibv_query_pkey)(self.raw, port, c_int::from(index), &mut pkey) };
        if rc != 0 {
            return Err(Error::last_os(&format!(
                "ibv_query_pkey({}, port {port}, index {index})",
                self.info.name
            )));
        }
        Ok(u16::from_be(pkey))
    }

    /// GID `index` of `port`.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<[u8; 16]> {
        // SAFETY: zeroed ibv_gid (a byte union) is valid.
        let mut gid: sys::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: live context, valid out-pointer.
        let rc = unsafe { (self.verbs.ibv_query_gid)(self.raw, port, index, &mut gid) };
        if rc != 0 {
            return Err(Error::system(format!(
                "ibv_query_gid({}, port {port}, index {index}) failed",
                self.info.name
            )));
        }
        // SAFETY: every bit pattern is a valid [u8; 16].
        Ok(unsafe { gid.raw })
    }

    /// The RoCE version of GID `index` (1 or 2), `Ok(None)` when unknown
    /// (docs/nccl-net-abi.md#gid-selection).
    /// Asks the library (`ibv_query_gid_ex`) first, then sysfs as NCCL does.
    pub fn gid_roce_version(&self, port: u8, index: i32) -> Result<Option<u8>> {
        if let Some(query) = self.verbs._ibv_query_gid_ex {
            // SAFETY: zeroed ibv_gid_entry is valid.
            let mut entry: sys::ibv_gid_entry = unsafe { std::mem::zeroed() };
            // SAFETY: live context; entry is a valid out-buffer of the size passed.
            let rc = unsafe {
                query(
                    self.raw,
                    u32::from(port),
                    index as u32,
                    &mut entry,
                    0,
                    std::mem::size_of::<sys::ibv_gid_entry>(),
                )
            };
            if rc == libc::ENODATA || rc == -libc::ENODATA {
                // An empty entry of a sparse table: it has no type (its sysfs file may be
                // missing or unreadable, as in a container).
                return Ok(None);
            }
            if rc == 0 {
                // IBV_GID_TYPE_IB = 0, ROCE_V1 = 1, ROCE_V2 = 2.
                return Ok(match entry.gid_type {
                    0 | 1 => Some(1),
                    2 => Some(2),
                    _ => None,
                });
            }
        }
        let path = format!("{}/ports/{port}/gid_attrs/types/{index}", self.info.ibdev_path);
        read_roce_type(std::fs::read_to_string(&path)).map_err(|e| {
            Error::system(format!(
                "cannot read the RoCE type of GID {index} of {} port {port}: {path}: {e}",
                self.info.name
            ))
        })
    }

    fn start_event_thread(self: &Arc<Self>) {
        // SAFETY: raw is live; async_fd is the context's event fd.
        let fd = unsafe { (*self.raw).async_fd };
        // SAFETY: fd is the context's own async fd; making it non-blocking lets the thread
        // notice `stop` (poll with a timeout) instead of blocking in ibv_get_async_event.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let verbs = self.verbs.clone();
        let stop = self.stop.clone();
        let sink = EventSink {
            name: self.info.name.clone(),
            fatal: self.fatal_events.clone(),
            port_errors: self.port_errors.clone(),
            port_actives: self.port_actives.clone(),
            gid_changes: self.gid_changes.clone(),
            qp_failures: self.qp_failures.clone(),
            cq_failures: self.cq_failures.clone(),
            generation: self.fatal_generation.clone(),
        };
        let raw = SendPtr(self.raw);
        let spawned = std::thread::Builder::new()
            .name(format!("ferroce-ev-{}", sink.name))
            .spawn(move || {
                let raw = raw;
                while !stop.load(Ordering::Acquire) {
                    let mut pfd = libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    let n = unsafe { libc::poll(&mut pfd, 1, 100) };
                    if n <= 0 {
                        continue;
                    }
                    // SAFETY: zeroed ibv_async_event is a valid out-buffer.
                    let mut ev: sys::ibv_async_event = unsafe { std::mem::zeroed() };
                    // SAFETY: live context (Drop joins this thread before closing it).
                    if unsafe { (verbs.ibv_get_async_event)(raw.0, &mut ev) } != 0 {
                        continue;
                    }
                    // SAFETY: ev was just filled by ibv_get_async_event and is not acked yet.
                    let facts = unsafe { EventFacts::read(&ev) };
                    sink.record(&facts, &verbs.event_type_str(facts.kind as u32));
                    // Acked after the log line: ibv_destroy_qp waits for the acks of its QP's
                    // events, so the WARN about a QP comes before the close that destroys it returns.
                    // SAFETY: ev was filled by ibv_get_async_event and is acked exactly once.
                    unsafe { (verbs.ibv_ack_async_event)(&mut ev) };
                }
            });
        match spawned {
            Ok(handle) => *self.events_thread.lock() = Some(handle),
            Err(e) => crate::log_warn!("device {}: cannot start the async-event thread: {e}", self.info.name),
        }
    }
}

/// What an async event names: its kind and the QP number, port or CQ it is about.
#[derive(Clone, Copy)]
struct EventFacts {
    kind: sys::ibv_event_type,
    is_qp_event: bool,
    is_port_event: bool,
    qpn: u32,
    port: c_int,
    /// The CQ's address (only kept to tell CQs apart).
    cq: u64,
}

impl EventFacts {
    /// # Safety
    /// `ev` was filled by `ibv_get_async_event` and not yet acked (its element is alive).
    unsafe fn read(ev: &sys::ibv_async_event) -> EventFacts {
        use sys::ibv_event_type::*;
        let kind = ev.event_type;
        let is_qp_event = matches!(
            kind,
            IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR
        );
        let is_port_event = matches!(
            kind,
            IBV_EVENT_PORT_ERR
                | IBV_EVENT_PORT_ACTIVE
                | IBV_EVENT_GID_CHANGE
                | IBV_EVENT_LID_CHANGE
                | IBV_EVENT_PKEY_CHANGE
                | IBV_EVENT_SM_CHANGE
                | IBV_EVENT_CLIENT_REREGISTER
        );
        // SAFETY: for QP events the element is the QP, alive until the event is acked (the
        // caller's contract); for port events it is the port number; for a CQ error the CQ
        // (only its address is kept).
        let (qpn, port, cq) = unsafe {
            (
                if is_qp_event { (*ev.element.qp).qp_num } else { 0 },
                if is_port_event { ev.element.port_num } else { 0 },
                if kind == IBV_EVENT_CQ_ERR {
                    ev.element.cq as usize as u64
                } else {
                    0
                },
            )
        };
        EventFacts {
            kind,
            is_qp_event,
            is_port_event,
            qpn,
            port,
            cq,
        }
    }
}

/// Where the async-event thread records what it saw: the context's shared failure counters, and
/// one log line per event.
struct EventSink {
    name: String,
    fatal: Arc<AtomicU32>,
    port_errors: Arc<[AtomicU32; MAX_PORTS + 1]>,
    port_actives: Arc<[AtomicU32; MAX_PORTS + 1]>,
    gid_changes: Arc<[AtomicU32; MAX_PORTS + 1]>,
    qp_failures: Arc<ElementFailures>,
    cq_failures: Arc<ElementFailures>,
    generation: Arc<AtomicU32>,
}

impl EventSink {
    /// Counts the event (`text`: its name) against the QP, port or CQ it names and logs it.
    fn record(&self, facts: &EventFacts, text: &str) {
        use sys::ibv_event_type::*;
        let name = &self.name;
        let EventFacts {
            kind,
            is_qp_event,
            is_port_event,
            qpn,
            port,
            cq,
        } = *facts;
        let counts = match kind {
            IBV_EVENT_PORT_ACTIVE => Some(&self.port_actives),
            IBV_EVENT_GID_CHANGE => Some(&self.gid_changes),
            _ => None,
        };
        if let Some(c) = counts.and_then(|c| usize::try_from(port).ok().and_then(|p| c.get(p))) {
            c.fetch_add(1, Ordering::AcqRel);
        }
        if is_qp_event {
            self.qp_failures.record(u64::from(qpn));
            let hint = if kind == IBV_EVENT_QP_ACCESS_ERR {
                " (an access error: the peer wrote into memory of ours that is not registered, e.g. a buffer deregistered while a receive into it was in flight, as when a comm is aborted)"
            } else {
                ""
            };
            crate::log_warn!("device {name}: fatal async event '{text}' on QP {qpn:#x}{hint} — the connection using it fails; the WARN of that connection says why, if it is used again");
        } else if kind == IBV_EVENT_PORT_ERR {
            if let Some(c) = usize::try_from(port).ok().and_then(|p| self.port_errors.get(p)) {
                c.fetch_add(1, Ordering::AcqRel);
            }
            crate::log_warn!("device {name} port {port}: the port went down ('{text}'): its link is down or the switch port is disabled. Connections over this port recover over new QPs: a fused device's on its members whose ports are up, at once (and back here when the port is up), others when it comes back within FERROCE_RECOVERY_TIMEOUT_SEC, else they fail; the device's other ports go on. Check `ibv_devinfo`, the cable and the switch port");
        } else if kind == IBV_EVENT_CQ_ERR {
            self.cq_failures.record(cq);
            crate::log_warn!("device {name}: fatal async event '{text}': a completion queue overran (more completions than its size were left unpolled), so completions may be lost — the connection using that CQ fails; the others go on. If it repeats, report it: ferroce sizes each CQ for every work request it can have in flight");
        } else if matches!(kind, IBV_EVENT_DEVICE_FATAL | IBV_EVENT_SRQ_ERR) {
            self.fatal.fetch_add(1, Ordering::AcqRel);
            crate::log_warn!("device {name}: fatal async event '{text}' — the NIC failed; every connection on it fails. Check the device (ibv_devinfo) and `dmesg`");
        } else {
            crate::log_info!(
                crate::log::subsys::NET,
                "device {name}{}: {}",
                if is_port_event {
                    format!(" port {port}")
                } else {
                    String::new()
                },
                event_words(kind, text)
            );
        }
        if is_qp_event
            || matches!(
                kind,
                IBV_EVENT_PORT_ERR
                    | IBV_EVENT_PORT_ACTIVE
                    | IBV_EVENT_CQ_ERR
                    | IBV_EVENT_DEVICE_FATAL
                    | IBV_EVENT_SRQ_ERR
            )
        {
            // The comms' data paths look at their devices' failures when this moves.
            self.generation.fetch_add(1, Ordering::Release);
        }
    }
}

impl Context {
    /// Stops and joins the async-event thread (idempotent).
    pub fn stop_events(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(handle) = self.events_thread.lock().take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        self.stop_events();
        // SAFETY: every child holds an Arc to this context, so none is alive; raw is owned.
        let rc = unsafe { (self.verbs.ibv_close_device)(self.raw) };
        if rc != 0 {
            crate::log_warn!(
                "ibv_close_device({}) failed: {}",
                self.info.name,
                std::io::Error::from_raw_os_error(rc.abs())
            );
        }
    }
}

/// A protection domain, shared by every connection on one device.
pub struct ProtectionDomain {
    pub context: Arc<Context>,
    raw: *mut sys::ibv_pd,
}

// SAFETY: ibv_pd is thread-safe per rdma-core; owned pointer.
unsafe impl Send for ProtectionDomain {}
// SAFETY: see Send.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    pub fn new(context: Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: live context.
        let raw = unsafe { (context.verbs.ibv_alloc_pd)(context.as_ptr()) };
        if raw.is_null() {
            return Err(Error::last_os(&format!("ibv_alloc_pd({})", context.info.name)));
        }
        Ok(Arc::new(ProtectionDomain { context, raw }))
    }

    pub fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.raw
    }

    /// Whether `ibv_reg_dmabuf_mr` is supported (docs/nccl-net-abi.md#gpudirect-detection): a
    /// registration with fd -1 must fail,
    /// and only EOPNOTSUPP/EPROTONOSUPPORT mean "no support".
    pub fn probe_dmabuf(&self) -> bool {
        let Some(reg) = self.context.verbs.ibv_reg_dmabuf_mr else {
            return false;
        };
        // SAFETY: a deliberately invalid registration (fd -1, length 0) on a live PD.
        let mr = unsafe { reg(self.raw, 0, 0, 0, -1, 0) };
        if !mr.is_null() {
            // SAFETY: mr was just returned by the library and is freed once.
            unsafe { (self.context.verbs.ibv_dereg_mr)(mr) };
            return true;
        }
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        !matches!(errno, libc::EOPNOTSUPP | libc::EPROTONOSUPPORT)
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR/QP holds an Arc to this PD, so none is alive; raw is owned.
        let rc = unsafe { (self.context.verbs.ibv_dealloc_pd)(self.raw) };
        if rc != 0 {
            crate::log_warn!(
                "ibv_dealloc_pd({}) failed: {}",
                self.context.info.name,
                std::io::Error::from_raw_os_error(rc.abs())
            );
        }
    }
}

/// `c_int` result helper shared by the verbs wrappers: 0 → Ok, else the errno as a system error.
pub fn check_rc(rc: c_int, what: impl FnOnce() -> String) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::system(format!(
            "{} failed: {}",
            what(),
            std::io::Error::from_raw_os_error(rc.abs())
        )))
    }
}

/// Parses a sysfs `gid_attrs/types/<i>` read (docs/nccl-net-abi.md#gid-selection): `RoCE v2` → 2,
/// `IB/RoCE v1` or
/// `RoCE v1` → 1; EINVAL (an index not mapped into this container) → unknown; other errors fail.
pub(super) fn read_roce_type(read: std::io::Result<String>) -> std::io::Result<Option<u8>> {
    match read {
        Ok(text) => {
            let t = text.trim();
            Ok(if t.starts_with("RoCE v2") {
                Some(2)
            } else if t.starts_with("IB/RoCE v1") || t.starts_with("RoCE v1") {
                Some(1)
            } else {
                None
            })
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {

    /// Regression: a failed QP's number, reused by a comm made later, must not fail
    /// that comm when some other QP fails afterwards.
    #[test]
    fn issue_14_a_reused_qp_number_is_not_failed_by_an_older_event() {
        let f = ElementFailures::default();
        f.record(0x11);
        let base = f.count.load(Ordering::Acquire);
        assert!(!f.any_of_since(base, [0x11]), "the old failure predates the new comm");
        f.record(0x99);
        assert!(!f.any_of_since(base, [0x11]), "a later, unrelated failure");
        f.record(0x11);
        assert!(f.any_of_since(base, [0x11]), "its own QP failing now");
        assert!(f.any_of_since(0, [0x99]));
    }

    use super::*;

    #[test]
    fn roce_type_strings() {
        assert_eq!(read_roce_type(Ok("RoCE v2\n".into())).unwrap(), Some(2));
        assert_eq!(read_roce_type(Ok("IB/RoCE v1\n".into())).unwrap(), Some(1));
        assert_eq!(read_roce_type(Ok("RoCE v1".into())).unwrap(), Some(1));
        assert_eq!(read_roce_type(Ok("garbage".into())).unwrap(), None);
        assert_eq!(
            read_roce_type(Err(std::io::Error::from_raw_os_error(libc::EINVAL))).unwrap(),
            None
        );
        assert!(read_roce_type(Err(std::io::Error::from_raw_os_error(libc::EACCES))).is_err());
    }
}

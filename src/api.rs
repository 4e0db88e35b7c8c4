//! The one internal API behind every exported table version.
//!
//! The per-version shims in `abi` only adapt argument types and call these functions, which
//! check arguments, own the process-wide state and map nothing to C: errors stay [`Error`]s
//! until the shim's `ffi_call!` turns them into `ncclResult_t`.
//!
//! Lifetime: the process-wide [`Registry`] (libibverbs, devices, virtual devices) is created by
//! the first `init` and reference-counted by contexts; the last `finalize` drops it, which closes
//! the devices and joins their threads. Comms hold `Arc`s to their devices, so a comm NCCL never
//! closed (after an abort) keeps its device alive instead of dangling.

use crate::config;
use crate::device::{self, NetDevice, VirtualDevice};
use crate::error::{Error, Result};
use crate::ibv::Verbs;
use crate::log::{subsys, NcclLogger};
use crate::transport::{self, ListenComm, RecvComm, SendComm};
/// The transport's types the shims hand to NCCL as opaque pointers, and the memory kinds
/// `reg_mr` takes: the ABI layer reaches the transport only through this file.
pub use crate::transport::{MemHandle, MemKind, Request};
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::ffi::{c_char, CString};
use std::sync::Arc;

/// Per-communicator context (v11+ `init` writes one; older versions share [`LEGACY_CONTEXT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommContext {
    /// `ncclNetCommConfig.trafficClass`, -1 when unset.
    pub traffic_class: i32,
}

/// The context of v6–v10 callers, which have no per-communicator init.
pub const LEGACY_CONTEXT: CommContext = CommContext { traffic_class: -1 };

/// Most virtual devices (docs/nccl-net-abi.md#nic-fusion).
pub const MAX_VIRTUAL_DEVICES: usize = 256;
/// `maxRecvs` we report: grouped receives up to 8, as NCCL's IB transport.
pub use crate::transport::MAX_RECVS;
/// `maxP2pBytes` NCCL accepts at most (docs/nccl-net-abi.md#types-and-constants); a device reports
/// what its data path
/// carries, below this: as many pieces as one chain holds, each at most the port's `max_msg_sz`
/// (`transport::proto::split::max_buffer_bytes`).
pub const MAX_P2P_BYTES: usize = 1 << 40;
/// `maxCollBytes`, as NCCL's IB transport.
pub const MAX_COLL_BYTES: usize = 512 << 20;

/// Process-wide state shared by all contexts.
pub struct Registry {
    pub verbs: Arc<Verbs>,
    pub physical: Vec<Arc<NetDevice>>,
    pub virtual_devices: Mutex<Vec<Arc<VirtualDevice>>>,
    pub peer_memory: bool,
}

struct Global {
    registry: Option<Arc<Registry>>,
    contexts: usize,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    registry: None,
    contexts: 0,
});

fn registry() -> Result<Arc<Registry>> {
    GLOBAL
        .lock()
        .registry
        .clone()
        .ok_or_else(|| Error::internal("the plugin is not initialized (init was not called or failed)"))
}

/// `init`: stores the logger, discovers devices on first use, and counts one more context.
/// Fails (one WARN, via the caller) when libibverbs or a usable device is missing, because
/// NCCL requires `devices()` never to report 0.
///
/// `once_per_load`: the caller is a v6–v10 table, whose `init` NCCL calls once per load of the
/// library. If the library stayed mapped across an unload (glibc may keep it), the previous
/// load's fused devices are dropped so the new load numbers devices from scratch.
pub fn init(logger: NcclLogger, traffic_class: i32, once_per_load: bool) -> Result<Box<CommContext>> {
    crate::log::set_logger(logger);
    let cfg = config::get();
    let mut g = GLOBAL.lock();
    if g.registry.is_none() {
        let verbs = Arc::new(Verbs::load(cfg.ibverbs_lib.as_deref())?);
        let found = device::discover(&verbs, cfg)?;
        for d in &found.devices {
            log_info!(
                subsys::INIT | subsys::NET,
                "device {} {} port {} {:?} GID[{}] {} P_Key[{}] {:#06x} speed {} Mbps MTU {} pci {} dmabuf {}",
                d.index,
                d.name,
                d.port,
                d.link_layer,
                d.gid_index,
                device::format_gid(&d.gid),
                d.pkey_index,
                d.pkey,
                d.speed_mbps,
                device::mtu_bytes(d.active_mtu),
                d.pci_path.as_deref().unwrap_or("(none)"),
                d.dmabuf
            );
        }
        let ib_ports: Vec<String> = found
            .devices
            .iter()
            .filter(|d| d.link_layer == device::LinkLayer::InfiniBand)
            .map(|d| d.label())
            .collect();
        if let Some(line) = device::ib_gid_index_ignored(cfg.gid_index, &ib_ports) {
            log_info!(subsys::INIT | subsys::NET, "{line}");
        }
        let virtual_devices = found
            .devices
            .iter()
            .map(|d| Arc::new(VirtualDevice::single(d.clone())))
            .collect();
        log_info!(
            subsys::INIT | subsys::NET,
            "version {}: using {} device(s) through {}; GPUDirect peer memory {}",
            crate::VERSION,
            found.devices.len(),
            verbs.path,
            if found.peer_memory { "present" } else { "absent" }
        );
        g.registry = Some(Arc::new(Registry {
            verbs,
            physical: found.devices,
            virtual_devices: Mutex::new(virtual_devices),
            peer_memory: found.peer_memory,
        }));
    }
    if once_per_load {
        if let Some(reg) = &g.registry {
            reg.virtual_devices.lock().truncate(reg.physical.len());
        }
    }
    g.contexts += 1;
    Ok(Box::new(CommContext { traffic_class }))
}

/// `finalize` (v11+): the last context drops the registry, closing devices and joining threads.
pub fn finalize(ctx: Box<CommContext>) -> Result<()> {
    drop(ctx);
    let old = {
        let mut g = GLOBAL.lock();
        g.contexts = g.contexts.saturating_sub(1);
        if g.contexts == 0 {
            // A connect NCCL started and never resumed holds QPs and device references.
            transport::forget_pending_connects();
            g.registry.take()
        } else {
            None
        }
    };
    // Dropped outside the lock: closing devices joins threads.
    let last = old.is_some();
    drop(old);
    if last {
        crate::stats_file::finish();
    }
    Ok(())
}

/// Stops every thread the plugin started, for an unload without `finalize` (v6–v10 callers):
/// the library's code must not run after `dlclose`. Devices stay open (other threads may still
/// use them during process exit).
pub fn stop_threads_for_unload() {
    crate::stats_file::finish();
    let reg = GLOBAL.lock().registry.clone();
    if let Some(reg) = reg {
        for d in &reg.physical {
            d.context.stop_events();
        }
    }
}

/// `devices`: physical plus virtual devices.
pub fn devices() -> Result<i32> {
    Ok(registry()?.virtual_devices.lock().len() as i32)
}

fn virtual_device(dev: i32) -> Result<Arc<VirtualDevice>> {
    let reg = registry()?;
    let list = reg.virtual_devices.lock();
    usize::try_from(dev)
        .ok()
        .and_then(|i| list.get(i).cloned())
        .ok_or_else(|| {
            Error::internal(format!(
                "device {dev} does not exist (ferroce has {} devices)",
                list.len()
            ))
        })
}

/// What memory a device registers besides host memory (the shims turn it into `ptrSupport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySupport {
    /// CUDA memory through GPUDirect peer memory.
    pub cuda: bool,
    /// DMA-BUF file descriptors (every member device supports them).
    pub dmabuf: bool,
}

/// Properties in the newest layout; the shims copy what their version has. The device is
/// always a host-side network device (`NCCL_NET_DEVICE_HOST`, set by the shims).
#[derive(Debug, Clone)]
pub struct Properties {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    /// Memory registrations accept besides host memory.
    pub memory: MemorySupport,
    pub reg_is_global: i32,
    pub force_flush: i32,
    pub speed: i32,
    pub port: i32,
    pub latency: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub net_device_version: i32,
    pub vdevs: Vec<i32>,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: i32,
    pub rail_id: i16,
    pub plane_id: i16,
}

/// Returns a C string that stays valid for as long as the library is mapped (NCCL keeps the
/// `name` and `pciPath` pointers). Equal strings share one allocation, so repeated calls and
/// reloads do not grow the table.
fn interned(s: &str) -> *const c_char {
    static STRINGS: Mutex<Vec<CString>> = Mutex::new(Vec::new());
    let mut table = STRINGS.lock();
    if let Some(c) = table.iter().find(|c| c.to_bytes() == s.as_bytes()) {
        return c.as_ptr();
    }
    let c = CString::new(s.replace('\0', "")).unwrap_or_default();
    let p = c.as_ptr();
    table.push(c);
    p
}

/// `getProperties` (docs/nccl-net-abi.md#properties, #rules-ferroce-keeps): every field.
pub fn properties(dev: i32) -> Result<Properties> {
    let reg = registry()?;
    let vdev = virtual_device(dev)?;
    let first = &vdev.members[0];
    let memory = MemorySupport {
        cuda: reg.peer_memory,
        dmabuf: vdev.members.iter().all(|d| d.dmabuf),
    };
    let is_physical = vdev.members.len() == 1;
    Ok(Properties {
        name: interned(&vdev.name),
        // A device without a PCI function (softroce, a virtual NIC) reports NULL: NCCL then
        // attaches it to the CPU, as documented for virtual NICs.
        pci_path: first.pci_path.as_deref().map(interned).unwrap_or(std::ptr::null()),
        guid: first.guid,
        memory,
        reg_is_global: 1,
        force_flush: 0,
        speed: vdev.speed_mbps(),
        port: i32::from(first.port) + if is_physical { first.real_port } else { 0 },
        latency: 0.0,
        max_comms: vdev.members.iter().map(|d| d.max_qp).min().unwrap_or(0).max(1),
        max_recvs: MAX_RECVS as i32,
        net_device_version: 0,
        vdevs: vdev.members.iter().map(|d| d.index as i32).collect(),
        max_p2p_bytes: vdev
            .members
            .iter()
            .map(|d| transport::proto::split::max_buffer_bytes(d.max_msg_bytes))
            .min()
            .unwrap_or(0)
            .clamp(1, MAX_P2P_BYTES),
        max_coll_bytes: MAX_COLL_BYTES,
        max_multi_request_size: 1,
        rail_id: vdev.rail,
        plane_id: vdev.plane,
    })
}

/// `makeVDevice` (docs/nccl-net-abi.md#nic-fusion): fuses physical devices; returns the new device
/// index. An
/// identical group made before (e.g. by a previous load) returns the same index.
pub fn make_vdevice(members: &[i32], max_members: usize) -> Result<i32> {
    let reg = registry()?;
    if members.is_empty() || members.len() > max_members {
        return Err(Error::internal(format!(
            "makeVDevice with {} devices (1..={max_members} allowed)",
            members.len()
        )));
    }
    if members.len() > 1 && !config::get().merge_nics {
        return Err(Error::usage("NIC fusion is disabled by NCCL_IB_MERGE_NICS=0"));
    }
    let mut devs = Vec::with_capacity(members.len());
    for &m in members {
        let d = usize::try_from(m)
            .ok()
            .and_then(|i| reg.physical.get(i))
            .ok_or_else(|| {
                Error::internal(format!(
                    "makeVDevice: {m} is not a physical device (0..{})",
                    reg.physical.len()
                ))
            })?;
        if devs.iter().any(|x: &Arc<NetDevice>| Arc::ptr_eq(x, d)) {
            return Err(Error::internal(format!("makeVDevice: device {m} listed twice")));
        }
        devs.push(d.clone());
    }
    let mut list = reg.virtual_devices.lock();
    let same = |v: &Arc<VirtualDevice>| {
        v.members.len() == devs.len() && v.members.iter().zip(&devs).all(|(a, b)| Arc::ptr_eq(a, b))
    };
    if let Some(i) = list.iter().skip(reg.physical.len()).position(same) {
        return Ok((reg.physical.len() + i) as i32);
    }
    if list.len() >= MAX_VIRTUAL_DEVICES {
        return Err(Error::internal(format!(
            "makeVDevice: already {MAX_VIRTUAL_DEVICES} devices"
        )));
    }
    let fused = VirtualDevice::fused(devs)?;
    log_info!(
        subsys::INIT | subsys::NET,
        "fused device {} = {}",
        list.len(),
        fused.name
    );
    list.push(Arc::new(fused));
    Ok((list.len() - 1) as i32)
}

// ---------------------------------------------------------------------------------------------
// Connections and the data path

/// What NCCL holds as a send or receive comm: the transport object plus the device it lives on.
///
/// Registration (NCCL's service thread) uses only `device`; the data path (progress thread)
/// uses only `inner`; NCCL never runs a close concurrently with either. So `inner` is reached
/// through `UnsafeCell` by one thread at a time and no `&`/`&mut` pair ever aliases.
#[repr(C)]
pub struct CommHandle<T> {
    /// First field, at offset 0 for every `T` (`repr(C)`): see [`comm_device`].
    device: Arc<VirtualDevice>,
    inner: UnsafeCell<Box<T>>,
}

pub type SendHandle = CommHandle<SendComm>;
pub type RecvHandle = CommHandle<RecvComm>;

impl<T> CommHandle<T> {
    fn new(device: Arc<VirtualDevice>, inner: Box<T>) -> Box<Self> {
        Box::new(CommHandle {
            device,
            inner: UnsafeCell::new(inner),
        })
    }

    /// # Safety
    /// Only the thread that runs this comm's data path calls it, and not concurrently with a close.
    // The &self → &mut is the point of the UnsafeCell: exclusivity comes from NCCL's threading
    // contract (one progress thread per comm), stated in `# Safety`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn data_path(&self) -> &mut T {
        // SAFETY: per the contract above this is the only live reference to `inner`.
        unsafe { &mut *self.inner.get() }
    }
}

/// The device of a send or receive comm that NCCL passes as `void*` without saying which.
///
/// # Safety
/// `comm` is a live `SendHandle` or `RecvHandle` pointer (both are `repr(C)` with the device
/// first) and stays live while the returned reference is used.
pub unsafe fn comm_device<'a>(comm: *mut std::ffi::c_void) -> &'a Arc<VirtualDevice> {
    // SAFETY: per the contract, `comm` points at a CommHandle<T>, whose offset 0 is the Arc.
    unsafe { &*(comm as *const Arc<VirtualDevice>) }
}

/// Listen state as NCCL holds it.
pub struct ListenHandle {
    device: Arc<VirtualDevice>,
    inner: Box<ListenComm>,
}

pub fn listen(_ctx: &CommContext, dev: i32, handle: &mut [u8; 128]) -> Result<Box<ListenHandle>> {
    let device = virtual_device(dev)?;
    let inner = transport::listen(&device, handle)?;
    if config::get().subnet_aware_routing {
        transport::write_listen_gids(handle, &roce_gids(&device));
    }
    Ok(Box::new(ListenHandle { device, inner }))
}

/// The GIDs of a device's RoCE members (none for InfiniBand ones).
fn roce_gids(device: &VirtualDevice) -> Vec<[u8; 16]> {
    device
        .members
        .iter()
        .filter(|m| m.link_layer == device::LinkLayer::Ethernet)
        .map(|m| m.gid)
        .collect()
}

/// Subnet-aware routing (docs/nccl-net-abi.md#subnet-aware-routing): the device a connect to
/// the listener of `handle` uses — `dev`, or the device in the listener's subnet when `dev` is
/// not. Says so once per connection (on the first call, before the stage is recorded).
fn route_by_subnet(dev: i32, handle: &[u8; 128]) -> Result<Arc<VirtualDevice>> {
    let cfg = config::get();
    let asked = virtual_device(dev)?;
    if !cfg.subnet_aware_routing {
        return Ok(asked);
    }
    let remote = transport::read_listen_gids(handle);
    let all: Vec<Arc<VirtualDevice>> = registry()?.virtual_devices.lock().clone();
    let gids: Vec<Vec<[u8; 16]>> = all.iter().map(|d| roce_gids(d)).collect();
    let default = usize::try_from(dev).unwrap_or(0);
    let chosen = device::subnet::device_by_subnet(default, &gids, &remote, cfg.subnet_prefix_len);
    if chosen == default {
        return Ok(asked);
    }
    let to = all.get(chosen).cloned().unwrap_or(asked.clone());
    if transport::read_stage(handle).is_none() {
        log_info!(
            subsys::NET | subsys::INIT,
            "subnet-aware routing: connecting from device {chosen} ({}) instead of {dev} ({}), which is not in the subnet (/{}) of the listener's GID {}",
            to.name,
            asked.name,
            cfg.subnet_prefix_len,
            device::format_gid(&remote[0])
        );
    }
    Ok(to)
}

pub fn connect(ctx: &CommContext, dev: i32, handle: &mut [u8; 128]) -> Result<Option<Box<SendHandle>>> {
    let device = route_by_subnet(dev, handle)?;
    let comm = transport::connect(ctx.traffic_class, &device, handle)?;
    if comm.is_some() {
        crate::stats_file::comm_opened();
    }
    Ok(comm.map(|c| CommHandle::new(device, c)))
}

pub fn accept(listen: &mut ListenHandle) -> Result<Option<Box<RecvHandle>>> {
    let device = listen.device.clone();
    let comm = listen.inner.accept()?;
    if comm.is_some() {
        crate::stats_file::comm_opened();
    }
    Ok(comm.map(|c| CommHandle::new(device, c)))
}

/// Registration (docs/nccl-net-abi.md#memory-registration): host memory always; CUDA memory
/// through peer memory or DMA-BUF.
pub fn reg_mr(
    device: &Arc<VirtualDevice>,
    addr: usize,
    len: usize,
    kind: MemKind,
    dmabuf: Option<(i32, u64)>,
) -> Result<Box<MemHandle>> {
    if addr == 0 && len > 0 {
        return Err(Error::internal("regMr: NULL buffer"));
    }
    transport::reg_mr(device, addr, len, kind, dmabuf)
}

pub fn dereg_mr(mh: Box<MemHandle>) -> Result<()> {
    transport::dereg_mr(mh)
}

/// Keep NCCL's profiler callback (v10+ `init`; NULL: none).
pub fn set_profiler(cb: crate::profiler::NcclProfilerCallback) {
    crate::profiler::set(cb);
}

/// # Safety
/// As [`CommHandle::data_path`]; `mh` is a live handle from `reg_mr`.
pub unsafe fn isend(
    comm: &SendHandle,
    data: usize,
    size: usize,
    tag: i32,
    mh: &MemHandle,
) -> Result<Option<*mut Request>> {
    // SAFETY: forwarded contract.
    unsafe { isend_profiled(comm, data, size, tag, mh, std::ptr::null_mut()) }
}

/// [`isend`] with NCCL's profiler handle (NULL: no events for this send).
///
/// # Safety
/// As [`isend`]; `phandle` is NULL or NCCL's.
pub unsafe fn isend_profiled(
    comm: &SendHandle,
    data: usize,
    size: usize,
    tag: i32,
    mh: &MemHandle,
    phandle: *mut std::ffi::c_void,
) -> Result<Option<*mut Request>> {
    // SAFETY: forwarded contract.
    unsafe { comm.data_path() }.isend(data, size, tag, mh, phandle)
}

/// # Safety
/// As [`CommHandle::data_path`]; the handles are live.
pub unsafe fn irecv(
    comm: &RecvHandle,
    data: &[usize],
    sizes: &[usize],
    tags: &[i32],
    mhs: &[&MemHandle],
    optional_completion: bool,
) -> Result<Option<*mut Request>> {
    // SAFETY: forwarded contract.
    unsafe { irecv_profiled(comm, data, sizes, tags, mhs, optional_completion, &[]) }
}

/// [`irecv`] with NCCL's profiler handles, one per buffer (empty or NULL: no events).
///
/// # Safety
/// As [`irecv`]; each phandle is NULL or NCCL's.
pub unsafe fn irecv_profiled(
    comm: &RecvHandle,
    data: &[usize],
    sizes: &[usize],
    tags: &[i32],
    mhs: &[&MemHandle],
    optional_completion: bool,
    phandles: &[*mut std::ffi::c_void],
) -> Result<Option<*mut Request>> {
    if data.is_empty() || data.len() > MAX_RECVS {
        return Err(Error::internal(format!(
            "irecv with n={} (1..={MAX_RECVS} allowed)",
            data.len()
        )));
    }
    // SAFETY: forwarded contract.
    unsafe { comm.data_path() }.irecv(data, sizes, tags, mhs, optional_completion, phandles)
}

/// # Safety
/// As [`irecv`].
pub unsafe fn iflush(
    comm: &RecvHandle,
    data: &[usize],
    sizes: &[i32],
    mhs: &[&MemHandle],
) -> Result<Option<*mut Request>> {
    // SAFETY: forwarded contract.
    unsafe { comm.data_path() }.iflush(data, sizes, mhs)
}

/// # Safety
/// `req` came from isend/irecv/iflush and has not been reported done; `sizes` is NULL or has room
/// for the request's count.
pub unsafe fn test(req: *mut Request, sizes: *mut i32) -> Result<bool> {
    // SAFETY: forwarded contract.
    unsafe { transport::test(req, sizes) }
}

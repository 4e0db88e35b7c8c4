//! Device discovery, GID selection and the properties NCCL sees, as NCCL's IB transport does
//! them (docs/nccl-net-abi.md#device-discovery, #gpudirect-detection, #gid-selection).
//!
//! The decisions (which ports, which GID, what speed, which PCI path) are pure functions with
//! table-driven tests; [`discover`] only gathers their inputs from libibverbs and sysfs.

use crate::config::{AddrFamily, Config};
use crate::error::{Error, Result};
use crate::ibv::{Context, PortInfo, ProtectionDomain, Verbs};
use std::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// NCCL uses at most this many devices.
pub const MAX_DEVICES: usize = 32;
/// `IBV_PORT_DOWN`.
pub const PORT_DOWN: u32 = 1;
/// `IBV_PORT_INIT`: on InfiniBand, up but not configured by a subnet manager.
pub const PORT_INIT: u32 = 2;
/// `IBV_PORT_ACTIVE`.
pub const PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_INFINIBAND` / `_ETHERNET` (UNSPECIFIED = 0 is reported by old IB drivers).
pub const LINK_LAYER_UNSPECIFIED: u8 = 0;
pub const LINK_LAYER_INFINIBAND: u8 = 1;
pub const LINK_LAYER_ETHERNET: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    /// RoCE.
    Ethernet,
}

impl std::fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "RoCE",
        })
    }
}

/// The members of a fused device (label, link layer) share one link layer, or the one line
/// that says which two do not: NCCL's IB transport refuses such a device too.
pub fn fusable_link_layers(members: &[(String, LinkLayer)]) -> std::result::Result<(), String> {
    let Some((first, ll)) = members.first() else {
        return Ok(());
    };
    match members.iter().find(|(_, l)| l != ll) {
        None => Ok(()),
        Some((odd, l)) => Err(format!(
            "cannot fuse {first} ({ll}) with {odd} ({l}): the members of a fused device must share one link layer, InfiniBand or RoCE — fuse ports of one link layer (NCCL_IB_HCA selects them)"
        )),
    }
}

impl LinkLayer {
    pub fn from_port(link_layer: u8) -> Option<LinkLayer> {
        match link_layer {
            LINK_LAYER_INFINIBAND | LINK_LAYER_UNSPECIFIED => Some(LinkLayer::InfiniBand),
            LINK_LAYER_ETHERNET => Some(LinkLayer::Ethernet),
            _ => None,
        }
    }
}

/// One usable port: what NCCL calls a (physical) network device.
pub struct NetDevice {
    /// Index among physical devices, as NCCL numbers them.
    pub index: usize,
    /// The verbs device name, e.g. `mlx5_0` or `softroce0`.
    pub name: String,
    pub context: Arc<Context>,
    /// Shared by every connection on this device.
    pub pd: Arc<ProtectionDomain>,
    pub port: u8,
    pub link_layer: LinkLayer,
    pub gid_index: i32,
    pub gid: [u8; 16],
    pub lid: u16,
    /// The P_Key the QPs use and its index in the port's table, which their INIT names: from
    /// `NCCL_IB_PKEY_VALUE` when set, else `NCCL_IB_PKEY` ([`port_pkey`]).
    pub pkey: u16,
    pub pkey_index: u16,
    /// `ibv_mtu` enum value of the port's active MTU.
    pub active_mtu: u32,
    /// The port's `max_msg_sz`: the most bytes one WR carries (longer chunks go in pieces).
    pub max_msg_bytes: usize,
    pub speed_mbps: i32,
    /// Merged PCI path (function digit zeroed), `None` when the device has no PCI function.
    pub pci_path: Option<String>,
    /// `guid` of the properties: see [`nccl_guid`].
    pub guid: u64,
    pub max_qp: i32,
    /// Earlier devices sharing this PCI path; NCCL reports `port + real_port`.
    pub real_port: i32,
    pub rail: i16,
    pub plane: i16,
    pub dmabuf: bool,
    pub adaptive_routing: bool,
    /// The GID connections use now (`gid_index`/`gid` are the pick at discovery): selected
    /// again after a GID change ([`NetDevice::gid_now`]).
    pub gid_cache: GidCache,
}

impl NetDevice {
    pub fn verbs(&self) -> &Arc<Verbs> {
        &self.context.verbs
    }

    /// `name:port` as logs show it.
    pub fn label(&self) -> String {
        format!("{}:{}", self.name, self.port)
    }

    /// The GID index and GID a new connection or a recovery on this port uses: the port's
    /// cached pick, made again as at discovery once its GID table changed ([`GidCache`]). `Err`
    /// when the table now has no usable GID (the interface lost its address).
    pub fn gid_now(&self) -> Result<(i32, [u8; 16])> {
        let changes = gid_cache::changes(&self.context, self.port);
        self.gid_cache.get(changes, &self.label(), || {
            let info = self.context.query_port(self.port).map_err(|e| e.message)?;
            port_gid(&self.context, self.port, &info, self.link_layer, crate::config::get())
        })
    }
}

impl std::fmt::Debug for NetDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetDevice")
            .field("index", &self.index)
            .field("name", &self.name)
            .field("port", &self.port)
            .field("link_layer", &self.link_layer)
            .field("gid_index", &self.gid_index)
            .field("gid", &format_gid(&self.gid))
            .finish()
    }
}

/// What NCCL sees as a device: one physical device, or several fused by `makeVDevice`.
#[derive(Debug)]
pub struct VirtualDevice {
    pub name: String,
    pub members: Vec<Arc<NetDevice>>,
    pub rail: i16,
    pub plane: i16,
}

impl VirtualDevice {
    pub fn single(dev: Arc<NetDevice>) -> VirtualDevice {
        VirtualDevice {
            name: dev.name.clone(),
            rail: dev.rail,
            plane: dev.plane,
            members: vec![dev],
        }
    }

    /// Fuses `members` (docs/nccl-net-abi.md#nic-fusion): same link layer, joined name, common
    /// rail or -1.
    pub fn fused(members: Vec<Arc<NetDevice>>) -> Result<VirtualDevice> {
        let first = members
            .first()
            .ok_or_else(|| Error::internal("makeVDevice with no devices"))?;
        let layers: Vec<(String, LinkLayer)> = members.iter().map(|d| (d.label(), d.link_layer)).collect();
        fusable_link_layers(&layers).map_err(Error::usage)?;
        let name = members.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join("+");
        let rail = if members.iter().all(|d| d.rail == first.rail) {
            first.rail
        } else {
            -1
        };
        let plane = if members.iter().all(|d| d.plane == first.plane) {
            first.plane
        } else {
            -1
        };
        Ok(VirtualDevice {
            name,
            members,
            rail,
            plane,
        })
    }

    /// Striped, the members' speeds add up; active-standby, one member carries the traffic.
    pub fn speed_mbps(&self) -> i32 {
        let speeds = self.members.iter().map(|d| d.speed_mbps);
        if crate::config::get().active_standby_for(self.members.len()) {
            speeds.max().unwrap_or(0)
        } else {
            speeds.fold(0i32, i32::saturating_add)
        }
    }
}

/// Formats a GID as an IPv6 address (IPv4-mapped GIDs print as `::ffff:a.b.c.d`).
pub fn format_gid(gid: &[u8; 16]) -> String {
    Ipv6Addr::from(*gid).to_string()
}

// ---------------------------------------------------------------------------------------------
// Pure decisions

/// Whether a port becomes a device (docs/nccl-net-abi.md#device-discovery): ACTIVE, IB or Ethernet
/// link layer.
pub fn port_is_usable(port: &PortInfo) -> std::result::Result<LinkLayer, String> {
    if port.state != PORT_ACTIVE {
        let state = port_state_name(port.state);
        if port.state == PORT_INIT && LinkLayer::from_port(port.link_layer) == Some(LinkLayer::InfiniBand) {
            return Err(format!(
                "port state is {state} (not ACTIVE): no subnet manager has configured this InfiniBand port (LID {}) — check that opensm or the fabric's subnet manager runs (`sminfo`, `ibstat`)",
                port.lid
            ));
        }
        return Err(format!("port state is {state} (not ACTIVE)"));
    }
    LinkLayer::from_port(port.link_layer)
        .ok_or_else(|| format!("link layer {} is neither InfiniBand nor Ethernet", port.link_layer))
}

/// `IBV_PORT_*` state as `ibv_devinfo` names it.
pub fn port_state_name(state: u32) -> &'static str {
    match state {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

/// Port speed in Mbps from the lowest set bits of `active_speed` and `active_width` (docs/nccl-net-abi.md#device-discovery).
pub fn speed_mbps(active_speed: u8, active_width: u8) -> i32 {
    const PER_LANE: [i32; 9] = [2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000];
    const LANES: [i32; 5] = [1, 4, 8, 12, 2];
    let lane = PER_LANE[(active_speed.trailing_zeros() as usize).min(PER_LANE.len() - 1)];
    let width = LANES[(active_width.trailing_zeros() as usize).min(LANES.len() - 1)];
    if active_speed == 0 || active_width == 0 {
        return 10000;
    }
    lane * width
}

/// The PCI path NCCL should see: the function digit forced to 0 so the ports (and, with
/// `merge_vfs`, the VFs) of one adapter share a PCI node (docs/nccl-net-abi.md#properties). Input
/// is a realpath such as
/// `/sys/devices/pci0000:00/0000:00:02.0/0000:3b:00.1`.
pub fn merged_pci_path(realpath: &str, merge_vfs: bool) -> String {
    let mut path = realpath.as_bytes().to_vec();
    let n = path.len();
    // A BDF ends in "bb:dd.f": function digit at n-1, device digits at n-4, n-3.
    if n >= 4 && path[n - 2] == b'.' {
        path[n - 1] = b'0';
        if merge_vfs && n >= 5 && path[n - 5] == b':' {
            path[n - 4] = b'0';
            path[n - 3] = b'0';
        }
    }
    String::from_utf8(path).unwrap_or_else(|_| realpath.to_string())
}

/// The address a GID stands for: the IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`),
/// else the GID as an IPv6 address. The one test of the mapping in this crate (and in
/// `ferroce-doctor`, which uses this one).
pub fn gid_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// IPv4 for IPv4-mapped GIDs (unicast or multicast), else IPv6.
pub fn gid_family(gid: &[u8; 16]) -> AddrFamily {
    // ff0e::ffff:a.b.c.d is the multicast form of an IPv4-mapped GID.
    let mut unicast = *gid;
    if unicast[..2] == [0xff, 0x0e] {
        unicast[..2].copy_from_slice(&[0, 0]);
    }
    if gid_ip(&unicast).is_ipv4() {
        AddrFamily::Inet
    } else {
        AddrFamily::Inet6
    }
}

/// Neither all zero nor link-local (`fe80::/64`): a GID another subnet can route to.
pub fn gid_valid(gid: &[u8; 16]) -> bool {
    let zero = gid.iter().all(|&b| b == 0);
    let link_local = gid[0] == 0xfe && gid[1] == 0x80 && gid[2..8].iter().all(|&b| b == 0);
    !zero && !link_local
}

fn gid_in_range(gid: &[u8; 16], cfg: &Config) -> bool {
    match cfg.addr_range {
        None => true,
        Some(range) => match gid_family(gid) {
            AddrFamily::Inet => range.contains_v4(Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15])),
            AddrFamily::Inet6 => range.contains_v6(Ipv6Addr::from(*gid)),
        },
    }
}

/// Chooses the RoCE GID index (docs/nccl-net-abi.md#gid-selection): `NCCL_IB_GID_INDEX` when set,
/// else the first valid GID of the wanted family, inside the range, with the wanted RoCE version.
/// `gid(i)` and `roce_type(i)` read the table. The table may be sparse (a container sees only its
/// own netdev's entries): an unreadable GID counts as an empty (all-zero) entry, and the type of
/// an empty entry is unknown without being read, so holes anywhere, index 0 included, neither
/// stop the search nor fail the port.
pub fn select_roce_gid(
    table_len: i32,
    gid: &dyn Fn(i32) -> Option<[u8; 16]>,
    roce_type: &dyn Fn(i32) -> std::io::Result<Option<u8>>,
    cfg: &Config,
) -> std::result::Result<i32, String> {
    if cfg.gid_index >= 0 {
        if cfg.gid_index >= table_len {
            return Err(format!(
                "NCCL_IB_GID_INDEX={} is outside the GID table (length {table_len})",
                cfg.gid_index
            ));
        }
        return Ok(cfg.gid_index);
    }
    let want = cfg.addr_family;
    let entry = |i: i32| gid(i).unwrap_or([0; 16]);
    let type_of = |i: i32, g: &[u8; 16]| {
        if g.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        roce_type(i).map_err(|e| format!("reading the type of GID {i}: {e}"))
    };
    let mut cur = 0;
    for cand in 1..table_len {
        let (g_cur, g_cand) = (entry(cur), entry(cand));
        let fam_cand = gid_family(&g_cand);
        let in_range = gid_in_range(&g_cand, cfg);
        if fam_cand != gid_family(&g_cur) && fam_cand == want && in_range {
            // Rule A: the first entry of the wanted family.
            cur = cand;
        } else if fam_cand == want && gid_valid(&g_cand) && in_range {
            // Rule B: prefer the wanted RoCE version over an entry of another type or an invalid one.
            let t_cur = type_of(cur, &g_cur)?;
            let t_cand = type_of(cand, &g_cand)?;
            if (t_cur != t_cand || !gid_valid(&g_cur)) && t_cand == Some(cfg.roce_version as u8) {
                cur = cand;
            }
        }
    }
    Ok(cur)
}

/// The IB GID index (docs/nccl-net-abi.md#gid-selection): the routable-FLID index when its FLID is
/// non-zero, else 0.
pub fn select_ib_gid(table_len: i32, gid: &dyn Fn(i32) -> Option<[u8; 16]>, cfg: &Config) -> i32 {
    let idx = cfg.routable_flid_gid_index;
    if idx >= 0 && idx < table_len {
        if let Some(g) = gid(idx) {
            if g[4] != 0 || g[5] != 0 {
                return idx;
            }
        }
    }
    0
}

/// The INFO line saying that `NCCL_IB_GID_INDEX` (`gid_index`, -1 unset) does not apply to the
/// InfiniBand ports `ib_ports` (NCCL's IB transport reads it on RoCE only); `None` when it is
/// unset or no port is InfiniBand.
pub fn ib_gid_index_ignored(gid_index: i32, ib_ports: &[String]) -> Option<String> {
    (gid_index >= 0 && !ib_ports.is_empty()).then(|| {
        format!(
            "{}={gid_index} ignored on InfiniBand port(s) {}: their GID is {} when it carries a FLID, else GID 0",
            crate::config::var::gid_index,
            ib_ports.join(", "),
            crate::config::var::routable_flid_gid_index
        )
    })
}

/// How a QP on an InfiniBand port addresses its peer (docs/nccl-net-abi.md#qp-attributes), as
/// NCCL's IB transport does: within one subnet (the low 16 bits of the two GIDs' subnet
/// prefixes agree) by the peer's LID alone, no GRH; across subnets with a GRH to the peer's
/// GID and, as DLID, the FLID (bytes 4..6 of the peer's GID) that the router answers on, or
/// the peer's LID when its FLID is 0 (`flid_missing`: worth a WARN, it rarely routes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbRoute {
    pub global: bool,
    pub dlid: u16,
    pub flid_missing: bool,
}

pub fn ib_route(local_gid: &[u8; 16], remote_gid: &[u8; 16], remote_lid: u16) -> IbRoute {
    if local_gid[6..8] == remote_gid[6..8] {
        return IbRoute {
            global: false,
            dlid: remote_lid,
            flid_missing: false,
        };
    }
    let flid = u16::from_be_bytes([remote_gid[4], remote_gid[5]]);
    IbRoute {
        global: true,
        dlid: if flid == 0 { remote_lid } else { flid },
        flid_missing: flid == 0,
    }
}

// ---------------------------------------------------------------------------------------------
// Discovery

/// The devices of this process, found once per load of the plugin.
pub struct Discovery {
    pub devices: Vec<Arc<NetDevice>>,
    /// A peer-memory module (nvidia-peermem) is loaded: GPU pointers can be registered.
    pub peer_memory: bool,
}

/// Whether GPU memory can be registered through a peer-memory module
/// (docs/nccl-net-abi.md#gpudirect-detection).
pub fn peer_memory_present() -> bool {
    [
        "/sys/kernel/mm/memory_peers/nv_mem/version",
        "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
        "/sys/module/nvidia_peermem/version",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

/// The line softroce printed for a variable of its own that does not parse
/// (`softroce_config_error`, docs/softroce-variables.md); `None` when every one parses or the
/// library is not softroce.
pub fn provider_config_error(verbs: &Verbs) -> Option<String> {
    let f = verbs.softroce_config_error?;
    // SAFETY: softroce_config_error takes nothing and returns NULL or a NUL-terminated string
    // that lives as long as the process.
    let line = unsafe { f() };
    // SAFETY: non-NULL (checked) and NUL-terminated (above).
    (!line.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(line) }.to_string_lossy().into_owned())
}

/// Why `ibv_get_device_list` returned NULL with `err` (`ibv_get_device_list failed: …`). EINVAL
/// from softroce: one of its variables does not parse, and the line names it.
pub fn device_list_failed(verbs: &Verbs, err: &std::io::Error) -> String {
    if err.raw_os_error() == Some(libc::EINVAL) {
        return match provider_config_error(verbs) {
            Some(line) => format!("ibv_get_device_list failed: {err}: {line} — see docs/softroce-variables.md"),
            None => format!(
                "ibv_get_device_list failed: {err} — the verbs provider rejected its configuration (see its message on stderr)"
            ),
        };
    }
    format!("ibv_get_device_list failed: {err} — is an RDMA driver loaded (ibv_devices lists none)? see docs/errors.md")
}

/// Opens every device, keeps the usable ports, selects GIDs. Fails with one message that says
/// what was found and what to check when nothing is usable.
pub fn discover(verbs: &Arc<Verbs>, cfg: &Config) -> Result<Discovery> {
    let mut count: c_int = 0;
    // SAFETY: count is a valid out-pointer; the list is freed below.
    let list = unsafe { (verbs.ibv_get_device_list)(&mut count) };
    if list.is_null() {
        let err = std::io::Error::last_os_error();
        return Err(Error::system(format!(
            "no RDMA device: {}",
            device_list_failed(verbs, &err)
        )));
    }
    let mut skipped = Vec::new();
    let mut found = Vec::new();
    for i in 0..count.max(0) as usize {
        // SAFETY: the list has `count` entries.
        let dev = unsafe { *list.add(i) };
        // SAFETY: dev is a live entry of the list.
        match unsafe { Context::open(verbs.clone(), dev) } {
            Ok(ctx) => probe_ports(&ctx, cfg, &mut found, &mut skipped),
            Err(e) => skipped.push(e.to_string()),
        }
    }
    // SAFETY: list came from ibv_get_device_list; opened contexts do not need it.
    unsafe { (verbs.ibv_free_device_list)(list) };

    if found.is_empty() {
        let why = if count == 0 {
            "libibverbs found 0 devices — is an RDMA driver loaded (ibv_devices lists none)?".to_string()
        } else {
            format!("{count} device(s), none usable: {}", skipped.join("; "))
        };
        return Err(Error::system(format!("no RDMA device: {why} see docs/errors.md")));
    }
    if cfg.device_pci_order {
        // Every node must see the same order; devices without PCI sort last, by name.
        found.sort_by(|a, b| {
            (a.pci_path.is_none(), &a.pci_path, &a.name, a.port).cmp(&(
                b.pci_path.is_none(),
                &b.pci_path,
                &b.name,
                b.port,
            ))
        });
    }
    found.truncate(MAX_DEVICES);
    let mut devices = Vec::with_capacity(found.len());
    for (index, mut d) in found.into_iter().enumerate() {
        d.index = index;
        d.real_port = devices
            .iter()
            .filter(|e: &&Arc<NetDevice>| e.pci_path.is_some() && e.pci_path == d.pci_path)
            .count() as i32;
        devices.push(Arc::new(d));
    }
    Ok(Discovery {
        devices,
        peer_memory: peer_memory_present(),
    })
}

fn probe_ports(ctx: &Arc<Context>, cfg: &Config, found: &mut Vec<NetDevice>, skipped: &mut Vec<String>) {
    let name = ctx.info.name.clone();
    let pci_path = std::fs::canonicalize(format!("{}/device", ctx.info.ibdev_path))
        .ok()
        .map(|p| merged_pci_path(&p.to_string_lossy(), cfg.merge_vfs));
    let mut pd = None;
    for port in 1..=ctx.info.phys_port_cnt {
        let info = match ctx.query_port(port) {
            Ok(i) => i,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        let link_layer = match port_is_usable(&info) {
            Ok(l) => l,
            Err(why) => {
                skipped.push(format!("{name} port {port}: {why}"));
                continue;
            }
        };
        if !cfg.hca.accepts(&name, u32::from(port)) {
            skipped.push(format!("{name} port {port}: excluded by NCCL_IB_HCA"));
            continue;
        }
        let entry = cfg
            .hca
            .matching_entry(&name, u32::from(port))
            .filter(|_| !cfg.hca.exclude);
        let gid_changes = gid_cache::changes(ctx, port); // first: a racing change picks again
        let addr = match port_address(ctx, port, &info, link_layer, cfg) {
            Ok(g) => g,
            Err(why) => {
                skipped.push(format!("{name} port {port}: {why}"));
                continue;
            }
        };
        let pd = match shared_pd(ctx, &mut pd) {
            Ok(p) => p,
            Err(e) => {
                skipped.push(e.to_string());
                continue;
            }
        };
        let dmabuf = cfg.dmabuf_enable && pd.probe_dmabuf();
        let adaptive_routing = match cfg.adaptive_routing {
            -2 => link_layer == LinkLayer::InfiniBand,
            v => v != 0,
        };
        found.push(NetDevice {
            index: 0,
            name: name.clone(),
            context: ctx.clone(),
            pd,
            port,
            link_layer,
            gid_index: addr.gid_index,
            gid: addr.gid,
            gid_cache: GidCache::new(gid_changes, addr.gid_index, addr.gid),
            lid: info.lid,
            pkey: addr.pkey,
            pkey_index: addr.pkey_index,
            active_mtu: info.active_mtu,
            max_msg_bytes: info.max_msg_sz as usize,
            speed_mbps: speed_mbps(info.active_speed, info.active_width),
            pci_path: pci_path.clone(),
            guid: nccl_guid(ctx.info.sys_image_guid),
            max_qp: ctx.info.max_qp,
            real_port: 0,
            rail: entry.and_then(|e| e.rail).unwrap_or(-1),
            plane: entry.and_then(|e| e.plane).unwrap_or(-1),
            dmabuf,
            adaptive_routing,
        });
    }
}

/// The protection domain every port of one context shares: `pd`, made on first use.
fn shared_pd(ctx: &Arc<Context>, pd: &mut Option<Arc<ProtectionDomain>>) -> Result<Arc<ProtectionDomain>> {
    if let Some(pd) = pd {
        return Ok(Arc::clone(pd));
    }
    let made = ProtectionDomain::new(ctx.clone())?;
    *pd = Some(Arc::clone(&made));
    Ok(made)
}

/// The GID a port's connections use and its index: on InfiniBand as NCCL's IB transport picks
/// it, on RoCE the configured or auto-selected RoCE GID, which must be routable. `Err` says why
/// the port cannot be used.
fn port_gid(
    ctx: &Context,
    port: u8,
    info: &PortInfo,
    link_layer: LinkLayer,
    cfg: &Config,
) -> std::result::Result<(i32, [u8; 16]), String> {
    let gid_at = |i: i32| ctx.query_gid(port, i).ok();
    let gid_index = match link_layer {
        LinkLayer::InfiniBand => select_ib_gid(info.gid_tbl_len, &gid_at, cfg),
        LinkLayer::Ethernet => {
            let roce_type = |i: i32| {
                ctx.gid_roce_version(port, i)
                    .map_err(|e| std::io::Error::other(e.message))
            };
            select_roce_gid(info.gid_tbl_len, &gid_at, &roce_type, cfg)?
        }
    };
    let gid = gid_at(gid_index).ok_or_else(|| format!("cannot read GID {gid_index}"))?;
    if link_layer == LinkLayer::Ethernet && !gid_valid(&gid) {
        return Err(format!(
            "GID {gid_index} is {} — no routable RoCE address; check the interface's IP address or NCCL_IB_GID_INDEX",
            format_gid(&gid)
        ));
    }
    Ok((gid_index, gid))
}

/// What a port's connections are addressed by, picked at discovery: the P_Key ([`port_pkey`])
/// and the GID ([`port_gid`]; a GID change picks that again, the P_Key stays). `Err` says why
/// the port is skipped.
fn port_address(
    ctx: &Context,
    port: u8,
    info: &PortInfo,
    link_layer: LinkLayer,
    cfg: &Config,
) -> std::result::Result<PortAddress, String> {
    let pkey_at = |i: u16| ctx.query_pkey(port, i).map_err(|e| e.message);
    let value = u16::try_from(cfg.pkey_value).ok();
    let (pkey_index, pkey) = port_pkey(cfg.pkey_index, value, info.pkey_tbl_len, &pkey_at)?;
    let (gid_index, gid) = port_gid(ctx, port, info, link_layer, cfg)?;
    Ok(PortAddress {
        gid_index,
        gid,
        pkey_index,
        pkey,
    })
}

/// What a port's connections are addressed by: [`port_address`]'s pick.
struct PortAddress {
    gid_index: i32,
    gid: [u8; 16],
    pkey_index: u16,
    pkey: u16,
}

/// The `guid` NCCL's IB transport reports for a device: `ibv_device_attr.sys_image_guid` copied
/// as it is, i.e. the GUID's big-endian bytes read as a host-order integer (NCCL does no byte
/// swap). `sys_image_guid` is the GUID's value (what `ibv_devinfo` prints).
pub fn nccl_guid(sys_image_guid: u64) -> u64 {
    sys_image_guid.to_be()
}

/// `IBV_MTU_*` enum value → bytes.
pub fn mtu_bytes(mtu: u32) -> u32 {
    match mtu {
        1..=5 => 128 << mtu,
        _ => 0,
    }
}

mod gid_cache;
mod pkey;
pub mod subnet;

pub use gid_cache::GidCache;
pub use pkey::{pkey_index_check, pkey_value_index, port_pkey};

#[cfg(test)]
mod tests;

//! Devices: the static `ibv_device` list, the per-process device instance shared
//! by every context opened on it, the GID table and the address rules.
//!
//! Address rules (issue 3): `SOFTROCE_ADDR` (a comma-separated list, entry *i*
//! for device *i*) when set; otherwise the IPv4 address of an up, non-loopback
//! interface of this network namespace; when there is none, or it is already
//! bound on port 4791 by another softroce process, the first 127.0.0.x that can
//! be bound. Never the wildcard address.

use std::collections::HashMap;
use std::ffi::CStr;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::config;
use crate::engine::Engine;
use crate::udp::UdpSocket;

/// Number of GID table entries reported (`gid_tbl_len`); 0..3 are filled.
pub const GID_TABLE_LEN: usize = 16;
/// `ibv_gid_entry.gid_type` values (enum ibv_gid_type).
pub const GID_TYPE_ROCE_V1: u32 = 1;
pub const GID_TYPE_ROCE_V2: u32 = 2;
/// `ibv_query_gid_type()` values (enum ibv_gid_type_sysfs of rdma-core's driver.h).
pub const GID_TYPE_SYSFS_ROCE_V1: u32 = 0;
pub const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// Device identity advertised by `ibv_query_device`.
pub const VENDOR_ID: u32 = 0x00ff_fffe;
/// Outside perftest's table of known parts (keeps it on `ibv_post_send`).
pub const VENDOR_PART_ID: u32 = 0x5ec0;
pub const MAX_QP: u32 = 1 << 16;
pub const MAX_QP_WR: u32 = 16 * 1024;
pub const MAX_SGE: u32 = 32;
pub const MAX_CQE: u32 = 1 << 20;
pub const MAX_MR: u32 = 1 << 20;
pub const MAX_PD: u32 = 1 << 16;
pub const MAX_QP_RD_ATOM: u32 = 16;
pub const MAX_INLINE: u32 = 256;
pub const MAX_MSG_SZ: u32 = 1 << 31;
pub const MAX_SRQ: u32 = 1 << 16;
pub const MAX_SRQ_WR: u32 = 16 * 1024;

/// The `struct ibv_device` we hand out, plus our index.
#[repr(C)]
pub struct IbvDevice {
    pub ibv: rdma_sys::ibv_device,
    pub index: usize,
}

// SAFETY: the struct holds only plain data and two unused (None) fn pointers;
// it is written once before being published and never mutated afterwards.
unsafe impl Sync for IbvDevice {}
// SAFETY: as above.
unsafe impl Send for IbvDevice {}

fn copy_cstr(dst: &mut [libc::c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as libc::c_char;
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
                let mut ibv: rdma_sys::ibv_device = unsafe { std::mem::zeroed() };
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

/// Registered memory region, as the data path sees it.
#[derive(Clone, Copy, Debug)]
pub struct MrInfo {
    /// Host address of the first byte.
    pub addr: usize,
    pub len: usize,
    /// The address remote peers use for byte 0 (== addr for plain ibv_reg_mr).
    pub iova: u64,
    pub access: u32,
    pub pd: u32,
}

/// Per-process device instance, shared by every context opened on the device.
pub struct Device {
    pub index: usize,
    pub name: String,
    pub addr: Ipv4Addr,
    /// Link MTU of the interface the address lives on.
    pub link_mtu: u32,
    /// Active MTU as an `ibv_mtu` enum value (1 = 256 ... 5 = 4096).
    pub active_mtu: u32,
    /// Index of the network interface holding `addr` (`ibv_gid_entry.ndev_ifindex`).
    pub ifindex: u32,
    pub guid: u64,
    pub sock: Arc<UdpSocket>,
    pub mrs: RwLock<HashMap<u32, MrInfo>>,
    next_key: AtomicU32,
    next_handle: AtomicU32,
    next_qpn: AtomicU32,
    pub engine: Engine,
}

impl Device {
    /// The GID at `index`, or None for an empty slot.
    pub fn gid(&self, index: usize) -> Option<[u8; 16]> {
        match index {
            0 | 1 => {
                let mut g = [0u8; 16];
                g[0] = 0xfe;
                g[1] = 0x80;
                g[8..].copy_from_slice(&self.guid.to_be_bytes());
                Some(g)
            }
            2 | 3 => Some(ipv4_mapped_gid(self.addr)),
            _ => None,
        }
    }

    /// GID type for `ibv_gid_entry` (1 = RoCE v1, 2 = RoCE v2).
    pub fn gid_type(&self, index: usize) -> Option<u32> {
        match index {
            0 | 2 => Some(GID_TYPE_ROCE_V1),
            1 | 3 => Some(GID_TYPE_ROCE_V2),
            _ => None,
        }
    }

    pub fn alloc_handle(&self) -> u32 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// A fresh lkey/rkey: an index in the upper 24 bits and a generation byte.
    pub fn alloc_key(&self) -> u32 {
        loop {
            let k = self.next_key.fetch_add(0x101, Ordering::Relaxed);
            if k != 0 && !self.mrs.read().unwrap().contains_key(&k) {
                return k;
            }
        }
    }

    /// A fresh 24-bit QP number (0 and 1 are reserved for QP0/QP1).
    pub fn alloc_qpn(&self) -> u32 {
        loop {
            let q = self.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            if q >= 2 && !self.engine.has_qp(q) {
                return q;
            }
        }
    }

    pub fn gid_index_of(&self, gid: &[u8; 16]) -> Option<usize> {
        (0..4).find(|&i| self.gid(i).as_ref() == Some(gid))
    }
}

/// `::ffff:a.b.c.d`.
pub fn ipv4_mapped_gid(a: Ipv4Addr) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a.octets());
    g
}

/// The node GUID (and link-local interface ID) of a device bound to `a`: a
/// locally administered EUI-64 that embeds the address,
/// `02:53:a:ff:fe:b:c:d` — so a link-local GID of a softroce peer
/// (`fe80::253:aff:feb:c0d`, GID index 0/1, what `ibv_rc_pingpong -g 0`
/// exchanges) can be routed to its IPv4 address.
pub fn guid_for(a: Ipv4Addr) -> u64 {
    let o = a.octets();
    u64::from_be_bytes([0x02, 0x53, o[0], 0xff, 0xfe, o[1], o[2], o[3]])
}

/// The IPv4 destination of a GID: the address inside an IPv4-mapped GID
/// (`::ffff:a.b.c.d`), or the address embedded in a softroce link-local GID
/// (see [`guid_for`]). Other GIDs (IPv6) are not routable by this device.
pub fn gid_to_ipv4(g: &[u8; 16]) -> Option<Ipv4Addr> {
    if g[..10].iter().all(|&b| b == 0) && g[10] == 0xff && g[11] == 0xff {
        return Some(Ipv4Addr::new(g[12], g[13], g[14], g[15]));
    }
    let ll = [0xfe, 0x80, 0, 0, 0, 0, 0, 0];
    if g[..8] == ll && g[8] == 0x02 && g[9] == 0x53 && g[11] == 0xff && g[12] == 0xfe {
        return Some(Ipv4Addr::new(g[10], g[13], g[14], g[15]));
    }
    None
}

/// Largest IB MTU enum value whose payload fits `link_mtu` (rxe's rule: - 80).
pub fn mtu_enum_for_link(link_mtu: u32) -> u32 {
    let room = link_mtu.saturating_sub(80);
    let mut e = 1;
    for (v, bytes) in [(1u32, 256u32), (2, 512), (3, 1024), (4, 2048), (5, 4096)] {
        if bytes <= room {
            e = v;
        }
    }
    e
}

pub fn mtu_enum_to_bytes(e: u32) -> u32 {
    match e {
        1 => 256,
        2 => 512,
        3 => 1024,
        4 => 2048,
        _ => 4096,
    }
}

/// Up, non-loopback IPv4 interfaces: (address, link MTU), in getifaddrs order.
pub fn host_ipv4_addrs() -> Vec<(Ipv4Addr, String)> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head to ifap that we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: p is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        let flags = ifa.ifa_flags;
        if ifa.ifa_addr.is_null()
            || flags & libc::IFF_UP as u32 == 0
            || flags & libc::IFF_RUNNING as u32 == 0
            || flags & libc::IFF_LOOPBACK as u32 != 0
        {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr.
        if unsafe { (*ifa.ifa_addr).sa_family } as i32 != libc::AF_INET {
            continue;
        }
        // SAFETY: family is AF_INET so the sockaddr is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        let a = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push((a, name));
    }
    // SAFETY: ifap came from getifaddrs.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

/// Name of the interface holding `a` (for its MTU), "lo" for 127/8.
fn ifname_of(a: Ipv4Addr) -> Option<String> {
    if a.is_loopback() {
        return Some("lo".into());
    }
    host_ipv4_addrs().into_iter().find(|(x, _)| *x == a).map(|(_, n)| n)
}

fn link_mtu_of(a: Ipv4Addr) -> u32 {
    ifname_of(a)
        .and_then(|n| std::fs::read_to_string(format!("/sys/class/net/{n}/mtu")).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(if a.is_loopback() { 65536 } else { 1500 })
}

/// Binds the device's socket following the address rules.
fn bind_for(index: usize) -> std::io::Result<(Ipv4Addr, UdpSocket)> {
    if let Some(list) = config::addr_list() {
        if let Some(a) = list.get(index) {
            return UdpSocket::bind(*a, config::gso()).map(|s| (*a, s));
        }
    }
    let host = host_ipv4_addrs();
    if let Some((a, _)) = host.get(index) {
        if let Ok(s) = UdpSocket::bind(*a, config::gso()) {
            return Ok((*a, s));
        }
    }
    let mut last = std::io::Error::from_raw_os_error(libc::EADDRINUSE);
    for x in 1..=254u8 {
        let a = Ipv4Addr::new(127, 0, 0, x);
        match UdpSocket::bind(a, config::gso()) {
            Ok(s) => return Ok((a, s)),
            Err(e) => last = e,
        }
    }
    Err(last)
}

static INSTANCES: Mutex<Vec<Option<Arc<Device>>>> = Mutex::new(Vec::new());

/// The process-wide instance of device `index`, created (socket bound, engine
/// started) on first use.
pub fn instance(index: usize) -> std::io::Result<Arc<Device>> {
    let mut v = INSTANCES.lock().unwrap();
    if v.len() <= index {
        v.resize(index + 1, None);
    }
    if let Some(d) = &v[index] {
        return Ok(d.clone());
    }
    let (addr, sock) = bind_for(index)?;
    let link_mtu = link_mtu_of(addr);
    let ifindex = ifname_of(addr)
        .and_then(|n| std::ffi::CString::new(n).ok())
        // SAFETY: if_nametoindex reads a NUL-terminated name.
        .map(|n| unsafe { libc::if_nametoindex(n.as_ptr()) })
        .unwrap_or(0);
    let active_mtu = config::mtu_override().unwrap_or_else(|| mtu_enum_for_link(link_mtu).min(5));
    let guid = guid_for(addr);
    let sock = Arc::new(sock);
    let name = format!("softroce{index}");
    let dev = Arc::new_cyclic(|weak| Device {
        index,
        name,
        addr,
        link_mtu,
        active_mtu,
        ifindex,
        guid,
        sock: sock.clone(),
        mrs: RwLock::new(HashMap::new()),
        next_key: AtomicU32::new(0x0000_1201 + ((std::process::id() & 0xff) << 8)),
        next_handle: AtomicU32::new(1),
        next_qpn: AtomicU32::new(0x11),
        engine: Engine::new(weak.clone()),
    });
    dev.engine.start()?;
    v[index] = Some(dev.clone());
    Ok(dev)
}

//! Address rules and GIDs.
//!
//! A device binds `SOFTROCE_ADDR` (a comma-separated list, entry *i* for
//! device *i*) when set; otherwise the IPv4 address of an up, non-loopback
//! interface of this network namespace; when there is none, or it is already
//! bound on port 4791 by another softroce process, the first 127.0.0.x that
//! can be bound. Never the wildcard address.
//!
//! GIDs: 0 / 1 are link-local with the node GUID as interface ID (which
//! embeds the IPv4 address, see [`guid_for`]), 2 / 3 the IPv4-mapped address;
//! both route to that IPv4 address ([`gid_to_ipv4`]).

use std::ffi::CStr;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::udp::UdpSocket;
use crate::config;
use crate::wire;

/// `::ffff:a.b.c.d`.
pub fn ipv4_mapped_gid(a: Ipv4Addr) -> [u8; 16] {
    a.to_ipv6_mapped().octets()
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
    if let Some(a) = Ipv6Addr::from(*g).to_ipv4_mapped() {
        return Some(a);
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
    (1..=5u8)
        .take_while(|&e| wire::mtu_bytes(e).is_some_and(|bytes| bytes <= room))
        .last()
        .unwrap_or(1)
        .into()
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
pub fn ifname_of(a: Ipv4Addr) -> Option<String> {
    if a.is_loopback() {
        return Some("lo".into());
    }
    host_ipv4_addrs().into_iter().find(|(x, _)| *x == a).map(|(_, n)| n)
}

pub fn link_mtu_of(a: Ipv4Addr) -> u32 {
    ifname_of(a)
        .and_then(|n| std::fs::read_to_string(format!("/sys/class/net/{n}/mtu")).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(if a.is_loopback() { 65536 } else { 1500 })
}

/// Binds the device's socket following the address rules.
pub fn bind_for(index: usize) -> std::io::Result<(Ipv4Addr, UdpSocket)> {
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

/// The index of the network interface holding `a` (0 when unknown).
pub fn ifindex_of(a: Ipv4Addr) -> u32 {
    ifname_of(a)
        .and_then(|n| std::ffi::CString::new(n).ok())
        // SAFETY: if_nametoindex reads a NUL-terminated name.
        .map(|n| unsafe { libc::if_nametoindex(n.as_ptr()) })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest IB MTU that fits the link MTU less 80 bytes of headers
    /// (rxe's rule), 256 when nothing fits.
    #[test]
    fn mtu_enum_for_link_picks_the_largest_that_fits() {
        for (link, want) in [
            (65536, 5),
            (4176, 5),
            (4175, 4),
            (1500, 3),
            (1400, 3),
            (1103, 2),
            (1104, 3),
            (336, 1),
            (100, 1),
            (0, 1),
        ] {
            assert_eq!(mtu_enum_for_link(link), want, "link MTU {link}");
        }
    }

    /// A softroce link-local GID and an IPv4-mapped GID route to the address
    /// they embed; other IPv6 GIDs do not route.
    #[test]
    fn gids_route_to_their_embedded_ipv4_address() {
        let a = Ipv4Addr::new(10, 1, 2, 3);
        let mut link_local = [0u8; 16];
        link_local[0] = 0xfe;
        link_local[1] = 0x80;
        link_local[8..].copy_from_slice(&guid_for(a).to_be_bytes());
        assert_eq!(gid_to_ipv4(&link_local), Some(a));
        assert_eq!(gid_to_ipv4(&ipv4_mapped_gid(a)), Some(a));
        let mut v6 = ipv4_mapped_gid(a);
        v6[0] = 0x20;
        assert_eq!(gid_to_ipv4(&v6), None);
    }
}

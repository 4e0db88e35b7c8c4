//! Facts about the host outside libibverbs: interfaces and their MTUs, PCI config space (ACS),
//! NUMA nodes, the CPU frequency governor, `/dev/infiniband`, the GPU driver. Parsers are pure
//! and tested on literal bytes; the readers only fetch their input.

use std::net::IpAddr;
use std::path::Path;

/// An interface address with its prefix length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub ip: IpAddr,
    pub prefix_len: u8,
}

/// Every interface address of this network namespace (`getifaddrs`).
pub fn interfaces() -> Vec<IfAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: head is a valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_netmask.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string of the live node.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: both pointers are non-NULL sockaddrs whose family says their type.
        let (ip, mask) = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in);
                    (
                        IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes()),
                        u32::from_be(m.sin_addr.s_addr).count_ones(),
                    )
                }
                libc::AF_INET6 => {
                    let a = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    let m = &*(ifa.ifa_netmask as *const libc::sockaddr_in6);
                    (
                        IpAddr::from(a.sin6_addr.s6_addr),
                        u128::from_be_bytes(m.sin6_addr.s6_addr).count_ones(),
                    )
                }
                _ => continue,
            }
        };
        out.push(IfAddr {
            name,
            ip,
            prefix_len: mask as u8,
        });
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Whether `a` and `b` share the first `prefix_len` bits (same family only).
pub fn same_subnet(a: IpAddr, b: IpAddr, prefix_len: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix_len.min(32))).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix_len.min(128))).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// The interface holding `ip`: the one with that exact address, else the narrowest subnet
/// containing it (all of 127/8 is on `lo`).
pub fn interface_of(ip: IpAddr, all: &[IfAddr]) -> Option<IfAddr> {
    if let Some(exact) = all.iter().find(|a| a.ip == ip) {
        return Some(exact.clone());
    }
    all.iter()
        .filter(|a| same_subnet(a.ip, ip, a.prefix_len))
        .max_by_key(|a| a.prefix_len)
        .cloned()
}

pub fn netdev_mtu(name: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The largest IB MTU that fits a RoCE packet into a netdev MTU, by the kernel's rule
/// (`iboe_get_mtu`: GRH/IP 40, UDP 8, BTH 12, XRC 4, AtomicETH 28, ICRC 4 bytes).
pub fn best_roce_mtu(netdev_mtu: u32) -> u32 {
    const OVERHEAD: u32 = 40 + 8 + 12 + 4 + 28 + 4;
    [4096, 2048, 1024, 512, 256]
        .into_iter()
        .find(|&m| m + OVERHEAD <= netdev_mtu)
        .unwrap_or(256)
}

/// ACS control bits that send peer-to-peer traffic up to the root complex (GPUDirect then
/// crawls or fails): P2P Request Redirect (bit 2) and P2P Completion Redirect (bit 3).
pub const ACS_P2P_REDIRECT: u16 = (1 << 2) | (1 << 3);

/// The ACS control register of a PCI config space, if it has the ACS extended capability
/// (id 0x000d). `Err` when the extended space is not readable (a non-root read gets 64 bytes).
pub fn acs_control(config: &[u8]) -> Result<Option<u16>, String> {
    if config.len() < 0x104 {
        return Err(format!(
            "only {} bytes of config space readable (run as root to read the extended space)",
            config.len()
        ));
    }
    let mut offset = 0x100usize;
    for _ in 0..64 {
        let Some(header) = config.get(offset..offset + 4) else {
            return Ok(None);
        };
        let header = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        if header == 0 || header == u32::MAX {
            return Ok(None);
        }
        if header & 0xffff == 0x000d {
            return Ok(config
                .get(offset + 6..offset + 8)
                .map(|c| u16::from_le_bytes([c[0], c[1]])));
        }
        offset = (header >> 20) as usize;
        if offset < 0x100 {
            return Ok(None);
        }
    }
    Ok(None)
}

/// The bridges above a PCI function: every `dddd:bb:dd.f` component of its sysfs path but the
/// last.
pub fn upstream_bridges(sysfs_path: &str) -> Vec<String> {
    let bdfs: Vec<&str> = sysfs_path.split('/').filter(|c| is_bdf(c)).collect();
    bdfs[..bdfs.len().saturating_sub(1)]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn is_bdf(c: &str) -> bool {
    let b = c.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

/// `scaling_governor` of every CPU, counted: `[("performance", 64)]`.
pub fn cpu_governors() -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") else {
        return counts;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        if let Ok(g) = std::fs::read_to_string(entry.path().join("cpufreq/scaling_governor")) {
            let g = g.trim().to_string();
            match counts.iter_mut().find(|(n, _)| *n == g) {
                Some((_, c)) => *c += 1,
                None => counts.push((g, 1)),
            }
        }
    }
    counts.sort();
    counts
}

/// The NVIDIA kernel driver is loaded (a GPU may use GPUDirect).
pub fn nvidia_driver_loaded() -> bool {
    Path::new("/proc/driver/nvidia/version").exists()
}

/// Whether this process may open `path` for reading and writing.
pub fn accessible(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: c is a NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) == 0 }
}

pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_acs(control: u16) -> Vec<u8> {
        let mut c = vec![0u8; 0x200];
        // AER (id 1) at 0x100, next 0x140; ACS (id 0xd) at 0x140, last.
        c[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x140 << 20)).to_le_bytes());
        c[0x140..0x144].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        c[0x146..0x148].copy_from_slice(&control.to_le_bytes());
        c
    }

    #[test]
    fn acs_is_found_through_the_capability_list() {
        assert_eq!(acs_control(&config_with_acs(0x001d)), Ok(Some(0x001d)));
        assert_ne!(0x001d & ACS_P2P_REDIRECT, 0);
        assert_eq!(acs_control(&config_with_acs(0)), Ok(Some(0)));
        let mut no_acs = config_with_acs(0);
        no_acs[0x140..0x144].copy_from_slice(&0x0002_0001u32.to_le_bytes());
        assert_eq!(acs_control(&no_acs), Ok(None));
        assert!(acs_control(&[0u8; 64]).unwrap_err().contains("64 bytes"));
    }

    #[test]
    fn bridges_are_the_path_above_the_function() {
        let p = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.1";
        assert_eq!(upstream_bridges(p), ["0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]);
        assert!(upstream_bridges("/sys/devices/virtual/net/lo").is_empty());
    }

    #[test]
    fn roce_mtu_from_the_netdev_mtu() {
        assert_eq!(best_roce_mtu(9000), 4096);
        assert_eq!(best_roce_mtu(1500), 1024);
        assert_eq!(best_roce_mtu(65536), 4096);
        assert_eq!(best_roce_mtu(4200), 4096);
        assert_eq!(best_roce_mtu(4000), 2048);
    }

    #[test]
    fn subnets_and_interfaces() {
        let lo = IfAddr {
            name: "lo".into(),
            ip: "127.0.0.1".parse().unwrap(),
            prefix_len: 8,
        };
        let eth = IfAddr {
            name: "eth0".into(),
            ip: "192.0.2.2".parse().unwrap(),
            prefix_len: 24,
        };
        let all = [lo, eth];
        assert_eq!(interface_of("127.0.61.1".parse().unwrap(), &all).unwrap().name, "lo");
        assert_eq!(interface_of("192.0.2.2".parse().unwrap(), &all).unwrap().name, "eth0");
        assert_eq!(interface_of("10.0.0.1".parse().unwrap(), &all), None);
        assert!(same_subnet(
            "10.1.2.3".parse().unwrap(),
            "10.1.9.9".parse().unwrap(),
            16
        ));
        assert!(!same_subnet(
            "10.1.2.3".parse().unwrap(),
            "10.2.0.1".parse().unwrap(),
            16
        ));
        assert!(!same_subnet("10.1.2.3".parse().unwrap(), "::1".parse().unwrap(), 0));
    }
}

//! Subnet-aware routing (`NCCL_IB_SUBNET_AWARE_ROUTING`), as NCCL's IB transport does it for
//! multi-subnet RoCE: the listener puts the GIDs of its RoCE members in the handle, and the
//! connector connects from the local device whose RoCE members all share a subnet with one of
//! them, when the device NCCL asked for does not.
//!
//! Pure functions over GIDs; `transport::setup` reads the handle and the devices.

use super::{gid_family, gid_valid, AddrFamily};

/// Whether two RoCE GIDs lie in one subnet: for IPv4-mapped GIDs the first `prefix_len` bits
/// (1..=32) of the two addresses agree, for IPv6 GIDs the 64-bit subnet prefixes; GIDs of two
/// families never do.
pub fn same_subnet(local: &[u8; 16], remote: &[u8; 16], prefix_len: u32) -> bool {
    match (gid_family(local), gid_family(remote)) {
        (AddrFamily::Inet, AddrFamily::Inet) => {
            let mask = u32::MAX.checked_shl(32 - prefix_len.clamp(1, 32)).unwrap_or(0);
            let addr = |g: &[u8; 16]| u32::from_be_bytes([g[12], g[13], g[14], g[15]]);
            addr(local) & mask == addr(remote) & mask
        }
        (AddrFamily::Inet6, AddrFamily::Inet6) => local[..8] == remote[..8],
        _ => false,
    }
}

/// Whether every RoCE member of a device (`members`: the GIDs of its RoCE ports; an empty list
/// is a device with none, such as an InfiniBand one) is valid and shares a subnet with one of the
/// peer's valid GIDs.
fn reaches(members: &[[u8; 16]], remote: &[[u8; 16]], prefix_len: u32) -> bool {
    !members.is_empty()
        && members
            .iter()
            .all(|l| gid_valid(l) && remote.iter().any(|r| gid_valid(r) && same_subnet(l, r, prefix_len)))
}

/// The device a connection to a listener with GIDs `remote` should use: `default` (the one NCCL
/// asked for) when the peer has no valid GID (an InfiniBand or older listener, or one without
/// subnet-aware routing) or every RoCE member of `default` reaches it; else the first other
/// device all of whose RoCE members do; else `default`. `devices[i]` lists device `i`'s RoCE
/// members' GIDs.
pub fn device_by_subnet(default: usize, devices: &[Vec<[u8; 16]>], remote: &[[u8; 16]], prefix_len: u32) -> usize {
    if !remote.iter().any(gid_valid) {
        return default;
    }
    if devices.get(default).is_some_and(|d| reaches(d, remote, prefix_len)) {
        return default;
    }
    (0..devices.len())
        .find(|&i| i != default && reaches(&devices[i], remote, prefix_len))
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::tests::{v4, v6};

    #[test]
    fn subnets_by_prefix_length_and_family() {
        assert!(same_subnet(&v4(10, 1, 2, 3), &v4(10, 1, 2, 200), 24));
        assert!(!same_subnet(&v4(10, 1, 2, 3), &v4(10, 1, 3, 3), 24));
        assert!(same_subnet(&v4(10, 1, 2, 3), &v4(10, 1, 3, 3), 16));
        assert!(same_subnet(&v4(10, 1, 2, 3), &v4(10, 1, 2, 3), 32));
        assert!(!same_subnet(&v4(10, 1, 2, 3), &v4(10, 1, 2, 4), 32));
        assert!(same_subnet(&v4(10, 1, 2, 3), &v4(11, 1, 2, 3), 1));
        assert!(!same_subnet(&v4(10, 1, 2, 3), &v4(138, 1, 2, 3), 1));
        assert!(same_subnet(&v6("fd00:1::5"), &v6("fd00:1::9"), 24));
        assert!(!same_subnet(&v6("fd00:1::5"), &v6("fd00:2::5"), 24));
        assert!(!same_subnet(&v4(10, 1, 2, 3), &v6("fd00:1::5"), 24));
    }

    #[test]
    fn the_device_in_the_peers_subnet_is_chosen() {
        let devs = vec![vec![v4(10, 0, 1, 1)], vec![v4(10, 0, 2, 1)]];
        // The peer is in 10.0.2.0/24: device 1, whichever NCCL asked for.
        assert_eq!(device_by_subnet(0, &devs, &[v4(10, 0, 2, 7), [0; 16]], 24), 1);
        assert_eq!(device_by_subnet(1, &devs, &[v4(10, 0, 2, 7), [0; 16]], 24), 1);
        assert_eq!(device_by_subnet(1, &devs, &[v4(10, 0, 1, 7), [0; 16]], 24), 0);
        // A /16 puts both in the peer's subnet: NCCL's choice stands.
        assert_eq!(device_by_subnet(0, &devs, &[v4(10, 0, 2, 7), [0; 16]], 16), 0);
        // No device reaches it, or the peer sent no GID (InfiniBand, an older listener): unchanged.
        assert_eq!(device_by_subnet(1, &devs, &[v4(192, 168, 0, 1), [0; 16]], 24), 1);
        assert_eq!(device_by_subnet(0, &devs, &[[0; 16], [0; 16]], 24), 0);
        // A link-local peer GID is not a subnet.
        let ll = v6("fe80::1");
        assert_eq!(device_by_subnet(1, &devs, &[ll, [0; 16]], 24), 1);
    }

    #[test]
    fn a_fused_device_must_reach_the_peer_with_every_member() {
        let fused_split = vec![v4(10, 0, 1, 1), v4(10, 0, 2, 1)];
        let devs = vec![fused_split.clone(), vec![v4(10, 0, 2, 9)], vec![]];
        // The peer's two members are in both subnets: the fused device stays.
        assert_eq!(device_by_subnet(0, &devs, &[v4(10, 0, 1, 5), v4(10, 0, 2, 5)], 24), 0);
        // Only in 10.0.2.0/24: the fused device cannot reach it with both members.
        assert_eq!(device_by_subnet(0, &devs, &[v4(10, 0, 2, 5), [0; 16]], 24), 1);
        // A device with no RoCE member (InfiniBand) is never chosen.
        assert_eq!(device_by_subnet(2, &devs, &[v4(10, 0, 1, 5), [0; 16]], 24), 2);
        let devs2 = vec![vec![], vec![v4(10, 0, 1, 1)]];
        assert_eq!(device_by_subnet(0, &devs2, &[v4(10, 0, 1, 5), [0; 16]], 24), 1);
    }
}

//! A peer that is not ferroce: a rank that loaded NCCL's own transport or another net plugin
//! hands this one foreign handle bytes, dials our listener speaking something else, or listens
//! where our connect lands and answers something else (or nothing). Each such failure is one
//! error or WARN that names the peer's address where it is known and ends with [`SAME_PLUGIN`]
//! (docs/nccl-net-abi.md#connection-setup). The bytes themselves are judged by
//! `proto::handshake` (the handle and frame magics); this module only words the verdicts.

use crate::transport::proto::handshake::{WireError, HANDLE_BYTES};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// What every failure caused by a peer that does not speak ferroce ends with.
pub const SAME_PLUGIN: &str = "every node must load the same net plugin (NCCL_NET_PLUGIN=ferroce)";

/// `AF_INET` and `AF_INET6` as Linux numbers them.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// The listener address a foreign handle begins with, if it begins with one: NCCL's own
/// transports (IB, Socket) and the plugins modelled on them start their listen handle with the
/// listener's socket address (`sockaddr_in` or `sockaddr_in6`: family in host byte order, then
/// port and address in network byte order). `None` when the first bytes are no plausible
/// address (another family, port 0, an unspecified address).
pub fn handle_listener(handle: &[u8; HANDLE_BYTES]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes([handle[0], handle[1]]);
    let port = u16::from_be_bytes([handle[2], handle[3]]);
    let addr = match family {
        AF_INET => {
            let ip = Ipv4Addr::new(handle[4], handle[5], handle[6], handle[7]);
            SocketAddr::V4(SocketAddrV4::new(ip, port))
        }
        AF_INET6 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&handle[8..24]);
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, 0))
        }
        _ => return None,
    };
    (port != 0 && !addr.ip().is_unspecified()).then_some(addr)
}

/// The connect error for `handle`, which is not a ferroce listen handle (`why`).
pub fn foreign_handle(handle: &[u8; HANDLE_BYTES], why: &WireError) -> String {
    let peer = match handle_listener(handle) {
        Some(a) => format!("a listener at {a}"),
        None => "no address ferroce can read".to_string(),
    };
    format!(
        "connect: the peer's handle is not a ferroce listen handle ({why}; it names {peer}): that rank runs NCCL's own transport or another net plugin — {SAME_PLUGIN}"
    )
}

/// Whether a framing error means the peer does not speak ferroce at all (not a ferroce of
/// another version, nor a corrupt ferroce frame).
pub fn is_foreign(e: &WireError) -> bool {
    matches!(e, WireError::BadMagic(_))
}

/// The connect error when the listener at `peer` answered bytes that are not ferroce's (`e`).
pub fn foreign_listener(peer: SocketAddr, e: &WireError) -> String {
    format!("connection setup with {peer} failed: it answered {e}: the listener is not ferroce — {SAME_PLUGIN}")
}

/// The listener's WARN for a connection from `peer` whose first bytes are not ferroce's (`e`).
pub fn foreign_connector(peer: SocketAddr, e: &WireError) -> String {
    format!("listener: rejected a connection from {peer}: {e}: the connecting rank is not ferroce — {SAME_PLUGIN}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle_with(prefix: &[u8]) -> [u8; HANDLE_BYTES] {
        let mut h = [0u8; HANDLE_BYTES];
        h[..prefix.len()].copy_from_slice(prefix);
        h
    }

    #[test]
    fn a_handle_that_begins_with_a_socket_address_names_it() {
        let mut v4 = AF_INET.to_ne_bytes().to_vec();
        v4.extend_from_slice(&4791u16.to_be_bytes());
        v4.extend_from_slice(&[10, 1, 2, 3]);
        assert_eq!(
            handle_listener(&handle_with(&v4)),
            Some("10.1.2.3:4791".parse().unwrap())
        );
        let mut v6 = AF_INET6.to_ne_bytes().to_vec();
        v6.extend_from_slice(&5000u16.to_be_bytes());
        v6.extend_from_slice(&[0; 4]); // flow info
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        assert_eq!(handle_listener(&handle_with(&v6)), Some("[::1]:5000".parse().unwrap()));
        let text = foreign_handle(&handle_with(&v4), &WireError::BadMagic(0x1234));
        assert!(text.contains("it names a listener at 10.1.2.3:4791"), "{text}");
        assert!(text.ends_with(SAME_PLUGIN), "{text}");
    }

    #[test]
    fn zeroes_and_other_families_name_no_address() {
        assert_eq!(handle_listener(&[0u8; HANDLE_BYTES]), None);
        // AF_INET with port 0, or with 0.0.0.0.
        let mut h = handle_with(&AF_INET.to_ne_bytes());
        assert_eq!(handle_listener(&h), None);
        h[2..4].copy_from_slice(&80u16.to_be_bytes());
        assert_eq!(handle_listener(&h), None);
        // AF_UNIX.
        assert_eq!(handle_listener(&handle_with(&[1, 0, 0, 80, 127, 0, 0, 1])), None);
        let text = foreign_handle(&[0u8; HANDLE_BYTES], &WireError::BadMagic(0));
        assert!(text.contains("it names no address ferroce can read"), "{text}");
    }
}

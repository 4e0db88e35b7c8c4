//! The transmitter: appends each packet's ICRC and batches runs of
//! equal-size packets to one destination into one UDP GSO datagram.

use std::net::Ipv4Addr;

use super::link::{ib_trailer, IbHeaders};
use super::udp::{Ip, UdpSocket, MAX_GSO_BYTES, MAX_GSO_SEGS, MAX_PACKET};
use crate::config;
use crate::wire::{icrc, ROCEV2_UDP_PORT};

/// Per-thread transmit state: a scratch packet buffer and the GSO batch
/// being built (consecutive equal-size packets to one destination).
pub struct Tx {
    /// The packet `poll_transmit` writes; see [`Self::push`].
    pub scratch: Vec<u8>,
    batch: Vec<u8>,
    dst: Ipv4Addr,
    ip: Ip,
    seg: usize,
    count: usize,
    /// A shorter packet ended the batch (GSO: only the last segment may be short).
    closed: bool,
}

impl Default for Tx {
    fn default() -> Self {
        Self::new()
    }
}

impl Tx {
    pub fn new() -> Tx {
        Tx {
            scratch: Vec::with_capacity(MAX_PACKET),
            // Up front, not at the thread's first packet: the engine's first transmission may
            // come late (a retransmission), and a process's heap should not step up then.
            batch: Vec::with_capacity(MAX_GSO_BYTES + MAX_PACKET),
            dst: Ipv4Addr::UNSPECIFIED,
            ip: Ip::default(),
            seg: 0,
            count: 0,
            closed: false,
        }
    }

    /// Queues the packet in `scratch[..len]` for `dst`, appending its ICRC
    /// computed for the IP ID it will carry (its index in the GSO batch).
    pub fn push(&mut self, sock: &UdpSocket, len: usize, dst: Ipv4Addr, ip: Ip) {
        let l = len + icrc::ICRC_LEN;
        self.admit(sock, l, dst, ip);
        let fields = icrc::Ipv4Fields::new(sock.local.octets(), dst.octets(), self.count as u16);
        let crc = icrc::icrc_ipv4(&fields, ROCEV2_UDP_PORT, ROCEV2_UDP_PORT, &self.scratch[..len]);
        self.batch.extend_from_slice(&self.scratch[..len]);
        self.batch.extend_from_slice(&crc.to_le_bytes());
        self.count += 1;
    }

    /// Queues the transport packet in `scratch[..len]` for `dst` as an InfiniBand packet: `hdr`
    /// (LRH, GRH) before it, ICRC and VCRC after it (docs/softroce-internals.md#infiniband-link-layer).
    /// No IP header enters these CRCs, so a packet is the same in any GSO segment.
    pub fn push_ib(&mut self, sock: &UdpSocket, len: usize, dst: Ipv4Addr, hdr: &IbHeaders) {
        let transport = &self.scratch[..len];
        let trailer = ib_trailer(hdr, transport);
        let l = hdr.len + len + trailer.len();
        self.admit(sock, l, dst, Ip::default());
        self.batch.extend_from_slice(&hdr.bytes[..hdr.len]);
        self.batch.extend_from_slice(&self.scratch[..len]);
        self.batch.extend_from_slice(&trailer);
        self.count += 1;
    }

    /// Makes room for a packet of `l` bytes to `dst`: sends the batch first unless the packet
    /// can be its next GSO segment; the first packet of a batch sets its segment size.
    fn admit(&mut self, sock: &UdpSocket, l: usize, dst: Ipv4Addr, ip: Ip) {
        if self.count > 0
            && (!sock.gso()
                || dst != self.dst
                || ip != self.ip
                || l > self.seg
                || self.closed
                // A lone longer packet (e.g. a WRITE First with its RETH) goes
                // alone, so the equal-size packets after it share one batch.
                || (self.count == 1 && l < self.seg)
                || self.count == MAX_GSO_SEGS
                || self.batch.len() + l > MAX_GSO_BYTES)
        {
            self.flush(sock);
        }
        if self.count == 0 {
            self.dst = dst;
            self.ip = ip;
            self.seg = l;
        } else if l < self.seg {
            self.closed = true;
        }
    }

    /// Sends the pending batch (one datagram, or one GSO datagram).
    pub fn flush(&mut self, sock: &UdpSocket) {
        if self.count == 0 {
            return;
        }
        let seg = (self.count > 1).then_some(self.seg);
        let r = sock.send(&self.batch, seg, self.dst, self.ip);
        if let Err(e) = r {
            // A lost packet: RC retransmission recovers.
            if config::debug() {
                eprintln!("softroce: send to {} failed: {e}", self.dst);
            }
        }
        self.batch.clear();
        self.count = 0;
        self.closed = false;
    }
}

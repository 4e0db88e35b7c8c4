//! The thin UDP layer: one unconnected IPv4 socket per device, bound to
//! `<addr>:4791`, with `IP_PMTUDISC_DO` so that the kernel sends every datagram
//! with DF set and IP ID 0 — the ICRC covers both (docs/softroce-internals.md#icrc).
//!
//! With UDP GSO (`send_gso`), the kernel cuts one datagram into `seg`-byte
//! segments and gives segment *i* IP ID *i* (docs/softroce-internals.md#udp-segmentation-offload);
//! the caller computes
//! each segment's ICRC accordingly. With UDP GRO enabled on receive, a
//! datagram may carry several equal-size segments; [`RecvMeta::seg`] says
//! their size.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use super::faults::PortFaults;
use crate::wire::ROCEV2_UDP_PORT;

/// Largest single RoCE packet we accept (a 4096-byte MTU packet is 4096 + 60; jumbo slack).
pub const MAX_PACKET: usize = 9216;
/// Largest datagram we receive (a GRO super-datagram).
pub const MAX_DGRAM: usize = 65536;
/// Largest number of segments in one GSO send (kernel limit UDP_MAX_SEGMENTS is 64 or 128).
pub const MAX_GSO_SEGS: usize = 64;
/// Largest GSO datagram payload.
pub const MAX_GSO_BYTES: usize = 65000;

pub struct UdpSocket {
    fd: RawFd,
    pub local: Ipv4Addr,
    gso: AtomicBool,
    /// The port's injected faults: a packet they drop is lost on the wire, silently.
    pub faults: PortFaults,
}

/// Per-packet IPv4 header fields from the address vector (0 = kernel default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ip {
    /// TTL (`grh.hop_limit`).
    pub ttl: u8,
    /// TOS (`grh.traffic_class`).
    pub tos: u8,
}

/// What `recv_batch` learned about one datagram.
#[derive(Clone, Copy, Debug)]
pub struct RecvMeta {
    pub len: usize,
    pub src: SocketAddrV4,
    /// Segment size when the kernel coalesced several packets (GRO), else `len`.
    pub seg: usize,
}

impl Default for RecvMeta {
    fn default() -> Self {
        RecvMeta {
            len: 0,
            src: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            seg: 0,
        }
    }
}

fn sockaddr(a: Ipv4Addr, port: u16) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain data; all-zero is valid.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = port.to_be();
    sa.sin_addr.s_addr = u32::from(a).to_be();
    sa
}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl UdpSocket {
    /// Binds `addr:4791` (never the wildcard), with UDP GRO on receive;
    /// `gso` allows GSO sends ([`Self::send_gso`]).
    pub fn bind(addr: Ipv4Addr, gso: bool) -> io::Result<UdpSocket> {
        if addr.is_unspecified() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: plain socket(2) call.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let s = UdpSocket {
            fd,
            local: addr,
            gso: AtomicBool::new(false),
            faults: PortFaults::default(),
        };
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
        for (opt, v) in [(libc::SO_RCVBUF, 4 << 20), (libc::SO_SNDBUF, 4 << 20)] {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, opt, v);
        }
        // GRO is always on: a peer's GSO datagram then arrives whole, so each
        // segment's index (= its IP ID, inside the ICRC) is known. Without it
        // the kernel would split the datagram and the IDs would be lost.
        let gro = setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        if gso && gro {
            s.gso.store(true, Ordering::Relaxed);
        }
        let sa = sockaddr(addr, ROCEV2_UDP_PORT);
        // SAFETY: sa is a valid sockaddr_in of the size passed.
        let r = unsafe {
            libc::bind(
                fd,
                &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(s)
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Whether GSO sends are in use (cleared if the kernel refuses one).
    pub fn gso(&self) -> bool {
        self.gso.load(Ordering::Relaxed)
    }

    /// Sends one datagram to `dst:4791`. Blocking; errors are returned (the
    /// caller treats them as a lost packet: RC retransmission recovers).
    pub fn send_to(&self, buf: &[u8], dst: Ipv4Addr) -> io::Result<()> {
        self.send(buf, None, dst, Ip::default())
    }

    /// Sends `buf` as `ceil(len/seg)` segments of `seg` bytes (the last may be
    /// shorter) with one UDP GSO `sendmsg`.
    pub fn send_gso(&self, buf: &[u8], seg: usize, dst: Ipv4Addr) -> io::Result<()> {
        self.send(buf, Some(seg), dst, Ip::default())
    }

    /// Sends `buf` to `dst:4791`, as GSO segments of `seg` bytes when given
    /// (and `buf` is longer), with the IPv4 TTL / TOS of `ip` when non-zero.
    pub fn send(&self, buf: &[u8], seg: Option<usize>, dst: Ipv4Addr, ip: Ip) -> io::Result<()> {
        if self.faults.drops(dst) {
            return Ok(());
        }
        let seg = seg.filter(|&s| buf.len() > s);
        let mut sa = sockaddr(dst, ROCEV2_UDP_PORT);
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // Room for three cmsgs (u16 segment size, int TTL, int TOS):
        // CMSG_SPACE(2) = CMSG_SPACE(4) = 24 bytes each on x86-64.
        let mut cbuf = [0u64; 16];
        // SAFETY: msghdr is plain data; all pointers below point to live locals.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = &mut sa as *mut libc::sockaddr_in as *mut libc::c_void;
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let mut cmsgs: [(i32, i32, u32, usize); 3] = [(0, 0, 0, 0); 3];
        let mut n = 0;
        if let Some(s) = seg {
            cmsgs[n] = (libc::SOL_UDP, libc::UDP_SEGMENT, s as u32, 2);
            n += 1;
        }
        if ip.ttl != 0 {
            cmsgs[n] = (libc::IPPROTO_IP, libc::IP_TTL, ip.ttl as u32, 4);
            n += 1;
        }
        if ip.tos != 0 {
            cmsgs[n] = (libc::IPPROTO_IP, libc::IP_TOS, ip.tos as u32, 4);
            n += 1;
        }
        if n > 0 {
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            // SAFETY: CMSG_SPACE is a pure computation.
            msg.msg_controllen = cmsgs[..n]
                .iter()
                .map(|c| unsafe { libc::CMSG_SPACE(c.3 as u32) } as usize)
                .sum();
            assert!(msg.msg_controllen <= std::mem::size_of_val(&cbuf));
            // SAFETY: msg_control points to cbuf (128 bytes), enough for the
            // three cmsgs (24 bytes each, checked below); CMSG_NXTHDR stays inside it.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                for &(level, ty, v, len) in &cmsgs[..n] {
                    (*c).cmsg_level = level;
                    (*c).cmsg_type = ty;
                    (*c).cmsg_len = libc::CMSG_LEN(len as u32) as usize;
                    if len == 2 {
                        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, v as u16);
                    } else {
                        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, v as i32);
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
        }
        // SAFETY: msg is fully initialised and its buffers outlive the call.
        let r = unsafe { libc::sendmsg(self.fd, &msg, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if seg.is_some()
                && matches!(
                    e.raw_os_error(),
                    Some(libc::EIO) | Some(libc::EINVAL) | Some(libc::ENOPROTOOPT)
                )
            {
                // The route/device cannot segment: stop using GSO.
                self.gso.store(false, Ordering::Relaxed);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Receives up to `bufs.len()` datagrams without blocking. Returns the count;
    /// `meta[i]` describes datagram *i*.
    pub fn recv_batch(&self, bufs: &mut [Vec<u8>], meta: &mut [RecvMeta]) -> io::Result<usize> {
        const N: usize = 64;
        let n = bufs.len().min(meta.len()).min(N);
        // SAFETY: zeroed iovec / sockaddr_in / mmsghdr are valid initial values.
        let mut iov: [libc::iovec; N] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_in; N] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut hdrs: [libc::mmsghdr; N] = unsafe { std::mem::zeroed() };
        let mut ctl = [[0u64; 4]; N];
        for i in 0..n {
            iov[i].iov_base = bufs[i].as_mut_ptr() as *mut libc::c_void;
            iov[i].iov_len = bufs[i].len();
            let h = &mut hdrs[i].msg_hdr;
            h.msg_iov = &mut iov[i];
            h.msg_iovlen = 1;
            h.msg_name = &mut names[i] as *mut libc::sockaddr_in as *mut libc::c_void;
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            h.msg_control = ctl[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = std::mem::size_of_val(&ctl[i]);
        }
        // SAFETY: every header points at live buffers of the sizes given.
        let r = unsafe {
            libc::recvmmsg(
                self.fd,
                hdrs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        let r = r as usize;
        for i in 0..r {
            let len = hdrs[i].msg_len as usize;
            let mut seg = len;
            let h = &hdrs[i].msg_hdr;
            // SAFETY: walking the control buffer the kernel filled for this header.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(h);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const u16) as usize;
                        if v > 0 {
                            seg = v;
                        }
                    }
                    c = libc::CMSG_NXTHDR(h, c);
                }
            }
            let sa = &names[i];
            meta[i] = RecvMeta {
                len,
                src: SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
                    u16::from_be(sa.sin_port),
                ),
                seg,
            };
        }
        Ok(self.drop_faulted(r, bufs, meta))
    }

    /// Keep the first `n` datagrams the port's faults let through, in order; their count.
    fn drop_faulted(&self, n: usize, bufs: &mut [Vec<u8>], meta: &mut [RecvMeta]) -> usize {
        let mut kept = 0;
        for i in 0..n {
            if self.faults.drops(*meta[i].src.ip()) {
                continue;
            }
            if kept != i {
                bufs.swap(kept, i);
                meta[kept] = meta[i];
            }
            kept += 1;
        }
        kept
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        // SAFETY: we own fd.
        unsafe { libc::close(self.fd) };
    }
}

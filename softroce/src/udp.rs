//! The thin UDP layer: one unconnected IPv4 socket per device, bound to
//! `<addr>:4791`, with `IP_PMTUDISC_DO` so that the kernel sends every datagram
//! with DF set and IP ID 0 — the ICRC covers both (spec §3.6).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;

pub const ROCE_PORT: u16 = 4791;
/// Largest datagram we receive (a 4096-byte MTU packet is 4096 + 60; jumbo slack).
pub const MAX_DGRAM: usize = 9216;

pub struct UdpSocket {
    fd: RawFd,
    pub local: Ipv4Addr,
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
    /// Binds `addr:4791` (never the wildcard).
    pub fn bind(addr: Ipv4Addr) -> io::Result<UdpSocket> {
        if addr.is_unspecified() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: plain socket(2) call.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let s = UdpSocket { fd, local: addr };
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER, libc::IP_PMTUDISC_DO)?;
        for (opt, v) in [(libc::SO_RCVBUF, 4 << 20), (libc::SO_SNDBUF, 4 << 20)] {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, opt, v);
        }
        let sa = sockaddr(addr, ROCE_PORT);
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

    /// Sends one datagram to `dst:4791`. Blocking; errors are returned (the
    /// caller treats them as a lost packet: RC retransmission recovers).
    pub fn send_to(&self, buf: &[u8], dst: Ipv4Addr) -> io::Result<()> {
        let sa = sockaddr(dst, ROCE_PORT);
        // SAFETY: buf and sa are valid for the lengths passed.
        let r = unsafe {
            libc::sendto(
                self.fd,
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                0,
                &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Receives up to `bufs.len()` datagrams without blocking. Returns the count;
    /// `lens[i]` and `srcs[i]` describe datagram *i*.
    pub fn recv_batch(&self, bufs: &mut [Vec<u8>], lens: &mut [usize], srcs: &mut [SocketAddrV4]) -> io::Result<usize> {
        let n = bufs.len().min(lens.len()).min(srcs.len()).min(64);
        // SAFETY: zeroed iovec / sockaddr_in / mmsghdr are valid initial values.
        let mut iov: [libc::iovec; 64] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_in; 64] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut hdrs: [libc::mmsghdr; 64] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            iov[i].iov_base = bufs[i].as_mut_ptr() as *mut libc::c_void;
            iov[i].iov_len = bufs[i].len();
            hdrs[i].msg_hdr.msg_iov = &mut iov[i];
            hdrs[i].msg_hdr.msg_iovlen = 1;
            hdrs[i].msg_hdr.msg_name = &mut names[i] as *mut libc::sockaddr_in as *mut libc::c_void;
            hdrs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
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
            lens[i] = hdrs[i].msg_len as usize;
            let sa = &names[i];
            srcs[i] = SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
                u16::from_be(sa.sin_port),
            );
        }
        Ok(r)
    }
}

impl Drop for UdpSocket {
    fn drop(&mut self) {
        // SAFETY: we own fd.
        unsafe { libc::close(self.fd) };
    }
}

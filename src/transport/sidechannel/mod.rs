//! The TCP side channel used to set connections up: interface choice, a non-blocking
//! listener, non-blocking connect with retries, and framed message exchange.
//!
//! Nothing here blocks: every call does what the socket allows now and reports `Pending`.
//! The peer-liveness probe ([`Channel::peek`]) is how a comm notices a killed peer whose
//! RDMA traffic has stopped (RDMA alone would wait forever on a posted receive); a comm whose
//! channel is a shared link ([`shared_link`]) sees the same through its port.

pub(crate) mod shared_link;

use crate::config::{AddrFamily, DeviceFilter};
use crate::error::{limit_suffix, Error, Result};
use crate::transport::proto::handshake::{FrameReader, ListenAddr, Message, WireError, OLDEST_WIRE_VERSION};
use once_cell::sync::OnceCell;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Interface selection (docs/nccl-net-abi.md#device-discovery, #list-syntax)
// ---------------------------------------------------------------------------------------------

/// One address of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfAddr {
    pub name: String,
    pub ip: IpAddr,
    pub scope_id: u32,
}

fn name_matches(filter: &DeviceFilter, name: &str) -> bool {
    if filter.entries.is_empty() {
        return true;
    }
    let hit = filter.entries.iter().any(|e| {
        if filter.exact {
            e.name == name
        } else {
            name.starts_with(&e.name)
        }
    });
    hit != filter.exclude
}

fn family_ok(ip: &IpAddr, family: Option<AddrFamily>) -> bool {
    matches!(
        (family, ip),
        (None, _) | (Some(AddrFamily::Inet), IpAddr::V4(_)) | (Some(AddrFamily::Inet6), IpAddr::V6(_))
    )
}

fn usable(a: &IfAddr) -> bool {
    match a.ip {
        IpAddr::V4(v) => !v.is_unspecified(),
        // NCCL skips IPv6 loopback; link-local needs a scope, which we carry.
        IpAddr::V6(v) => !v.is_loopback() && !v.is_unspecified(),
    }
}

/// NCCL's choice of the side-channel address (pure). With `NCCL_SOCKET_IFNAME` set, the first
/// address whose interface passes the filter; otherwise, in order: `ib*`, then anything but
/// `docker*`/`lo`/`virbr*`, then those. Loopback is only used when nothing else exists or
/// when the filter asks for it.
pub fn select_interface(addrs: &[IfAddr], filter: Option<&DeviceFilter>, family: Option<AddrFamily>) -> Option<IfAddr> {
    let cands: Vec<&IfAddr> = addrs.iter().filter(|a| usable(a) && family_ok(&a.ip, family)).collect();
    if let Some(f) = filter {
        return cands.into_iter().find(|a| name_matches(f, &a.name)).cloned();
    }
    let is_virtual = |n: &str| n.starts_with("docker") || n == "lo" || n.starts_with("virbr");
    let passes: [&dyn Fn(&IfAddr) -> bool; 3] = [
        &|a: &IfAddr| a.name.starts_with("ib"),
        &|a: &IfAddr| !is_virtual(&a.name),
        &|a: &IfAddr| is_virtual(&a.name),
    ];
    for pass in passes {
        // IPv4 first within a pass, as NCCL's default family order does in practice.
        if let Some(a) = cands.iter().filter(|a| pass(a)).min_by_key(|a| a.ip.is_ipv6()) {
            return Some((*a).clone());
        }
    }
    None
}

/// Every address of every interface that is up (getifaddrs).
pub fn list_interfaces() -> Vec<IfAddr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: head is a valid out-pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as u32 == 0 {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string of the live list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr is non-NULL and its family says which sockaddr it is.
        let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        let (ip, scope_id) = match fam {
            libc::AF_INET => {
                // SAFETY: AF_INET → sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                (IpAddr::V4(u32::from_be(sin.sin_addr.s_addr).into()), 0)
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 → sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                (IpAddr::V6(sin6.sin6_addr.s6_addr.into()), sin6.sin6_scope_id)
            }
            _ => continue,
        };
        out.push(IfAddr { name, ip, scope_id });
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

static SIDE_CHANNEL_IF: OnceCell<IfAddr> = OnceCell::new();

/// The side-channel interface of this process, chosen once.
pub fn side_channel_interface() -> Result<&'static IfAddr> {
    SIDE_CHANNEL_IF.get_or_try_init(|| {
        let cfg = crate::config::get();
        let all = list_interfaces();
        let chosen = select_interface(&all, cfg.socket_ifname.as_ref(), cfg.socket_family).ok_or_else(|| {
            let names: Vec<String> = all.iter().map(|a| format!("{}={}", a.name, a.ip)).collect();
            Error::system(format!(
                "no IP interface for the connection side channel (NCCL_SOCKET_IFNAME={:?}, NCCL_SOCKET_FAMILY={:?}; interfaces: {})",
                std::env::var(crate::config::var::socket_ifname).ok(),
                cfg.socket_family,
                if names.is_empty() { "none".into() } else { names.join(", ") }
            ))
        })?;
        crate::log_info!(crate::log::subsys::INIT | crate::log::subsys::NET, "side channel on {} ({})", chosen.name, chosen.ip);
        Ok(chosen)
    })
}

/// A random nonzero id: a listener's nonce (so a stale or foreign handle is told apart from
/// ours), a process id, a link key. Unique, not secret.
pub fn random_nonzero() -> u64 {
    let mut v = 0u64;
    // SAFETY: writes at most 8 bytes into v.
    let n = unsafe { libc::getrandom(&mut v as *mut u64 as *mut libc::c_void, 8, 0) };
    if n != 8 {
        // Fall back to time and address entropy; uniqueness, not secrecy, is what matters.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        v = t ^ (&v as *const u64 as u64).rotate_left(32) ^ u64::from(std::process::id());
    }
    v | 1
}

// ---------------------------------------------------------------------------------------------
// Sockets
// ---------------------------------------------------------------------------------------------

/// The handle's form of a listener's socket address.
pub fn listen_addr(a: SocketAddr) -> ListenAddr {
    match a {
        SocketAddr::V4(a) => ListenAddr::V4 {
            ip: a.ip().octets(),
            port: a.port(),
        },
        SocketAddr::V6(a) => ListenAddr::V6 {
            ip: a.ip().octets(),
            port: a.port(),
            scope_id: a.scope_id(),
        },
    }
}

/// The socket address a handle names.
pub fn socket_addr(a: ListenAddr) -> SocketAddr {
    match a {
        ListenAddr::V4 { ip, port } => SocketAddr::new(IpAddr::V4(ip.into()), port),
        ListenAddr::V6 { ip, port, scope_id } => {
            SocketAddr::V6(std::net::SocketAddrV6::new(ip.into(), port, 0, scope_id))
        }
    }
}

/// A non-blocking listener on the side-channel interface, ephemeral port.
pub fn bind_listener(ifa: &IfAddr) -> Result<TcpListener> {
    let addr = match ifa.ip {
        IpAddr::V4(v) => SocketAddr::new(IpAddr::V4(v), 0),
        IpAddr::V6(v) => SocketAddr::V6(std::net::SocketAddrV6::new(v, 0, 0, ifa.scope_id)),
    };
    let l = TcpListener::bind(addr).map_err(|e| {
        Error::system(format!(
            "cannot listen on {} ({addr}): {e}{}",
            ifa.name,
            limit_suffix(&e)
        ))
    })?;
    l.set_nonblocking(true)
        .map_err(|e| Error::system(format!("listener O_NONBLOCK: {e}")))?;
    // Every listen comm of the process shares this listener, and NCCL connects a whole
    // communicator at once: std's backlog of 128 would drop the SYNs past it, which TCP sends
    // again only after a second. Listening again sets the backlog (the kernel caps it at
    // net.core.somaxconn).
    // SAFETY: listen(2) on the listener's own open socket; it reads no memory of ours.
    if unsafe { libc::listen(l.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
        let e = io::Error::last_os_error();
        return Err(Error::system(format!("listen backlog on {addr}: {e}")));
    }
    Ok(l)
}

/// The backlog of the process's listener: pending connects of one communicator's setup.
const LISTEN_BACKLOG: libc::c_int = 4096;

/// Accept one pending connection, if any.
pub fn try_accept(l: &TcpListener) -> Result<Option<Channel>> {
    match l.accept() {
        Ok((s, peer)) => {
            s.set_nonblocking(true)
                .map_err(|e| Error::system(format!("accepted socket O_NONBLOCK: {e}")))?;
            let _ = s.set_nodelay(true);
            Ok(Some(Channel::new(s, peer)))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => Ok(None),
        // A connection reset before we accepted it: nothing to do.
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(None),
        Err(e) => Err(Error::system(format!(
            "accept on the side channel failed: {e}{}",
            limit_suffix(&e)
        ))),
    }
}

fn sockaddr_of(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// Start a non-blocking TCP connect.
fn start_connect(addr: &SocketAddr) -> io::Result<TcpStream> {
    let fam = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own; TcpStream takes ownership and closes it.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let (ss, len) = sockaddr_of(addr);
    // SAFETY: ss holds a sockaddr of `len` bytes for the socket's family.
    let rc = unsafe { libc::connect(fd, &ss as *const _ as *const libc::sockaddr, len) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

fn poll_fd(fd: i32, events: i16) -> i16 {
    let mut p = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n <= 0 {
        0
    } else {
        p.revents
    }
}

/// Where a [`Connector`]'s current attempt is.
enum Attempt {
    /// No socket; the next attempt starts at `retry_at`.
    Waiting { retry_at: Instant },
    /// A non-blocking connect(2) in progress.
    Connecting(TcpStream),
}

/// A TCP connect that retries refused/unreachable attempts until a deadline, without blocking.
pub struct Connector {
    addr: SocketAddr,
    attempt: Attempt,
    attempts: u32,
    deadline: Instant,
    timeout: Duration,
    last_error: Option<io::Error>,
}

impl Connector {
    pub fn new(addr: SocketAddr, timeout: Duration) -> Connector {
        let now = Instant::now();
        Connector {
            addr,
            attempt: Attempt::Waiting { retry_at: now },
            attempts: 0,
            deadline: now + timeout,
            timeout,
            last_error: None,
        }
    }

    /// `Some(channel)` once connected; `None` while in progress; an error after the deadline.
    pub fn poll(&mut self) -> Result<Option<Channel>> {
        let now = Instant::now();
        let attempt = std::mem::replace(&mut self.attempt, Attempt::Waiting { retry_at: now });
        self.attempt = match attempt {
            Attempt::Connecting(s) => match self.check_connected(s, now) {
                Ok(s) => return Ok(Some(Channel::new(s, self.addr))),
                Err(next) => next,
            },
            waiting => waiting,
        };
        if now >= self.deadline {
            let why = self
                .last_error
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "no answer".into());
            return Err(Error::remote(format!(
                "cannot connect to the peer's side channel at {} within {:?} ({} attempts, last: {why}) — is the peer process alive, and is NCCL_SOCKET_IFNAME the same network on both hosts? (FERROCE_CONNECT_TIMEOUT_SEC sets the limit)",
                self.addr,
                self.timeout,
                self.attempts + 1
            )));
        }
        if let Attempt::Waiting { retry_at } = self.attempt {
            if now >= retry_at {
                self.attempt = match start_connect(&self.addr) {
                    Ok(s) => Attempt::Connecting(s),
                    // Out of descriptors: waiting for the deadline would not help.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        return Err(Error::system(format!(
                            "cannot open a socket to the peer's side channel at {}: {e}{}",
                            self.addr,
                            limit_suffix(&e)
                        )));
                    }
                    Err(e) => self.failed(e, now),
                };
            }
        }
        Ok(None)
    }

    /// `Ok`: the connect in progress on `s` succeeded; `Err`: the attempt to go on with.
    fn check_connected(&mut self, s: TcpStream, now: Instant) -> std::result::Result<TcpStream, Attempt> {
        let rev = poll_fd(s.as_raw_fd(), libc::POLLOUT);
        if rev == 0 {
            return Err(Attempt::Connecting(s));
        }
        let error = match s.take_error() {
            Ok(None) if rev & (libc::POLLERR | libc::POLLHUP) == 0 => return Ok(s),
            Ok(_) => io::Error::from_raw_os_error(libc::ECONNREFUSED),
            Err(e) => e,
        };
        let error = match s.take_error() {
            Ok(Some(e)) => e,
            _ => error,
        };
        Err(self.failed(error, now))
    }

    /// An attempt failed: wait a little longer after each failure before the next.
    fn failed(&mut self, e: io::Error, now: Instant) -> Attempt {
        self.attempts += 1;
        self.last_error = Some(e);
        Attempt::Waiting {
            retry_at: now + Duration::from_millis(100 * u64::from(self.attempts.min(10))),
        }
    }
}

/// Why a channel stopped.
#[derive(Debug)]
pub enum ChannelError {
    Io(io::Error),
    Closed,
    Wire(WireError),
}

impl std::fmt::Display for ChannelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelError::Io(e) => write!(f, "{e}"),
            ChannelError::Closed => write!(f, "connection closed by the peer"),
            ChannelError::Wire(e) => write!(f, "{e}"),
        }
    }
}

/// What [`Channel::peek`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peek {
    Nothing,
    Data,
    Gone,
}

/// A connected, non-blocking stream carrying framed [`Message`]s.
pub struct Channel {
    stream: TcpStream,
    pub peer: SocketAddr,
    reader: FrameReader,
    out: Vec<u8>,
    out_pos: usize,
    /// The connection's wire version: the connector's choice, which the listener takes from
    /// the first frame; `None` on a listener before it.
    version: Option<u16>,
}

impl Channel {
    fn new(stream: TcpStream, peer: SocketAddr) -> Channel {
        Channel {
            stream,
            peer,
            reader: FrameReader::default(),
            out: Vec::new(),
            out_pos: 0,
            version: None,
        }
    }

    /// The connector's negotiated wire version, set before its first message.
    pub fn set_version(&mut self, v: u16) {
        self.version = Some(v);
    }

    /// The connection's wire version (the oldest before it is known: what a refusal to an
    /// unidentified peer is written in).
    pub fn version(&self) -> u16 {
        self.version.unwrap_or(OLDEST_WIRE_VERSION)
    }

    pub fn queue(&mut self, m: &Message) {
        m.emit(self.version(), &mut self.out);
    }

    /// Write what the socket takes now; `Ok(true)` when everything queued is sent.
    pub fn flush(&mut self) -> std::result::Result<bool, ChannelError> {
        while self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(ChannelError::Closed),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ChannelError::Io(e)),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(true)
    }

    /// Setup is over: give back the buffers' memory (a few hundred bytes a comm). What is
    /// still queued or half read is kept.
    pub fn release_buffers(&mut self) {
        if self.out_pos >= self.out.len() {
            self.out = Vec::new();
            self.out_pos = 0;
        }
        self.reader.release_buffer();
    }

    /// The next whole message if one has arrived.
    pub fn poll_recv(&mut self) -> std::result::Result<Option<Message>, ChannelError> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(f) = self.reader.poll_message().map_err(ChannelError::Wire)? {
                // Every frame of a connection is of the version its first one set.
                if *self.version.get_or_insert(f.version) != f.version {
                    return Err(ChannelError::Wire(WireError::BadVersion(f.version)));
                }
                return Ok(Some(f.message));
            }
            let want = self.reader.want().min(buf.len());
            match self.stream.read(&mut buf[..want]) {
                Ok(0) => return Err(ChannelError::Closed),
                Ok(n) => self.reader.handle_bytes(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ChannelError::Io(e)),
            }
        }
    }

    /// Whether the peer closed or died (EOF, reset), or sent something (after setup only a
    /// recovery message, read with [`Channel::poll_recv`]). One `recv(MSG_PEEK | MSG_DONTWAIT)`.
    pub fn peek(&self) -> Peek {
        let mut b = [0u8; 1];
        // SAFETY: valid fd and a 1-byte buffer.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => Peek::Gone,
            n if n > 0 => Peek::Data,
            _ => {
                let e = io::Error::last_os_error();
                if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) {
                    Peek::Nothing
                } else {
                    Peek::Gone
                }
            }
        }
    }

    /// The peer closed or died.
    pub fn peer_gone(&self) -> bool {
        self.peek() == Peek::Gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(name: &str, ip: &str) -> IfAddr {
        IfAddr {
            name: name.into(),
            ip: ip.parse().unwrap(),
            scope_id: 0,
        }
    }

    #[test]
    fn auto_order() {
        let all = vec![
            a("lo", "127.0.0.1"),
            a("docker0", "172.17.0.1"),
            a("eth0", "10.0.0.5"),
            a("ib0", "192.168.1.5"),
        ];
        assert_eq!(select_interface(&all, None, None).unwrap().name, "ib0");
        assert_eq!(select_interface(&all[..3], None, None).unwrap().name, "eth0");
        assert_eq!(select_interface(&all[..2], None, None).unwrap().name, "lo");
        assert_eq!(
            select_interface(&all[..1], None, None).unwrap().name,
            "lo",
            "loopback only when nothing else exists"
        );
        assert_eq!(select_interface(&[], None, None), None);
        // IPv6 loopback is never used.
        assert_eq!(select_interface(&[a("lo", "::1")], None, None), None);
    }

    #[test]
    fn filters() {
        let all = vec![
            a("lo", "127.0.0.1"),
            a("eth0", "10.0.0.5"),
            a("eth10", "10.0.1.5"),
            a("eth1", "fd00::5"),
        ];
        let f = |s: &str| DeviceFilter::parse(s).unwrap();
        assert_eq!(select_interface(&all, Some(&f("lo")), None).unwrap().name, "lo");
        assert_eq!(
            select_interface(&all, Some(&f("=eth1")), None).unwrap().ip,
            "fd00::5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            select_interface(&all, Some(&f("eth1")), None).unwrap().name,
            "eth10",
            "prefix match"
        );
        assert_eq!(
            select_interface(&all, Some(&f("^lo,eth0")), None).unwrap().name,
            "eth10"
        );
        assert_eq!(
            select_interface(&all, Some(&f("^=eth0,lo")), None).unwrap().name,
            "eth10"
        );
        assert_eq!(
            select_interface(&all, None, Some(AddrFamily::Inet6)).unwrap().name,
            "eth1"
        );
        assert_eq!(select_interface(&all, Some(&f("nope")), None), None);
    }

    #[test]
    fn handle_addresses_round_trip() {
        for a in ["127.0.40.1:45678", "[fe80::1%3]:1000", "[fd00::5]:7"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(socket_addr(listen_addr(a)), a);
        }
    }

    #[test]
    fn channel_round_trip_and_peer_gone() {
        let ifa = a("lo", "127.0.0.1");
        let l = bind_listener(&ifa).unwrap();
        let addr = l.local_addr().unwrap();
        let mut c = Connector::new(addr, Duration::from_secs(5));
        let mut client = None;
        let mut server = None;
        let t0 = Instant::now();
        while client.is_none() || server.is_none() {
            if client.is_none() {
                client = c.poll().unwrap();
            }
            if server.is_none() {
                server = try_accept(&l).unwrap();
            }
            assert!(t0.elapsed() < Duration::from_secs(5));
        }
        let (mut client, mut server) = (client.unwrap(), server.unwrap());
        client.queue(&Message::Ready { nonce: 42 });
        while !client.flush().unwrap() {}
        let m = loop {
            if let Some(m) = server.poll_recv().unwrap() {
                break m;
            }
        };
        assert_eq!(m, Message::Ready { nonce: 42 });
        assert!(!server.peer_gone());
        drop(client);
        let t0 = Instant::now();
        while !server.peer_gone() {
            assert!(t0.elapsed() < Duration::from_secs(5));
        }
    }

    #[test]
    fn connect_gives_up_after_deadline() {
        // A port nobody listens on (bind then drop to get one).
        let ifa = a("lo", "127.0.0.1");
        let addr = bind_listener(&ifa).unwrap().local_addr().unwrap();
        let mut c = Connector::new(addr, Duration::from_millis(300));
        let t0 = Instant::now();
        let err = loop {
            match c.poll() {
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                Ok(Some(_)) => panic!("nobody listens there"),
                Err(e) => break e,
            }
        };
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(t0.elapsed() < Duration::from_secs(3));
        assert_eq!(err.kind, crate::error::ErrorKind::Remote);
        assert!(err.message.contains("cannot connect"), "{}", err.message);
    }
}

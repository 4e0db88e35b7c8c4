//! The side-channel links this process shares with its peer processes (the I/O around
//! [`proto::link`](super::proto::link), which says what links are and how both ends choose).
//!
//! A [`Link`] is one TCP connection and the comms on it; whichever comm looks at its side
//! channel reads the link under the link's lock and files every frame for the comm it names
//! (no thread of our own: see `watch`). A comm holds a [`Port`]: its route on the link.
//! The process keeps weak references to its links (a link closes with the last comm or
//! connect that holds it) and, per peer process, what it knows of its link to it.
//! [`SideChannel`] is what a connection holds: a port, or a connection of its own (a peer of
//! wire version 5 or older, a comm to this same process, or a listener that keeps comms
//! apart).

use super::proto::handshake::{Message, Route, WireError};
use super::proto::link::{self, PeerLink, Plan, PortState, Router};
use super::proto::time::Time;
use super::sidechannel::{Channel, ChannelError, Peek};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Why a link ended (kept to tell every comm on it).
#[derive(Clone, Debug)]
enum LinkEnd {
    Closed,
    Io(io::ErrorKind, String),
    Wire(WireError),
}

impl LinkEnd {
    fn of(e: ChannelError) -> LinkEnd {
        match e {
            ChannelError::Closed => LinkEnd::Closed,
            ChannelError::Io(e) => LinkEnd::Io(e.kind(), e.to_string()),
            ChannelError::Wire(w) => LinkEnd::Wire(w),
        }
    }

    fn error(&self) -> ChannelError {
        match self {
            LinkEnd::Closed => ChannelError::Closed,
            LinkEnd::Io(kind, text) => ChannelError::Io(io::Error::new(*kind, text.clone())),
            LinkEnd::Wire(w) => ChannelError::Wire(w.clone()),
        }
    }
}

/// One TCP connection shared by the comms between this process and one other.
pub struct Link {
    key: u64,
    /// The peer process's id.
    process: u64,
    peer: SocketAddr,
    version: u16,
    /// Set once `io.end` is: lets the registry skip an ended link without its lock.
    ended: AtomicBool,
    io: Mutex<LinkIo>,
}

struct LinkIo {
    chan: Channel,
    router: Router,
    end: Option<LinkEnd>,
}

impl LinkIo {
    fn finish(&mut self, e: ChannelError, ended: &AtomicBool) {
        if self.end.is_none() {
            self.end = Some(LinkEnd::of(e));
            ended.store(true, Ordering::Release);
        }
    }

    /// Send what is queued, then read every whole frame that arrived and file it.
    fn pump(&mut self, ended: &AtomicBool) {
        if self.end.is_some() {
            return;
        }
        if let Err(e) = self.chan.flush() {
            return self.finish(e, ended);
        }
        loop {
            match self.chan.poll_recv() {
                Ok(Some(m)) => {
                    if let Err(w) = self.router.handle_message(m) {
                        return self.finish(ChannelError::Wire(w), ended);
                    }
                }
                Ok(None) => return,
                Err(e) => return self.finish(e, ended),
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        crate::log_info!(
            crate::log::subsys::NET,
            "side-channel link {:#x} with {} closed (no comm uses it)",
            self.key,
            self.peer
        );
    }
}

/// A comm's place on a link.
pub struct Port {
    link: Arc<Link>,
    local: Route,
    /// The peer's address of the comm's own setup connection: what its logs name (the same
    /// as without a link).
    peer: SocketAddr,
}

impl Port {
    fn new(link: Arc<Link>, local: Route, peer: SocketAddr) -> Port {
        link.io.lock().router.open(local);
        Port { link, local, peer }
    }

    /// Join `link` as the comm the connector numbered `comm` (`recv`: the recv comm), set up
    /// over a connection with `peer`.
    pub fn attach(link: Arc<Link>, comm: u64, recv: bool, peer: SocketAddr) -> Port {
        Port::new(link, link::local_route(comm, recv), peer)
    }

    fn peek(&self) -> Peek {
        let mut io = self.link.io.lock();
        io.pump(&self.link.ended);
        match (io.router.state(self.local), &io.end) {
            (PortState::Data | PortState::Flooded, _) => Peek::Data,
            // A malformed frame: `poll_recv` reports it (not just "gone").
            (_, Some(LinkEnd::Wire(_))) => Peek::Data,
            (PortState::Closed, _) | (PortState::Nothing, Some(_)) => Peek::Gone,
            (PortState::Nothing, None) => Peek::Nothing,
        }
    }

    fn poll_recv(&mut self) -> Result<Option<Message>, ChannelError> {
        let mut io = self.link.io.lock();
        io.pump(&self.link.ended);
        match io.router.state(self.local) {
            PortState::Flooded => Err(ChannelError::Wire(WireError::BadField(
                "more recovery messages for one comm than a recovery sends",
            ))),
            PortState::Data => Ok(io.router.take(self.local)),
            _ if matches!(io.end, Some(LinkEnd::Wire(_))) => {
                Err(io.end.as_ref().map_or(ChannelError::Closed, LinkEnd::error))
            }
            PortState::Closed => Err(ChannelError::Closed),
            PortState::Nothing => match &io.end {
                Some(e) => Err(e.error()),
                None => Ok(None),
            },
        }
    }

    fn queue(&mut self, m: &Message) {
        let mut io = self.link.io.lock();
        if io.end.is_none() {
            io.chan.queue(&Message::OnComm {
                route: link::peer_route(self.local),
                message: Box::new(m.clone()),
            });
        }
    }

    fn flush(&mut self) -> Result<bool, ChannelError> {
        let mut io = self.link.io.lock();
        if let Some(e) = &io.end {
            return Err(e.error());
        }
        io.chan.flush().map_err(|e| {
            let error = LinkEnd::of(e);
            io.finish(error.error(), &self.link.ended);
            error.error()
        })
    }
}

impl Drop for Port {
    /// Tell the other end its comm's peer is gone (what closing a connection of its own did).
    fn drop(&mut self) {
        let mut io = self.link.io.lock();
        let bye = io.router.close(self.local);
        if io.end.is_none() {
            io.chan.queue(&bye);
            if let Err(e) = io.chan.flush() {
                io.finish(e, &self.link.ended);
            }
        }
    }
}

/// A connection's side channel after setup.
pub enum SideChannel {
    /// A TCP connection of its own.
    Own(Channel),
    /// A route on a link shared with the other comms between the two processes.
    Shared(Port),
}

impl SideChannel {
    /// The peer's side-channel address.
    pub fn peer(&self) -> SocketAddr {
        match self {
            SideChannel::Own(c) => c.peer,
            SideChannel::Shared(p) => p.peer,
        }
    }

    /// The connection's wire version.
    pub fn version(&self) -> u16 {
        match self {
            SideChannel::Own(c) => c.version(),
            SideChannel::Shared(p) => p.link.version,
        }
    }

    /// Whether the peer closed the comm or died, or sent something (read with `poll_recv`).
    pub fn peek(&self) -> Peek {
        match self {
            SideChannel::Own(c) => c.peek(),
            SideChannel::Shared(p) => p.peek(),
        }
    }

    /// The comm's next whole message, if one arrived.
    pub fn poll_recv(&mut self) -> Result<Option<Message>, ChannelError> {
        match self {
            SideChannel::Own(c) => c.poll_recv(),
            SideChannel::Shared(p) => p.poll_recv(),
        }
    }

    pub fn queue(&mut self, m: &Message) {
        match self {
            SideChannel::Own(c) => c.queue(m),
            SideChannel::Shared(p) => p.queue(m),
        }
    }

    /// Write what the socket takes now; `Ok(true)` when everything queued is sent.
    pub fn flush(&mut self) -> Result<bool, ChannelError> {
        match self {
            SideChannel::Own(c) => c.flush(),
            SideChannel::Shared(p) => p.flush(),
        }
    }

    /// Whether the comm shares a link.
    pub fn shared(&self) -> bool {
        matches!(self, SideChannel::Shared(_))
    }
}

// ---------------------------------------------------------------------------------------------
// The process's links
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Registry {
    links: HashMap<u64, Weak<Link>>,
    peers: HashMap<u64, PeerLink>,
}

static LINKS: Lazy<Mutex<Registry>> = Lazy::new(Default::default);
static NEXT_COMM: AtomicU64 = AtomicU64::new(1);

/// This process's id on links: random, never 0 (a restarted peer is another process).
pub fn process_id() -> u64 {
    static ID: Lazy<u64> = Lazy::new(super::sidechannel::random_nonzero);
    *ID
}

/// A fresh id for a comm this process connects (never 0).
pub fn next_comm_id() -> u64 {
    NEXT_COMM.fetch_add(1, Ordering::Relaxed)
}

/// A fresh link key (never 0).
pub fn new_key() -> u64 {
    super::sidechannel::random_nonzero()
}

fn live(links: &HashMap<u64, Weak<Link>>, key: u64, process: u64) -> Option<Arc<Link>> {
    links
        .get(&key)
        .and_then(Weak::upgrade)
        .filter(|l| l.process == process && !l.ended.load(Ordering::Acquire))
}

/// The link `key` with `process`, if it is open.
pub fn attachable(key: u64, process: u64) -> Option<Arc<Link>> {
    live(&LINKS.lock().links, key, process)
}

/// A connect's choice for a link to `process` at `now`. `Attach` comes with the link (held, so
/// it stays open while the connect uses it); `Found` marks the founding as `ticket`'s, undone
/// by dropping the [`FoundingMark`] unless [`found`] or [`keeps_own`] came first.
pub fn plan_connect(process: u64, ticket: u64, now: Time) -> (Plan, Option<Arc<Link>>, Option<FoundingMark>) {
    let mut reg = LINKS.lock();
    let mut peer = reg.peers.get(&process).copied().unwrap_or(PeerLink::None);
    if let PeerLink::Live { key } = peer {
        if let Some(l) = live(&reg.links, key, process) {
            return (Plan::Attach { key }, Some(l), None);
        }
        peer = PeerLink::None;
    }
    let plan = link::plan(peer, now);
    if plan == Plan::Found {
        reg.peers.insert(process, PeerLink::Founding { ticket, since: now });
        return (plan, None, Some(FoundingMark { process, ticket }));
    }
    (plan, None, None)
}

/// A founding in progress; dropped unfinished (the connect failed or was abandoned), it
/// lets the next connect to that process found the link.
pub struct FoundingMark {
    process: u64,
    ticket: u64,
}

impl Drop for FoundingMark {
    fn drop(&mut self) {
        let mut reg = LINKS.lock();
        // `found` and `keeps_own` replace the mark: then this is no longer ours to undo.
        if matches!(reg.peers.get(&self.process), Some(PeerLink::Founding { ticket, .. }) if *ticket == self.ticket) {
            reg.peers.remove(&self.process);
        }
    }
}

/// The listener keeps each comm on a connection of its own: connects to it stop waiting.
pub fn keeps_own(process: u64) {
    LINKS.lock().peers.insert(process, PeerLink::Own);
}

/// The setup connection `chan` becomes the link `key` with `process`; the comm the connector
/// numbered `comm` is its first (`recv`: the recv comm, at the listener). Later connects of
/// this process to `process` attach to it.
pub fn found(chan: Channel, key: u64, process: u64, comm: u64, recv: bool) -> Port {
    let peer = chan.peer;
    let version = chan.version();
    let link = Arc::new(Link {
        key,
        process,
        peer,
        version,
        ended: AtomicBool::new(false),
        io: Mutex::new(LinkIo {
            chan,
            router: Router::default(),
            end: None,
        }),
    });
    {
        let mut reg = LINKS.lock();
        reg.links.retain(|_, l| l.strong_count() > 0);
        reg.links.insert(key, Arc::downgrade(&link));
        reg.peers.insert(process, PeerLink::Live { key });
    }
    crate::log_info!(
        crate::log::subsys::NET,
        "side-channel link {key:#x} with {peer}: the comms between this process and that one share it"
    );
    Port::new(link, link::local_route(comm, recv), peer)
}

/// Links of this process that are open (for tests and `--stats`).
pub fn open_links() -> usize {
    LINKS.lock().links.values().filter(|l| l.strong_count() > 0).count()
}

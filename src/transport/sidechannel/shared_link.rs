//! The side-channel links this process shares with its peer processes (the I/O around
//! [`proto::link`](crate::transport::proto::link), which says what links are and how both ends choose).
//!
//! A [`Link`] is one TCP connection and the comms on it; whichever comm looks at its side
//! channel reads the link under the link's lock and files every frame for the comm it names
//! (no thread of our own: see `datapath::watch`). A comm holds a [`Port`]: its route on the link.
//! The process keeps weak references to its links (a link closes with the last comm or
//! connect that holds it) and, per peer process, what it knows of its link to it.
//! [`SideChannel`] is what a connection holds: a port, or a connection of its own (a peer of
//! wire version 5 or older, a comm to this same process, or a listener that keeps comms
//! apart).

use super::{Channel, ChannelError, Peek};
use crate::transport::proto::handshake::{EndpointRepr, Message, Route, WireError};
use crate::transport::proto::link::{self, PeerLink, Plan, PortState, Router};
use crate::transport::proto::setup::reject;
use crate::transport::proto::time::Time;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Why a link ended (kept to tell every comm on it).
#[derive(Clone, Debug)]
enum LinkEnd {
    Closed,
    Io(io::ErrorKind, String),
    Wire(WireError),
}

impl LinkEnd {
    fn of(e: &ChannelError) -> LinkEnd {
        match e {
            ChannelError::Closed => LinkEnd::Closed,
            ChannelError::Io(e) => LinkEnd::Io(e.kind(), e.to_string()),
            ChannelError::Wire(w) => LinkEnd::Wire(w.clone()),
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
    fn finish(&mut self, e: &ChannelError, ended: &AtomicBool) {
        if self.end.is_none() {
            self.end = Some(LinkEnd::of(e));
            ended.store(true, Ordering::Release);
        }
    }

    /// Send what is queued, then read every whole frame that arrived and file it: a new
    /// comm's request for its listen comm (`link` is this one's).
    fn pump(&mut self, link: &Arc<Link>) {
        if self.end.is_some() {
            return;
        }
        if let Err(e) = self.chan.flush() {
            return self.finish(&e, &link.ended);
        }
        loop {
            match self.chan.poll_recv() {
                Ok(Some(m)) => match self.router.handle_message(m) {
                    Ok(None) => {}
                    Ok(Some((route, req))) => self.file_request(link, route, req),
                    Err(w) => return self.finish(&ChannelError::Wire(w), &link.ended),
                },
                Ok(None) => break,
                Err(e) => return self.finish(&e, &link.ended),
            }
        }
        // A burst of setups grows the buffers; between them the link keeps none.
        self.chan.release_buffers();
    }

    /// A connect's request that came on the link: for its listen comm to take, or refused now
    /// when no listen comm of this process has its nonce (a stale or foreign handle).
    fn file_request(&mut self, link: &Arc<Link>, route: Route, req: EndpointRepr) {
        let mut waiting = REQUESTS.lock();
        let refusal = match waiting.get_mut(&req.nonce) {
            Some(q) if q.len() < MAX_REQUESTS => {
                q.push_back(LinkRequest {
                    link: Arc::clone(link),
                    route,
                    req,
                });
                return;
            }
            Some(_) => (reject::BUSY, "too many connection requests waiting for this listener"),
            None => (
                reject::NONCE_MISMATCH,
                "no listener of this process has that handle's nonce (a stale or foreign handle, or the listen comm was closed)",
            ),
        };
        drop(waiting);
        self.refuse(route, refusal);
    }

    /// Answer the comm `route` names with a `Reject` and forget it.
    fn refuse(&mut self, route: Route, (code, text): (u32, &str)) {
        self.chan.queue(&Message::OnComm {
            route: link::peer_route(route),
            message: Box::new(Message::Reject {
                code,
                text: text.into(),
            }),
        });
        let _ = self.router.close(route);
    }
}

impl Link {
    /// The peer's address of the connection that became the link.
    pub fn peer(&self) -> SocketAddr {
        self.peer
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
        io.pump(&self.link);
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
        io.pump(&self.link);
        match (io.router.state(self.local), &io.end) {
            (PortState::Flooded, _) => Err(ChannelError::Wire(WireError::BadField(
                "more recovery messages for one comm than a recovery sends",
            ))),
            (PortState::Data, _) => Ok(io.router.take(self.local)),
            // A malformed frame is reported before "closed".
            (_, Some(e @ LinkEnd::Wire(_))) | (PortState::Nothing, Some(e)) => Err(e.error()),
            (PortState::Closed, _) => Err(ChannelError::Closed),
            (PortState::Nothing, None) => Ok(None),
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
        let sent = io.chan.flush();
        if let Err(e) = &sent {
            io.finish(e, &self.link.ended);
        }
        sent
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
                io.finish(&e, &self.link.ended);
            }
        }
    }
}

/// What a comm's side channel becomes once its handshake is over (the outcome of its link
/// offer, `proto::link::Outcome`).
pub(crate) enum Joining {
    /// The comm's port on a link (held from the answer on).
    Attached(Port),
    /// The setup connection becomes the link of this key.
    Founded(u64),
    /// The setup channel stays the comm's: a connection of its own, or its port on the link
    /// it was set up over.
    Keep,
}

impl Joining {
    /// The comm's side channel, its handshake done over `setup`: with the peer process
    /// `process`, the connector's comm id `comm`, `recv` at the recv comm.
    pub(crate) fn side_channel(self, setup: SideChannel, process: u64, comm: u64, recv: bool) -> SideChannel {
        match (self, setup) {
            (Joining::Attached(port), _) => SideChannel::Shared(port),
            (Joining::Founded(key), SideChannel::Own(c)) => SideChannel::Shared(found(c, key, process, comm, recv)),
            // (Only a setup connection of its own is offered or answered as a founding.)
            (Joining::Founded(_) | Joining::Keep, chan) => chan,
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

    /// Whether this is a port on a link that ended (its peer process closed it or died).
    pub fn link_ended(&self) -> bool {
        matches!(self, SideChannel::Shared(p) if p.link.ended.load(Ordering::Acquire))
    }

    /// The key of the link the comm shares, if it does.
    pub fn link_key(&self) -> Option<u64> {
        match self {
            SideChannel::Own(_) => None,
            SideChannel::Shared(p) => Some(p.link.key),
        }
    }

    /// The connector's wire version on a connection of its own, set before its first message
    /// (a link runs the version it was founded with).
    pub fn set_version(&mut self, v: u16) {
        if let SideChannel::Own(c) = self {
            c.set_version(v);
        }
    }

    /// Setup is over: a connection of its own gives back its buffers' memory.
    pub fn release_buffers(&mut self) {
        if let SideChannel::Own(c) = self {
            c.release_buffers();
        }
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
pub(crate) fn process_id() -> u64 {
    static ID: Lazy<u64> = Lazy::new(super::random_nonzero);
    *ID
}

/// A fresh id for a comm this process connects (never 0).
pub(crate) fn next_comm_id() -> u64 {
    NEXT_COMM.fetch_add(1, Ordering::Relaxed)
}

/// A fresh link key (never 0).
pub(crate) fn new_key() -> u64 {
    super::random_nonzero()
}

fn live(links: &HashMap<u64, Weak<Link>>, key: u64, process: u64) -> Option<Arc<Link>> {
    links
        .get(&key)
        .and_then(Weak::upgrade)
        .filter(|l| l.process == process && !l.ended.load(Ordering::Acquire))
}

/// The link `key` with `process`, if it is open.
pub(crate) fn attachable(key: u64, process: u64) -> Option<Arc<Link>> {
    live(&LINKS.lock().links, key, process)
}

/// A connect's choice for a link to `process` at `now`. `Attach` comes with the link (held, so
/// it stays open while the connect uses it); `Found` marks the founding as `ticket`'s, undone
/// by dropping the [`FoundingMark`] unless [`found`] or [`keeps_own`] came first.
pub(crate) fn plan_connect(process: u64, ticket: u64, now: Time) -> (Plan, Option<Arc<Link>>, Option<FoundingMark>) {
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
pub(crate) struct FoundingMark {
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
pub(crate) fn keeps_own(process: u64) {
    LINKS.lock().peers.insert(process, PeerLink::Own);
}

/// The setup connection `chan` becomes the link `key` with `process`; the comm the connector
/// numbered `comm` is its first (`recv`: the recv comm, at the listener). Later connects of
/// this process to `process` attach to it.
pub(crate) fn found(chan: Channel, key: u64, process: u64, comm: u64, recv: bool) -> Port {
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

/// A connect's request that came on a link, for the listen comm its nonce names.
struct LinkRequest {
    link: Arc<Link>,
    route: Route,
    req: EndpointRepr,
}

/// Requests waiting per listen comm (its nonce): the ones NCCL has not accepted yet.
static REQUESTS: Lazy<Mutex<HashMap<u64, VecDeque<LinkRequest>>>> = Lazy::new(Default::default);
/// The most requests one listen comm keeps waiting, on links and at the process's listener
/// alike (NCCL connects once per handle).
pub(crate) const MAX_REQUESTS: usize = 64;

/// A listen comm with this nonce takes requests that come on links.
pub(crate) fn listen_on(nonce: u64) {
    REQUESTS.lock().entry(nonce).or_default();
}

/// The listen comm of `nonce` closed: its waiting requests are refused.
pub(crate) fn unlisten(nonce: u64) {
    let waiting = {
        let mut all = REQUESTS.lock();
        let mine = all.remove(&nonce).unwrap_or_default();
        // NCCL closes a listen comm once accepted: after a burst, give the table back.
        if all.len() * 4 < all.capacity() {
            all.shrink_to_fit();
        }
        mine
    };
    for r in waiting {
        let mut io = r.link.io.lock();
        io.refuse(
            r.route,
            (reject::NONCE_MISMATCH, "the listen comm closed before it accepted"),
        );
        let _ = io.chan.flush();
    }
}

/// Read every link of the process that no one holds now (at most once per
/// [`ACCEPT_ROUND`](crate::transport::clock::ACCEPT_ROUND)):
/// requests for a listen comm arrive on any of them. Called by a listen comm's accept.
pub(crate) fn pump_links() {
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    if !LAST
        .try_lock()
        .is_some_and(|mut last| crate::transport::clock::due(&mut last, crate::transport::clock::ACCEPT_ROUND))
    {
        return;
    }
    let links: Vec<Arc<Link>> = LINKS.lock().links.values().filter_map(Weak::upgrade).collect();
    for l in &links {
        if let Some(mut io) = l.io.try_lock() {
            io.pump(l);
        }
    }
}

/// The next request that came on a link for the listen comm of `nonce`: the new comm's port
/// (open since the request came) and the request.
pub(crate) fn take_request(nonce: u64) -> Option<(Port, EndpointRepr)> {
    let r = REQUESTS.lock().get_mut(&nonce)?.pop_front()?;
    let peer = r.link.peer;
    Some((Port::new(r.link, r.route, peer), r.req))
}

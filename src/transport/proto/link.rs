//! One side-channel link per pair of processes (wire version 6): the comms between two
//! processes share one TCP connection instead of holding one each, so file descriptors grow
//! with peers, not with comms (NCCL's all-to-all over several channels makes thousands of
//! comms). Pure: what the link's frames mean and the choices of both ends; the sockets are
//! `transport::link`'s.
//!
//! * A connect whose process has no link to the listener's process *founds* one: its own
//!   setup connection stays open as the link once the handshake is done. While a founding is
//!   in progress, other connects to that process wait for it (at most [`FOUNDING_WAIT`], then
//!   they found their own), so a burst of connects makes one link.
//! * A connect whose process has a link *attaches* to it: its handshake travels on the link
//!   (`ConnectReq` in an `OnComm` frame under the new comm's route, filed for the listen comm
//!   its nonce names), so it opens no socket. Should the link end before the answer, the
//!   connect founds a link of its own instead. A request on a connection of its own (from an
//!   older build of the plan, or a peer that lost its link) may still ask to attach: the
//!   listener attaches only to a link it has with that process and that is open; else the
//!   connection becomes a new link (the connector's `found` key) — never an error.
//! * After setup a comm's messages (recovery) travel on the link as `OnComm` frames named by
//!   a [`Route`]: the connector's id of the comm and which end receives. Closing a comm sends
//!   `CommClosed`, which the other end's comm reports as "the peer closed" at once, as a
//!   closed TCP connection of its own did before; the link ending (the peer process died)
//!   ends every comm on it.
//! * Ids: a connector numbers its comms; a frame to a recv comm names an id of the sending
//!   process, one to a send comm an id of the receiving process, so the ids of both
//!   directions on one link never collide.

use super::handshake::{EndpointRepr, LinkOffer, Message, Route, WireError};
use super::time::Time;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// The longest a connect waits for another connect of its process to found the link to the
/// same process before it founds one itself (that founding may wait on a listen comm its
/// peer does not accept yet).
pub const FOUNDING_WAIT: Duration = Duration::from_secs(1);

/// Messages a comm may have waiting on its link before the peer counts as misbehaving (a
/// recovery exchanges two per epoch).
pub const INBOX_LIMIT: usize = 64;

/// The route a comm's frames arrive with: `recv` says whether it is a recv comm.
pub fn local_route(comm: u64, recv: bool) -> Route {
    Route { comm, to_recv: recv }
}

/// The route the frames a comm sends carry (they arrive at the other end's comm).
pub fn peer_route(local: Route) -> Route {
    Route {
        comm: local.comm,
        to_recv: !local.to_recv,
    }
}

/// What a comm on a link sees now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// Nothing waiting.
    Nothing,
    /// A message waiting.
    Data,
    /// The other end closed the comm (and every message before that was taken).
    Closed,
    /// More than [`INBOX_LIMIT`] messages arrived untaken.
    Flooded,
}

#[derive(Debug, Default)]
struct Inbox {
    messages: VecDeque<Message>,
    closed: bool,
    flooded: bool,
}

/// The comms of one link at this end and what arrived for them.
#[derive(Debug, Default)]
pub struct Router {
    inboxes: HashMap<Route, Inbox>,
}

impl Router {
    /// A comm joins this end of the link.
    pub fn open(&mut self, local: Route) {
        self.inboxes.entry(local).or_default();
    }

    /// A comm of this end closed: what to tell the other end.
    pub fn close(&mut self, local: Route) -> Message {
        self.inboxes.remove(&local);
        // Give back the table of a burst of comms once most have closed.
        if self.inboxes.len() * 4 < self.inboxes.capacity() {
            self.inboxes.shrink_to_fit();
        }
        Message::CommClosed {
            route: peer_route(local),
        }
    }

    #[cfg(any(test, feature = "testing"))]
    /// Comms open at this end.
    pub fn comms(&self) -> usize {
        self.inboxes.len()
    }

    /// A frame read off the link: `Some` for a new comm's `ConnectReq` (the comm is open from
    /// then on, for the listen comm the request's nonce names to take or refuse). Other frames
    /// for a comm this end does not have (closed here, its peer not told yet) are dropped; a
    /// message that is not a link frame is an error, and the link is then unusable.
    pub fn handle_message(&mut self, m: Message) -> Result<Option<(Route, EndpointRepr)>, WireError> {
        match m {
            Message::OnComm { route, message } => {
                match (self.inboxes.get_mut(&route), *message) {
                    (None, Message::ConnectReq(req)) => {
                        self.open(route);
                        return Ok(Some((route, req)));
                    }
                    (None, _) => {}
                    (Some(inbox), _) if inbox.messages.len() >= INBOX_LIMIT => inbox.flooded = true,
                    (Some(inbox), m) => inbox.messages.push_back(m),
                }
                Ok(None)
            }
            Message::CommClosed { route } => {
                if let Some(inbox) = self.inboxes.get_mut(&route) {
                    inbox.closed = true;
                }
                Ok(None)
            }
            _ => Err(WireError::BadField("a message outside any comm on a shared link")),
        }
    }

    /// The comm's state: messages first, then its close.
    pub fn state(&self, local: Route) -> PortState {
        match self.inboxes.get(&local) {
            None => PortState::Closed,
            Some(i) if i.flooded => PortState::Flooded,
            Some(i) if !i.messages.is_empty() => PortState::Data,
            Some(i) if i.closed => PortState::Closed,
            Some(_) => PortState::Nothing,
        }
    }

    /// The comm's next message.
    pub fn take(&mut self, local: Route) -> Option<Message> {
        let messages = &mut self.inboxes.get_mut(&local)?.messages;
        let m = messages.pop_front();
        // Messages come in a setup and in recoveries only: an empty inbox keeps no memory.
        if messages.is_empty() {
            *messages = VecDeque::new();
        }
        m
    }
}

/// What a process knows of its links to one peer process (the connector's view).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerLink {
    /// No link, nor one being founded.
    None,
    /// A connect (`ticket`) founds one, since `since`.
    Founding { ticket: u64, since: Time },
    /// An open link.
    Live { key: u64 },
    /// The peer keeps each comm on a connection of its own (it answered so).
    Own,
}

/// What a connect does about the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Ask to attach to this link (and to found one if the listener has not got it).
    Attach { key: u64 },
    /// Ask to found a link.
    Found,
    /// Another connect founds the link: ask again later.
    Wait,
}

/// The connector's choice at `now`.
pub fn plan(peer: PeerLink, now: Time) -> Plan {
    match peer {
        PeerLink::Live { key } => Plan::Attach { key },
        PeerLink::Founding { since, .. } if now.saturating_since(since) < FOUNDING_WAIT => Plan::Wait,
        PeerLink::None | PeerLink::Founding { .. } | PeerLink::Own => Plan::Found,
    }
}

/// How a connection's side channel ended up, as both ends agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The comm joined the link `key`; its setup connection closes.
    Attached { key: u64 },
    /// The setup connection becomes the link `key`.
    Founded { key: u64 },
    /// The setup connection stays the comm's own.
    Own,
}

/// The listener's answer to a request's offer. `attachable`: it has the open link the offer asks to
/// attach to, with the offering process. `share`: it takes part in links (wire version 6 on). A comm
/// within one process keeps its own connection (both ends of a link would be this process's).
pub fn answer(asked: &LinkOffer, own_process: u64, share: bool, attachable: bool) -> LinkOffer {
    let outcome = if !share || asked.process == 0 || asked.comm == 0 || asked.process == own_process {
        Outcome::Own
    } else if asked.attach != 0 && attachable {
        Outcome::Attached { key: asked.attach }
    } else if asked.found != 0 {
        Outcome::Founded { key: asked.found }
    } else {
        Outcome::Own
    };
    let (attach, found) = match outcome {
        Outcome::Attached { key } => (key, 0),
        Outcome::Founded { key } => (0, key),
        Outcome::Own => (0, 0),
    };
    LinkOffer {
        process: if share { own_process } else { 0 },
        attach,
        found,
        comm: asked.comm,
    }
}

/// The outcome of the listener's answer `got` to what the connector `asked`; an error names
/// what does not fit (a corrupt or foreign peer).
pub fn outcome(asked: &LinkOffer, got: &LinkOffer) -> Result<Outcome, &'static str> {
    match (got.attach, got.found) {
        (0, 0) => Ok(Outcome::Own),
        _ if got.comm != asked.comm || got.process == 0 => Err("the link answer names another comm or no process"),
        (a, 0) if a == asked.attach => Ok(Outcome::Attached { key: a }),
        (0, f) if f == asked.found => Ok(Outcome::Founded { key: f }),
        _ => Err("the link answer names a link the connector did not offer"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(epoch: u32) -> Message {
        Message::RecoverReady { epoch }
    }

    fn on(route: Route, epoch: u32) -> Message {
        Message::OnComm {
            route,
            message: Box::new(ready(epoch)),
        }
    }

    #[test]
    fn frames_reach_their_comm_in_order_and_a_close_comes_after_them() {
        let send7 = local_route(7, false);
        let recv7 = local_route(7, true);
        let mut r = Router::default();
        r.open(send7);
        r.open(recv7);
        assert_eq!(r.state(send7), PortState::Nothing);
        // A frame to the peer's recv comm 7 is not one to our recv comm 7's partner.
        r.handle_message(on(recv7, 1)).unwrap();
        r.handle_message(on(recv7, 2)).unwrap();
        r.handle_message(Message::CommClosed { route: recv7 }).unwrap();
        assert_eq!(r.state(send7), PortState::Nothing);
        assert_eq!(r.state(recv7), PortState::Data);
        assert_eq!(r.take(recv7), Some(ready(1)));
        assert_eq!(r.take(recv7), Some(ready(2)));
        assert_eq!(r.take(recv7), None);
        assert_eq!(r.state(recv7), PortState::Closed);
        // Frames for a comm closed here are dropped.
        assert_eq!(r.close(send7), Message::CommClosed { route: recv7 });
        r.handle_message(on(send7, 3)).unwrap();
        assert_eq!(r.comms(), 1);
        assert_eq!(r.state(send7), PortState::Closed);
    }

    #[test]
    fn the_two_ends_of_a_comm_route_to_each_other() {
        let (mut a, mut b) = (Router::default(), Router::default());
        let sender = local_route(3, false);
        let receiver = local_route(3, true);
        a.open(sender);
        b.open(receiver);
        b.handle_message(on(peer_route(sender), 9)).unwrap();
        a.handle_message(on(peer_route(receiver), 10)).unwrap();
        assert_eq!(b.take(receiver), Some(ready(9)));
        assert_eq!(a.take(sender), Some(ready(10)));
        let bye = a.close(sender);
        b.handle_message(bye).unwrap();
        assert_eq!(b.state(receiver), PortState::Closed);
    }

    #[test]
    fn a_flood_and_a_setup_message_are_refused() {
        let c = local_route(1, true);
        let mut r = Router::default();
        r.open(c);
        for i in 0..INBOX_LIMIT as u32 {
            r.handle_message(on(c, i)).unwrap();
        }
        assert_eq!(r.state(c), PortState::Data);
        r.handle_message(on(c, 99)).unwrap();
        assert_eq!(r.state(c), PortState::Flooded);
        assert!(r.handle_message(Message::Ready { nonce: 1 }).is_err());
    }

    #[test]
    fn a_connect_request_on_the_link_opens_its_comm() {
        let mut r = Router::default();
        let route = local_route(5, true);
        let req = |nonce| crate::transport::proto::handshake::EndpointRepr {
            nonce,
            tc: 0,
            sl: 0,
            flags: 0,
            addr: 0,
            devs: vec![],
            qps: vec![],
            eager: Default::default(),
            link: Default::default(),
        };
        let ask = |nonce| Message::OnComm {
            route,
            message: Box::new(Message::ConnectReq(req(nonce))),
        };
        assert_eq!(r.handle_message(ask(7)).unwrap(), Some((route, req(7))));
        assert_eq!(r.state(route), PortState::Nothing, "open, nothing waiting");
        // Its later frames wait for the comm; a second request on it is just a message.
        r.handle_message(on(route, 1)).unwrap();
        assert_eq!(r.handle_message(ask(8)).unwrap(), None);
        assert_eq!(r.take(route), Some(ready(1)));
        assert_eq!(r.take(route), Some(Message::ConnectReq(req(8))));
        // Anything else for an unknown comm is dropped.
        assert_eq!(r.handle_message(on(local_route(6, true), 1)).unwrap(), None);
        assert_eq!(r.comms(), 1);
    }

    #[test]
    fn connectors_wait_for_one_founding_then_attach() {
        let t0 = Time::ZERO;
        assert_eq!(plan(PeerLink::None, t0), Plan::Found);
        let founding = PeerLink::Founding { ticket: 1, since: t0 };
        assert_eq!(plan(founding, t0 + Duration::from_millis(999)), Plan::Wait);
        assert_eq!(plan(founding, t0 + FOUNDING_WAIT), Plan::Found);
        assert_eq!(plan(PeerLink::Live { key: 5 }, t0), Plan::Attach { key: 5 });
        assert_eq!(plan(PeerLink::Own, t0), Plan::Found);
    }

    #[test]
    fn the_listener_attaches_only_to_an_open_link_of_that_process() {
        let asked = LinkOffer {
            process: 10,
            attach: 5,
            found: 6,
            comm: 1,
        };
        let open = |key: u64, process: u64| key == 5 && process == 10;
        let a = answer(&asked, 20, true, open(asked.attach, asked.process));
        assert_eq!((a.attach, a.found, a.comm, a.process), (5, 0, 1, 20));
        assert_eq!(outcome(&asked, &a), Ok(Outcome::Attached { key: 5 }));
        // The link is gone here (or is another process's): the connection founds a new one.
        let f = answer(&asked, 20, true, false);
        assert_eq!(outcome(&asked, &f), Ok(Outcome::Founded { key: 6 }));
        let other = LinkOffer { process: 11, ..asked };
        assert_eq!(
            outcome(&other, &answer(&other, 20, true, open(other.attach, other.process))),
            Ok(Outcome::Founded { key: 6 })
        );
        // A listener that does not share, or a connector that offers nothing: own connection.
        let own = answer(&asked, 20, false, open(asked.attach, asked.process));
        assert_eq!(
            own,
            LinkOffer {
                process: 0,
                attach: 0,
                found: 0,
                comm: 1
            }
        );
        assert_eq!(outcome(&asked, &own), Ok(Outcome::Own));
        assert_eq!(
            outcome(&asked, &answer(&LinkOffer::default(), 20, true, false)),
            Ok(Outcome::Own)
        );
        // Within one process: own connection.
        assert_eq!(
            outcome(&asked, &answer(&asked, 10, true, open(asked.attach, asked.process))),
            Ok(Outcome::Own)
        );
    }

    #[test]
    fn a_listener_answer_the_connector_did_not_offer_is_refused() {
        let asked = LinkOffer {
            process: 10,
            attach: 5,
            found: 6,
            comm: 1,
        };
        let bad = [
            LinkOffer {
                process: 20,
                attach: 7,
                found: 0,
                comm: 1,
            },
            LinkOffer {
                process: 20,
                attach: 0,
                found: 8,
                comm: 1,
            },
            LinkOffer {
                process: 20,
                attach: 5,
                found: 6,
                comm: 1,
            },
            LinkOffer {
                process: 20,
                attach: 5,
                found: 0,
                comm: 2,
            },
            LinkOffer {
                process: 0,
                attach: 5,
                found: 0,
                comm: 1,
            },
        ];
        for b in bad {
            assert!(outcome(&asked, &b).is_err(), "{b:?}");
        }
    }
}

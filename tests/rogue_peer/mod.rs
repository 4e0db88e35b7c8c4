//! A rogue peer for the softroce tests: it completes ferroce's side-channel handshake with the
//! plugin's own encoders (`proto::handshake`) and its own verbs objects (`transport::conn`,
//! the same softroce device in this process), so it holds real RC QPs connected to a ferroce
//! comm, and then posts whatever RDMA writes a test wants.
//!
//! Everything is driven from one thread: while the rogue waits for bytes it calls `pump`, which
//! advances ferroce's own non-blocking connect or accept (as NCCL's loop would).
#![allow(dead_code)]

use nccl_net_ferroce::config;
use nccl_net_ferroce::device::NetDevice;
use nccl_net_ferroce::ibv::qp::QpCaps;
use nccl_net_ferroce::ibv::{sys, QueuePair, WorkCompletion};
use nccl_net_ferroce::transport::conn::{self, ConnQp, LocalDev, RegBuf};
use nccl_net_ferroce::transport::driver::to_ibv;
use nccl_net_ferroce::transport::proto::fifo::{CtsEntry, ENTRY_BYTES, RING_BYTES};
use nccl_net_ferroce::transport::proto::handshake::{
    EndpointRepr, FrameReader, HandleRepr, LinkOffer, ListenAddr, Message, OLDEST_WIRE_VERSION, WIRE_VERSION,
};
use nccl_net_ferroce::transport::proto::plan::{Op, Remote, Sge, WorkRequest};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the rogue waits for anything from ferroce.
pub const WAIT: Duration = Duration::from_secs(20);
/// Bytes of the rogue's own registered block (its CTS FIFO as a sender; as a receiver, its
/// completion records in the first 4 KiB and its receive buffer after them).
pub const BLOCK: usize = 3 * RING_BYTES;

/// The `wr_id` of the rogue's writes (its receives are numbered from 0).
const WRITE_WR_ID: u64 = 0x0dd;

/// The rogue's end of a connection: QPs in RTS against ferroce's, and its registered block.
pub struct Rogue {
    pub stream: TcpStream,
    pub devs: Vec<LocalDev>,
    pub qps: Vec<ConnQp>,
    pub block: RegBuf,
    /// What ferroce told about its end (FIFO address and rkeys, or completion records).
    pub peer: EndpointRepr,
}

fn access() -> u32 {
    use sys::ibv_access_flags as A;
    A::IBV_ACCESS_LOCAL_WRITE.0 | A::IBV_ACCESS_REMOTE_WRITE.0 | A::IBV_ACCESS_REMOTE_READ.0
}

/// Devices, QPs in INIT and the registered block for a rogue end of `nqps` QPs.
fn resources(members: &[Arc<NetDevice>], nqps: usize) -> (Vec<LocalDev>, Vec<QueuePair>, Vec<usize>, RegBuf) {
    // Striped, as ferroce stripes them.
    let placement: Vec<usize> = (0..nqps).map(|i| i % members.len()).collect();
    let devs = conn::local_devs(members, &placement, 64, 64).expect("rogue CQ");
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_inline_data: 0,
        max_send_sge: 1,
    };
    let qps = conn::create_qps(&devs, &placement, caps, access(), config::get()).expect("rogue QPs");
    let block = RegBuf::new(&devs, BLOCK, conn::remote_access()).expect("rogue block");
    (devs, qps, placement, block)
}

/// Send one side-channel message.
pub fn send_msg(s: &mut TcpStream, m: &Message) {
    let mut out = Vec::new();
    m.emit(WIRE_VERSION, &mut out);
    s.write_all(&out).expect("rogue side-channel write");
}

/// Read one side-channel message, calling `pump` while none is there.
pub fn read_msg(s: &mut TcpStream, pump: &mut dyn FnMut()) -> Message {
    s.set_nonblocking(true).expect("nonblocking");
    let mut fr = FrameReader::default();
    let end = Instant::now() + WAIT;
    let mut b = [0u8; 4096];
    loop {
        if let Some(f) = fr.poll_message().expect("ferroce sent a malformed frame") {
            return f.message;
        }
        match s.read(&mut b) {
            Ok(0) => panic!("ferroce closed the side channel"),
            Ok(n) => fr.handle_bytes(&b[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => pump(),
            Err(e) => panic!("rogue side-channel read: {e}"),
        }
        assert!(Instant::now() < end, "no message from ferroce within {WAIT:?}");
    }
}

/// A rogue listener: its handle (for ferroce's connect) and its TCP listener.
pub fn rogue_listen(ndevs: u8) -> ([u8; 128], TcpListener) {
    rogue_listen_as(ndevs, 0)
}

/// [`rogue_listen`] with a process id in the handle (0: none), so ferroce offers it a link.
pub fn rogue_listen_as(ndevs: u8, process: u64) -> ([u8; 128], TcpListener) {
    let l = TcpListener::bind("127.0.0.1:0").expect("rogue listener");
    l.set_nonblocking(true).expect("nonblocking");
    let mut h = [0u8; 128];
    HandleRepr {
        addr: ListenAddr::V4 {
            ip: [127, 0, 0, 1],
            port: l.local_addr().expect("addr").port(),
        },
        ndevs,
        nonce: 0x005e_ed0f_5eed,
        min_version: OLDEST_WIRE_VERSION,
        max_version: WIRE_VERSION,
        process,
    }
    .emit(&mut h);
    (h, l)
}

/// Accept ferroce's side-channel connection on `l`, calling `pump` while it is not there.
pub fn rogue_accept(l: &TcpListener, pump: &mut dyn FnMut()) -> TcpStream {
    let end = Instant::now() + WAIT;
    loop {
        match l.accept() {
            Ok((s, _)) => return s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => pump(),
            Err(e) => panic!("rogue accept: {e}"),
        }
        assert!(Instant::now() < end, "ferroce never dialed");
    }
}

/// Be the receiving end ferroce's sender connects to: answer its ConnectReq honestly (our QPs
/// in RTS, our completion records at the start of our block, `recvs_per_qp` receives posted
/// on each QP for ferroce's writes with immediate) and take its Ready. `pump` drives
/// ferroce's connect.
pub fn rogue_receiver(members: &[Arc<NetDevice>], l: &TcpListener, recvs_per_qp: u64, pump: &mut dyn FnMut()) -> Rogue {
    let mut rogue = rogue_receiver_answering(members, l, recvs_per_qp, pump, |_| LinkOffer::default());
    let Message::Ready { .. } = read_msg(&mut rogue.stream, pump) else {
        panic!("ferroce did not send Ready")
    };
    rogue
}

/// [`rogue_receiver`] that answers ferroce's link offer with `link(offer)` and returns once
/// its answer is sent (before ferroce's Ready).
pub fn rogue_receiver_answering(
    members: &[Arc<NetDevice>],
    l: &TcpListener,
    recvs_per_qp: u64,
    pump: &mut dyn FnMut(),
    link: fn(&LinkOffer) -> LinkOffer,
) -> Rogue {
    let mut stream = rogue_accept(l, pump);
    let Message::ConnectReq(req) = read_msg(&mut stream, pump) else {
        panic!("ferroce's first message is not ConnectReq")
    };
    let (devs, qps, placement, block) = resources(members, req.qps.len());
    let rkeys: Vec<u32> = block.mrs.iter().map(|m| m.rkey()).collect();
    let list = conn::qp_list(qps.iter().map(QueuePair::qpn).zip(placement.iter().copied()), &[]);
    let mut resp = conn::endpoint(
        &devs,
        list,
        req.nonce,
        req.tc,
        req.sl,
        req.flags,
        block.addr() as u64,
        &rkeys,
    )
    .expect("the rogue's record");
    resp.link = link(&req.link);
    let qps = conn::bring_up(&devs, qps, &placement, &[], &req, req.tc, req.sl).expect("rogue RTS");
    // ferroce's writes with immediate each take a receive (else RNR: they would never end).
    for q in &qps {
        for i in 0..recvs_per_qp {
            // SAFETY: zeroed ibv_recv_wr is valid: no SGE (a write with immediate needs none).
            let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = i;
            // SAFETY: the WR names no memory.
            unsafe { q.qp.post_recv(&mut wr) }.expect("rogue post_recv");
        }
    }
    send_msg(&mut stream, &Message::ConnectResp(resp));
    Rogue {
        stream,
        devs,
        qps,
        block,
        peer: req,
    }
}

/// Be the sending end that connects to ferroce's listener (its `handle`): an honest ConnectReq
/// (our QPs, our CTS FIFO at the start of our block), then Ready. `pump` drives ferroce's
/// accept.
pub fn rogue_sender(members: &[Arc<NetDevice>], handle: &[u8; 128], pump: &mut dyn FnMut()) -> Rogue {
    rogue_sender_offering(members, handle, pump, LinkOffer::default())
}

/// [`rogue_sender`] whose request makes `link` offer (say, to found a link).
pub fn rogue_sender_offering(
    members: &[Arc<NetDevice>],
    handle: &[u8; 128],
    pump: &mut dyn FnMut(),
    link: LinkOffer,
) -> Rogue {
    let h = HandleRepr::parse(handle).expect("ferroce's handle");
    let ListenAddr::V4 { ip, port } = h.addr else {
        panic!("an IPv4 side channel on lo")
    };
    let mut stream = TcpStream::connect((std::net::Ipv4Addr::from(ip), port)).expect("dial ferroce");
    let (devs, qps, placement, block) = resources(members, members.len());
    let rkeys: Vec<u32> = block.mrs.iter().map(|m| m.rkey()).collect();
    let list = conn::qp_list(qps.iter().map(QueuePair::qpn).zip(placement.iter().copied()), &[]);
    let mut req =
        conn::endpoint(&devs, list, h.nonce, 0, 0, 0, block.addr() as u64, &rkeys).expect("the rogue's record");
    req.link = link;
    send_msg(&mut stream, &Message::ConnectReq(req.clone()));
    let Message::ConnectResp(resp) = read_msg(&mut stream, pump) else {
        panic!("ferroce did not answer with ConnectResp")
    };
    let qps = conn::bring_up(&devs, qps, &placement, &[], &resp, 0, 0).expect("rogue RTS");
    send_msg(&mut stream, &Message::Ready { nonce: h.nonce });
    Rogue {
        stream,
        devs,
        qps,
        block,
        peer: resp,
    }
}

impl Rogue {
    /// Our block's address and lkey.
    pub fn local(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: (self.block.addr() + off) as u64,
            len: len as u32,
            lkey: self.block.mrs[0].lkey(),
        }
    }

    /// Our block's rkey (what an honest CTS entry of ours carries).
    pub fn rkey(&self) -> u32 {
        self.block.mrs[0].rkey()
    }

    /// Bytes of our block.
    #[allow(clippy::mut_from_ref)]
    pub fn bytes(&self) -> &mut [u8] {
        // SAFETY: the block is BLOCK bytes we own for as long as self; the tests read and write
        // it only between RDMA operations they have waited for.
        unsafe { std::slice::from_raw_parts_mut(self.block.addr() as *mut u8, BLOCK) }
    }

    /// Write `len` bytes of our block from `off` to `remote` (with `imm`: write with
    /// immediate) on QP 0, and wait for its completion: Ok, or Err(status).
    ///
    /// Other completions on our CQ are passed over: the receives we posted for ferroce's
    /// writes, which a refused write flushes (the QP goes to error), and which the NIC may
    /// queue before the write's own error completion (the order of send and receive queue
    /// completions on one CQ is not defined).
    pub fn write(&self, off: usize, len: usize, remote: Remote, imm: Option<u32>) -> Result<(), u32> {
        let plan = WorkRequest {
            wr_id: WRITE_WR_ID,
            op: imm.map_or(Op::Write, Op::WriteImm),
            local: (len > 0).then(|| self.local(off, len)),
            remote,
            signaled: true,
            inline: false,
            prefix: None,
        };
        // SAFETY: zeroed ibv_send_wr / ibv_sge are valid; to_ibv fills them.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        let mut sge: [sys::ibv_sge; 2] = unsafe { std::mem::zeroed() };
        to_ibv(&plan, &mut wr, &mut sge);
        // SAFETY: the local range is inside our registered block, which outlives the wait
        // for the completion below.
        unsafe { self.qps[0].qp.post_send(&mut wr) }.expect("rogue post_send");
        let end = Instant::now() + WAIT;
        let mut wcs: [WorkCompletion; 4] = Default::default();
        loop {
            let got = self.devs[0].cq.poll(&mut wcs).expect("rogue poll");
            if let Some(wc) = got.iter().find(|wc| wc.wr_id() == WRITE_WR_ID) {
                return wc.result().map(|_| ()).map_err(|f| f.status);
            }
            assert!(Instant::now() < end, "the rogue's write never completed");
        }
    }

    /// Write `e` (host order, sealed or not as given) into ferroce's FIFO entry `pos`.
    pub fn write_cts(&self, pos: usize, e: &CtsEntry) -> Result<(), u32> {
        self.write_fifo_bytes(pos * ENTRY_BYTES, &entry_bytes(&e.to_wire()))
    }

    /// Write raw `bytes` at offset `off` of ferroce's FIFO (staged at the end of our block).
    pub fn write_fifo_bytes(&self, off: usize, bytes: &[u8]) -> Result<(), u32> {
        let stage = BLOCK - RING_BYTES;
        self.bytes()[stage..stage + bytes.len()].copy_from_slice(bytes);
        let remote = Remote {
            addr: self.peer.addr + off as u64,
            rkey: self.peer.devs[0].rkey,
        };
        self.write(stage, bytes.len(), remote, None)
    }

    /// The CTS entry ferroce's receiver wrote into our FIFO (the start of our block) at `pos`
    /// for posting counter `counter`, once it has landed sealed.
    pub fn wait_cts(&self, pos: usize, counter: u64) -> CtsEntry {
        let end = Instant::now() + WAIT;
        loop {
            let at = pos * ENTRY_BYTES;
            // SAFETY: in our block; volatile: ferroce's NIC writes it.
            let w: CtsEntry = unsafe { std::ptr::read_volatile((self.block.addr() + at) as *const CtsEntry) };
            let e = CtsEntry::from_wire(&w);
            if e.sealed() && e.idx() == counter + 1 {
                return e;
            }
            assert!(Instant::now() < end, "ferroce's CTS for counter {counter} never came");
        }
    }
}

/// The 64 bytes of a wire-order entry.
pub fn entry_bytes(w: &CtsEntry) -> [u8; ENTRY_BYTES] {
    let mut b = [0u8; ENTRY_BYTES];
    b[0..8].copy_from_slice(&w.addr.to_ne_bytes());
    b[8..16].copy_from_slice(&w.size.to_ne_bytes());
    for (i, k) in w.rkeys.iter().enumerate() {
        b[16 + 4 * i..20 + 4 * i].copy_from_slice(&k.to_ne_bytes());
    }
    b[48..52].copy_from_slice(&w.seal.to_ne_bytes());
    b[52..56].copy_from_slice(&w.tag.to_ne_bytes());
    b[56..64].copy_from_slice(&w.stamp.to_ne_bytes());
    b
}

//! Deterministic two-endpoint simulation: two `QpCore`s joined by in-memory
//! queues on a virtual clock, with seeded loss, duplication, reordering
//! (jitter) and bit flips (caught by the ICRC, as the driver would).
#![allow(dead_code)]

use softroce::proto::*;
use softroce::wire::icrc::{icrc_ipv4, verify_ipv4, Ipv4Fields};

pub const MTU_1024: u8 = 3;
pub const MTU_4096: u8 = 5;

/// Memory layout used by every endpoint.
pub const SRC: u64 = 0x1000_0000;
pub const DST: u64 = 0x2000_0000;
pub const ATOM: u64 = 0x3000_0000;
pub const REGION: usize = 1 << 20;

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub loss: f64,
    pub dup: f64,
    /// Probability that a packet gets extra delay (so later ones overtake it).
    pub reorder: f64,
    pub bitflip: f64,
}

pub struct Endpoint {
    pub qp: QpCore,
    pub mem: InMemory,
    pub ip: [u8; 4],
    pub src_lkey: u32,
    pub src_rkey: u32,
    pub dst_lkey: u32,
    pub dst_rkey: u32,
    pub atom_lkey: u32,
    pub atom_rkey: u32,
    pub send_cq: Vec<Completion>,
    pub recv_cq: Vec<Completion>,
    pub events: Vec<AsyncEvent>,
}

impl Endpoint {
    pub fn new(qpn: u32, ip: [u8; 4], caps: QpCaps) -> Self {
        let mut mem = InMemory::new();
        let all = mem::access::LOCAL_WRITE
            | mem::access::REMOTE_WRITE
            | mem::access::REMOTE_READ
            | mem::access::REMOTE_ATOMIC;
        let (src_lkey, src_rkey) = mem.register(SRC, REGION, all);
        let (dst_lkey, dst_rkey) = mem.register(DST, REGION, all);
        let (atom_lkey, atom_rkey) = mem.register(ATOM, 4096, all);
        Endpoint {
            qp: QpCore::new(qpn, caps),
            mem,
            ip,
            src_lkey,
            src_rkey,
            dst_lkey,
            dst_rkey,
            atom_lkey,
            atom_rkey,
            send_cq: Vec::new(),
            recv_cq: Vec::new(),
            events: Vec::new(),
        }
    }

    pub fn fill_src(&mut self, seed: u64) {
        let mut r = Rng(seed);
        let data: Vec<u8> = (0..REGION).map(|_| r.next() as u8).collect();
        assert!(self.mem.poke(SRC, &data));
    }

    pub fn peek(&self, addr: u64, len: usize) -> Vec<u8> {
        self.mem.peek(addr, len).expect("in a region").to_vec()
    }

    fn collect(&mut self) {
        while let Some(c) = self.qp.poll_completion() {
            match c.queue {
                WcQueue::Send => self.send_cq.push(c),
                WcQueue::Recv => self.recv_cq.push(c),
            }
        }
        while let Some(e) = self.qp.poll_event() {
            self.events.push(e);
        }
    }
}

pub struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    bytes: Vec<u8>,
}

pub struct Pair {
    pub ep: [Endpoint; 2],
    pub now: Instant,
    pub latency: Duration,
    pub faults: Faults,
    pub rng: Rng,
    pub net: Vec<InFlight>,
    seq: u64,
    /// When false, everything sent by endpoint i is dropped (peer gone).
    pub link_up: [bool; 2],
    pub sent: [u64; 2],
    pub delivered: [u64; 2],
    pub icrc_drops: u64,
    pub trace: bool,
    buf: Vec<u8>,
}

pub struct Setup {
    pub mtu: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub caps: QpCaps,
    pub access: u32,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            mtu: MTU_1024,
            timeout: 10, // 4.2 ms
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            caps: QpCaps {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                ..QpCaps::default()
            },
            access: mem::access::LOCAL_WRITE
                | mem::access::REMOTE_WRITE
                | mem::access::REMOTE_READ
                | mem::access::REMOTE_ATOMIC,
        }
    }
}

pub fn gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

pub fn connect_qp(qp: &mut QpCore, s: &Setup, dest_qpn: u32, dgid: [u8; 16], sq_psn: u32, rq_psn: u32) {
    use attr_mask as m;
    qp.modify(&ModifyAttrs {
        mask: m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS,
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: s.access,
        ..Default::default()
    })
    .expect("INIT");
    qp.modify(&ModifyAttrs {
        mask: m::STATE | m::AV | m::PATH_MTU | m::DEST_QPN | m::RQ_PSN | m::MAX_DEST_RD_ATOMIC | m::MIN_RNR_TIMER,
        qp_state: QpState::Rtr,
        path_mtu: s.mtu,
        dest_qp_num: dest_qpn,
        rq_psn,
        max_dest_rd_atomic: s.max_rd_atomic,
        min_rnr_timer: s.min_rnr_timer,
        ah: AddressVector {
            dgid,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    })
    .expect("RTR");
    qp.modify(&ModifyAttrs {
        mask: m::STATE | m::SQ_PSN | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY | m::MAX_QP_RD_ATOMIC,
        qp_state: QpState::Rts,
        sq_psn,
        timeout: s.timeout,
        retry_cnt: s.retry_cnt,
        rnr_retry: s.rnr_retry,
        max_rd_atomic: s.max_rd_atomic,
        ..Default::default()
    })
    .expect("RTS");
}

impl Pair {
    /// Two connected QPs; PSNs start near the 24-bit wrap to exercise it.
    pub fn new(s: &Setup, seed: u64) -> Pair {
        let mut a = Endpoint::new(0x11, [127, 0, 0, 1], s.caps);
        let mut b = Endpoint::new(0x22, [127, 0, 0, 2], s.caps);
        let psn_a = 0xFF_FFF0;
        let psn_b = 0x12_3456;
        connect_qp(&mut a.qp, s, 0x22, gid(b.ip), psn_a, psn_b);
        connect_qp(&mut b.qp, s, 0x11, gid(a.ip), psn_b, psn_a);
        a.fill_src(seed ^ 0xA);
        b.fill_src(seed ^ 0xB);
        Pair {
            ep: [a, b],
            now: Instant::from_micros(1),
            latency: Duration::from_micros(5),
            faults: Faults::default(),
            rng: Rng(seed),
            net: Vec::new(),
            seq: 0,
            link_up: [true, true],
            sent: [0; 2],
            delivered: [0; 2],
            icrc_drops: 0,
            trace: std::env::var("SIM_TRACE").is_ok(),
            buf: Vec::with_capacity(8192),
        }
    }

    pub fn a(&mut self) -> &mut Endpoint {
        &mut self.ep[0]
    }
    pub fn b(&mut self) -> &mut Endpoint {
        &mut self.ep[1]
    }

    fn transmit_all(&mut self) {
        for i in 0..2 {
            while self.transmit_one(i) {}
            self.ep[i].collect();
        }
    }

    /// Everything endpoint `i` has to send, the virtual clock advancing by `gap` after each
    /// packet, as a driver's does while it copies and sends a long burst in software (its
    /// thread holds the QP, so no timer of the QP fires in between).
    pub fn transmit_paced(&mut self, i: usize, gap: Duration) {
        while self.transmit_one(i) {
            self.now += gap;
        }
        self.ep[i].collect();
    }

    /// One packet of endpoint `i` onto the network, if it has one.
    fn transmit_one(&mut self, i: usize) -> bool {
        let ep = &mut self.ep[i];
        let Some(meta) = ep.qp.poll_transmit(self.now, &mut ep.mem, &mut self.buf) else {
            return false;
        };
        assert_eq!(meta.len, self.buf.len());
        assert_eq!(meta.dgid, gid(self.ep[1 - i].ip));
        self.sent[i] += 1;
        // Driver: append the ICRC (IPv4, ID 0, DF, sport 4791).
        let ip = Ipv4Fields::new(self.ep[i].ip, self.ep[1 - i].ip, 0);
        let mut dgram = self.buf.clone();
        dgram.extend_from_slice(&icrc_ipv4(&ip, 4791, 4791, &self.buf).to_le_bytes());
        if !self.link_up[i] || self.rng.chance(self.faults.loss) {
            return true;
        }
        if self.rng.chance(self.faults.bitflip) {
            let bit = self.rng.below(dgram.len() as u64 * 8);
            dgram[(bit / 8) as usize] ^= 1 << (bit % 8);
        }
        let copies = if self.rng.chance(self.faults.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let mut at = self.now + self.latency;
            if self.rng.chance(self.faults.reorder) {
                at += Duration::from_micros(1 + self.rng.below(30));
            }
            self.seq += 1;
            self.net.push(InFlight {
                at,
                seq: self.seq,
                to: 1 - i,
                bytes: dgram.clone(),
            });
        }
        true
    }

    fn deliver_due(&mut self) {
        let now = self.now;
        let mut due: Vec<InFlight> = Vec::new();
        let mut k = 0;
        while k < self.net.len() {
            if self.net[k].at <= now {
                due.push(self.net.swap_remove(k));
            } else {
                k += 1;
            }
        }
        due.sort_by_key(|p| (p.at, p.seq));
        for p in due {
            let to = p.to;
            let ip = Ipv4Fields::new(self.ep[1 - to].ip, self.ep[to].ip, 0);
            let Some(t) = verify_ipv4(&ip, 4791, 4791, &p.bytes) else {
                self.icrc_drops += 1;
                continue;
            };
            self.delivered[to] += 1;
            if self.trace {
                if let Ok(r) = softroce::wire::RocePacketRepr::parse(t) {
                    eprintln!(
                        "{:>10} {}->{} {:?} psn={} ar={} aeth={:?} len={}",
                        now.as_nanos(),
                        1 - to,
                        to,
                        r.bth.opcode,
                        r.bth.psn.value(),
                        r.bth.ack_req,
                        r.aeth.map(|a| a.syndrome),
                        r.payload.len()
                    );
                }
            }
            let ep = &mut self.ep[to];
            ep.qp.handle_packet(now, t, &mut ep.mem);
            ep.collect();
        }
    }

    /// Run until nothing is in flight and no timer is armed, or until
    /// `limit` of virtual time has passed. Returns the number of steps.
    pub fn run_for(&mut self, limit: Duration) -> usize {
        let end = self.now + limit;
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 5_000_000, "simulation does not converge");
            self.transmit_all();
            self.deliver_due();
            self.transmit_all();
            let next_pkt = self.net.iter().map(|p| p.at).min();
            let next_timer = self.ep.iter().filter_map(|e| e.qp.poll_timeout()).min();
            let next = match (next_pkt, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(t) => t,
                    None => return steps,
                },
            };
            if next > end {
                return steps;
            }
            if next > self.now {
                self.now = next;
            }
            for i in 0..2 {
                if self.ep[i].qp.poll_timeout().is_some_and(|t| t <= self.now) {
                    let now = self.now;
                    if self.trace {
                        eprintln!("{:>10} timeout at {}", now.as_nanos(), i);
                    }
                    self.ep[i].qp.handle_timeout(now);
                    self.ep[i].collect();
                }
            }
        }
    }

    /// The packets endpoint `i` has to send now, with their opcodes, taken from it but not put
    /// on the network (without the driver's ICRC: `handle_packet` takes verified packets): for
    /// tests that deliver, hold back or drop each one by hand.
    pub fn send_now(&mut self, i: usize) -> Vec<(softroce::wire::opcode::OpCode, Vec<u8>)> {
        let (now, mut buf, mut out) = (self.now, Vec::new(), Vec::new());
        let ep = &mut self.ep[i];
        while ep.qp.poll_transmit(now, &mut ep.mem, &mut buf).is_some() {
            let op = softroce::wire::RocePacketRepr::parse(&buf)
                .expect("a packet")
                .bth
                .opcode;
            out.push((op, buf.clone()));
        }
        ep.collect();
        out
    }

    /// Hands `packets` (as [`Pair::send_now`] gives them) to endpoint `i` now, in order.
    pub fn hand(&mut self, i: usize, packets: &[(softroce::wire::opcode::OpCode, Vec<u8>)]) {
        let now = self.now;
        let ep = &mut self.ep[i];
        for (_, pkt) in packets {
            ep.qp.handle_packet(now, pkt, &mut ep.mem);
        }
        ep.collect();
    }

    /// Run until idle (bounded by one virtual hour).
    pub fn run(&mut self) -> usize {
        self.run_for(Duration::from_millis(3_600_000))
    }
}

/// The PSN of a packet [`Pair::send_now`] gave.
pub fn psn_of(packet: &[u8]) -> softroce::wire::Psn {
    softroce::wire::RocePacketRepr::parse(packet).expect("a packet").bth.psn
}

pub fn sge(addr: u64, len: u32, lkey: u32) -> Vec<Sge> {
    vec![Sge {
        addr,
        length: len,
        lkey,
    }]
}

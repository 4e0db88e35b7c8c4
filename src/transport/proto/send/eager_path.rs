//! The sender's eager path ([`super::super::eager`]): a small send whose group's CTS has not
//! landed goes at once into the receiver's landing ring, claiming the next receive; the claim is
//! decided when its group's CTS lands (bound: the group is consumed; refused: the message goes
//! through the CTS path, in order).

use super::super::eager::{self, GroupView, Header, Imm, EAGER_QP};
use super::super::fifo;
use super::super::limits::MAX_DEVS;
use super::super::plan::{Op, Post, Remote, Sge, WorkRequest};
use super::super::request::{ReqKind, SendWrId};
use super::super::time::Time;
use super::chains::EAGER_CHAIN;
use super::kept::Kept;
use super::{reported_size, FifoRing, Isend, SendBuf, SendCore};
use crate::error::Result;

impl SendCore {
    /// The send of eager slot `slot` as its request's kept buffer and lkeys describe it.
    pub(super) fn eager_kept_send(&self, slot: usize) -> SendBuf {
        let Some(e) = self.eager.as_deref() else {
            return SendBuf::default();
        };
        let (r, tag, host) = (e.req[slot], e.tag[slot], e.host & (1 << slot) != 0);
        let k = self.kept.get(usize::from(r)).copied().unwrap_or_default();
        let mut lkeys = [0; MAX_DEVS];
        let l = usize::from(r) * self.nldevs;
        if let Some(src) = self.kept_lkeys.get(l..l + self.nldevs) {
            lkeys[..self.nldevs].copy_from_slice(src);
        }
        SendBuf {
            data: k.data as usize,
            size: k.len(),
            tag,
            lkeys,
            host,
        }
    }

    /// Whether a send of `len` bytes that found no buffer ([`Isend::NoBuffer`]) may go once
    /// completions are polled: the eager path would take a message of its size, and a chain on
    /// the eager QP (an eager write: its slot, the QP's credits) waits for its completion.
    /// Otherwise only the receiver's CTS lets it go, and that lands in the FIFO ring's memory,
    /// which the next isend reads: polling the CQ for it moves nothing on.
    pub fn eager_waits_for_completions(&self, len: usize) -> bool {
        let small = self.eager.as_deref().is_some_and(|e| len <= e.cfg.max);
        small && self.chains.get(EAGER_QP).is_some_and(|c| c.len > 0)
    }

    /// Send `send` eagerly, claiming the group after the open claims, if the eager path allows
    /// it now (else "no buffer yet": the CTS path waits for the group's CTS).
    pub(super) fn send_eager(&mut self, send: SendBuf, post: &mut impl FnMut(Post<'_>) -> Result<()>) -> Result<Isend> {
        let Some(e) = self.eager.as_deref() else {
            return Ok(Isend::NoBuffer);
        };
        let inline = e.cfg.inline(send.host, send.size);
        let wrs = if inline || send.size == 0 { 1 } else { 2 };
        if !e.may_send(send.size) || usize::from(self.credits[EAGER_QP]) < wrs {
            return Ok(Isend::NoBuffer);
        }
        let Some(r) = self.state.pool.alloc(ReqKind::Send) else {
            return Ok(Isend::Busy);
        };
        let claim = self.counter + e.claims.len() as u64;
        if let Some(t) = self.kept_tags.get_mut(usize::from(r)) {
            *t = send.tag;
        }
        if let Some(k) = self.kept.get_mut(usize::from(r)) {
            *k = Kept::new(send.data, send.size, 0);
            k.set_counter(claim);
        }
        let l = usize::from(r) * self.nldevs;
        if let Some(dst) = self.kept_lkeys.get_mut(l..l + self.nldevs) {
            dst.copy_from_slice(&send.lkeys[..self.nldevs]);
        }
        if let Some(req) = self.state.pool.get_mut(r) {
            req.set_pos_n(0, 1);
            req.size = reported_size(send.size);
            // Its write's acknowledgement, and the claim's verdict.
            req.pending = 2;
        }
        let Some(e) = self.eager.as_deref_mut() else {
            return Ok(Isend::NoBuffer);
        };
        let slot = eager::slot_of(e.sent);
        let header = Header {
            claim,
            head: self.head,
            tag: send.tag,
            len: send.size as u32,
            epoch: e.epoch,
            seq: e.sent as u32,
        };
        e.req[slot] = r;
        e.tag[slot] = send.tag;
        e.hdr[slot] = header.to_bytes();
        e.host = (e.host & !(1 << slot)) | (u32::from(send.host) << slot);
        e.acked &= !(1 << slot);
        e.busy |= 1 << slot;
        e.sent += 1;
        e.claims.push(slot);
        self.chains[EAGER_QP].push(EAGER_CHAIN | slot as u16);
        self.post_eager(slot, send, post)?;
        Ok(Isend::Started {
            idx: r,
            truncated_to: None,
            eager: true,
        })
    }

    /// Post the eager write of slot `slot` (its header kept in the eager state, its payload
    /// `send`) on the eager QP: one inline write when both fit and the payload is host memory,
    /// else the payload (by DMA) and then the header inline. The write with immediate is
    /// signaled; its completion acknowledges it. The caller logs the chain.
    pub(super) fn post_eager(
        &mut self,
        slot: usize,
        send: SendBuf,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        let Some(e) = self.eager.as_deref() else {
            return Ok(());
        };
        let route = self.cfg.routes.get(EAGER_QP).copied().unwrap_or_default();
        let (ldev, rdev) = (route.dev.min(MAX_DEVS - 1), route.remote_dev.min(MAX_DEVS - 1));
        let at = e.cfg.landing + (slot * e.cfg.slot_bytes) as u64;
        let rkey = e.cfg.landing_rkeys[rdev];
        let payload = (send.size > 0).then(|| Sge {
            addr: send.data as u64,
            len: send.size as u32,
            lkey: send.lkeys[ldev],
        });
        let inline = e.cfg.inline(send.host, send.size);
        let r = e.req[slot];
        let mut chain = [WorkRequest::EMPTY; 2];
        let mut k = 0;
        if !inline && payload.is_some() {
            chain[0] = WorkRequest {
                wr_id: 0,
                op: Op::Write,
                local: payload,
                remote: Remote {
                    addr: at + eager::EAGER_HEADER_BYTES as u64,
                    rkey,
                },
                signaled: false,
                inline: false,
                prefix: None,
            };
            k = 1;
        }
        chain[k] = WorkRequest {
            wr_id: 0,
            op: Op::WriteImm(Imm::Eager { slot }.to_u32()),
            local: if inline { payload } else { None },
            remote: Remote { addr: at, rkey },
            signaled: true,
            inline: true,
            prefix: Some(e.hdr[slot]),
        };
        k += 1;
        let wr_id = SendWrId::new(&[r], k, EAGER_QP).0;
        for w in &mut chain[..k] {
            w.wr_id = wr_id;
        }
        self.credits[EAGER_QP] = self.credits[EAGER_QP].saturating_sub(k as u16);
        if let Err(err) = post(Post::Send {
            qp: EAGER_QP,
            chain: &chain[..k],
        }) {
            return Err(self.state.fail(err));
        }
        Ok(())
    }

    /// Decide the open claims whose groups' CTS entries have landed, and match the refused
    /// messages to groups through the CTS path, in their order ([`super::super::eager`]). A bound
    /// claim consumes its group's entry; the first refusal turns every open claim into a
    /// refused message; once none is left a new epoch begins.
    pub(super) fn advance(
        &mut self,
        ring: &mut impl FifoRing,
        now: impl Fn() -> Time + Copy,
        post: &mut impl FnMut(Post<'_>) -> Result<()>,
    ) -> Result<()> {
        if self.recovering || self.eager.is_none() {
            return Ok(());
        }
        loop {
            let Some(e) = self.eager.as_deref() else {
                return Ok(());
            };
            let (claim, deferred) = (e.claims.front(), e.deferred.front());
            let deferred = deferred.map(|slot| (slot, e.acked(slot), e.req[slot]));
            if let Some(slot) = claim {
                if !self.cur.active && !self.load_group(ring, now)? {
                    return Ok(());
                }
                self.decide_claim(slot);
                continue;
            }
            if let Some((slot, acked, r)) = deferred {
                if !acked || self.waiting() {
                    return Ok(());
                }
                if !self.cur.active && !self.load_group(ring, now)? {
                    return Ok(());
                }
                let send = self.eager_kept_send(slot);
                let Some(i) = fifo::match_tag(&self.cur.entries[..self.cur.n], self.cur.matched, send.tag) else {
                    // The group waits for other sends first.
                    return Ok(());
                };
                self.take_entry(i, r, send);
                if let Some(e) = self.eager.as_deref_mut() {
                    e.deferred.pop();
                    e.decided(slot);
                }
                self.post_waiting(ring, post)?;
                continue;
            }
            if let Some(e) = self.eager.as_deref_mut() {
                if e.refused {
                    e.refused = false;
                    e.epoch = e.epoch.wrapping_add(1);
                }
            }
            return Ok(());
        }
    }

    /// The oldest open claim (slot `slot`) meets its group, loaded as the current one: both
    /// ends decide it alike ([`eager::binds`]).
    pub(super) fn decide_claim(&mut self, slot: usize) {
        let Some(e) = self.eager.as_deref_mut() else {
            return;
        };
        let first = self.cur.entries[0];
        let view = GroupView {
            eager_ok: self.cur.n == 1 && first.eager_ok(),
            tag: first.tag as i32,
        };
        if eager::binds(view, e.tag[slot], e.refused) {
            e.claims.pop();
            e.bound += 1;
            e.decided(slot);
            let r = e.req[slot];
            let posted = usize::try_from(first.posted_size()).unwrap_or(usize::MAX);
            let len = self.kept.get(usize::from(r)).map_or(0, |k| k.len()).min(posted);
            if let Some(req) = self.state.pool.get_mut(r) {
                req.size = reported_size(len);
                req.complete_one();
            }
            // The group is consumed: nothing is written for it.
            self.counter += 1;
            self.head += self.cur.n as u64;
            self.cur.active = false;
        } else {
            e.refused = true;
            while let Some(s) = e.claims.pop() {
                e.refused_msgs += 1;
                e.deferred.push(s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{Bench, Opts, EAGER_MAX, LANDING_ADDR, LANDING_RKEY, PLAIN, RECV_ADDR};
    use super::*;

    const EAGER: Opts = Opts {
        eager: true,
        named_imm: true,
        ..PLAIN
    };

    /// A bench whose first group (a single host receive, granting credit) was sent and
    /// completed through the CTS path: the next small send may go eagerly.
    fn warmed_up() -> Bench {
        let mut b = Bench::new(EAGER);
        b.cts(&[(1000, 7)]);
        let got = b.isend(100, 7).unwrap();
        assert!(matches!(got, Isend::Started { eager: false, .. }), "{got:?}");
        b.complete_from(0);
        b
    }

    fn eager_idx(got: Isend) -> u16 {
        match got {
            Isend::Started { idx, eager: true, .. } => idx,
            other => panic!("not sent eagerly: {other:?}"),
        }
    }

    /// Before its CTS a small send is one inline write with immediate into landing slot 0,
    /// its header in front: it claims the next receive (posting counter 1).
    #[test]
    fn a_small_send_before_its_cts_goes_to_the_landing_ring() {
        let mut b = warmed_up();
        eager_idx(b.isend(50, 9).unwrap());
        let (qp, chain) = &b.posted[1];
        assert_eq!((*qp, chain.len()), (EAGER_QP, 1));
        let w = chain[0];
        assert_eq!(w.op, Op::WriteImm(Imm::Eager { slot: 0 }.to_u32()));
        assert_eq!(
            (w.remote.addr, w.remote.rkey, w.inline, w.signaled),
            (LANDING_ADDR, LANDING_RKEY, true, true)
        );
        let h = Header::parse(&w.prefix.expect("the header"));
        assert_eq!((h.claim, h.tag, h.len, h.head, h.seq), (1, 9, 50, 1, 0));
        assert!(
            b.isend(EAGER_MAX + 1, 9).unwrap() == Isend::NoBuffer,
            "too large: waits for its CTS"
        );
    }

    /// The claimed group lands as a single host receive of the same tag: the claim binds, the
    /// group is consumed without a write, and the send is done once its write was acknowledged.
    #[test]
    fn a_claim_on_a_matching_group_binds() {
        let mut b = warmed_up();
        let idx = eager_idx(b.isend(50, 9).unwrap());
        b.cts(&[(1000, 9)]);
        b.progress().unwrap();
        assert_eq!(b.core.eager().map(|e| e.bound), Some(1));
        assert_eq!(b.core.test(idx).unwrap(), None, "its write is not acknowledged yet");
        b.complete_from(1);
        assert_eq!(b.core.test(idx).unwrap(), Some(50));
        assert_eq!((b.posted.len(), b.core.head), (2, 2), "no write for the bound group");
    }

    /// The claimed group is no single host receive: the claim is refused, and once its write
    /// was acknowledged the message goes again through the CTS path into that group.
    #[test]
    fn a_refused_claim_goes_again_through_the_cts_path() {
        let mut b = warmed_up();
        let idx = eager_idx(b.isend(50, 9).unwrap());
        b.cts(&[(1000, 9), (1000, 8)]);
        b.progress().unwrap();
        assert_eq!(b.core.eager().map(|e| e.refused_msgs), Some(1));
        assert_eq!(b.posted.len(), 2, "not before the eager write was acknowledged");
        b.complete_from(1);
        b.progress().unwrap();
        assert!(b.core.group_open(), "it took its buffer; the other waits for its send");
        b.isend(30, 8).unwrap();
        let chain = &b.posted[2].1;
        assert_eq!(
            (chain[0].remote.addr, chain[0].local.map(|s| s.len)),
            (RECV_ADDR, Some(50))
        );
        b.complete_from(2);
        assert_eq!(b.core.test(idx).unwrap(), Some(50));
    }

    /// A send that found no buffer may go once completions are polled only while an eager
    /// write waits for its acknowledgement, and only if it is small enough for the eager path;
    /// without the eager path, never.
    #[test]
    fn only_a_small_send_behind_an_eager_write_waits_for_completions() {
        let mut b = warmed_up();
        assert!(!b.core.eager_waits_for_completions(50), "nothing on the eager QP");
        eager_idx(b.isend(50, 9).unwrap());
        assert!(b.core.eager_waits_for_completions(50));
        assert!(
            !b.core.eager_waits_for_completions(EAGER_MAX + 1),
            "too large: its CTS alone lets it go"
        );
        b.complete_from(1);
        assert!(!b.core.eager_waits_for_completions(50), "every eager write completed");
        let mut plain = Bench::new(PLAIN);
        plain.cts(&[(1000, 7)]);
        plain.isend(100, 7).unwrap();
        assert!(!plain.core.eager_waits_for_completions(50), "no eager path");
    }
}

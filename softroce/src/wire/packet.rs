//! A whole RoCEv2 transport packet: BTH, the extension headers its opcode
//! implies (in IBTA order: RETH, AtomicETH, AETH, AtomicAckETH, ImmDt,
//! IETH), payload and pad. The ICRC is not part of it (see [`super::icrc`]).

use super::{aeth, atomic_ack_eth, atomic_eth, bth, ieth, immdt, pad_len, reth, Error, OpCode, Result};

/// Parsed transport packet borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    pub bth: bth::Repr,
    pub reth: Option<reth::Repr>,
    pub atomic_eth: Option<atomic_eth::Repr>,
    pub aeth: Option<aeth::Repr>,
    pub atomic_ack_eth: Option<atomic_ack_eth::Repr>,
    /// ImmDt as the big-endian reading of its 4 wire bytes.
    pub immdt: Option<u32>,
    pub ieth: Option<u32>,
    /// Payload without the pad bytes.
    pub payload: &'a [u8],
}

impl<'a> Repr<'a> {
    /// Parse `buf` = BTH .. pad (no ICRC). Unknown opcodes, TVer != 0, a
    /// pad count larger than the payload, a payload on an opcode that
    /// carries none, or a missing header → `Err`.
    pub fn parse(buf: &'a [u8]) -> Result<Repr<'a>> {
        let bthp = bth::Packet::new_checked(buf)?;
        let b = bth::Repr::parse(&bthp)?;
        let op = b.opcode;
        if op.kind().is_none() {
            return Err(Error::Malformed);
        }
        let mut rest = &buf[bth::HEADER_LEN..];
        let mut take = |n: usize| -> Result<&'a [u8]> {
            if rest.len() < n {
                return Err(Error::Truncated);
            }
            let (h, t) = rest.split_at(n);
            rest = t;
            Ok(h)
        };
        let reth = if op.has_reth() {
            Some(reth::Repr::parse(&reth::Packet::new_checked(take(reth::HEADER_LEN)?)?)?)
        } else {
            None
        };
        let atomic_eth = if op.has_atomic_eth() {
            Some(atomic_eth::Repr::parse(&atomic_eth::Packet::new_checked(take(
                atomic_eth::HEADER_LEN,
            )?)?)?)
        } else {
            None
        };
        let aeth = if op.has_aeth() {
            Some(aeth::Repr::parse(&aeth::Packet::new_checked(take(aeth::HEADER_LEN)?)?)?)
        } else {
            None
        };
        let atomic_ack_eth = if op.has_atomic_ack_eth() {
            Some(atomic_ack_eth::Repr::parse(&atomic_ack_eth::Packet::new_checked(
                take(atomic_ack_eth::HEADER_LEN)?,
            )?)?)
        } else {
            None
        };
        let immdt = if op.has_immdt() {
            Some(immdt::Repr::parse(&immdt::Packet::new_checked(take(immdt::HEADER_LEN)?)?)?.imm)
        } else {
            None
        };
        let ieth = if op.has_ieth() {
            Some(ieth::Repr::parse(&ieth::Packet::new_checked(take(ieth::HEADER_LEN)?)?)?.rkey)
        } else {
            None
        };
        let pad = usize::from(b.pad_count);
        if pad > rest.len() {
            return Err(Error::Malformed);
        }
        let payload = &rest[..rest.len() - pad];
        if !op.has_payload() && !rest.is_empty() {
            return Err(Error::Malformed);
        }
        Ok(Repr {
            bth: b,
            reth,
            atomic_eth,
            aeth,
            atomic_ack_eth,
            immdt,
            ieth,
            payload,
        })
    }

    /// Bytes of BTH + extension headers for `opcode`.
    pub fn header_len_for(opcode: OpCode) -> usize {
        bth::HEADER_LEN + opcode.ext_headers_len()
    }

    /// Bytes of BTH + extension headers.
    pub fn header_len(&self) -> usize {
        Self::header_len_for(self.bth.opcode)
    }

    /// Headers + payload + pad.
    pub fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + pad_len(self.payload.len())
    }

    /// Emit headers for a payload of `payload_len` bytes into `buf[..header_len]`.
    /// The BTH pad count is derived from `payload_len` (the `bth.pad_count`
    /// field is ignored). Headers the opcode needs but `self` lacks are
    /// emitted as zero. Panics if `buf` is shorter than `header_len()`.
    pub fn emit_headers(&self, buf: &mut [u8], payload_len: usize) {
        let op = self.bth.opcode;
        let mut b = self.bth;
        b.pad_count = pad_len(payload_len) as u8;
        b.emit(&mut bth::Packet::new_unchecked(&mut buf[..bth::HEADER_LEN]));
        let mut off = bth::HEADER_LEN;
        if op.has_reth() {
            let r = self.reth.unwrap_or_default();
            r.emit(&mut reth::Packet::new_unchecked(&mut buf[off..off + reth::HEADER_LEN]));
            off += reth::HEADER_LEN;
        }
        if op.has_atomic_eth() {
            let r = self.atomic_eth.unwrap_or_default();
            r.emit(&mut atomic_eth::Packet::new_unchecked(
                &mut buf[off..off + atomic_eth::HEADER_LEN],
            ));
            off += atomic_eth::HEADER_LEN;
        }
        if op.has_aeth() {
            let r = self.aeth.unwrap_or(aeth::Repr {
                syndrome: aeth::Syndrome::ACK_NO_CREDITS,
                msn: 0,
            });
            r.emit(&mut aeth::Packet::new_unchecked(&mut buf[off..off + aeth::HEADER_LEN]));
            off += aeth::HEADER_LEN;
        }
        if op.has_atomic_ack_eth() {
            let r = self.atomic_ack_eth.unwrap_or_default();
            r.emit(&mut atomic_ack_eth::Packet::new_unchecked(
                &mut buf[off..off + atomic_ack_eth::HEADER_LEN],
            ));
            off += atomic_ack_eth::HEADER_LEN;
        }
        if op.has_immdt() {
            let r = immdt::Repr {
                imm: self.immdt.unwrap_or(0),
            };
            r.emit(&mut immdt::Packet::new_unchecked(
                &mut buf[off..off + immdt::HEADER_LEN],
            ));
            off += immdt::HEADER_LEN;
        }
        if op.has_ieth() {
            let r = ieth::Repr {
                rkey: self.ieth.unwrap_or(0),
            };
            r.emit(&mut ieth::Packet::new_unchecked(&mut buf[off..off + ieth::HEADER_LEN]));
        }
    }

    /// Emit the whole packet into `buf[..buffer_len()]`. Panics if short.
    pub fn emit(&self, buf: &mut [u8]) {
        let h = self.header_len();
        self.emit_headers(buf, self.payload.len());
        let end = h + self.payload.len();
        buf[h..end].copy_from_slice(self.payload);
        let pad = pad_len(self.payload.len());
        buf[end..end + pad].fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, NakCode, Psn, RethRepr, Syndrome};
    use super::*;

    fn bth(op: OpCode) -> BthRepr {
        BthRepr {
            opcode: op,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: Psn::new(0x123456),
        }
    }

    const BTH_TAIL: [u8; 11] = [0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56];

    fn lit(op: u8, flags: u8, rest: &[u8]) -> Vec<u8> {
        let mut v = vec![op];
        v.extend_from_slice(&BTH_TAIL);
        v[1] = flags;
        v.extend_from_slice(rest);
        v
    }

    fn check(bytes: &[u8], repr: Repr) {
        assert_eq!(Repr::parse(bytes), Ok(repr), "parse {:?}", repr.bth.opcode);
        assert_eq!(repr.buffer_len(), bytes.len());
        let mut out = vec![0xAA; bytes.len()];
        repr.emit(&mut out);
        assert_eq!(out, bytes, "emit {:?}", repr.bth.opcode);
        // Every truncation is rejected without panicking.
        for n in 0..bytes.len() {
            let _ = Repr::parse(&bytes[..n]);
        }
    }

    const RETH: [u8; 16] = [0, 0, 0x7f, 0, 0, 0, 0x10, 0, 0, 0, 0x12, 0x34, 0, 0, 0, 0x10];
    const RETH_R: RethRepr = RethRepr {
        va: 0x7f00_0000_1000,
        rkey: 0x1234,
        dma_len: 16,
    };

    #[test]
    fn every_rc_opcode_literal_round_trip() {
        let pl3 = b"abc";
        // SEND First/Middle/Last/Only: payload only (3 bytes + 1 pad).
        for (op, code) in [
            (OpCode::SendFirst, 0x00),
            (OpCode::SendMiddle, 0x01),
            (OpCode::SendLast, 0x02),
            (OpCode::SendOnly, 0x04),
            (OpCode::WriteMiddle, 0x07),
            (OpCode::WriteLast, 0x08),
            (OpCode::ReadResponseMiddle, 0x0E),
        ] {
            let bytes = lit(code, 0x10, b"abc\0");
            let mut b = bth(op);
            b.pad_count = 1;
            check(
                &bytes,
                Repr {
                    bth: b,
                    reth: None,
                    atomic_eth: None,
                    aeth: None,
                    atomic_ack_eth: None,
                    immdt: None,
                    ieth: None,
                    payload: pl3,
                },
            );
        }
        // SEND Last/Only with Immediate.
        for (op, code) in [
            (OpCode::SendLastWithImm, 0x03),
            (OpCode::SendOnlyWithImm, 0x05),
            (OpCode::WriteLastWithImm, 0x09),
        ] {
            let bytes = lit(code, 0x00, &[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4]);
            check(
                &bytes,
                Repr {
                    bth: bth(op),
                    reth: None,
                    atomic_eth: None,
                    aeth: None,
                    atomic_ack_eth: None,
                    immdt: Some(0xdead_beef),
                    ieth: None,
                    payload: &[1, 2, 3, 4],
                },
            );
        }
        // WRITE First / Only: RETH + payload; READ Request: RETH, no payload.
        for (op, code, pl) in [
            (OpCode::WriteFirst, 0x06, &b"ABCD"[..]),
            (OpCode::WriteOnly, 0x0A, &b"ABCD"[..]),
            (OpCode::ReadRequest, 0x0C, &b""[..]),
        ] {
            let mut rest = RETH.to_vec();
            rest.extend_from_slice(pl);
            check(
                &lit(code, 0, &rest),
                Repr {
                    bth: bth(op),
                    reth: Some(RETH_R),
                    atomic_eth: None,
                    aeth: None,
                    atomic_ack_eth: None,
                    immdt: None,
                    ieth: None,
                    payload: pl,
                },
            );
        }
        // WRITE Only with Immediate: BTH 0, RETH 12, ImmDt 28, payload 32
        // (docs/softroce-internals.md#opcodes).
        let mut rest = RETH.to_vec();
        rest.extend_from_slice(&[0, 0, 0, 7, 9, 9, 9, 9]);
        let bytes = lit(0x0B, 0, &rest);
        assert_eq!(&bytes[28..32], &[0, 0, 0, 7]);
        check(
            &bytes,
            Repr {
                bth: bth(OpCode::WriteOnlyWithImm),
                reth: Some(RETH_R),
                atomic_eth: None,
                aeth: None,
                atomic_ack_eth: None,
                immdt: Some(7),
                ieth: None,
                payload: &[9, 9, 9, 9],
            },
        );
        // READ Response First/Last/Only and ACK: AETH (+ payload).
        let aeth_r = AethRepr {
            syndrome: Syndrome::ACK_NO_CREDITS,
            msn: 5,
        };
        for (op, code, pl) in [
            (OpCode::ReadResponseFirst, 0x0D, &b"wxyz"[..]),
            (OpCode::ReadResponseLast, 0x0F, &b"wxyz"[..]),
            (OpCode::ReadResponseOnly, 0x10, &b""[..]),
            (OpCode::Acknowledge, 0x11, &b""[..]),
        ] {
            let mut rest = vec![0x1f, 0, 0, 5];
            rest.extend_from_slice(pl);
            check(
                &lit(code, 0, &rest),
                Repr {
                    bth: bth(op),
                    reth: None,
                    atomic_eth: None,
                    aeth: Some(aeth_r),
                    atomic_ack_eth: None,
                    immdt: None,
                    ieth: None,
                    payload: pl,
                },
            );
        }
        // NAK remote access error.
        let nak = AethRepr {
            syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
            msn: 5,
        };
        check(
            &lit(0x11, 0, &[0x62, 0, 0, 5]),
            Repr {
                bth: bth(OpCode::Acknowledge),
                reth: None,
                atomic_eth: None,
                aeth: Some(nak),
                atomic_ack_eth: None,
                immdt: None,
                ieth: None,
                payload: &[],
            },
        );
        // ATOMIC ACK: AETH 12, AtomicAckETH 16, total 24.
        let bytes = lit(0x12, 0, &[0x1f, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0x01, 0x02]);
        assert_eq!(bytes.len(), 24);
        check(
            &bytes,
            Repr {
                bth: bth(OpCode::AtomicAcknowledge),
                reth: None,
                atomic_eth: None,
                aeth: Some(aeth_r),
                atomic_ack_eth: Some(AtomicAckEthRepr { orig: 0x102 }),
                immdt: None,
                ieth: None,
                payload: &[],
            },
        );
        // CmpSwap / FetchAdd: AtomicETH.
        let ae = [
            0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3,
        ];
        let ae_r = AtomicEthRepr {
            va: 0x1000,
            rkey: 9,
            swap_add: 2,
            compare: 3,
        };
        for (op, code) in [(OpCode::CompareSwap, 0x13), (OpCode::FetchAdd, 0x14)] {
            check(
                &lit(code, 0, &ae),
                Repr {
                    bth: bth(op),
                    reth: None,
                    atomic_eth: Some(ae_r),
                    aeth: None,
                    atomic_ack_eth: None,
                    immdt: None,
                    ieth: None,
                    payload: &[],
                },
            );
        }
        // SEND Last/Only with Invalidate: IETH.
        for (op, code) in [
            (OpCode::SendLastWithInvalidate, 0x16),
            (OpCode::SendOnlyWithInvalidate, 0x17),
        ] {
            check(
                &lit(code, 0, &[0, 0, 0x12, 0x34, 0xAB, 0xCD, 0xEF, 0x01]),
                Repr {
                    bth: bth(op),
                    reth: None,
                    atomic_eth: None,
                    aeth: None,
                    atomic_ack_eth: None,
                    immdt: None,
                    ieth: Some(0x1234),
                    payload: &[0xAB, 0xCD, 0xEF, 0x01],
                },
            );
        }
    }

    #[test]
    fn malformed_rejected() {
        // Unknown opcode (UC SEND Only).
        assert_eq!(Repr::parse(&lit(0x24, 0, &[])), Err(Error::Malformed));
        // Pad count larger than the payload.
        assert_eq!(Repr::parse(&lit(0x04, 0x30, &[1, 2])), Err(Error::Malformed));
        // Payload on an ACK.
        assert_eq!(Repr::parse(&lit(0x11, 0, &[0x1f, 0, 0, 0, 1])), Err(Error::Malformed));
        // Missing RETH.
        assert_eq!(Repr::parse(&lit(0x0A, 0, &[0; 15])), Err(Error::Truncated));
        // Short BTH.
        assert_eq!(Repr::parse(&[0u8; 11]), Err(Error::Truncated));
    }
}

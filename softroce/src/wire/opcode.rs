//! BTH opcodes (IBTA Vol 1 §9.2, Table 38) and what each implies.

enum_with_unknown! {
    /// BTH OpCode. Only the RC transport (prefix 0b000) is named; every other
    /// value — UC, UD, CNP, reserved — is `Unknown(_)`.
    pub enum OpCode(u8) {
        SendFirst = 0x00,
        SendMiddle = 0x01,
        SendLast = 0x02,
        SendLastWithImm = 0x03,
        SendOnly = 0x04,
        SendOnlyWithImm = 0x05,
        WriteFirst = 0x06,
        WriteMiddle = 0x07,
        WriteLast = 0x08,
        WriteLastWithImm = 0x09,
        WriteOnly = 0x0A,
        WriteOnlyWithImm = 0x0B,
        ReadRequest = 0x0C,
        ReadResponseFirst = 0x0D,
        ReadResponseMiddle = 0x0E,
        ReadResponseLast = 0x0F,
        ReadResponseOnly = 0x10,
        Acknowledge = 0x11,
        AtomicAcknowledge = 0x12,
        CompareSwap = 0x13,
        FetchAdd = 0x14,
        SendLastWithInvalidate = 0x16,
        SendOnlyWithInvalidate = 0x17,
    }
}

/// The class of message an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgKind {
    Send,
    Write,
    Read,
    Atomic,
    ReadResponse,
    Ack,
    AtomicAck,
}

/// Position of a packet within its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    First,
    Middle,
    Last,
    Only,
}

impl OpCode {
    /// `(kind, position)` of a known opcode.
    pub fn kind(self) -> Option<(MsgKind, Position)> {
        use MsgKind as K;
        use OpCode::*;
        use Position as P;
        Some(match self {
            SendFirst => (K::Send, P::First),
            SendMiddle => (K::Send, P::Middle),
            SendLast | SendLastWithImm | SendLastWithInvalidate => (K::Send, P::Last),
            SendOnly | SendOnlyWithImm | SendOnlyWithInvalidate => (K::Send, P::Only),
            WriteFirst => (K::Write, P::First),
            WriteMiddle => (K::Write, P::Middle),
            WriteLast | WriteLastWithImm => (K::Write, P::Last),
            WriteOnly | WriteOnlyWithImm => (K::Write, P::Only),
            ReadRequest => (K::Read, P::Only),
            ReadResponseFirst => (K::ReadResponse, P::First),
            ReadResponseMiddle => (K::ReadResponse, P::Middle),
            ReadResponseLast => (K::ReadResponse, P::Last),
            ReadResponseOnly => (K::ReadResponse, P::Only),
            Acknowledge => (K::Ack, P::Only),
            AtomicAcknowledge => (K::AtomicAck, P::Only),
            CompareSwap | FetchAdd => (K::Atomic, P::Only),
            Unknown(_) => return None,
        })
    }

    /// True for request opcodes (handled by the responder).
    pub fn is_request(self) -> bool {
        matches!(
            self.kind(),
            Some((MsgKind::Send | MsgKind::Write | MsgKind::Read | MsgKind::Atomic, _))
        )
    }

    /// True for response opcodes (handled by the requester's completer).
    pub fn is_response(self) -> bool {
        matches!(
            self.kind(),
            Some((MsgKind::ReadResponse | MsgKind::Ack | MsgKind::AtomicAck, _))
        )
    }

    //= IBTA Vol 1 §9.2, Table 38 "OpCode field": headers following the BTH
    /// RETH follows the BTH (WRITE First/Only, READ Request).
    pub fn has_reth(self) -> bool {
        use OpCode::*;
        matches!(self, WriteFirst | WriteOnly | WriteOnlyWithImm | ReadRequest)
    }
    /// AtomicETH follows the BTH.
    pub fn has_atomic_eth(self) -> bool {
        matches!(self, OpCode::CompareSwap | OpCode::FetchAdd)
    }
    /// ImmDt follows the BTH (and RETH).
    pub fn has_immdt(self) -> bool {
        use OpCode::*;
        matches!(
            self,
            SendLastWithImm | SendOnlyWithImm | WriteLastWithImm | WriteOnlyWithImm
        )
    }
    /// IETH follows the BTH.
    pub fn has_ieth(self) -> bool {
        matches!(self, OpCode::SendLastWithInvalidate | OpCode::SendOnlyWithInvalidate)
    }
    /// AETH follows the BTH.
    pub fn has_aeth(self) -> bool {
        use OpCode::*;
        matches!(
            self,
            ReadResponseFirst | ReadResponseLast | ReadResponseOnly | Acknowledge | AtomicAcknowledge
        )
    }
    /// AtomicAckETH follows the AETH.
    pub fn has_atomic_ack_eth(self) -> bool {
        self == OpCode::AtomicAcknowledge
    }
    /// May carry a payload.
    pub fn has_payload(self) -> bool {
        matches!(
            self.kind(),
            Some((MsgKind::Send | MsgKind::Write | MsgKind::ReadResponse, _))
        )
    }

    /// Length of all headers after the BTH.
    pub fn ext_headers_len(self) -> usize {
        let mut n = 0;
        if self.has_reth() {
            n += super::reth::HEADER_LEN;
        }
        if self.has_atomic_eth() {
            n += super::atomic_eth::HEADER_LEN;
        }
        if self.has_aeth() {
            n += super::aeth::HEADER_LEN;
        }
        if self.has_atomic_ack_eth() {
            n += super::atomic_ack_eth::HEADER_LEN;
        }
        if self.has_immdt() {
            n += super::immdt::HEADER_LEN;
        }
        if self.has_ieth() {
            n += super::ieth::HEADER_LEN;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte: the RC opcodes 0x0D..=0x12 (READ responses, ACK, atomic ACK) are responses,
    /// the other named ones requests, and `Unknown` (UC, UD, CNP, reserved) is neither.
    #[test]
    fn is_request_and_is_response_split_the_rc_opcodes() {
        for b in 0..=u8::MAX {
            let op = OpCode::from(b);
            let named = !matches!(op, OpCode::Unknown(_));
            let response = (0x0D..=0x12).contains(&b);
            assert_eq!(op.is_response(), named && response, "{b:#04x} is_response");
            assert_eq!(op.is_request(), named && !response, "{b:#04x} is_request");
        }
    }
}

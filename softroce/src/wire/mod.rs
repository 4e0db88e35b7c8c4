//! RoCEv2 wire formats (IBTA Vol 1 ch. 9 and Annex A17 "RoCEv2"), and the InfiniBand link
//! layer's LRH, GRH and VCRC (IBTA Vol 1 ch. 7 and 8) for softroce's IB mode.
//!
//! Two levels, as in smoltcp: a `Packet<T: AsRef<[u8]>>` view over a byte
//! buffer with byte ranges in `mod field`, and a `Repr` with `parse`,
//! `emit` and `buffer_len`.
//!
//! # Contract
//!
//! * `Packet::new_checked` verifies the buffer is long enough; after it
//!   succeeds no accessor panics. `Packet::new_unchecked` is for emitting
//!   into buffers the caller sized with `Repr::buffer_len`; accessors on a
//!   too-short unchecked buffer panic (slice indexing) — that is a caller bug.
//! * `Repr::parse` never panics on any input; unknown opcodes and syndromes
//!   map to `Unknown(_)`.
//! * `Repr::emit` panics if the buffer is shorter than `buffer_len()`.
//! * All multi-byte fields are big-endian except the ICRC, which is appended
//!   little-endian (see [`icrc`]).

#![forbid(unsafe_code)]

/// The mask of the headers' 24-bit fields (BTH PSN and destination QP, AETH MSN): keeps a value's
/// low 24 bits; also the largest value such a field holds.
pub const MASK_24: u32 = 0x00FF_FFFF;

/// Define a wire enum whose unknown values map to `Unknown(_)` (smoltcp's `enum_with_unknown!`).
macro_rules! enum_with_unknown {
    (
        $( #[$enum_attr:meta] )*
        pub enum $name:ident($ty:ty) {
            $( $( #[$variant_attr:meta] )* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $( #[$enum_attr] )*
        #[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Clone, Copy)]
        pub enum $name {
            $( $( #[$variant_attr] )* $variant ),*,
            Unknown($ty)
        }

        impl ::core::convert::From<$ty> for $name {
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant ),*,
                    other => $name::Unknown(other)
                }
            }
        }

        impl ::core::convert::From<$name> for $ty {
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value ),*,
                    $name::Unknown(other) => other
                }
            }
        }
    }
}

/// Errors of `new_checked` / `parse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Buffer shorter than the header (or than the headers the opcode implies).
    Truncated,
    /// A field has a value this implementation does not accept (TVer != 0,
    /// pad count larger than the payload, unknown opcode when a full packet
    /// is parsed, …).
    Malformed,
}

pub type Result<T> = core::result::Result<T, Error>;

#[macro_use]
mod scalar;

pub mod aeth;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod grh;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod lrh;
pub mod opcode;
pub mod packet;
pub mod psn;
pub mod reth;
pub mod vcrc;

pub use aeth::{NakCode, Packet as AethPacket, Repr as AethRepr, Syndrome};
pub use atomic_ack_eth::{Packet as AtomicAckEthPacket, Repr as AtomicAckEthRepr};
pub use atomic_eth::{Packet as AtomicEthPacket, Repr as AtomicEthRepr};
pub use bth::{Packet as BthPacket, Repr as BthRepr};
pub use grh::{Packet as GrhPacket, Repr as GrhRepr};
pub use ieth::{Packet as IethPacket, Repr as IethRepr};
pub use immdt::{Packet as ImmDtPacket, Repr as ImmDtRepr};
pub use lrh::{Lnh, Packet as LrhPacket, Repr as LrhRepr};
pub use opcode::OpCode;
pub use packet::Repr as RocePacketRepr;
pub use psn::Psn;
pub use reth::{Packet as RethPacket, Repr as RethRepr};

/// UDP destination port of RoCEv2.
//= IBTA Annex A17 §A17.4.2
//# The UDP destination port shall be 4791.
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Default P_Key (full member of the default partition).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// Path MTU in bytes from `enum ibv_mtu` (1..=5); `None` otherwise.
pub fn mtu_bytes(ibv_mtu: u8) -> Option<u32> {
    match ibv_mtu {
        1 => Some(256),
        2 => Some(512),
        3 => Some(1024),
        4 => Some(2048),
        5 => Some(4096),
        _ => None,
    }
}

/// Pad bytes needed after `payload_len` bytes to reach a multiple of 4.
pub fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

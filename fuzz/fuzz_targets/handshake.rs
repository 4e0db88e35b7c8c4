//! The plugin's connection handle and side-channel frames on arbitrary bytes
//! (`ferroce::transport::proto::handshake`: `HandleRepr`, the connect-stage bytes, `HeaderRepr`,
//! `EndpointRepr`, `Message::parse` and `FrameReader`).
//!
//! Invariants, beyond "no panic":
//! * every `Repr` that parsed emits bytes that parse to the same `Repr` (a `Reject` text only
//!   when it fits the 1 KiB that `emit` keeps), and an endpoint's `buffer_len` is its input's;
//! * the stage bytes of a handle are independent of its listener part;
//! * a `FrameReader` fed the input whole, byte by byte, in `want()`-sized pieces and in pieces
//!   split at input-chosen points yields the same messages and the same first error, and never
//!   a message before `want()` bytes arrived.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nccl_net_ferroce::transport::proto::handshake::*;

/// What a reader produced: the messages in order, then the first error, if any.
#[derive(Debug, PartialEq)]
struct Outcome {
    messages: Vec<Frame>,
    error: Option<WireError>,
}

/// Drain `r`: push every whole message; stop at the first error. Returns false after an error.
fn drain(r: &mut FrameReader, out: &mut Outcome) -> bool {
    loop {
        match r.poll_message() {
            Ok(Some(m)) => out.messages.push(m),
            Ok(None) => return true,
            Err(e) => {
                out.error = Some(e);
                return false;
            }
        }
    }
}

/// Feed `data` to a fresh reader in the pieces `cut` chooses (bytes left -> piece length).
fn read_in_pieces(data: &[u8], mut cut: impl FnMut(&FrameReader, usize) -> usize) -> Outcome {
    let mut r = FrameReader::default();
    let mut out = Outcome {
        messages: vec![],
        error: None,
    };
    let mut at = 0;
    while at < data.len() {
        let want = r.want();
        assert!(want >= 1, "want() is at least 1");
        let n = cut(&r, data.len() - at).clamp(1, data.len() - at);
        r.handle_bytes(&data[at..at + n]);
        at += n;
        let before = out.messages.len();
        if !drain(&mut r, &mut out) {
            return out;
        }
        if n < want {
            assert_eq!(
                out.messages.len(),
                before,
                "a message before want() = {want} bytes arrived ({n})"
            );
        }
        r.release_buffer();
    }
    out
}

/// Whether `emit` keeps all of `m`: a `Reject` text (also one a link frame carries) only when
/// it fits the 1 KiB that `emit` keeps.
fn emitted_whole(m: &Message) -> bool {
    match m {
        Message::Reject { text, .. } => text.len() <= 1024,
        Message::OnComm { message, .. } => emitted_whole(message),
        _ => true,
    }
}

fn round_trip_message(version: u16, m: &Message) {
    if !emitted_whole(m) {
        return;
    }
    let mut out = Vec::new();
    m.emit(version, &mut out);
    let h = HeaderRepr::parse(&out).expect("an emitted header parses");
    assert_eq!(h.body_len + HEADER_BYTES, out.len());
    assert_eq!(h.version, version);
    assert_eq!(
        &Message::parse(version, h.kind, &out[HEADER_BYTES..]).expect("an emitted body parses"),
        m
    );
}

fuzz_target!(|data: &[u8]| {
    // The handle: its first 128 bytes.
    if data.len() >= HANDLE_BYTES {
        let mut h = [0u8; HANDLE_BYTES];
        h.copy_from_slice(&data[..HANDLE_BYTES]);
        let parsed = HandleRepr::parse(&h);
        if let Ok(r) = parsed {
            let mut h2 = [0u8; HANDLE_BYTES];
            r.emit(&mut h2);
            assert_eq!(HandleRepr::parse(&h2), Ok(r), "handle: parse(emit(r)) == r");
            assert_eq!(read_stage(&h2), None, "a fresh handle records no stage");
        }
        let id = u64::from_le_bytes(data[..8].try_into().unwrap());
        write_stage(&mut h, Some(id));
        assert_eq!(read_stage(&h), Some(id));
        assert_eq!(
            HandleRepr::parse(&h),
            parsed,
            "stage bytes do not change the listener part"
        );
        write_stage(&mut h, None);
        assert_eq!(read_stage(&h), None);
    }
    // A frame header.
    if let Ok(hd) = HeaderRepr::parse(data) {
        let mut out = Vec::new();
        hd.emit(&mut out);
        assert_eq!(HeaderRepr::parse(&out), Ok(hd), "header: parse(emit(h)) == h");
        // Byte 11 is reserved: parse ignores it, emit writes 0.
        let mut want = [0u8; HEADER_BYTES];
        want.copy_from_slice(&data[..HEADER_BYTES]);
        want[11] = 0;
        assert_eq!(out[..], want[..], "header: emit(parse(x)) == x but the reserved byte");
    }
    // A body, as every kind (including unknown ones), at every version this build speaks.
    for v in OLDEST_WIRE_VERSION..=WIRE_VERSION {
        if let Ok(e) = EndpointRepr::parse(v, data) {
            assert_eq!(e.buffer_len(v), data.len());
            let mut out = Vec::new();
            e.emit(v, &mut out);
            assert_eq!(
                EndpointRepr::parse(v, &out).as_ref(),
                Ok(&e),
                "endpoint: parse(emit(e)) == e at version {v}"
            );
        }
    }
    for k in [1u8, 2, 3, 4, 5, 6, 7, 8, data.first().copied().unwrap_or(0)] {
        for v in OLDEST_WIRE_VERSION..=WIRE_VERSION {
            if let Ok(m) = Message::parse(v, Kind::from(k), data) {
                round_trip_message(v, &m);
            }
        }
    }
    // The stream: whole, byte by byte, in want()-sized pieces, and split where the input says.
    let whole = read_in_pieces(data, |_, left| left);
    for f in &whole.messages {
        round_trip_message(f.version, &f.message);
    }
    assert_eq!(read_in_pieces(data, |_, _| 1), whole, "byte by byte");
    assert_eq!(read_in_pieces(data, |r, _| r.want()), whole, "in want()-sized pieces");
    let mut seed = data
        .iter()
        .fold(0x9e37_79b9_u64, |h, &b| h.rotate_left(5) ^ u64::from(b));
    let split = read_in_pieces(data, |_, left| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        1 + (seed >> 33) as usize % left.min(64)
    });
    assert_eq!(split, whole, "split at random points");
});

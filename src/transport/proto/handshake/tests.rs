//! The handshake formats' tests: literal bytes for the wire, round trips, garbage refused.

use super::*;

#[test]
fn recovery_messages_round_trip_and_a_lying_count_is_refused() {
    let qps = EndpointRepr {
        nonce: 0,
        tc: 0,
        sl: 0,
        flags: 0,
        addr: 0,
        devs: vec![DevRepr {
            gid: [7; 16],
            lid: 0,
            port: 1,
            link_layer: LinkLayer::Ethernet,
            mtu: 3,
            gid_index: 1,
            rkey: 0,
            name: [0; NAME_BYTES],
        }],
        qps: vec![QpRepr { qpn: 0x33, dev: 0 }],
        eager: EagerOffer::default(),
        link: LinkOffer::default(),
    };
    for m in [
        Message::RecoverHello {
            epoch: 3,
            head: 77,
            taken: vec![5, 1 << 40],
            qps: Box::new(qps.clone()),
        },
        Message::RecoverReady { epoch: 9 },
    ] {
        let mut out = Vec::new();
        m.emit(WIRE_VERSION, &mut out);
        let h = HeaderRepr::parse(&out).unwrap();
        assert_eq!(Message::parse(h.version, h.kind, &out[HEADER_BYTES..]).unwrap(), m);
    }
    let mut body = vec![0u8; 16];
    body[12..16].copy_from_slice(&(u32::MAX).to_le_bytes());
    assert!(Message::parse(WIRE_VERSION, Kind::RecoverHello, &body).is_err());
    assert!(Message::parse(WIRE_VERSION, Kind::RecoverHello, &body[..10]).is_err());
    assert!(Message::parse(WIRE_VERSION, Kind::RecoverReady, &[1, 2]).is_err());
}

fn endpoint(ndevs: usize, nqps: usize) -> EndpointRepr {
    let devs = (0..ndevs)
        .map(|i| {
            let mut d = DevRepr {
                gid: [i as u8; 16],
                lid: 0x100 + i as u16,
                port: 1,
                link_layer: LinkLayer::Ethernet,
                mtu: 3,
                gid_index: 3,
                rkey: 0xabc0 + i as u32,
                name: [0; NAME_BYTES],
            };
            d.set_name(&format!("softroce{i}"));
            d
        })
        .collect();
    let qps = (0..nqps)
        .map(|i| QpRepr {
            qpn: 0x11 + i as u32,
            dev: (i % ndevs) as u8,
        })
        .collect();
    EndpointRepr {
        nonce: 0x1234_5678_9abc_def0,
        tc: 106,
        sl: 3,
        flags: FLAG_SPLIT,
        addr: 0x7f00_dead_b000,
        devs,
        qps,
        eager: EagerOffer {
            landing: 0x7f00_dead_c000,
            slot_bytes: 256,
            max: 224,
        },
        link: LinkOffer {
            process: 9,
            attach: 0,
            found: 0x5eed,
            comm: 77,
        },
    }
}

#[test]
fn handle_round_trip_v4_v6() {
    let mut fe80_1 = [0u8; 16];
    fe80_1[0] = 0xfe;
    fe80_1[1] = 0x80;
    fe80_1[15] = 1;
    for addr in [
        ListenAddr::V4 {
            ip: [127, 0, 40, 1],
            port: 45678,
        },
        ListenAddr::V6 {
            ip: fe80_1,
            port: 1000,
            scope_id: 3,
        },
    ] {
        let r = HandleRepr {
            addr,
            ndevs: 2,
            nonce: 77,
            min_version: OLDEST_WIRE_VERSION,
            max_version: WIRE_VERSION,
            process: 0xabc,
        };
        let mut h = [0xffu8; HANDLE_BYTES];
        r.emit(&mut h);
        assert_eq!(HandleRepr::parse(&h), Ok(r));
        assert_eq!(read_stage(&h), None);
        write_stage(&mut h, Some(5));
        assert_eq!(read_stage(&h), Some(5));
        assert_eq!(
            HandleRepr::parse(&h),
            Ok(r),
            "stage bytes do not disturb the listener part"
        );
        write_stage(&mut h, None);
        assert_eq!(read_stage(&h), None);
        // The GID slots: empty as emitted, two at most, apart from the rest.
        assert_eq!(read_listen_gids(&h), [[0; 16]; 2]);
        write_listen_gids(&mut h, &[[1; 16], [2; 16], [3; 16]]);
        write_stage(&mut h, Some(9));
        assert_eq!(read_listen_gids(&h), [[1; 16], [2; 16]]);
        assert_eq!((HandleRepr::parse(&h), read_stage(&h)), (Ok(r), Some(9)));
        write_listen_gids(&mut h, &[[4; 16]]);
        assert_eq!(read_listen_gids(&h), [[4; 16], [0; 16]]);
    }
}

/// A handle as a version-4 build writes it: version 4 at byte 8, nothing at 14..16.
fn handle_of(min: u16, max: u16) -> [u8; HANDLE_BYTES] {
    let mut h = [0u8; HANDLE_BYTES];
    HandleRepr {
        addr: ListenAddr::V4 {
            ip: [127, 0, 0, 1],
            port: 9,
        },
        ndevs: 1,
        nonce: 1,
        min_version: min,
        max_version: max,
        process: 0,
    }
    .emit(&mut h);
    h
}

#[test]
fn versions_are_negotiated_to_the_newest_both_ends_speak() {
    let mut v4_build = handle_of(4, 4);
    v4_build[14..16].fill(0);
    let listener = HandleRepr::parse(&v4_build).expect("a version-4 build's handle");
    assert_eq!((listener.min_version, listener.max_version), (4, 4));
    assert_eq!(
        listener.negotiate(WIRE_VERSION),
        Ok(4),
        "an older listener gets its version"
    );
    let ours = HandleRepr::parse(&handle_of(4, WIRE_VERSION)).unwrap();
    assert_eq!(ours.negotiate(WIRE_VERSION), Ok(WIRE_VERSION));
    assert_eq!(
        ours.negotiate(4),
        Ok(4),
        "a connector held at 4 (FERROCE_WIRE_VERSION=4)"
    );
    assert_eq!(
        &handle_of(4, WIRE_VERSION)[8..10],
        &[4, 0],
        "what a version-4 build checks"
    );
    let newer = HandleRepr::parse(&handle_of(4, 9)).expect("a newer build that still speaks 4");
    assert_eq!(newer.negotiate(WIRE_VERSION), Ok(WIRE_VERSION));
    assert_eq!(HandleRepr::parse(&handle_of(8, 9)), Err(WireError::BadVersion(8)));
    assert_eq!(local_max_version(0), WIRE_VERSION);
    assert_eq!(local_max_version(1), OLDEST_WIRE_VERSION);
    assert_eq!(local_max_version(99), WIRE_VERSION);
}

#[test]
fn handle_literal_bytes() {
    let r = HandleRepr {
        addr: ListenAddr::V4 {
            ip: [10, 1, 2, 3],
            port: 4660,
        },
        ndevs: 1,
        nonce: 0x0102030405060708,
        min_version: 4,
        max_version: 5,
        process: 0,
    };
    let mut h = [0u8; HANDLE_BYTES];
    r.emit(&mut h);
    assert_eq!(&h[0..8], b"ferroceH");
    assert_eq!(&h[8..16], &[4, 0, 4, 1, 0x12, 0x34, 5, 0]);
    assert_eq!(&h[16..20], &[10, 1, 2, 3]);
    assert_eq!(&h[40..48], &[8, 7, 6, 5, 4, 3, 2, 1]);
    assert!(h[48..].iter().all(|&b| b == 0));
    // Version 6: the listener's process id at 48..56; a handle that says only 5 has none.
    let v6 = HandleRepr {
        max_version: 6,
        process: 0x1112131415161718,
        ..r
    };
    v6.emit(&mut h);
    assert_eq!(&h[14..16], &[6, 0]);
    assert_eq!(&h[48..56], &[0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]);
    assert_eq!(HandleRepr::parse(&h), Ok(v6));
    h[14] = 5;
    assert_eq!(HandleRepr::parse(&h).map(|p| p.process), Ok(0));
}

#[test]
fn handle_garbage_rejected() {
    let h = [0u8; HANDLE_BYTES];
    assert!(matches!(HandleRepr::parse(&h), Err(WireError::BadMagic(0))));
    let mut h = [0u8; HANDLE_BYTES];
    HandleRepr {
        addr: ListenAddr::V4 {
            ip: [1, 2, 3, 4],
            port: 5,
        },
        ndevs: 1,
        nonce: 0,
        min_version: OLDEST_WIRE_VERSION,
        max_version: WIRE_VERSION,
        process: 0,
    }
    .emit(&mut h);
    let mut bad = h;
    bad[8] = 9;
    bad[14] = 9;
    assert!(matches!(HandleRepr::parse(&bad), Err(WireError::BadVersion(9))));
    let mut bad = h;
    bad[8] = 5;
    bad[14] = 4;
    assert!(
        HandleRepr::parse(&bad).is_err(),
        "a version range that ends before it starts"
    );
    let mut bad = h;
    bad[10] = 5;
    assert!(HandleRepr::parse(&bad).is_err());
    let mut bad = h;
    bad[11] = 0;
    assert!(HandleRepr::parse(&bad).is_err());
    let mut bad = h;
    bad[12] = 0;
    bad[13] = 0;
    assert!(HandleRepr::parse(&bad).is_err());
}

#[test]
fn endpoint_round_trip() {
    for (nd, nq) in [(1, 1), (2, 4), (8, 1024)] {
        let e = endpoint(nd, nq);
        let mut out = Vec::new();
        Message::ConnectReq(e.clone()).emit(WIRE_VERSION, &mut out);
        assert_eq!(out.len(), HEADER_BYTES + e.buffer_len(WIRE_VERSION));
        let mut r = FrameReader::default();
        // Byte-by-byte delivery.
        let mut got = None;
        for b in &out {
            assert!(r.want() >= 1);
            r.handle_bytes(std::slice::from_ref(b));
            if let Some(m) = r.poll_message().unwrap() {
                got = Some(m);
            }
        }
        assert_eq!(got.map(|f| f.message), Some(Message::ConnectReq(e.clone())));
        assert_eq!(e.devs[0].name_str(), "softroce0");
    }
}

#[test]
fn small_messages_round_trip() {
    for m in [
        Message::Ready { nonce: 9 },
        Message::Reject {
            code: 2,
            text: "nonce mismatch".into(),
        },
    ] {
        let mut out = Vec::new();
        m.emit(WIRE_VERSION, &mut out);
        let mut r = FrameReader::default();
        r.handle_bytes(&out);
        assert_eq!(
            r.poll_message().unwrap(),
            Some(Frame {
                version: WIRE_VERSION,
                message: m
            })
        );
        assert_eq!(r.poll_message().unwrap(), None);
    }
}

#[test]
fn link_frames_round_trip_and_only_carry_a_comm_s_messages() {
    let route = Route {
        comm: 0x0102_0304_0506_0708,
        to_recv: true,
    };
    let on = Message::OnComm {
        route,
        message: Box::new(Message::RecoverReady { epoch: 3 }),
    };
    let mut out = Vec::new();
    on.emit(WIRE_VERSION, &mut out);
    // kind 7, body: comm, direction 1, inner kind 6 (RecoverReady), 2 zero bytes, epoch.
    assert_eq!(out[10], 7);
    assert_eq!(&out[16..], &[8, 7, 6, 5, 4, 3, 2, 1, 1, 6, 0, 0, 3, 0, 0, 0]);
    let closed = Message::CommClosed {
        route: Route {
            to_recv: false,
            ..route
        },
    };
    closed.emit(WIRE_VERSION, &mut out);
    let mut r = FrameReader::default();
    r.handle_bytes(&out);
    assert_eq!(r.poll_message().unwrap().map(|f| f.message), Some(on.clone()));
    assert_eq!(r.poll_message().unwrap().map(|f| f.message), Some(closed));
    // A link frame inside OnComm, a bad direction, and link frames before version 6.
    let mut body = out[16..32].to_vec();
    body[9] = 8;
    assert!(Message::parse(WIRE_VERSION, Kind::OnComm, &body).is_err());
    body[9] = 6;
    body[8] = 2;
    assert!(Message::parse(WIRE_VERSION, Kind::OnComm, &body).is_err());
    let mut v5 = Vec::new();
    on.emit(WIRE_VERSION, &mut v5);
    v5[8] = 5;
    assert_eq!(HeaderRepr::parse(&v5), Err(WireError::BadKind(7)));
    assert_eq!(
        Message::parse(5, Kind::CommClosed, &[0; 12]),
        Err(WireError::BadKind(8))
    );
}

#[test]
fn the_link_trailer_follows_the_eager_one_from_version_6() {
    let e = endpoint(1, 2);
    for (v, trailer) in [(4u16, 0usize), (5, 16), (6, 48)] {
        let mut out = Vec::new();
        e.emit(v, &mut out);
        assert_eq!(out.len(), 24 + 48 + 2 * 8 + trailer);
        let back = EndpointRepr::parse(v, &out).unwrap();
        assert_eq!(back.link, if v >= 6 { e.link } else { LinkOffer::default() });
    }
}

/// The trailers' bytes, literally: after 24 + 48 + 8 bytes (one device, one QP), the eager
/// trailer (landing u64, slot bytes u32, largest payload u32), then the link trailer (process,
/// attach, found, comm: u64 each), all little-endian; the view reads them back.
#[test]
fn endpoint_trailers_literal_bytes() {
    let e = endpoint(1, 1);
    let mut out = Vec::new();
    e.emit(6, &mut out);
    let t = 24 + 48 + 8;
    assert_eq!(
        &out[t..],
        &[
            0x00, 0xc0, 0xad, 0xde, 0x00, 0x7f, 0, 0, // landing 0x7f00_dead_c000
            0x00, 0x01, 0, 0, // slot bytes 256
            0xe0, 0, 0, 0, // max 224
            9, 0, 0, 0, 0, 0, 0, 0, // process
            0, 0, 0, 0, 0, 0, 0, 0, // attach
            0xed, 0x5e, 0, 0, 0, 0, 0, 0, // found 0x5eed
            77, 0, 0, 0, 0, 0, 0, 0, // comm
        ][..]
    );
    let p = EndpointPacket::new_checked(6, &out[..]).unwrap();
    assert_eq!(p.eager_trailer(), Some(&out[t..t + 16]));
    assert_eq!(p.link_trailer(), Some(&out[t + 16..]));
    assert_eq!((p.ndevs(), p.nqps(), p.nonce()), (1, 1, e.nonce));
    let v5 = EndpointPacket::new_checked(5, &out[..t + 16]).unwrap();
    assert_eq!(v5.link_trailer(), None, "no link trailer before version 6");
    assert!(
        EndpointPacket::new_checked(6, &out[..t + 16]).is_err(),
        "version 6 needs both"
    );
}

#[test]
fn frame_header_literal() {
    let mut out = Vec::new();
    Message::Ready { nonce: 1 }.emit(WIRE_VERSION, &mut out);
    assert_eq!(&out[..16], b"ferroceW\x07\x00\x03\x00\x08\x00\x00\x00");
    let mut out = Vec::new();
    Message::Ready { nonce: 1 }.emit(4, &mut out);
    assert_eq!(
        &out[..16],
        b"ferroceW\x04\x00\x03\x00\x08\x00\x00\x00",
        "a version-4 frame"
    );
}

#[test]
fn garbage_frames_rejected_early() {
    // An HTTP request, NCCL's own socket magic, random bytes.
    let nccl = 0x564ab9f2fc4b9d6cu64.to_le_bytes();
    for junk in [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], &nccl[..], &[0xffu8; 64][..]] {
        let mut r = FrameReader::default();
        r.handle_bytes(junk);
        if junk.len() >= HEADER_BYTES {
            assert!(r.poll_message().is_err());
        } else {
            assert_eq!(r.poll_message(), Ok(None));
        }
    }
    // Valid header, unknown kind / wrong version / oversize.
    let mut out = Vec::new();
    Message::Ready { nonce: 1 }.emit(WIRE_VERSION, &mut out);
    let mut k = out.clone();
    k[10] = 99;
    assert_eq!(HeaderRepr::parse(&k), Err(WireError::BadKind(99)));
    let mut v = out.clone();
    v[8] = 1;
    assert_eq!(
        HeaderRepr::parse(&v),
        Err(WireError::BadVersion(1)),
        "version 1 (records apart) is rejected"
    );
    v[8] = 2;
    assert_eq!(
        HeaderRepr::parse(&v),
        Err(WireError::BadVersion(2)),
        "version 2 (FIFO slots of 8 entries) is rejected"
    );
    let mut l = out.clone();
    l[12..16].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
    assert!(matches!(HeaderRepr::parse(&l), Err(WireError::TooLong(_))));
}

#[test]
fn the_eager_offer_travels_from_version_5_only() {
    let e = endpoint(1, 2);
    for (v, trailer) in [(4u16, 0usize), (5, 16)] {
        let mut body = Vec::new();
        e.emit(v, &mut body);
        assert_eq!(body.len(), 24 + DEV_BYTES + 2 * QP_BYTES + trailer, "version {v}");
        let back = EndpointRepr::parse(v, &body).expect("parses at its version");
        let want = if v >= EAGER_VERSION {
            e.eager
        } else {
            EagerOffer::default()
        };
        assert_eq!(back.eager, want, "version {v}");
        assert!(
            EndpointRepr::parse(9 - v, &body).is_err(),
            "a body of version {v} is not one of the other"
        );
    }
    let mut body = Vec::new();
    e.emit(5, &mut body);
    let t = body.len() - 16;
    assert_eq!(&body[t..t + 8], &0x7f00_dead_c000u64.to_le_bytes());
    assert_eq!(&body[t + 8..], &[0, 1, 0, 0, 224, 0, 0, 0]);
    let mut bad = body.clone();
    bad[t + 8] = 65;
    assert_eq!(
        EndpointRepr::parse(5, &bad),
        Err(WireError::BadField("eager landing ring"))
    );
    let mut bad = body;
    bad[t + 12] = 225;
    assert_eq!(
        EndpointRepr::parse(5, &bad),
        Err(WireError::BadField("eager landing ring")),
        "a payload past its slot"
    );
}

#[test]
fn endpoint_inconsistent_rejected() {
    let e = endpoint(2, 4);
    let mut body = Vec::new();
    e.emit(WIRE_VERSION, &mut body);
    // Truncated.
    assert!(EndpointRepr::parse(WIRE_VERSION, &body[..body.len() - 1]).is_err());
    // Trailing junk.
    let mut long = body.clone();
    long.push(0);
    assert!(EndpointRepr::parse(WIRE_VERSION, &long).is_err());
    // QP pointing at a device that does not exist.
    let mut bad = body.clone();
    let qoff = 24 + 2 * DEV_BYTES + 4;
    bad[qoff] = 2;
    assert_eq!(
        EndpointRepr::parse(WIRE_VERSION, &bad),
        Err(WireError::BadField("QP device index"))
    );
    // QP number 0 / ≥ 2^24.
    let mut bad = body.clone();
    bad[24 + 2 * DEV_BYTES..24 + 2 * DEV_BYTES + 4].copy_from_slice(&(1u32 << 24).to_le_bytes());
    assert!(EndpointRepr::parse(WIRE_VERSION, &bad).is_err());
    // MTU out of range.
    let mut bad = body.clone();
    bad[24 + 20] = 9;
    assert_eq!(EndpointRepr::parse(WIRE_VERSION, &bad), Err(WireError::BadField("MTU")));
    // Zero devices, too few QPs.
    let mut bad = body.clone();
    bad[8] = 0;
    assert!(EndpointRepr::parse(WIRE_VERSION, &bad).is_err());
    let mut bad = body;
    bad[12..14].copy_from_slice(&1u16.to_le_bytes());
    assert!(EndpointRepr::parse(WIRE_VERSION, &bad).is_err());
}

#[test]
fn fuzz_never_panics() {
    let mut seed = 0x2545f4914f6cdd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut good = Vec::new();
    Message::ConnectReq(endpoint(2, 4)).emit(WIRE_VERSION, &mut good);
    for _ in 0..20000 {
        let mut b = good.clone();
        let flips = rnd() % 4 + 1;
        for _ in 0..flips {
            let i = (rnd() as usize) % b.len();
            b[i] = rnd() as u8;
        }
        b.truncate((rnd() as usize) % (b.len() + 1));
        let mut r = FrameReader::default();
        r.handle_bytes(&b);
        let _ = r.poll_message();
        let _ = r.want();
        let mut h = [0u8; HANDLE_BYTES];
        for x in h.iter_mut() {
            *x = rnd() as u8;
        }
        let _ = HandleRepr::parse(&h);
    }
}

/// `RecvClosed` (version 7): literal bytes, the round trip inside an `OnComm` frame, and the
/// refusals: an older version, a count past the most QPs, a body of another length.
#[test]
fn recv_closed_is_version_7_and_checked() {
    let m = Message::RecvClosed {
        receives: 3,
        in_flight: 2,
        taken: vec![1, 0x0102],
    };
    let mut out = Vec::new();
    m.emit(CLOSE_VERSION, &mut out);
    assert_eq!(out[10], 9, "kind");
    #[rustfmt::skip]
    let body: [u8; 32] = [
        3, 0, 0, 0, 0, 0, 0, 0, // receives taken
        2, 0, 0, 0, // receives never taken
        2, 0, 0, 0, // QPs
        1, 0, 0, 0, 0, 0, 0, 0, // QP 0
        2, 1, 0, 0, 0, 0, 0, 0, // QP 1
    ];
    assert_eq!(&out[HEADER_BYTES..], &body);
    assert_eq!(Message::parse(CLOSE_VERSION, Kind::RecvClosed, &body).unwrap(), m);
    let on = Message::OnComm {
        route: Route {
            comm: 5,
            to_recv: false,
        },
        message: Box::new(m.clone()),
    };
    let mut framed = Vec::new();
    on.emit(CLOSE_VERSION, &mut framed);
    let mut r = FrameReader::default();
    r.handle_bytes(&framed);
    assert_eq!(r.poll_message().unwrap().map(|f| f.message), Some(on));
    // A version-6 peer never sends it, and a frame that says it did is refused.
    let mut old = out.clone();
    old[8..10].copy_from_slice(&LINK_VERSION.to_le_bytes());
    assert!(HeaderRepr::parse(&old).is_err());
    assert!(Message::parse(LINK_VERSION, Kind::RecvClosed, &body).is_err());
    let mut many = body;
    many[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Message::parse(CLOSE_VERSION, Kind::RecvClosed, &many).is_err());
    assert!(Message::parse(CLOSE_VERSION, Kind::RecvClosed, &body[..31]).is_err());
}

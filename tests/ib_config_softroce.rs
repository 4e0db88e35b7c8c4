//! The plugin's InfiniBand configuration on softroce's InfiniBand ports
//! (docs/nccl-net-abi.md#gid-selection, docs/testing.md#infiniband), each check in a child
//! process of its own (the configuration is read once per process):
//!
//! * the GID: the routable FLID GID at `NCCL_IB_ROUTABLE_FLID_GID_INDEX` when softroce's router
//!   gives the port one (`SOFTROCE_IB_ROUTER=on`), else GID 0, whatever `NCCL_IB_GID_INDEX` says;
//! * `NCCL_IB_PKEY`: an index into the port's P_Key table (`SOFTROCE_PKEYS`) that the
//!   connections use, and an index past the table a clear error of `init`; `NCCL_IB_PKEY_VALUE`:
//!   the P_Key by value (or by its partition), looked up in the table, and one not there a clear
//!   error of `init`;
//! * a peer on the other link layer (an InfiniBand process and a RoCE process): refused on both
//!   ends with one line naming both link layers;
//! * a fused device of an InfiniBand and a RoCE port (`SOFTROCE_LINK_LAYER=ib,roce`): refused.
//!
//! Addresses 127.0.38.x (ci/tests/lib/softroce.sh has the table), one or two per case.

mod softroce_common;

use nccl_net_ferroce::api::{self, RecvHandle, SendHandle};
use nccl_net_ferroce::device::NetDevice;
use nccl_net_ferroce::error::{code, Error};
use softroce_common::{child, child_command, pair, run_child, transfer};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const IB: (&str, &str) = ("SOFTROCE_LINK_LAYER", "ib");

/// The first member of the device of send comm `s`.
fn member(s: &SendHandle) -> &NetDevice {
    // SAFETY: s is a live SendHandle.
    let dev = unsafe { api::comm_device(s as *const SendHandle as *mut c_void) };
    &dev.members[0]
}

/// A pair on device 0 that moves one message: `check` sees the port's device and the two comms
/// first.
fn connect_and_check(check: impl FnOnce(&NetDevice, &SendHandle, &RecvHandle)) {
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    check(member(&s), &s, &r);
    transfer(
        &s,
        &r,
        65536,
        0x36,
        (std::ptr::null_mut(), std::ptr::null_mut()),
        Duration::from_secs(20),
    )
    .expect("a message over the pair");
    drop((s, r));
    api::finalize(ctx).expect("finalize");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn ib_uses_the_flid_gid_when_the_port_has_one_whatever_nccl_ib_gid_index_says() {
    let name = "ib_uses_the_flid_gid_when_the_port_has_one_whatever_nccl_ib_gid_index_says";
    if child(name, || {
        connect_and_check(|d, _, _| {
            assert_eq!(d.gid_index, 1, "NCCL_IB_ROUTABLE_FLID_GID_INDEX's GID: {d:?}");
            assert_eq!(d.gid[..2], [0xfe, 0xc0], "{d:?}");
            assert_eq!(d.gid[4..6], d.lid.to_be_bytes(), "softroce's FLID is the LID: {d:?}");
            println!("GID[{}] {:?}", d.gid_index, d);
        })
    }) {
        return;
    }
    run_child(
        name,
        "127.0.38.1",
        &[IB, ("SOFTROCE_IB_ROUTER", "on"), ("NCCL_IB_GID_INDEX", "3")],
    );
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn ib_uses_gid_0_without_a_flid_whatever_nccl_ib_gid_index_says() {
    let name = "ib_uses_gid_0_without_a_flid_whatever_nccl_ib_gid_index_says";
    if child(name, || {
        connect_and_check(|d, _, _| {
            assert_eq!(d.gid_index, 0, "no FLID GID: GID 0 ({d:?})");
            assert_eq!(d.gid[..2], [0xfe, 0x80], "{d:?}");
        })
    }) {
        return;
    }
    run_child(name, "127.0.38.2", &[IB, ("NCCL_IB_GID_INDEX", "3")]);
    // The router's GID at an index NCCL_IB_ROUTABLE_FLID_GID_INDEX does not name is not taken.
    run_child(
        name,
        "127.0.38.3",
        &[
            IB,
            ("SOFTROCE_IB_ROUTER", "on"),
            ("NCCL_IB_ROUTABLE_FLID_GID_INDEX", "2"),
        ],
    );
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn nccl_ib_pkey_picks_the_p_key_the_connections_use() {
    let name = "nccl_ib_pkey_picks_the_p_key_the_connections_use";
    if child(name, || {
        connect_and_check(|d, s, r| {
            assert_eq!(d.pkey, 0x8001, "P_Key[1]: {d:?}");
            // SAFETY: this thread alone runs both comms' data paths.
            let (sq, rq) = unsafe { (s.data_path().qp_pkey_indices(), r.data_path().qp_pkey_indices()) };
            let (sq, rq) = (sq.expect("query the send QPs"), rq.expect("query the receive QPs"));
            assert!(
                !sq.is_empty() && sq.iter().all(|&i| i == 1),
                "send QPs' P_Key indices {sq:?}"
            );
            assert!(
                !rq.is_empty() && rq.iter().all(|&i| i == 1),
                "receive QPs' P_Key indices {rq:?}"
            );
        });
    }) {
        return;
    }
    // By index, by value, by the partition alone (the membership bit differs); InfiniBand and
    // RoCE ports alike.
    for link_layer in [IB, ("SOFTROCE_LINK_LAYER", "roce")] {
        for pick in [
            ("NCCL_IB_PKEY", "1"),
            ("NCCL_IB_PKEY_VALUE", "0x8001"),
            ("NCCL_IB_PKEY_VALUE", "1"),
        ] {
            run_child(
                name,
                "127.0.38.4",
                &[link_layer, ("SOFTROCE_PKEYS", "0xffff,0x8001"), pick],
            );
        }
    }
}

/// Where [`a_p_key_the_table_lacks_fails_init_saying_so`]'s child reads the error it expects.
const EXPECTED_ERROR: &str = "FERROCE_TEST_EXPECTED_ERROR";

/// A P_Key the port's table does not have — an index past it (`NCCL_IB_PKEY`) or a value not in
/// it (`NCCL_IB_PKEY_VALUE`) — fails `init` with one line saying so.
#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_p_key_the_table_lacks_fails_init_saying_so() {
    let name = "a_p_key_the_table_lacks_fails_init_saying_so";
    if child(name, || {
        let want = std::env::var(EXPECTED_ERROR).expect("the error the parent expects");
        let e = api::init(None, -1, false).map(|_| ()).expect_err("no usable port");
        assert_eq!(e.result_code(), code::SYSTEM_ERROR, "{e}");
        assert!(e.message.contains(&want), "{e}");
    }) {
        return;
    }
    for (pick, says) in [
        (
            ("NCCL_IB_PKEY", "2"),
            "softroce0 port 1: NCCL_IB_PKEY=2 is outside the port's P_Key table (2 entries, indices 0 to 1)",
        ),
        (
            ("NCCL_IB_PKEY_VALUE", "0x8002"),
            "softroce0 port 1: NCCL_IB_PKEY_VALUE=0x8002 is not in the port's P_Key table (its filled entries: 0xffff, 0x8001)",
        ),
    ] {
        run_child(
            name,
            "127.0.38.5",
            &[IB, ("SOFTROCE_PKEYS", "0xffff,0x8001"), pick, (EXPECTED_ERROR, says)],
        );
    }
}

/// Where the listening child of [`a_peer_on_the_other_link_layer_is_refused_naming_both`]
/// leaves its handle.
fn handle_file(dir: &Path) -> PathBuf {
    dir.join("handle")
}

/// The first error of `step` (called until it fails, 20 s at most).
fn first_error<T>(mut step: impl FnMut() -> Result<Option<T>, Error>) -> Error {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match step() {
            Err(e) => return e,
            Ok(Some(_)) => panic!("the connection was set up across link layers"),
            Ok(None) => assert!(Instant::now() < end, "no error within 20 s"),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn refuse_the_other_link_layer() {
    let dir = PathBuf::from(std::env::var("IB_CONFIG_DIR").expect("IB_CONFIG_DIR"));
    let ctx = api::init(None, -1, false).expect("init");
    let e = if std::env::var("SOFTROCE_LINK_LAYER").as_deref() == Ok("ib") {
        let mut handle = [0u8; 128];
        let mut l = api::listen(&ctx, 0, &mut handle).expect("listen");
        std::fs::write(dir.join("handle.tmp"), handle).expect("write the handle");
        std::fs::rename(dir.join("handle.tmp"), handle_file(&dir)).expect("publish the handle");
        let e = first_error(|| api::accept(&mut l));
        // This end found the mismatch: a usage error, naming both link layers.
        assert_eq!(e.result_code(), code::INVALID_USAGE, "{e}");
        e
    } else {
        let end = Instant::now() + Duration::from_secs(20);
        let mut handle = loop {
            if let Ok(h) = std::fs::read(handle_file(&dir)) {
                break <[u8; 128]>::try_from(h.as_slice()).expect("a 128-byte handle");
            }
            assert!(Instant::now() < end, "no handle from the listener");
            std::thread::sleep(Duration::from_millis(10));
        };
        let e = first_error(|| api::connect(&ctx, 0, &mut handle));
        // The listener refused: a remote error carrying its line.
        assert_eq!(e.result_code(), code::REMOTE_ERROR, "{e}");
        e
    };
    assert!(
        e.message.contains(
            "link layer mismatch: the receiver's softroce0:1 is InfiniBand, the sender's softroce0:1 is RoCE: InfiniBand and RoCE ports cannot talk to each other"
        ),
        "{e}"
    );
    assert!(!e.message.contains('\n'), "one line: {e}");
    println!("refused: {e}");
    api::finalize(ctx).expect("finalize");
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_peer_on_the_other_link_layer_is_refused_naming_both() {
    let name = "a_peer_on_the_other_link_layer_is_refused_naming_both";
    if child(name, refuse_the_other_link_layer) {
        return;
    }
    softroce_common::require_softroce();
    let dir = std::env::temp_dir().join(format!("ferroce-ib-config-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the handle's directory");
    let start = |addr: &str, ll: &str| {
        child_command(name, addr, &dir.join(ll))
            .env("SOFTROCE_LINK_LAYER", ll)
            .env("IB_CONFIG_DIR", &dir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start a child")
    };
    let children = [start("127.0.38.6", "ib"), start("127.0.38.7", "roce")];
    for c in children {
        let out = c.wait_with_output().expect("wait for the child");
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains(&format!("{name}: done")),
            "{text}"
        );
        for line in text.lines().filter(|l| l.contains("refused: ")) {
            println!("{line}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build, run with --include-ignored (make test)"]
fn a_fused_device_of_an_infiniband_and_a_roce_port_is_refused() {
    let name = "a_fused_device_of_an_infiniband_and_a_roce_port_is_refused";
    if child(name, || {
        let ctx = api::init(None, -1, false).expect("init");
        assert_eq!(api::devices().expect("devices"), 2);
        let e = api::make_vdevice(&[0, 1], 4).expect_err("no fusion across link layers");
        assert_eq!(e.result_code(), code::INVALID_USAGE, "{e}");
        assert!(
            e.message.starts_with(
                "cannot fuse softroce0:1 (InfiniBand) with softroce1:1 (RoCE): the members of a fused device must share one link layer"
            ),
            "{e}"
        );
        println!("refused: {e}");
        api::finalize(ctx).expect("finalize");
    }) {
        return;
    }
    run_child(
        name,
        "127.0.38.8,127.0.38.9",
        &[("SOFTROCE_DEVICES", "2"), ("SOFTROCE_LINK_LAYER", "ib,roce")],
    );
}

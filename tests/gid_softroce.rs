//! The GID the plugin picks and keeps, over softroce: each test runs a child process (its own
//! softroce devices, both ends of a connection in it) with FERROCE_TEST_SOFTROCE=1 after
//! `make build`:
//!
//! * a sparse GID table (`SOFTROCE_GID_HOLES`: empty entries ahead of the port's own, as a
//!   container sees its NIC): auto-selection skips the holes, still picks the IPv4-mapped RoCE v2
//!   entry, and a connection over it moves bytes.
//!
//! Addresses 127.0.36.x (ci/tests/lib/softroce.sh has the table), one range per child.

mod softroce_common;

use nccl_net_ferroce::api::{self, SendHandle};
use softroce_common::{child, pair, run_child, transfer};
use std::ffi::c_void;
use std::time::Duration;

/// The child of [`a_sparse_gid_table_still_gives_the_ipv4_rocev2_gid`].
fn sparse_child() {
    let ctx = api::init(None, -1, false).expect("init");
    let (s, r) = pair(&ctx, 0);
    // SAFETY: s is a live SendHandle.
    let dev = unsafe { api::comm_device(&*s as *const SendHandle as *mut c_void) };
    let m = &dev.members[0];
    // Five holes, then link-local v1/v2 at 5 and 6, then the IPv4-mapped v1/v2 at 7 and 8.
    assert_eq!(m.gid_index, 8, "the IPv4-mapped RoCE v2 GID past the holes");
    let want: std::net::Ipv4Addr = "127.0.36.1".parse().expect("address");
    assert_eq!(m.gid[12..], want.octets(), "the port's own address");
    transfer(
        &s,
        &r,
        1 << 20,
        0x5a,
        (std::ptr::null_mut(), std::ptr::null_mut()),
        Duration::from_secs(20),
    )
    .expect("a transfer over the selected GID");
    println!("sparse table: GID index {}", m.gid_index);
}

#[test]
#[ignore = "needs softroce: FERROCE_TEST_SOFTROCE=1 after make build"]
fn a_sparse_gid_table_still_gives_the_ipv4_rocev2_gid() {
    if child("a_sparse_gid_table_still_gives_the_ipv4_rocev2_gid", sparse_child) {
        return;
    }
    let text = run_child(
        "a_sparse_gid_table_still_gives_the_ipv4_rocev2_gid",
        "127.0.36.1",
        &[("SOFTROCE_GID_HOLES", "5"), ("SOFTROCE_LINK_LAYER", "roce")],
    );
    assert!(text.contains("sparse table: GID index 8"), "{text}");
}

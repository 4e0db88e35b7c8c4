//! A variable that does not parse stops softroce before anything is created: no device list
//! (NULL, errno EINVAL), the reason through `softroce_config_error`, and no device instance, so
//! the address asked for is never bound with the wrong setting (nor another address instead).
//! One test in its own process: the variables are read once per process. Address 127.0.26.9.

use std::ffi::CStr;

use softroce::verbs::context::{ibv_get_device_list, softroce_config_error};

#[test]
fn a_bad_mtu_stops_softroce_before_it_binds_its_good_address() {
    std::env::set_var("SOFTROCE_ADDR", "127.0.26.9");
    std::env::set_var("SOFTROCE_MTU", "1500");
    let want = "softroce: SOFTROCE_MTU=\"1500\" is not valid: expected an IB MTU: 256, 512, 1024, 2048 or \
                4096 bytes, or the ibv_mtu enum 1 to 5; no device is offered until it is fixed";

    let mut n = -7;
    // SAFETY: n is a valid out-pointer.
    let list = unsafe { ibv_get_device_list(&mut n) };
    assert!(list.is_null(), "a device list despite SOFTROCE_MTU=1500");
    assert_eq!(softroce::verbs::errno(), libc::EINVAL);
    assert_eq!(n, -7, "the count was written although the call failed");

    let line = softroce_config_error();
    assert!(!line.is_null());
    // SAFETY: non-NULL, NUL-terminated, valid for the life of the process.
    assert_eq!(unsafe { CStr::from_ptr(line) }.to_str().unwrap(), want);

    let err = softroce::driver::instances::instance(0)
        .err()
        .expect("an instance despite SOFTROCE_MTU=1500");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(err.to_string(), want);

    // Nothing holds the address's RoCEv2 port: softroce did not bind it.
    std::net::UdpSocket::bind("127.0.26.9:4791").expect("softroce bound 127.0.26.9:4791 anyway");
}

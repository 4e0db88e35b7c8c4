//! The command line as a user meets it: `--version` names the release the doctor was built
//! from, the same release as the plugin whose code it runs (the pair check compares versions
//! by that number too).

use std::process::Command;

fn doctor(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ferroce-doctor"))
        .args(args)
        .output()
        .expect("run ferroce-doctor")
}

#[test]
fn version_prints_name_and_release_and_exits_0() {
    for flag in ["--version", "-V"] {
        let out = doctor(&[flag]);
        assert!(out.status.success(), "{flag}: exit {:?}", out.status);
        let text = String::from_utf8(out.stdout).expect("utf-8");
        assert_eq!(
            text,
            format!("ferroce-doctor {}\n", env!("CARGO_PKG_VERSION")),
            "{flag}"
        );
        assert_eq!(
            env!("CARGO_PKG_VERSION"),
            ferroce::VERSION,
            "doctor and plugin releases differ"
        );
    }
}

#[test]
fn help_lists_version() {
    let out = doctor(&["--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--version"));
}

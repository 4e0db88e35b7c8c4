//! `include/ferroce/ferroce_abi.h` is cbindgen's rendering of the Rust ABI declarations and is
//! checked in; this test fails when the Rust side changed without regenerating it
//! (`FERROCE_BLESS=1 cargo test --test cbindgen_header` rewrites it).

use std::path::PathBuf;

#[test]
fn checked_in_header_matches_the_rust_declarations() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/abi/types.rs"))
        // The logger type NCCL hands to init is declared by its caller, the logger.
        .with_src(root.join("src/log.rs"))
        // So is the profiler callback type, by the profiler module.
        .with_src(root.join("src/profiler.rs"))
        // ferroce's own in-process statistics call (the harness's --stats).
        .with_src(root.join("src/abi/stats.rs"))
        .generate()
        .expect("cbindgen parses src/abi/types.rs and src/log.rs")
        .write(&mut generated);
    let path = root.join("include/ferroce/ferroce_abi.h");
    if std::env::var_os("FERROCE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write header");
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{} is stale: run FERROCE_BLESS=1 cargo test --test cbindgen_header and commit it",
        path.display()
    );
}

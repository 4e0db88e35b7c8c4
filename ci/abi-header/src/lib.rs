//! `include/ferroce/ferroce_abi.h` is cbindgen's rendering of the plugin's Rust ABI declarations
//! and is checked in; the test below fails when the Rust side changed without regenerating it
//! (`FERROCE_BLESS=1 cargo test -p ferroce-abi-header` rewrites it).

use std::path::Path;

/// The header cbindgen renders from the plugin's sources under `repo_root`, with the
/// repository's `cbindgen.toml`.
pub fn render(repo_root: &Path) -> Result<Vec<u8>, String> {
    let config = cbindgen::Config::from_file(repo_root.join("cbindgen.toml"))?;
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_config(config)
        .with_src(repo_root.join("src/abi/types.rs"))
        // The logger type NCCL hands to init is declared by its caller, the logger.
        .with_src(repo_root.join("src/log.rs"))
        // So is the profiler callback type, by the profiler module.
        .with_src(repo_root.join("src/profiler.rs"))
        // ferroce's own in-process statistics call (the harness's --stats).
        .with_src(repo_root.join("src/abi/stats.rs"))
        .generate()
        .map_err(|e| format!("cbindgen could not render the plugin's ABI declarations: {e}"))?
        .write(&mut generated);
    Ok(generated)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn checked_in_header_matches_the_rust_declarations() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let generated = super::render(&root).expect("render the header");
        let path = root.join("include/ferroce/ferroce_abi.h");
        if std::env::var_os("FERROCE_BLESS").is_some() {
            std::fs::write(&path, &generated).expect("write header");
        }
        let checked_in = std::fs::read(&path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "{} is stale: run FERROCE_BLESS=1 cargo test -p ferroce-abi-header and commit it",
            path.display()
        );
    }
}

# Shared by packaging/deb/build.sh, packaging/python/build.sh and ci/tests/15-packages.sh
# (sourced, not run). The repository root is the current directory.
# shellcheck shell=sh

# ferroce_version: the version of the ferroce crate (Cargo.toml through cargo metadata).
ferroce_version() {
    "${CARGO:-cargo}" metadata --no-deps --format-version 1 |
        python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "ferroce"))'
}

# glibc_minor ELF...: N of the highest GLIBC_2.N symbol version the files import (the oldest
# glibc they load on is 2.N).
glibc_minor() {
    objdump -T "$@" | grep -oE '\bGLIBC_2\.[0-9]+' | sed 's/GLIBC_2\.//' | sort -n | tail -n 1
}

# strip_elf FILE...: what dh_strip does: the debug info and the .comment and .note sections go,
# the dynamic symbol table stays (softroce's versioned exports, the plugin's ncclNetPlugin_v*).
strip_elf() {
    for f in "$@"; do
        case $f in
        *.so | *.so.*) strip --remove-section=.comment --remove-section=.note --strip-unneeded "$f" ;;
        *) strip --remove-section=.comment --remove-section=.note "$f" ;;
        esac || return 1
    done
}

# ALLOWED_NEEDED: the only DT_NEEDED entries a shipped ELF file may have. glibc's own libraries
# (libc, libm, libdl, libpthread, the loader) are on every host the manylinux tag allows, and
# libgcc_s.so.1 is the unwinder Rust's panic=unwind needs (GCC's runtime, on every glibc host
# and in the manylinux whitelist). No libibverbs (dlopened at run time, so a host without RDMA
# loads the plugin), no CUDA, no libstdc++ (not guaranteed, and a version mismatch with the host's).
ALLOWED_NEEDED='libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 ld-linux-x86-64.so.2 libgcc_s.so.1'

# foreign_needed ELF...: prints "FILE: LIB" for each DT_NEEDED outside ALLOWED_NEEDED; fails if
# there is one.
foreign_needed() {
    bad=0
    for f in "$@"; do
        for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
            case " $ALLOWED_NEEDED " in
            *" $lib "*) ;;
            *)
                echo "$f: $lib"
                bad=1
                ;;
            esac
        done
    done
    [ $bad -eq 0 ]
}

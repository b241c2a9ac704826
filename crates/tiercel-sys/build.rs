//! With feature `xdp`: compiles tiercel's XDP program (`bpf/steer.bpf.c`) with clang for the BPF
//! target, into `$OUT_DIR/steer.bpf.o`, which `xdp::Steering` loads. Without clang (or without
//! the headers of Debian's `libbpf-dev` and `linux-libc-dev`), the crate builds all the same with
//! no program, and the AF_XDP path says why it is unavailable when asked for.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=bpf/steer.bpf.c");
    println!("cargo:rerun-if-env-changed=TIERCEL_CLANG");
    println!("cargo:rustc-check-cfg=cfg(tiercel_xdp_program)");
    if std::env::var_os("CARGO_FEATURE_XDP").is_none() {
        return;
    }
    let clang = std::env::var("TIERCEL_CLANG").unwrap_or_else(|_| "clang".into());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("steer.bpf.o");
    // Debian keeps asm/types.h under the multiarch directory, which clang's BPF target does not
    // search by itself.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let built = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-I", &multiarch, "-c", "bpf/steer.bpf.c", "-o"])
        .arg(&out)
        .output();
    match built {
        Ok(o) if o.status.success() => println!("cargo:rustc-cfg=tiercel_xdp_program"),
        Ok(o) => {
            // Built again once the headers are there.
            println!("cargo:rerun-if-changed=/usr/include/bpf/bpf_helpers.h");
            let why = String::from_utf8_lossy(&o.stderr);
            let first = why.lines().next().unwrap_or("");
            println!("cargo:warning=tiercel-sys: the XDP program did not build ({first}); AF_XDP is unavailable");
            println!("cargo:rustc-env=TIERCEL_XDP_MISSING={clang} could not build it: {first}");
        }
        Err(e) => {
            // Looked for again once clang is there.
            println!("cargo:rerun-if-changed=/usr/bin/{clang}");
            println!("cargo:rustc-env=TIERCEL_XDP_MISSING={clang} was not found ({e}): install Debian's clang and libbpf-dev and build again");
        }
    }
}

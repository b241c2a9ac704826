//! Misuse of `#[tiercel::interface]` and `#[derive(Wire)]` is a compile error at the offending span.

use std::path::Path;
use std::process::Command;

/// The macros' own errors: their text and spans are ours, so each case's whole output is checked.
#[test]
fn misuse_is_a_compile_error() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}

/// An argument whose type is not `Wire` is refused by the compiler, with tiercel's message, at the
/// argument. The rest of that error is the compiler's own (it lists other types that implement the
/// trait, in an order that changes between Rust releases), so only what tiercel controls is checked.
#[test]
fn an_argument_that_is_not_wire_is_refused_at_the_argument() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let project = Path::new(env!("CARGO_TARGET_TMPDIR")).join("not_wire");
    std::fs::create_dir_all(project.join("src")).unwrap();
    let tiercel = here.join("../tiercel").canonicalize().unwrap();
    std::fs::write(
        project.join("Cargo.toml"),
        format!(
            "[package]\nname = \"not_wire\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
             [dependencies]\ntiercel = {{ path = {:?} }}\n\n[workspace]\n",
            tiercel.to_str().unwrap()
        ),
    )
    .unwrap();
    // The workspace's lock file, so that the case builds offline with the versions tiercel's own
    // build fetched.
    std::fs::copy(here.join("../../Cargo.lock"), project.join("Cargo.lock")).unwrap();
    std::fs::copy(here.join("tests/compile/not_wire.rs"), project.join("src/main.rs")).unwrap();

    // Built where trybuild builds the cases above, with the flags it gives them, so that the two
    // share tiercel's dependencies (a cold build of them took as long as the cases themselves; the
    // second waits for the first's lock and builds only what differs). Only the build time
    // depends on that.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("tests/trybuild");
    let triple = "x86_64-unknown-linux-gnu";
    let flags = r#"["--cfg", "trybuild", "--verbose", "-A", "dead_code"]"#;
    let mut check = Command::new(env!("CARGO"));
    check.args(["check", "--offline", "--quiet", "--message-format=short"]);
    if cfg!(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")) {
        check.args(["--target", triple]);
    }
    let out = check
        .arg(format!("--config=build.rustflags={flags}"))
        .arg(format!("--config=target.{triple}.rustflags={flags}"))
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", target)
        .env_remove("RUSTFLAGS")
        .env("CARGO_INCREMENTAL", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the case compiled:\n{stderr}");

    // `--message-format=short` gives each diagnostic one line: `file:line:col: level[code]: text`,
    // then the primary span's label.
    let errors: Vec<&str> =
        stderr.lines().filter(|line| line.starts_with("error") || line.contains(": error")).collect();
    let ours = "error[E0277]: `NotWire` cannot travel as an argument or result: \
                it does not implement `tiercel::Wire`";
    assert!(
        errors.iter().any(|e| e.starts_with("src/main.rs:5:") && e.contains(ours)),
        "no error of tiercel's at the argument (line 5):\n{stderr}"
    );
    let others: Vec<&&str> = errors.iter().filter(|e| !e.contains(ours)).collect();
    // Only cargo's closing summary may differ: "error: could not compile `not_wire` ...".
    assert!(
        others.iter().all(|e| e.starts_with("error: could not compile `not_wire`")),
        "errors other than tiercel's:\n{stderr}"
    );
}

//! A C program built against include/torch_pjrt_engine.h and linked to the engine's cdylib runs
//! ops in Strict and DeferAndFuse, reads them back and sees the engine's errors.

use std::path::{Path, PathBuf};
use std::process::Command;

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding `libtorch_glue.so`: cargo builds the package's cdylib next to the
/// test binaries' `deps` directory when it builds the library for its tests.
fn cdylib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(Path::to_path_buf)
        .collect();
    for dir in &candidates {
        if dir.join("libtorch_glue.so").is_file() {
            return dir.clone();
        }
    }
    panic!(
        "libtorch_glue.so not found in {candidates:?}; build the cdylib with \
         `cargo build -p torch-glue` (cargo test -p torch-glue builds it too)"
    );
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn c_program_runs_ops_through_the_header_and_cdylib() {
    let lib_dir = cdylib_dir();
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("abi_demo");
    std::fs::create_dir_all(&work).unwrap();
    let exe = work.join(format!("abi_demo-{}", std::process::id()));
    let include = crate_dir().join("include");
    let source = crate_dir().join("tests/c/abi_demo.c");
    run(Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg("-L")
        .arg(&lib_dir)
        .arg("-ltorch_glue")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-o")
        .arg(&exe));
    let stdout = run(Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .env_remove("TORCH_PJRT_DEFER_AND_FUSE")
        .env_remove("TORCH_PJRT_LAUNCH_BLOCKING")
        .env_remove("TORCH_PJRT_CACHE_DIR")
        .env_remove("TORCH_PJRT_SHARED_CACHE"));
    let _ = std::fs::remove_file(&exe);
    let expected = "\
abi version 5, table matches
devices: some
strict add: 6 12 18 24
strict sum of squares: 1080 (outputs 1, ndim 0, nbytes 4)
deferred exp(a - a) * b: 10 20 30 40
mode inside: 2
mismatch status 1: The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 0
metrics json: ok
done
";
    assert_eq!(stdout, expected, "the C program's output");
}

#[test]
fn header_compiles_as_cpp() {
    let Ok(out) = Command::new("c++").arg("--version").output() else {
        eprintln!("no c++ compiler: skipping the C++ check of the header");
        return;
    };
    assert!(out.status.success());
    let include = crate_dir().join("include/torch_pjrt_engine.h");
    run(Command::new("c++")
        .args([
            "-x",
            "c++",
            "-std=c++17",
            "-fsyntax-only",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg(&include));
}

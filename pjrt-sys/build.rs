//! Finds `pjrt_c_api.h` (from `PJRT_C_API_HEADER` or the `xla-cpu-pjrt` package in a venv) and
//! runs bindgen on it.

use std::env;
use std::path::{Path, PathBuf};

const HEADER_IN_PACKAGE: &str = "xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h";

/// Every `site-packages` directory under a Python prefix (a venv or an installation).
fn site_packages_under(prefix: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_string_lossy().starts_with("python") {
                found.push(entry.path().join("site-packages"));
            }
        }
    }
    found
}

fn find_header(manifest_dir: &Path) -> Result<PathBuf, String> {
    println!("cargo:rerun-if-env-changed=PJRT_C_API_HEADER");
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");
    if let Ok(path) = env::var("PJRT_C_API_HEADER") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "PJRT_C_API_HEADER={} is not a file",
                path.display()
            ))
        };
    }
    let mut prefixes = Vec::new();
    if let Ok(venv) = env::var("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(venv));
    }
    // The workspace's own venv, made by `make`.
    if let Some(root) = manifest_dir.parent() {
        prefixes.push(root.join(".venv"));
    }
    let mut looked = Vec::new();
    for prefix in &prefixes {
        for site in site_packages_under(prefix) {
            let candidate = site.join(HEADER_IN_PACKAGE);
            if candidate.is_file() {
                return Ok(candidate);
            }
            looked.push(candidate.display().to_string());
        }
        if looked.is_empty() {
            looked.push(format!("{}/lib/python*/site-packages", prefix.display()));
        }
    }
    Err(format!(
        "pjrt_c_api.h not found; looked in: {}. Run `make venv` (it installs xla-cpu-pjrt into \
         .venv) or set PJRT_C_API_HEADER to the header's path.",
        looked.join(", ")
    ))
}

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let header = match find_header(&manifest_dir) {
        Ok(h) => h,
        Err(message) => panic!("{message}"),
    };
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:header={}", header.display());
    // Lets the safe layer find the plugin that shipped beside the header.
    println!("cargo:rustc-env=PJRT_SYS_HEADER_PATH={}", header.display());
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type("PJRT_.*")
        .allowlist_var("PJRT_.*")
        .allowlist_function("GetPjrtApi")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .expect("bindgen failed on pjrt_c_api.h");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(out).expect("writing bindings.rs");
}

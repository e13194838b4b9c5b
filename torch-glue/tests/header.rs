//! include/torch_pjrt_engine.h is what cbindgen generates from src/abi.rs today.

use std::path::PathBuf;

const REGENERATE: &str =
    "HEADER_BLESS=1 cargo test -p torch-glue --test header (or: cd torch-glue && \
                          cbindgen --config cbindgen.toml --crate torch-glue --output \
                          include/torch_pjrt_engine.h)";

/// The first line where two texts differ, for the failure message.
fn first_difference(a: &str, b: &str) -> String {
    for (n, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}:\n  checked in: {x}\n  generated:  {y}", n + 1);
        }
    }
    format!(
        "one is a prefix of the other ({} vs {} lines)",
        a.lines().count(),
        b.lines().count()
    )
}

#[test]
fn header_is_up_to_date() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(&dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header from src/abi.rs");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("utf-8 header");
    let path = dir.join("include/torch_pjrt_engine.h");
    if std::env::var_os("HEADER_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("writing include/torch_pjrt_engine.h");
    }
    let checked_in = std::fs::read_to_string(&path).expect("include/torch_pjrt_engine.h");
    assert!(
        generated == checked_in,
        "{} is stale: the C ABI in src/abi.rs changed. Regenerate it with\n    {REGENERATE}\n\
         First difference at {}",
        path.display(),
        first_difference(&checked_in, &generated)
    );
    for symbol in [
        "tpjrt_op(",
        "tpjrt_read_host(",
        "tpjrt_api(",
        "typedef struct TpjrtApi",
    ] {
        assert!(generated.contains(symbol), "the header declares {symbol}");
    }
}

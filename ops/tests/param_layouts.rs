//! python/torch_pjrt/csrc/param_layouts.json is the op catalogue's param layouts as the
//! plugin's kernel generator (gen_kernels.py) reads them: each op's layout name, and each
//! layout's fields with their kinds, in order.

use ops::{OpId, ParamLayout};
use std::path::PathBuf;

const REGENERATE: &str = "PARAM_LAYOUTS_BLESS=1 cargo test -p ops --test param_layouts";

/// The file's text: one layout or op per line, so a change shows as a small diff.
fn render() -> String {
    let mut out = String::from("{\n");
    out.push_str(
        "  \"generated_by\": \"ops/tests/param_layouts.rs from ops/src/op_id.rs and \
         ops/src/param_layout.rs; do not edit\",\n",
    );
    out.push_str("  \"layouts\": {\n");
    let layouts: Vec<String> = ParamLayout::ALL
        .iter()
        .map(|layout| {
            let fields: Vec<String> = layout
                .fields()
                .iter()
                .map(|f| {
                    format!(
                        "{{\"name\": \"{}\", \"kind\": \"{}\", \"optional\": {}}}",
                        f.name,
                        f.kind.name(),
                        f.optional
                    )
                })
                .collect();
            format!("    \"{}\": [{}]", layout.name(), fields.join(", "))
        })
        .collect();
    out.push_str(&layouts.join(",\n"));
    out.push_str("\n  },\n  \"ops\": {\n");
    let ops: Vec<String> = OpId::ALL
        .iter()
        .map(|op| format!("    \"{}\": \"{}\"", op.name(), op.param_layout().name()))
        .collect();
    out.push_str(&ops.join(",\n"));
    out.push_str("\n  }\n}\n");
    out
}

#[test]
fn the_plugin_reads_the_catalogues_param_layouts() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../python/torch_pjrt/csrc/param_layouts.json");
    let generated = render();
    if std::env::var_os("PARAM_LAYOUTS_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("writing param_layouts.json");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    let stale = checked_in
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .or_else(|| (checked_in != generated).then(|| checked_in.lines().count()));
    if let Some(line) = stale {
        panic!(
            "{} is stale: a catalogue row or a param layout changed. Regenerate it with\n    \
             {REGENERATE}\nFirst difference at line {}:\n  checked in: {}\n  generated:  {}",
            path.display(),
            line + 1,
            checked_in.lines().nth(line).unwrap_or("<end>"),
            generated.lines().nth(line).unwrap_or("<end>")
        );
    }
}

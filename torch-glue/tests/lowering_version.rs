//! Ties the emitted StableHLO to the cache version: a lowering change that moves any snapshot
//! must come with a new `+hloN` tag in `ENGINE_VERSION`, or disk caches would hand out programs
//! built by the old lowering.

use std::fs;
use std::path::{Path, PathBuf};

/// FNV-1a over bytes: fixed forever, so a recorded fingerprint never changes by itself.
fn fnv1a(state: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(state, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A snapshot's body: what follows insta's header (its source file and expression, which move
/// with the tests, not with the lowering).
fn body(text: &str) -> &str {
    let mut parts = text.splitn(3, "---\n");
    match (parts.next(), parts.next(), parts.next()) {
        (Some(""), Some(_header), Some(rest)) => rest,
        _ => text,
    }
}

fn snapshot_files(root: &Path) -> Vec<PathBuf> {
    let dirs = [
        root.join("../ops/tests/snapshots"),
        root.join("tests/snapshots"),
    ];
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|dir| fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {dir:?}: {e}")))
        .map(|entry| entry.expect("a snapshot directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "snap"))
        .collect();
    files.sort_by_key(|path| path.file_name().map(|name| name.to_owned()));
    files
}

fn fingerprint(root: &Path) -> (u64, usize) {
    let files = snapshot_files(root);
    let mut h = 0xcbf2_9ce4_8422_2325;
    for path in &files {
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path:?}: {e}"));
        h = fnv1a(h, path.file_name().unwrap().as_encoded_bytes());
        h = fnv1a(h, body(&text).as_bytes());
    }
    (h, files.len())
}

#[test]
fn every_change_to_the_emitted_stablehlo_comes_with_a_new_cache_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (print, count) = fingerprint(root);
    assert!(
        count >= 30,
        "expected the StableHLO snapshots, found {count} files"
    );
    let tag = torch_glue::ENGINE_VERSION
        .rsplit_once('+')
        .map(|(_, tag)| tag)
        .expect("ENGINE_VERSION ends in +hloN");
    let record_path = root.join("tests/lowering_versions.txt");
    let record = fs::read_to_string(&record_path).expect("tests/lowering_versions.txt");
    let lines: Vec<(&str, &str)> = record
        .lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            line.split_once(' ')
                .expect("each line is `<tag> <fingerprint>`")
        })
        .collect();
    let mut tags: Vec<&str> = lines.iter().map(|(tag, _)| *tag).collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(
        tags.len(),
        lines.len(),
        "tests/lowering_versions.txt names a version twice: a new fingerprint needs a new tag"
    );
    let (last_tag, last_print) = *lines.last().expect("at least one recorded version");
    let current = format!("{print:016x}");
    assert!(
        last_print == current,
        "the emitted StableHLO snapshots changed (fingerprint {current}, recorded {last_print} \
         for {last_tag}): bump the +hloN tag of ENGINE_VERSION in torch-glue/src/engine.rs and \
         append `<new tag> {current}` to tests/lowering_versions.txt"
    );
    assert_eq!(
        last_tag, tag,
        "ENGINE_VERSION's tag is {tag} but tests/lowering_versions.txt last records {last_tag}: \
         append `{tag} {current}`"
    );
}

#[test]
fn a_snapshot_body_leaves_out_the_header() {
    let text = "---\nsource: a.rs\nexpression: text\n---\nmodule {}\n";
    assert_eq!(body(text), "module {}\n");
    assert_eq!(body("module {}\n"), "module {}\n");
    assert_ne!(fnv1a(1, b"a"), fnv1a(1, b"b"));
}

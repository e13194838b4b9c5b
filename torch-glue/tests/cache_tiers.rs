//! The compilation cache tiers through the engine: a training loop in DeferAndFuse runs in a
//! child process (this test binary re-run, filtered to `child`) with a persistent (tier-3)
//! directory, twice. The second process compiles nothing, loads every executable from tier 3,
//! and computes the same losses bit for bit. Within one process, steps past the first reach a
//! steady state of cached regions.

mod engine_support;

use defer::Mode;
use engine_support::training::Model;
use engine_support::{engine_with, metric};
use std::path::{Path, PathBuf};
use std::process::Command;

const ROLE: &str = "CACHE_TIERS_TEST_DIR";
/// "1": synchronize twice a step; otherwise the loop only reads the loss.
const SYNC: &str = "CACHE_TIERS_TEST_SYNC";
const STEPS: usize = 5;

/// What a child reports.
#[derive(Debug, PartialEq)]
struct Report {
    losses: Vec<u32>,
    compilations: u64,
    tier1_hits: u64,
    tier3_hits: u64,
    executions: u64,
}

/// Child side: the training loop with a persistent cache directory; prints `LOSSES` (f32 bits)
/// and `STATS`.
#[test]
fn child() {
    let Ok(dir) = std::env::var(ROLE) else {
        return;
    };
    let sync = std::env::var(SYNC).is_ok_and(|v| v == "1");
    let e = engine_with(Mode::DeferAndFuse, None, Some(PathBuf::from(dir)));
    let model = Model::upload(&e);
    let losses: Vec<String> = (0..STEPS)
        .map(|n| model.step(&e, n, sync).to_bits().to_string())
        .collect();
    e.sync().expect("sync");
    println!("LOSSES {}", losses.join(" "));
    println!(
        "STATS {} {} {} {}",
        metric(&e, "compilations"),
        metric(&e, "cache_hits_tier1"),
        metric(&e, "cache_hits_tier3"),
        metric(&e, "executions")
    );
}

fn field<'a>(stdout: &'a str, marker: &str) -> Vec<&'a str> {
    let line = stdout
        .lines()
        .find_map(|line| line.find(marker).map(|at| &line[at + marker.len()..]))
        .unwrap_or_else(|| panic!("the child printed no {marker}: {stdout}"));
    line.split_whitespace().collect()
}

fn run_child(dir: &Path, sync: bool) -> Report {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, dir)
        .env(SYNC, if sync { "1" } else { "0" })
        .output()
        .expect("spawn the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stats: Vec<u64> = field(&stdout, "STATS")
        .iter()
        .map(|v| v.parse::<f64>().unwrap() as u64)
        .collect();
    Report {
        losses: field(&stdout, "LOSSES")
            .iter()
            .map(|v| v.parse().unwrap())
            .collect(),
        compilations: stats[0],
        tier1_hits: stats[1],
        tier3_hits: stats[2],
        executions: stats[3],
    }
}

/// Every `.pjrt` entry under `dir`.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(entries(&path));
        } else if path.extension().is_some_and(|e| e == "pjrt") {
            found.push(path);
        }
    }
    found
}

/// Two processes with one persistent directory: the second compiles nothing.
fn check_second_process(sync: bool) {
    let dir = tempfile::tempdir().unwrap();
    let first = run_child(dir.path(), sync);
    assert!(first.compilations > 0, "{first:?}");
    assert_eq!(first.tier3_hits, 0, "{first:?}");
    assert_eq!(first.losses.len(), STEPS);
    let stored = entries(dir.path());
    assert_eq!(
        stored.len() as u64,
        first.compilations,
        "one entry per compiled region: {stored:?}"
    );

    let second = run_child(dir.path(), sync);
    println!("first process: {first:?}\nsecond process: {second:?}");
    let floats = |bits: &[u32]| bits.iter().map(|&b| f32::from_bits(b)).collect::<Vec<_>>();
    assert_eq!(
        second.losses,
        first.losses,
        "losses {:?} then {:?}",
        floats(&first.losses),
        floats(&second.losses)
    );
    assert_eq!(second.compilations, 0, "{second:?}");
    assert_eq!(second.tier3_hits, first.compilations, "{second:?}");
    assert_eq!(second.executions, first.executions, "{second:?}");
    assert_eq!(
        second.tier1_hits + second.tier3_hits,
        second.executions,
        "every execution of the second process is a cache hit: {second:?}"
    );
    // The losses are those of a real descent: the loop trains.
    let losses = floats(&first.losses);
    assert!(
        losses.iter().all(|l| l.is_finite() && *l > 0.0),
        "{losses:?}"
    );
    assert!(losses[STEPS - 1] < losses[0], "{losses:?}");
}

/// The loop synchronizes twice a step, so every region is planned with nothing in flight.
#[test]
fn a_second_process_loads_every_region_from_the_persistent_tier() {
    check_second_process(true);
}

/// The loop only reads the loss (`loss.item()`), as a plain training script does.
#[test]
fn a_second_process_loads_every_region_from_the_persistent_tier_without_syncs() {
    check_second_process(false);
}

/// In one process: after the first steps, each step is the same cached regions (and the
/// changing learning rate, a lifted scalar, never recompiles).
fn check_steady_state(sync: bool) {
    let e = engine_with(Mode::DeferAndFuse, None, None);
    let model = Model::upload(&e);
    let mut compilations = Vec::new();
    for n in 0..8 {
        model.step(&e, n, sync);
        compilations.push(metric(&e, "compilations"));
    }
    println!("compilations after each step: {compilations:?}");
    assert!(
        compilations[2..].iter().all(|&c| c == compilations[2]),
        "compilations after each step: {compilations:?}"
    );
    assert_eq!(metric(&e, "recompiles"), 0.0);
}

#[test]
fn synchronized_training_steps_reach_a_steady_state_of_cached_regions() {
    check_steady_state(true);
}

#[test]
fn training_steps_reach_a_steady_state_of_cached_regions() {
    check_steady_state(false);
}

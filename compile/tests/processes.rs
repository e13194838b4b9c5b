//! The disk tiers across processes: this test binary re-runs itself, filtered to `child`, with
//! the child's role in environment variables. The child prints `BUILDING` when it builds a
//! module's text (holding the key's lock) and `STATS <compilations> <tier2 hits> <tier3 hits>
//! <invalid entries>` when done.

mod common;

use common::*;
use compile::{CacheKey, CompileConfig};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const ROLE: &str = "COMPILE_TEST_CHILD";

/// Child side: request every key in `COMPILE_TEST_KEYS`, building slowly when asked to.
#[test]
fn child() {
    let Ok(_role) = std::env::var(ROLE) else {
        return;
    };
    let path = |name: &str| std::env::var(name).ok().map(std::path::PathBuf::from);
    let compiler = compiler(CompileConfig {
        shared_dir: path("COMPILE_TEST_SHARED"),
        persistent_dir: path("COMPILE_TEST_PERSISTENT"),
        ..config()
    });
    let delay: u64 = std::env::var("COMPILE_TEST_BUILD_DELAY_MS")
        .map(|v| v.parse().unwrap())
        .unwrap_or(0);
    let keys = std::env::var("COMPILE_TEST_KEYS").unwrap();
    for id in keys.split(',') {
        let id: u64 = id.parse().unwrap();
        let handle = compiler.request(key(&compiler, id), move || {
            // The build runs while the pool thread holds the key's tier-2 lock.
            println!("BUILDING");
            std::thread::sleep(Duration::from_millis(delay));
            Ok(module(id as f32))
        });
        check_runs(&handle.wait().unwrap(), id as f32);
    }
    let s = compiler.stats();
    println!(
        "STATS {} {} {} {}",
        s.compilations, s.tier2_hits, s.tier3_hits, s.invalid_entries
    );
}

struct Spawned {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

fn spawn_child(env: &[(&str, String)]) -> Spawned {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, "1")
        .stdout(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    Spawned { child, lines }
}

impl Spawned {
    fn wait_for(&mut self, marker: &str) -> String {
        for line in self.lines.by_ref() {
            let line = line.unwrap();
            // libtest may print "test child ... " on the same line first.
            if let Some(at) = line.find(marker) {
                return line[at + marker.len()..].trim().to_string();
            }
        }
        panic!("the child exited before printing {marker}");
    }

    /// (compilations, tier-2 hits, tier-3 hits, invalid entries)
    fn finish(mut self) -> (u64, u64, u64, u64) {
        let stats = self.wait_for("STATS");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the child failed: {status}");
        let n: Vec<u64> = stats.split(' ').map(|v| v.parse().unwrap()).collect();
        (n[0], n[1], n[2], n[3])
    }
}

fn dir_env(name: &'static str, dir: &Path) -> (&'static str, String) {
    (name, dir.to_str().unwrap().to_string())
}

#[test]
fn second_process_is_served_from_tier2() {
    let shared = tempfile::tempdir().unwrap();
    let first = spawn_child(&[
        dir_env("COMPILE_TEST_SHARED", shared.path()),
        ("COMPILE_TEST_KEYS", "100".into()),
    ]);
    assert_eq!(first.finish(), (1, 0, 0, 0));
    let second = spawn_child(&[
        dir_env("COMPILE_TEST_SHARED", shared.path()),
        ("COMPILE_TEST_KEYS", "100".into()),
    ]);
    assert_eq!(second.finish(), (0, 1, 0, 0));
}

#[test]
fn two_processes_compiling_one_key_at_once_compile_it_once() {
    let shared = tempfile::tempdir().unwrap();
    let mut other = spawn_child(&[
        dir_env("COMPILE_TEST_SHARED", shared.path()),
        ("COMPILE_TEST_KEYS", "101".into()),
        ("COMPILE_TEST_BUILD_DELAY_MS", "600".into()),
    ]);
    // The child holds the key's lock through its slow build: this process waits on the lock,
    // then loads the child's entry.
    other.wait_for("BUILDING");
    let here = compiler(with_tier2(shared.path()));
    let k = key(&here, 101);
    let start = std::time::Instant::now();
    let executable = here.request(k, || Ok(module(101.0))).wait().unwrap();
    let waited = start.elapsed();
    check_runs(&executable, 101.0);
    let (child_compilations, child_tier2_hits, _, _) = other.finish();
    let stats = here.stats();
    assert_eq!(
        child_compilations + stats.compilations,
        1,
        "one compile across both processes (child {child_compilations}, here {stats:?})"
    );
    assert_eq!(child_tier2_hits + stats.tier2_hits, 1);
    assert_eq!(stats.compilations, 0, "{stats:?}");
    assert!(
        waited >= Duration::from_millis(300),
        "waited on the lock only {waited:?}"
    );
}

#[test]
fn two_processes_writing_one_entry_leave_it_valid() {
    let persistent = tempfile::tempdir().unwrap();
    // Tier 3 takes no lock: both children compile and write the same entries concurrently.
    let children: Vec<_> = (0..2)
        .map(|_| {
            spawn_child(&[
                dir_env("COMPILE_TEST_PERSISTENT", persistent.path()),
                ("COMPILE_TEST_KEYS", "110,111,112".into()),
            ])
        })
        .collect();
    for child in children {
        let (compilations, _, tier3_hits, invalid) = child.finish();
        assert_eq!(compilations + tier3_hits, 3);
        assert_eq!(invalid, 0);
    }
    let reader = compiler(with_tier3(persistent.path()));
    for id in [110u64, 111, 112] {
        let k: CacheKey = key(&reader, id);
        check_runs(
            &reader.request(k, || panic!("valid entry")).wait().unwrap(),
            id as f32,
        );
    }
    let stats = reader.stats();
    assert_eq!(
        (stats.tier3_hits, stats.invalid_entries),
        (3, 0),
        "{stats:?}"
    );
}

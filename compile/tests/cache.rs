//! The compile cache within one process: tier-1 hits, in-flight dedup, failures, tier-3
//! restarts, corrupt and foreign entries, concurrent writers, fingerprints, eviction and dumps.

mod common;

use common::*;
use compile::{CacheKey, CompileConfig, CompileError, FingerprintInputs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

#[test]
fn tier1_hit_serves_without_building() {
    let compiler = compiler(config());
    let k = key(&compiler, 1);
    assert!(compiler.lookup(&k).is_none());
    let calls = Arc::new(AtomicUsize::new(0));
    let first = compiler.request(k, counted_build(module(2.0), &calls));
    let executable = first.wait().unwrap();
    check_runs(&executable, 2.0);

    let again = compiler.request(k, counted_build(module(2.0), &calls));
    assert!(again.is_ready(), "a tier-1 hit is ready at once");
    assert!(Arc::ptr_eq(&again.try_get().unwrap().unwrap(), &executable));
    assert!(Arc::ptr_eq(&compiler.lookup(&k).unwrap(), &executable));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "text is built only on a miss"
    );

    let stats = compiler.stats();
    assert_eq!(stats.compilations, 1);
    assert_eq!(stats.misses, 1);
    assert_eq!(stats.tier1_hits, 2);
    assert_eq!(stats.tier1_entries, 1);
    assert!(stats.compile_time_total > Duration::ZERO);
    compiler.reset_stats();
    let stats = compiler.stats();
    assert_eq!((stats.compilations, stats.tier1_hits), (0, 0));
    assert_eq!(stats.tier1_entries, 1);
}

#[test]
fn concurrent_requests_for_one_key_compile_once() {
    let compiler = Arc::new(compiler(config()));
    let k = key(&compiler, 2);
    let calls = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (compiler, calls, start) = (compiler.clone(), calls.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let handle = compiler.request(k, move || {
                    calls.fetch_add(1, Ordering::SeqCst);
                    // Keeps the compile in flight while the other requests arrive.
                    std::thread::sleep(Duration::from_millis(150));
                    Ok(module(3.0))
                });
                handle.wait().unwrap()
            })
        })
        .collect();
    let executables: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    for executable in &executables {
        assert!(Arc::ptr_eq(executable, &executables[0]));
    }
    let stats = compiler.stats();
    assert_eq!(stats.compilations, 1);
    assert_eq!(stats.inflight_dedups + stats.tier1_hits, 7, "{stats:?}");
    assert!(stats.inflight_dedups >= 1, "{stats:?}");
    check_runs(&executables[0], 3.0);
}

#[test]
fn compile_failure_reaches_every_waiter_and_compiler_stays_usable() {
    let compiler = compiler(config());
    let k = key(&compiler, 3);
    let first = compiler.request(k, || {
        std::thread::sleep(Duration::from_millis(100));
        Ok(INVALID_MODULE.to_string())
    });
    let others: Vec<_> = (0..3)
        .map(|_| compiler.request(k, || Ok(INVALID_MODULE.to_string())))
        .collect();
    for handle in std::iter::once(&first).chain(&others) {
        assert!(handle.same_request(&first));
        let error = handle.wait().unwrap_err();
        assert!(matches!(error, CompileError::Compile { key, .. } if key == k));
        let message = error.to_string();
        assert!(
            message.contains("bogus_op"),
            "the diagnostic is carried: {message}"
        );
        assert!(message.contains(&k.to_string()), "{message}");
    }
    // With no dump directory, the rejected module is still written where the message says.
    let message = first.wait().unwrap_err().to_string();
    let path = message
        .split("failed to compile is in ")
        .nth(1)
        .and_then(|rest| rest.split(" (TORCH_PJRT_DUMP_DIR").next())
        .unwrap_or_else(|| panic!("the message names the module's file: {message}"));
    let kept = std::fs::read_to_string(path).unwrap();
    assert!(
        kept.contains("stablehlo.bogus_op") && kept.contains(&k.to_string()),
        "{kept}"
    );
    let stats = compiler.stats();
    assert_eq!((stats.failures, stats.compilations), (1, 0));
    assert!(compiler.lookup(&k).is_none(), "failures are not cached");

    // Another key compiles, and the failed key may be retried.
    check_runs(
        &compiler
            .request(key(&compiler, 4), || Ok(module(4.0)))
            .wait()
            .unwrap(),
        4.0,
    );
    check_runs(
        &compiler.request(k, || Ok(module(5.0))).wait().unwrap(),
        5.0,
    );
    assert_eq!(compiler.stats().compilations, 2);
}

#[test]
fn build_errors_and_panics_are_error_values() {
    let compiler = compiler(config());
    let error = compiler
        .request(key(&compiler, 5), || {
            Err("op 'frobnicate' has no lowering".into())
        })
        .wait()
        .unwrap_err();
    assert!(matches!(error, CompileError::Build { .. }));
    assert!(error.to_string().contains("frobnicate"), "{error}");

    let error = compiler
        .request(key(&compiler, 6), || panic!("lowering bug"))
        .wait()
        .unwrap_err();
    assert!(matches!(error, CompileError::Panicked { .. }));
    assert!(error.to_string().contains("lowering bug"), "{error}");

    // Both pool threads survived.
    let handles: Vec<_> = (0..2)
        .map(|i| compiler.request(key(&compiler, 7 + i), move || Ok(module(i as f32))))
        .collect();
    for handle in handles {
        handle.wait().unwrap();
    }
    assert_eq!(compiler.stats().failures, 2);
}

#[test]
fn restarted_process_is_served_from_tier3() {
    let dir = tempfile::tempdir().unwrap();
    let k;
    {
        let first = compiler(with_tier3(dir.path()));
        k = key(&first, 10);
        first.request(k, || Ok(module(6.0))).wait().unwrap();
        let stats = first.stats();
        assert_eq!(stats.compilations, 1);
        assert!(stats.bytes_written_tier3 > 0);
        let path = first.tier3_entry_path(&k).unwrap();
        assert!(path.is_file());
        let dir_name = path
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy();
        assert!(dir_name.starts_with("torch-pjrt-"), "{dir_name}");
        assert!(dir_name.contains(env!("CARGO_PKG_VERSION")), "{dir_name}");
        assert!(
            dir_name.contains("-plugin") && dir_name.contains("-cpu"),
            "{dir_name}"
        );
    }
    let restarted = compiler(with_tier3(dir.path()));
    let executable = restarted
        .request(k, || panic!("a tier-3 hit must not build the text"))
        .wait()
        .unwrap();
    check_runs(&executable, 6.0);
    let stats = restarted.stats();
    assert_eq!(
        (stats.compilations, stats.tier3_hits, stats.misses),
        (0, 1, 0)
    );
    assert!(stats.deserialize_time_total > Duration::ZERO);
    assert!(restarted.lookup(&k).is_some(), "a tier-3 hit fills tier 1");
}

#[test]
fn tier3_hit_fills_tier2() {
    let persistent = tempfile::tempdir().unwrap();
    let shared = tempfile::tempdir().unwrap();
    let both = || CompileConfig {
        persistent_dir: Some(persistent.path().to_path_buf()),
        shared_dir: Some(shared.path().to_path_buf()),
        ..config()
    };
    let k = key(&compiler(config()), 11);
    compiler(with_tier3(persistent.path()))
        .request(k, || Ok(module(7.0)))
        .wait()
        .unwrap();
    let second = compiler(both());
    second.request(k, || panic!("not built")).wait().unwrap();
    assert_eq!(
        (second.stats().tier3_hits, second.stats().tier2_hits),
        (1, 0)
    );
    assert!(second.stats().bytes_written_tier2 > 0);
    let third = compiler(both());
    check_runs(
        &third.request(k, || panic!("not built")).wait().unwrap(),
        7.0,
    );
    assert_eq!(
        (third.stats().tier2_hits, third.stats().compilations),
        (1, 0)
    );
}

/// Damages `key`'s tier-3 entry with `damage`, then checks that a fresh compiler treats it as a
/// miss, compiles, and rewrites it so that the next compiler loads it.
fn check_damage_is_rewritten(id: u64, damage: impl FnOnce(&std::path::Path)) {
    let dir = tempfile::tempdir().unwrap();
    let first = compiler(with_tier3(dir.path()));
    let k = key(&first, id);
    first.request(k, || Ok(module(8.0))).wait().unwrap();
    let path = first.tier3_entry_path(&k).unwrap();
    drop(first);
    damage(&path);

    let second = compiler(with_tier3(dir.path()));
    check_runs(&second.request(k, || Ok(module(8.0))).wait().unwrap(), 8.0);
    let stats = second.stats();
    assert_eq!(
        (stats.invalid_entries, stats.compilations),
        (1, 1),
        "{stats:?}"
    );
    assert!(second.last_disk_problem().is_some());

    let third = compiler(with_tier3(dir.path()));
    check_runs(
        &third.request(k, || panic!("rewritten")).wait().unwrap(),
        8.0,
    );
    let stats = third.stats();
    assert_eq!(
        (stats.tier3_hits, stats.invalid_entries),
        (1, 0),
        "{stats:?}"
    );
}

#[test]
fn corrupt_entry_is_a_miss_and_gets_rewritten() {
    check_damage_is_rewritten(20, |path| {
        let mut bytes = std::fs::read(path).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x5a;
        std::fs::write(path, bytes).unwrap();
    });
}

#[test]
fn truncated_and_empty_entries_are_misses() {
    check_damage_is_rewritten(21, |path| {
        let bytes = std::fs::read(path).unwrap();
        std::fs::write(path, &bytes[..bytes.len() / 3]).unwrap();
    });
    check_damage_is_rewritten(22, |path| std::fs::write(path, b"").unwrap());
}

#[test]
fn undeserializable_and_foreign_entries_are_misses() {
    // A well-formed entry whose payload the plugin cannot load.
    check_damage_is_rewritten(23, |path| {
        let k = CacheKey::from_hex(path.file_stem().unwrap().to_str().unwrap()).unwrap();
        std::fs::write(path, compile::disk::encode_entry(&k, b"not an executable")).unwrap();
    });
    // Another key's entry renamed into place.
    check_damage_is_rewritten(24, |path| {
        let other = CacheKey::new(999, 999, 999);
        let bytes = std::fs::read(path).unwrap();
        let payload = compile::disk::decode_entry(
            &CacheKey::from_hex(path.file_stem().unwrap().to_str().unwrap()).unwrap(),
            &bytes,
        )
        .unwrap()
        .to_vec();
        std::fs::write(path, compile::disk::encode_entry(&other, &payload)).unwrap();
    });
}

#[test]
fn unreadable_entry_is_a_miss_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let compiler = compiler(with_tier3(dir.path()));
    let k = key(&compiler, 25);
    // A directory where the entry should be: unreadable, and cannot be replaced either.
    std::fs::create_dir_all(compiler.tier3_entry_path(&k).unwrap().join("x")).unwrap();
    check_runs(
        &compiler.request(k, || Ok(module(9.0))).wait().unwrap(),
        9.0,
    );
    let stats = compiler.stats();
    assert_eq!(
        (stats.invalid_entries, stats.compilations),
        (1, 1),
        "{stats:?}"
    );
    assert_eq!(stats.disk_errors, 1, "{stats:?}");
}

#[test]
fn concurrent_writers_in_one_process_leave_a_valid_entry() {
    let dir = tempfile::tempdir().unwrap();
    // Separate compilers share no in-flight map: each compiles and writes the same entry.
    let writers: Vec<_> = (0..3).map(|_| compiler(with_tier3(dir.path()))).collect();
    let k = key(&writers[0], 30);
    let handles: Vec<_> = writers
        .iter()
        .map(|c| c.request(k, || Ok(module(10.0))))
        .collect();
    for handle in handles {
        handle.wait().unwrap();
    }
    let compiled: u64 = writers.iter().map(|c| c.stats().compilations).sum();
    assert_eq!(compiled, 3);
    let reader = compiler(with_tier3(dir.path()));
    check_runs(
        &reader.request(k, || panic!("valid entry")).wait().unwrap(),
        10.0,
    );
    assert_eq!(reader.stats().invalid_entries, 0);
    let leftovers: Vec<_> = std::fs::read_dir(reader.tier3_dir().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn another_cpu_misses() {
    let dir = tempfile::tempdir().unwrap();
    let here = compiler(with_tier3(dir.path()));
    let k = key(&here, 40);
    here.request(k, || Ok(module(11.0))).wait().unwrap();

    let elsewhere = compiler(CompileConfig {
        cpu_features: "x86_64;model=Another CPU;features=sse,sse2".to_string(),
        ..with_tier3(dir.path())
    });
    assert_ne!(elsewhere.options_fingerprint(), here.options_fingerprint());
    assert_ne!(elsewhere.tier3_dir(), here.tier3_dir());
    // Even a caller that reused the old key would find nothing in the other CPU's directory.
    elsewhere.request(k, || Ok(module(11.0))).wait().unwrap();
    let stats = elsewhere.stats();
    assert_eq!((stats.tier3_hits, stats.compilations), (0, 1));
    let other_key = key(&elsewhere, 40);
    assert_ne!(other_key, k);
}

type Change = Box<dyn Fn(&mut FingerprintInputs)>;

#[test]
fn options_fingerprint_covers_every_input_and_is_fixed() {
    let base = FingerprintInputs {
        compile_options: vec![1, 2, 3],
        xla_flags: String::new(),
        engine_version: "0.1.0".into(),
        plugin_file_name: "xla_cpu_pjrt.so".into(),
        plugin_version: "api=0.81;size=1;mtime=2".into(),
        api_version: (0, 81),
        platform_name: "cpu".into(),
        platform_version: "v1".into(),
        cpu_features: "x86_64;features=sse2".into(),
    };
    // xxh3 over a fixed encoding: this value must never change.
    assert_eq!(
        base.fingerprint(),
        0x9777_35a1_0886_874d,
        "{:#x}",
        base.fingerprint()
    );
    let variants: Vec<Change> = vec![
        Box::new(|i| i.compile_options.push(0)),
        Box::new(|i| i.xla_flags = "--xla_cpu_enable_fast_math=true".into()),
        Box::new(|i| i.engine_version = "0.2.0".into()),
        Box::new(|i| i.plugin_file_name = "other.so".into()),
        Box::new(|i| i.plugin_version.push('x')),
        Box::new(|i| i.api_version = (0, 82)),
        Box::new(|i| i.platform_name = "cuda".into()),
        Box::new(|i| i.platform_version = "v2".into()),
        Box::new(|i| i.cpu_features = "x86_64;features=sse2,avx512f".into()),
    ];
    let mut seen = std::collections::HashSet::from([base.fingerprint()]);
    for change in variants {
        let mut inputs = base.clone();
        change(&mut inputs);
        assert!(seen.insert(inputs.fingerprint()), "{inputs:?}");
    }

    let client = client();
    let live = compile::options_fingerprint(
        client.plugin(),
        &client,
        &pjrt::CompileOptions::default(),
        "0.1.0",
    );
    let again = compile::options_fingerprint(
        client.plugin(),
        &client,
        &pjrt::CompileOptions::default(),
        "0.1.0",
    );
    assert_eq!(live, again);
    let gathered = FingerprintInputs::gather(
        client.plugin(),
        &client,
        &pjrt::CompileOptions::default(),
        "0.1.0",
    );
    assert_eq!(gathered.cpu_features, compile::host_cpu_features());
    assert_eq!(gathered.plugin_file_name, "xla_cpu_pjrt.so");
}

#[test]
fn tier1_evicts_least_recently_used() {
    let compiler = compiler(CompileConfig {
        tier1_capacity: 2,
        ..config()
    });
    let executable = compiler
        .request(key(&compiler, 50), || Ok(module(1.0)))
        .wait()
        .unwrap();
    compiler.insert(key(&compiler, 51), executable.clone());
    assert!(compiler.lookup(&key(&compiler, 50)).is_some());
    compiler.insert(key(&compiler, 52), executable);
    assert!(compiler.lookup(&key(&compiler, 51)).is_none());
    assert!(compiler.lookup(&key(&compiler, 50)).is_some());
    let stats = compiler.stats();
    assert_eq!((stats.tier1_entries, stats.evictions), (2, 1));
}

#[test]
fn dump_dir_receives_text_and_key() {
    let dump = tempfile::tempdir().unwrap();
    let compiler = compiler(CompileConfig {
        dump_dir: Some(dump.path().to_path_buf()),
        ..config()
    });
    let k = key(&compiler, 60);
    compiler.request(k, || Ok(module(12.0))).wait().unwrap();
    let text = std::fs::read_to_string(dump.path().join(format!("{k}.mlir"))).unwrap();
    assert!(
        text.contains(&k.to_string()) && text.contains("stablehlo.multiply"),
        "{text}"
    );
    let bad = key(&compiler, 61);
    let failed = compiler
        .request(bad, || Ok(INVALID_MODULE.to_string()))
        .wait()
        .unwrap_err();
    let error = std::fs::read_to_string(dump.path().join(format!("{bad}.error.txt"))).unwrap();
    assert!(error.contains("bogus_op"), "{error}");
    // The failure points at the module in the dump directory.
    let module = dump.path().join(format!("{bad}.mlir"));
    assert!(
        failed.to_string().contains(&module.display().to_string()),
        "{failed}"
    );
}

#[test]
fn unusable_cache_directory_is_a_configuration_error() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let error = compile::Compiler::new(client(), with_tier3(file.path())).unwrap_err();
    assert!(matches!(error, CompileError::Config(_)));
    assert!(
        error.to_string().contains("TORCH_PJRT_CACHE_DIR"),
        "{error}"
    );
}

#[test]
fn an_idle_pool_hands_freed_heap_back_after_enough_compiling() {
    let compiler = compiler(config());
    // A build that takes longer than the trim threshold, as a large module's compile does.
    let slow = compiler.request(key(&compiler, 41), || {
        std::thread::sleep(Duration::from_millis(300));
        Ok(module(3.0))
    });
    check_runs(&slow.wait().unwrap(), 3.0);
    // The trim runs after the job has answered its waiters: poll for it.
    let mut trims = 0;
    for _ in 0..200 {
        trims = compiler.stats().heap_trims;
        if trims > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    if cfg!(all(target_os = "linux", target_env = "gnu")) {
        assert_eq!(trims, 1, "one trim once the queue is empty");
    } else {
        assert_eq!(trims, 0, "no allocator call to trim with");
    }
    // The pool keeps serving afterwards, and the counter resets with the others.
    let next = compiler.request(key(&compiler, 42), move || Ok(module(5.0)));
    check_runs(&next.wait().unwrap(), 5.0);
    compiler.reset_stats();
    assert_eq!(compiler.stats().heap_trims, 0);
}

#[test]
fn closing_for_exit_waits_for_running_compiles_and_refuses_later_ones() {
    let compiler = Arc::new(compiler(config()));
    let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let running = compiler.request(key(&compiler, 40), move || {
        started_tx.send(()).unwrap();
        release_rx.recv().unwrap();
        Ok(module(2.0))
    });
    started_rx.recv().unwrap();
    // The pool is not idle while that compile runs.
    assert!(!compiler.close_for_exit(Duration::from_millis(50)));
    let closer = {
        let compiler = compiler.clone();
        std::thread::spawn(move || compiler.close_for_exit(Duration::from_secs(120)))
    };
    release_tx.send(()).unwrap();
    assert!(
        closer.join().unwrap(),
        "the pool is idle once the running compile ends"
    );
    check_runs(&running.wait().unwrap(), 2.0);
    // Later requests are answered without compiling; what is cached is still served.
    let calls = Arc::new(AtomicUsize::new(0));
    let later = compiler.request(key(&compiler, 41), counted_build(module(3.0), &calls));
    assert!(
        matches!(later.wait(), Err(CompileError::ShutDown { .. })),
        "a request after closing is refused"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(compiler.lookup(&key(&compiler, 40)).is_some());
}

#[test]
fn each_effort_compiles_with_its_own_options_under_its_own_key() {
    let compiler = compiler(CompileConfig {
        fast_overrides: compile::fast_overrides_for("cpu"),
        quick_overrides: compile::quick_overrides_for("cpu"),
        ..config()
    });
    let words: Vec<u64> = [
        compile::Effort::Full,
        compile::Effort::Fast,
        compile::Effort::Quick,
    ]
    .into_iter()
    .map(|e| compiler.options_fingerprint_for(e))
    .collect();
    assert_eq!(words[0], compiler.options_fingerprint());
    assert!(words[0] != words[1] && words[1] != words[2] && words[0] != words[2]);
    for (id, &word) in words.iter().enumerate() {
        let key = CacheKey::new(100 + id as u64, 0xd1d1, word);
        let executable = compiler
            .request(key, move || Ok(module(3.0)))
            .wait()
            .unwrap();
        check_runs(&executable, 3.0);
    }
    let recent = compiler.stats().recent;
    let efforts: Vec<(bool, bool)> = recent.iter().map(|p| (p.fast, p.quick)).collect();
    assert_eq!(efforts, vec![(false, false), (true, false), (false, true)]);
    // Without quick overrides a quick key is a full compile (the word is the full one).
    let plain = common::compiler(config());
    assert_eq!(
        plain.options_fingerprint_for(compile::Effort::Quick),
        plain.options_fingerprint()
    );
}

/// Tiered compilation: a quick program served often enough is compiled again with the full
/// options in the background and takes its place in tier 1 under the same key, without
/// counting as a compilation; a later process finds the full program on disk and never builds
/// the module or upgrades again.
#[test]
fn a_quick_program_run_often_is_upgraded_in_place_and_kept_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let tiered = |after_runs| CompileConfig {
        quick_overrides: compile::quick_overrides_for("cpu"),
        upgrade_after_runs: after_runs,
        ..with_tier3(dir.path())
    };
    let compiler = compiler(tiered(Some(3)));
    let quick = compiler.options_fingerprint_for(compile::Effort::Quick);
    let key = CacheKey::new(7, 0xd1d1, quick);
    let first = compiler.request(key, || Ok(module(5.0))).wait().unwrap();
    assert_eq!(compiler.stats().compilations, 1);
    // Two runs served from tier 1 do not reach the count: nothing is upgraded.
    for _ in 0..2 {
        let same = compiler.lookup(&key).unwrap();
        assert!(Arc::ptr_eq(&same, &first));
    }
    assert!(compiler.wait_for_upgrades(Duration::from_secs(60)));
    assert_eq!(compiler.stats().upgrades, 0);
    // The third does; the full program replaces the quick one under the same key.
    compiler.lookup(&key).unwrap();
    assert!(compiler.wait_for_upgrades(Duration::from_secs(60)));
    let upgraded = compiler.lookup(&key).unwrap();
    assert!(
        !Arc::ptr_eq(&upgraded, &first),
        "tier 1 now serves the full program"
    );
    check_runs(&upgraded, 5.0);
    let stats = compiler.stats();
    assert_eq!((stats.compilations, stats.upgrades), (1, 1));
    assert!(stats.upgrade_time_total > Duration::ZERO);
    let origin = compiler.program_stats().into_iter().find(|p| p.key == key);
    assert_eq!(origin.unwrap().source, "upgraded");
    // Many more runs upgrade nothing again.
    for _ in 0..10 {
        compiler.lookup(&key).unwrap();
    }
    assert!(compiler.wait_for_upgrades(Duration::from_secs(60)));
    assert_eq!(compiler.stats().upgrades, 1);
    drop(compiler);

    // A new process: the full program comes from tier 3, with no build and no upgrade.
    let later = common::compiler(tiered(Some(1)));
    let calls = Arc::new(AtomicUsize::new(0));
    let found = later
        .request(key, counted_build(module(5.0), &calls))
        .wait()
        .unwrap();
    check_runs(&found, 5.0);
    for _ in 0..4 {
        later.lookup(&key).unwrap();
    }
    assert!(later.wait_for_upgrades(Duration::from_secs(60)));
    let stats = later.stats();
    assert_eq!(
        (stats.compilations, stats.tier3_hits, stats.upgrades),
        (0, 1, 0)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Off: a quick program stays quick however often it runs.
    let off = common::compiler(CompileConfig {
        quick_overrides: compile::quick_overrides_for("cpu"),
        ..config()
    });
    let key = CacheKey::new(
        8,
        0xd1d1,
        off.options_fingerprint_for(compile::Effort::Quick),
    );
    let first = off.request(key, || Ok(module(2.0))).wait().unwrap();
    for _ in 0..10 {
        assert!(Arc::ptr_eq(&off.lookup(&key).unwrap(), &first));
    }
    assert!(off.wait_for_upgrades(Duration::from_secs(1)));
    assert_eq!(off.stats().upgrades, 0);
}

/// A row normalization over 64 elements: two 64-element reductions, stating `longest` in its
/// header when given.
fn row_norm_module(longest: Option<i64>) -> String {
    let header = match longest {
        Some(n) => format!(
            "module attributes {{{} = {n} : i64}} {{",
            compile::LONGEST_REDUCTION_ATTR
        ),
        None => "module {".to_string(),
    };
    format!(
        r#"{header}
  func.func public @main(%x: tensor<4x64xf32>) -> (tensor<4x64xf32>) {{
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x64xf32>, tensor<f32>) -> tensor<4xf32>
    %sb = stablehlo.broadcast_in_dim %s, dims = [0] : (tensor<4xf32>) -> tensor<4x64xf32>
    %d = stablehlo.subtract %x, %sb : tensor<4x64xf32>
    %q = stablehlo.multiply %d, %d : tensor<4x64xf32>
    %v = stablehlo.reduce(%q init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<4x64xf32>, tensor<f32>) -> tensor<4xf32>
    %r = stablehlo.rsqrt %v : tensor<4xf32>
    %rb = stablehlo.broadcast_in_dim %r, dims = [0] : (tensor<4xf32>) -> tensor<4x64xf32>
    %o = stablehlo.multiply %d, %rb : tensor<4x64xf32>
    return %o : tensor<4x64xf32>
  }}
}}
"#
    )
}

/// A module that states its reductions are all short compiles with the short-reduction options
/// (on XLA CPU without the pass that splits each reduction in two: no buffer for the split's
/// partial sums); one that states a long reduction, or nothing, compiles as before.
#[test]
fn modules_stating_only_short_reductions_compile_without_the_split() {
    assert_eq!(
        compile::longest_reduction(&row_norm_module(Some(64))),
        Some(64)
    );
    assert_eq!(compile::longest_reduction(&row_norm_module(None)), None);
    assert_eq!(
        compile::longest_reduction("module attributes {x = 1 : i64} {\n}"),
        None
    );
    let compiler = compiler(CompileConfig {
        short_reduction_overrides: compile::short_reduction_overrides_for("cpu"),
        ..config()
    });
    let word = compiler.options_fingerprint();
    let temp_bytes = |id: u64, longest: Option<i64>| {
        let text = row_norm_module(longest);
        let executable = compiler
            .request(CacheKey::new(id, 0xd1d1, word), move || Ok(text))
            .wait()
            .unwrap();
        executable.temp_bytes()
    };
    let short = temp_bytes(1, Some(64));
    let unstated = temp_bytes(2, None);
    let long = temp_bytes(3, Some(compile::SHORT_REDUCTION_MAX + 1));
    assert!(short < unstated, "short {short} bytes, unstated {unstated}");
    assert_eq!(long, unstated);
    // A user's own value of the option wins over the short-reduction one.
    let user = compiler_with_user_passes();
    let executable = user
        .request(CacheKey::new(4, 0xd1d1, user.options_fingerprint()), || {
            Ok(row_norm_module(Some(64)))
        })
        .wait()
        .unwrap();
    assert_eq!(executable.temp_bytes(), unstated);
}

fn compiler_with_user_passes() -> compile::Compiler {
    let mut options = config();
    options.compile_options.overrides.push((
        "xla_disable_hlo_passes".to_string(),
        pjrt::CompileOverride::String("no_such_pass".to_string()),
    ));
    options.short_reduction_overrides = compile::short_reduction_overrides_for("cpu");
    compiler(options)
}

//! Compiles StableHLO module files and times their execution: for comparing two lowerings of
//! the same computation, or one lowering under different compile options, outside the engine.
//!
//! `cargo run --release -p pjrt --example time_modules -- [--runs N] [--option name=value]… FILE…`
//! Arguments of `@main` are filled with small values; each module's runs are interleaved with
//! the others' so that a noisy machine slows them alike. Prints medians and minima, and each
//! compile's time. `FILE@name=value,name=value` compiles that file with these options on top of
//! the `--option`s, so one module under several options is timed interleaved too.

use pjrt::{Client, CompileOptions, CompileOverride, ElementType, Plugin};
use std::time::Instant;

/// `tensor<64x784xf32>` → dims and element type (floats and 32/64-bit integers only).
fn parse_tensor_type(text: &str) -> Option<(Vec<i64>, ElementType)> {
    let inner = text.strip_prefix("tensor<")?.strip_suffix('>')?;
    let mut parts: Vec<&str> = inner.split('x').collect();
    let ty = match parts.pop()? {
        "f32" => ElementType::F32,
        "i32" => ElementType::S32,
        "i64" => ElementType::S64,
        "i1" => ElementType::Pred,
        _ => return None,
    };
    let dims = parts
        .iter()
        .map(|d| d.parse::<i64>().ok())
        .collect::<Option<Vec<_>>>()?;
    Some((dims, ty))
}

/// The argument types of `func.func public @main(...)`.
fn main_arguments(module: &str) -> Vec<(Vec<i64>, ElementType)> {
    let Some(start) = module.find("@main(") else {
        return Vec::new();
    };
    let signature = &module[start + "@main(".len()..];
    let end = signature.find(") ->").unwrap_or(signature.len());
    signature[..end]
        .split("%")
        .filter_map(|argument| {
            let ty = argument.split_once(':')?.1.trim();
            let ty = ty.split([',', ' ', '{']).next()?;
            parse_tensor_type(ty)
        })
        .collect()
}

fn argument_bytes(dims: &[i64], ty: ElementType) -> Vec<u8> {
    let count: i64 = dims.iter().product();
    (0..count)
        .flat_map(|i| match ty {
            ElementType::F32 => ((i % 7) as f32 * 0.125).to_le_bytes().to_vec(),
            ElementType::S32 => ((i % 3) as i32).to_le_bytes().to_vec(),
            ElementType::S64 => (i % 3).to_le_bytes().to_vec(),
            _ => vec![(i % 2) as u8],
        })
        .collect()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `name=value` as a compile option: `true`/`false`, a whole number, else a string (an enum's
/// name, say).
fn parse_option(item: &str) -> Result<(String, CompileOverride), String> {
    let (name, value) = item
        .split_once('=')
        .ok_or_else(|| format!("an option is name=value, got '{item}'"))?;
    let value = match value {
        "true" => CompileOverride::Bool(true),
        "false" => CompileOverride::Bool(false),
        v => v
            .parse::<i64>()
            .map(CompileOverride::Int)
            .unwrap_or_else(|_| CompileOverride::String(v.to_string())),
    };
    Ok((name.to_string(), value))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut runs = 200usize;
    let mut options = CompileOptions::default();
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().ok_or("--runs needs a count")?.parse()?,
            "--option" => {
                let item = args.next().ok_or("--option needs name=value")?;
                options.overrides.push(parse_option(&item)?);
            }
            _ => files.push(arg),
        }
    }
    let plugin = Plugin::load(&pjrt::configured_plugin_name())?;
    let client = Client::new(&plugin)?;
    let mut programs = Vec::new();
    for path in &files {
        let (file, extra) = match path.split_once('@') {
            Some((file, extra)) => (file, extra),
            None => (path.as_str(), ""),
        };
        let mut file_options = options.clone();
        for item in extra.split(',').filter(|item| !item.is_empty()) {
            file_options.overrides.push(parse_option(item)?);
        }
        let text = std::fs::read_to_string(file)?;
        let start = Instant::now();
        let exe = client.compile_with_options(&text, &file_options)?;
        let compile_ms = start.elapsed().as_secs_f64() * 1e3;
        let buffers = main_arguments(&text)
            .into_iter()
            .map(|(dims, ty)| client.buffer_from_host(&argument_bytes(&dims, ty), ty, &dims))
            .collect::<Result<Vec<_>, _>>()?;
        programs.push((path, exe, buffers, Vec::with_capacity(runs), compile_ms));
    }
    // `--runs 0` compiles only, for the temp bytes (modules that donate arguments run once).
    let rounds = if runs == 0 { 0 } else { runs + runs / 10 };
    for round in 0..rounds {
        for (_, exe, buffers, times, _) in programs.iter_mut() {
            let arguments: Vec<&pjrt::Buffer> = buffers.iter().collect();
            let start = Instant::now();
            for output in exe.execute(&arguments)? {
                output.wait_ready()?;
            }
            // The first tenth warms caches and thread pools up.
            if round >= runs / 10 {
                times.push(start.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    println!("| module | median µs | min µs | p10 | p25 | p75 | p90 | temp bytes | compile ms |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (path, exe, _, mut times, compile_ms) in programs {
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        if times.is_empty() {
            times.push(f64::NAN);
        }
        let median = median(&mut times);
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
        println!(
            "| {path} | {median:.1} | {min:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {compile_ms:.0} |",
            at(0.1),
            at(0.25),
            at(0.75),
            at(0.9),
            exe.temp_bytes()
        );
    }
    Ok(())
}

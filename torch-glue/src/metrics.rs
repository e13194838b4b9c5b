//! Engine metrics: what ran, what compiled, what was deferred, what fell back to the CPU.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::recompile::{mode_name, RecompileReason};

/// Counters updated on the hot path (atomics) plus the fallback table.
#[derive(Default, Debug)]
pub struct Counters {
    pub executions: AtomicU64,
    pub ops: AtomicU64,
    pub host_to_device: AtomicU64,
    pub device_to_host: AtomicU64,
    pub host_to_device_bytes: AtomicU64,
    pub device_to_host_bytes: AtomicU64,
    pub execute_errors: AtomicU64,
    pub donated_buffers: AtomicU64,
    /// Regions cut between two repetitions of a loop body (DeferAndFuse's repeat cuts).
    pub repeat_cuts: AtomicU64,
    /// Whole flushes cut where one region would need more memory (DeferAndFuse's memory cuts).
    pub memory_cuts: AtomicU64,
    /// Regions cut around ops whose shapes keep changing (DeferAndFuse's isolation cuts).
    pub isolation_cuts: AtomicU64,
    /// Compiled-mode graphs run as their recorded program, without capturing their ops.
    pub graph_replays: AtomicU64,
    /// Index range checks decided at capture from index values the host knows (RFC 0012).
    pub host_index_checks: AtomicU64,
    /// Index range checks captured to run on the device, their verdicts read later.
    pub device_index_checks: AtomicU64,
    /// Pending ops launched because an op of another device arrived (a region never mixes
    /// devices).
    pub device_switch_cuts: AtomicU64,
    /// Copies of a value from one device of the process to another, and their bytes.
    pub device_to_device: AtomicU64,
    pub device_to_device_bytes: AtomicU64,
    /// Collectives across the process's devices, each one replicated program
    /// (`torch_pjrt.comm`), and the compiles their programs needed.
    pub collectives: AtomicU64,
    pub collective_compiles: AtomicU64,
    /// Host time in the engine's op calls (capture, meta, and any flush an op triggered), ns.
    pub op_nanos: AtomicU64,
    /// Host time planning and launching regions, wherever a flush was triggered, ns.
    pub flush_nanos: AtomicU64,
    /// Host time blocked until the device had computed a value that was read, ns.
    pub wait_nanos: AtomicU64,
    /// Host time copying between host and device memory, ns.
    pub transfer_nanos: AtomicU64,
    pub fallback_ops: Mutex<BTreeMap<String, u64>>,
}

impl Counters {
    pub fn bump(counter: &AtomicU64, by: u64) {
        counter.fetch_add(by, Ordering::Relaxed);
    }

    /// Adds the time since `start` to a nanosecond counter.
    pub fn add_time(counter: &AtomicU64, start: std::time::Instant) {
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(nanos, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub fn reset(&self) {
        for c in [
            &self.executions,
            &self.ops,
            &self.host_to_device,
            &self.device_to_host,
            &self.host_to_device_bytes,
            &self.device_to_host_bytes,
            &self.execute_errors,
            &self.donated_buffers,
            &self.repeat_cuts,
            &self.memory_cuts,
            &self.isolation_cuts,
            &self.graph_replays,
            &self.host_index_checks,
            &self.device_index_checks,
            &self.device_switch_cuts,
            &self.device_to_device,
            &self.device_to_device_bytes,
            &self.collectives,
            &self.collective_compiles,
            &self.op_nanos,
            &self.flush_nanos,
            &self.wait_nanos,
            &self.transfer_nanos,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        self.fallback_ops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// A point-in-time copy of every metric.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub values: BTreeMap<&'static str, f64>,
    pub fallback_ops: BTreeMap<String, u64>,
    pub last_recompile_reason: Option<String>,
    /// The recent recompiles' reasons, oldest first.
    pub recompile_reasons: Vec<RecompileReason>,
    /// The latest programs compiled, oldest first, with their compile times.
    pub compiled_programs: Vec<compile::CompiledProgram>,
}

/// A number as JSON has it: integers without a fraction, and `null` for NaN and infinities,
/// which JSON cannot write (a ratio of zero by zero must not make the whole report unreadable).
fn json_number(v: f64) -> String {
    if !v.is_finite() {
        "null".to_string()
    } else if v.fract() == 0.0 && v.abs() < 9e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

impl MetricsSnapshot {
    /// The snapshot as a JSON object (what the Python `metrics()` parses).
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (k, v) in &self.values {
            out.push_str(&format!("\"{k}\":{},", json_number(*v)));
        }
        out.push_str("\"fallback_ops\":{");
        let entries: Vec<String> = self
            .fallback_ops
            .iter()
            .map(|(k, v)| format!("{}:{v}", json_string(k)))
            .collect();
        out.push_str(&entries.join(","));
        out.push_str("},\"recompile_reasons\":[");
        let reasons: Vec<String> = self.recompile_reasons.iter().map(reason_json).collect();
        out.push_str(&reasons.join(","));
        out.push_str("],\"compiled_programs\":[");
        let programs: Vec<String> = self
            .compiled_programs
            .iter()
            .map(|p| {
                format!(
                    "{{\"region\":{},\"seconds\":{},\"fast\":{},\"quick\":{},\"key\":\"{}\"}}",
                    json_string(&p.label),
                    json_number(p.time.as_secs_f64()),
                    p.fast,
                    p.quick,
                    p.key
                )
            })
            .collect();
        out.push_str(&programs.join(","));
        out.push_str("],\"last_recompile_reason\":");
        match &self.last_recompile_reason {
            Some(r) => out.push_str(&json_string(r)),
            None => out.push_str("null"),
        }
        out.push('}');
        out
    }

    /// A human-readable report.
    pub fn report(&self) -> String {
        let mut out = String::from("torch-pjrt metrics\n");
        for (k, v) in &self.values {
            out.push_str(&format!("  {k:<28} {v}\n"));
        }
        if self.fallback_ops.is_empty() {
            out.push_str("  fallback_ops                 (none)\n");
        } else {
            out.push_str("  fallback_ops\n");
            for (k, v) in &self.fallback_ops {
                out.push_str(&format!("    {k:<26} {v}\n"));
            }
        }
        if !self.compiled_programs.is_empty() {
            out.push_str("  latest compiles (seconds)\n");
            for p in &self.compiled_programs {
                let effort = match (p.fast, p.quick) {
                    (true, _) => " [fast]",
                    (_, true) => " [quick]",
                    _ => "",
                };
                out.push_str(&format!(
                    "    {:>8.4}  {}{effort}\n",
                    p.time.as_secs_f64(),
                    p.label
                ));
            }
        }
        if !self.recompile_reasons.is_empty() {
            out.push_str("  recent recompiles\n");
            for r in &self.recompile_reasons {
                out.push_str(&format!("    {}\n", r.message()));
            }
        }
        out
    }
}

/// One reason as a JSON object: the first change's fields at the top (`op`, `op_index`,
/// `what`, `old`, `new`), every kept change under `changes`.
fn reason_json(r: &RecompileReason) -> String {
    let change_json =
        |c: &defer::Change| {
            format!(
            "{{\"op\":{},\"op_index\":{},\"what\":{},\"old\":{},\"new\":{},\"op_location\":{}}}",
            json_string(&c.op),
            c.op_index.map_or("null".to_string(), |i| i.to_string()),
            json_string(&c.what),
            json_string(&c.old),
            json_string(&c.new),
            c.location.as_deref().map_or("null".to_string(), json_string)
        )
        };
    let mut out = format!(
        "{{\"number\":{},\"region\":{},\"mode\":{},\"message\":{},\"location\":{},\
         \"materialized_at\":{},\"shapeless_key\":\"{:016x}\",\"dims_key\":\"{:016x}\",\
         \"total_changes\":{},",
        r.number,
        json_string(&r.region),
        json_string(mode_name(r.mode)),
        json_string(&r.message()),
        r.user_line().map_or("null".to_string(), json_string),
        match (&r.location, r.mode) {
            (Some(at), defer::Mode::DeferAndFuse) => json_string(at),
            _ => "null".to_string(),
        },
        r.shapeless_key,
        r.dims_key,
        r.total_changes,
    );
    match r.changes.first() {
        Some(c) => {
            let first = change_json(c);
            // The first change's fields, without its braces.
            out.push_str(&first[1..first.len() - 1]);
        }
        None => {
            out.push_str("\"op\":null,\"op_index\":null,\"what\":null,\"old\":null,\"new\":null,\"op_location\":null")
        }
    }
    let changes: Vec<String> = r.changes.iter().map(change_json).collect();
    out.push_str(&format!(",\"changes\":[{}]}}", changes.join(",")));
    out
}

/// `torch_pjrt.cache_stats()`: one JSON object per program in the in-process cache.
pub fn programs_json(programs: &[compile::ProgramStats]) -> String {
    let rows: Vec<String> = programs
        .iter()
        .map(|p| {
            format!(
                "{{\"key\":{},\"region\":{},\"source\":{},\"compile_seconds\":{},\"hits\":{}}}",
                json_string(&p.key.to_string()),
                json_string(&p.label),
                json_string(p.source),
                p.compile_time.as_secs_f64(),
                p.hits
            )
        })
        .collect();
    format!("[{}]", rows.join(","))
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_contract_keys_and_escapes() {
        let mut s = MetricsSnapshot::default();
        s.values.insert("compilations", 3.0);
        s.values.insert("compile_seconds", 0.25);
        s.fallback_ops.insert("aten::\"odd\"".to_string(), 2);
        let j = s.to_json();
        assert!(j.contains("\"compilations\":3"), "{j}");
        assert!(j.contains("\"compile_seconds\":0.25"), "{j}");
        assert!(j.contains("\"aten::\\\"odd\\\"\":2"), "{j}");
        assert!(j.ends_with("\"last_recompile_reason\":null}"), "{j}");
    }

    #[test]
    fn json_writes_numbers_it_cannot_represent_as_null() {
        let mut s = MetricsSnapshot::default();
        s.values.insert("a_ratio", f64::NAN);
        s.values.insert("b_bound", f64::INFINITY);
        s.values.insert("c_count", 2.0);
        let j = s.to_json();
        assert!(j.contains("\"a_ratio\":null"), "{j}");
        assert!(j.contains("\"b_bound\":null"), "{j}");
        assert!(j.contains("\"c_count\":2"), "{j}");
        assert!(!j.contains("NaN") && !j.contains("inf"), "{j}");
    }
}

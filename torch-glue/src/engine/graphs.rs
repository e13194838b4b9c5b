//! Compiled-mode graphs run again without capturing their ops (RFC 0033): a graph's region is
//! recorded once as a program over the graph's input and output storages, then replayed by
//! launching its executable with the new inputs' values.
//!
//! Recording maps each argument of the region to the graph input whose storage held it, and
//! each result to the storages it was installed in (an input's, when the graph wrote into it;
//! a fresh one, when it is a graph output). A replay checks that every argument's storage holds
//! a value of the recorded type, makes new result values, installs them where the recording
//! did and enqueues the job; anything it cannot check answers "not replayed", and the caller
//! runs the graph's ops instead.

use super::{Engine, FlushedValues};
use crate::metrics::Counters;
use compile::{CacheKey, CompileHandle, DeviceValue, ExecJob, HostArgument};
use defer::{EngineError, Flush, FlushRequest, Graph, ReadSource, StorageId};
use ops::TensorType;
use std::sync::Arc;

/// Where a recorded result goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// The storage of the graph's input at this position (written in place).
    Input(usize),
    /// The fresh storage at this position of the caller's list (a graph output).
    Fresh(usize),
}

/// One graph's region, as a program over the graph's storages.
#[derive(Debug)]
pub(crate) struct GraphProgram {
    key: CacheKey,
    label: Arc<str>,
    /// The region's op count, for the trace.
    ops: usize,
    /// Per region argument: the graph input whose storage holds it, and the value's type.
    args: Vec<(usize, TensorType)>,
    inputs: usize,
    fresh: usize,
    outputs: usize,
    installs: Vec<(usize, Target, TensorType)>,
    donated: Vec<usize>,
    scalar_packs: fuse::ScalarPacks,
    /// Results that are assertion verdicts, with the op that made each.
    checks: Vec<(usize, defer::CheckSite)>,
    /// The ops pending before the graph that its region computed first
    /// ([`Engine::graph_begin_record`]): a replay finds the same ops pending and drops them.
    prologue: Option<defer::Prologue>,
}

/// `recorded`, the scalar packs of a region that starts with a prologue, with the prologue's
/// scalars replaced by `prologue`'s (the leading ones of each dtype's pack); `None` when
/// `recorded` has no room for them.
fn splice_prologue_scalars(
    recorded: &fuse::ScalarPacks,
    prologue: &defer::Prologue,
) -> Option<fuse::ScalarPacks> {
    let (_, now) = fuse::pack_scalars(prologue.scalars());
    let mut packs = recorded.clone();
    for pack in &now {
        let into = packs.iter_mut().find(|p| p.dtype == pack.dtype)?;
        into.bytes
            .get_mut(..pack.bytes.len())?
            .copy_from_slice(&pack.bytes);
    }
    Some(packs)
}

/// A storage's device value and its type, when it holds a computed (or launched) one.
fn device_value(
    graph: &Graph<DeviceValue>,
    id: StorageId,
) -> Result<Option<(DeviceValue, TensorType)>, EngineError> {
    Ok(match graph.storage_source(id)? {
        Some(ReadSource::Device(value, ty)) if !graph.storage_is_padded(id) => Some((value, ty)),
        _ => None,
    })
}

impl Engine {
    /// Closes the graph [`Engine::graph_begin`] opened, as [`Engine::graph_end`] does, and
    /// records its region as a program over `inputs` (the graph inputs' storages, in order) and
    /// `fresh` (the storages of its outputs that are not inputs'). Returns the program's handle,
    /// or 0 when the region cannot be replayed (it was not one region, it read a value that is
    /// not an input's, or a result went somewhere else).
    pub fn graph_end_record(
        &self,
        inputs: &[StorageId],
        fresh: &[StorageId],
    ) -> Result<u64, EngineError> {
        let recorded = self.flush_recording(inputs, fresh);
        self.graph_end()?;
        let Some(program) = recorded? else {
            return Ok(0);
        };
        let mut programs = self.graph_programs.lock();
        programs.push(Arc::new(program));
        Ok(programs.len() as u64)
    }

    fn flush_recording(
        &self,
        inputs: &[StorageId],
        fresh: &[StorageId],
    ) -> Result<Option<GraphProgram>, EngineError> {
        let prologue = self.graph_prologue.lock().take();
        let mut graph = self.graph.lock()?;
        // An input read before it was ever written was read as zeros baked into the region:
        // a replay with a written one would compute from the zeros.
        let zero_filled = graph.take_zero_filled();
        if graph.pending_len() == 0
            || !graph.memory_cuts().is_empty()
            || inputs.iter().any(|s| zero_filled.contains(s))
        {
            return Ok(None); // nothing to run, not one region, or not a function of its inputs
        }
        // Every value the graph's ops read, and the storage it was read from: the region's
        // arguments are among them.
        let mut before = graph.read_storages();
        let dropped = graph.stats().dropped_ops;
        let start = std::time::Instant::now();
        let began = compile::trace::on().then_some(start);
        let mut recorded = None;
        let flushed = self.flush_atomically(|made, planned| {
            let mut cached = None;
            let has_program = |shapeless, dims, size| {
                cached = self.lookup_program(shapeless, dims, size);
                cached.is_some()
            };
            let Some(flush) =
                graph.flush_with(FlushRequest::All, |_| made.pending(), has_program)?
            else {
                return Ok(FlushedValues::new());
            };
            planned.set(true);
            recorded = self.describe(&graph, &flush, inputs, fresh, &before)?;
            // The inputs' handles go before the launch, so the first run may donate them.
            before.clear();
            self.launch(flush, cached, began)
        });
        Counters::add_time(&self.counters.flush_nanos, start);
        flushed?;
        if graph.pending_len() != 0 {
            return Ok(None); // part of the graph is still pending: not one region
        }
        let Some(mut program) = recorded else {
            return Ok(None);
        };
        if let Some(prologue) = prologue {
            // The prologue's ops lead the region only if none was dropped, and its results are
            // the program's only if it installs them in the inputs that held them.
            let leads = graph.stats().dropped_ops == dropped
                && splice_prologue_scalars(&program.scalar_packs, &prologue).as_ref()
                    == Some(&program.scalar_packs);
            let installs = prologue.held_inputs().all(|k| {
                program
                    .installs
                    .iter()
                    .any(|&(_, t, _)| t == Target::Input(k))
            });
            if !leads || !installs {
                return Ok(None);
            }
            program.prologue = Some(prologue);
        }
        Ok(Some(program))
    }

    /// The flush as a program over the graph's storages, or `None` when it is not one.
    fn describe(
        &self,
        graph: &Graph<DeviceValue>,
        flush: &Flush<DeviceValue>,
        inputs: &[StorageId],
        fresh: &[StorageId],
        before: &[(StorageId, DeviceValue, TensorType)],
    ) -> Result<Option<GraphProgram>, EngineError> {
        let mut args = Vec::with_capacity(flush.args.len());
        for value in &flush.args {
            let read =
                before
                    .iter()
                    .find(|(_, v, _)| v.same(value))
                    .and_then(|(storage, _, ty)| {
                        let k = inputs.iter().position(|s| s == storage)?;
                        Some((k, ty.clone()))
                    });
            match read {
                Some(arg) => args.push(arg),
                None => return Ok(None), // a value no graph input's storage held
            }
        }
        let position = |value: &DeviceValue| flush.outputs.iter().position(|o| o.same(value));
        let mut installs = Vec::new();
        let mut covered = vec![false; flush.outputs.len()];
        for (k, &s) in inputs.iter().enumerate() {
            if let Some((value, ty)) = device_value(graph, s)? {
                if let Some(j) = position(&value) {
                    if installs.iter().all(|&(_, t, _)| t != Target::Input(k)) {
                        installs.push((j, Target::Input(k), ty));
                        covered[j] = true;
                    }
                }
            }
        }
        for (m, &s) in fresh.iter().enumerate() {
            let Some((value, ty)) = device_value(graph, s)? else {
                return Ok(None);
            };
            let Some(j) = position(&value) else {
                return Ok(None); // a graph output the region did not compute
            };
            installs.push((j, Target::Fresh(m), ty));
            covered[j] = true;
        }
        let mut checks = Vec::new();
        for (value, label) in &flush.checks {
            let Some(j) = position(value) else {
                return Ok(None);
            };
            checks.push((j, label.clone()));
            covered[j] = true;
        }
        if covered.contains(&false) {
            return Ok(None); // a result held by a storage outside the graph
        }
        Ok(Some(GraphProgram {
            key: CacheKey {
                shapeless: flush.shapeless,
                dims: flush.dims,
                options: self.options_for(defer::RegionSize {
                    ops: flush.ops,
                    work: flush.work,
                }),
            },
            label: flush.label.clone(),
            ops: flush.ops,
            args,
            inputs: inputs.len(),
            fresh: fresh.len(),
            outputs: flush.outputs.len(),
            installs,
            donated: flush.aliases.iter().map(|&(arg, _)| arg as usize).collect(),
            scalar_packs: flush.scalar_packs.clone(),
            checks,
            prologue: None,
        }))
    }

    /// Runs the program `handle` ([`Engine::graph_end_record`]) on `inputs` and `fresh` (the
    /// same roles as when it was recorded): its results are installed in their storages and its
    /// job is enqueued. `false` when it cannot run this way now (an argument's storage holds a
    /// value of another type, or the executable is not in the in-process cache yet): run the
    /// graph's ops instead.
    pub fn graph_replay(
        &self,
        handle: u64,
        inputs: &[StorageId],
        fresh: &[StorageId],
    ) -> Result<bool, EngineError> {
        let program = usize::try_from(handle)
            .ok()
            .and_then(|h| h.checked_sub(1))
            .and_then(|h| self.graph_programs.lock().get(h).cloned())
            .ok_or_else(|| {
                EngineError::runtime(format!("graph_replay: no recorded program {handle}"))
            })?;
        if inputs.len() != program.inputs || fresh.len() != program.fresh {
            return Err(EngineError::runtime(format!(
                "graph_replay: program {handle} was recorded with {} inputs and {} fresh \
                 outputs, got {} and {}",
                program.inputs,
                program.fresh,
                inputs.len(),
                fresh.len()
            )));
        }
        let Some(executable) = self.compiler.lookup(&program.key) else {
            return Ok(false);
        };
        let mut graph = self.graph.lock()?;
        // A program that computes its prologue runs only when the same ops are pending (with
        // their scalars of now); any other runs after what is pending.
        let mut spliced = None;
        if let Some(recorded) = &program.prologue {
            match graph.pending_prologue(inputs) {
                Some(now) if now.same_ops(recorded) => {
                    match splice_prologue_scalars(&program.scalar_packs, &now) {
                        Some(packs) => spliced = Some(packs),
                        None => return Ok(false),
                    }
                }
                _ => return Ok(false),
            }
        } else if graph.pending_len() > 0 {
            self.flush_locked(&mut graph, FlushRequest::All)?;
        }
        let start = std::time::Instant::now();
        // The program runs where its inputs are (a recorded graph never mixes devices).
        let device = match inputs.first() {
            Some(&first) => graph.storage_device(first)?,
            None => graph.device(),
        };
        if spliced.is_some() && graph.device() != device {
            return Ok(false); // a prologue pending on another device is not this program's
        }
        for &storage in inputs.iter().chain(fresh) {
            if graph.storage_device(storage)? != device {
                // Storages of two devices: the graph's ops run eagerly and raise PyTorch's error.
                return Ok(false);
            }
        }
        let mut args: smallvec::SmallVec<[DeviceValue; 4]> = smallvec::SmallVec::new();
        for (k, ty) in &program.args {
            match device_value(&graph, inputs[*k])? {
                Some((value, held)) if held == *ty => args.push(value),
                _ => return Ok(false),
            }
        }
        let target = |t: Target| match t {
            Target::Input(k) => inputs[k],
            Target::Fresh(m) => fresh[m],
        };
        if !program
            .installs
            .iter()
            .all(|(_, t, ty)| graph.can_install(target(*t), ty))
        {
            return Ok(false);
        }
        let replayed = self.flush_atomically(|made, planned| {
            let outputs: FlushedValues = (0..program.outputs).map(|_| made.pending()).collect();
            planned.set(true);
            for (j, t, ty) in &program.installs {
                graph.install_value(target(*t), outputs[*j].clone(), ty.clone())?;
            }
            // The prologue's values are the program's now: its pending ops are dead.
            if program.prologue.is_some() && !graph.drop_unheld_pending() {
                return Err(EngineError::runtime(
                    "internal error: a replayed graph's prologue is still held",
                ));
            }
            let mut job = ExecJob::new(
                program.label.clone(),
                CompileHandle::ready(program.key, executable),
                std::mem::take(&mut args),
                &outputs,
            )
            .donate(program.donated.iter().copied())
            .on_device(self.execution_device(device));
            for pack in spliced.as_ref().unwrap_or(&program.scalar_packs) {
                job = job.upload(HostArgument {
                    client: self.client.clone(),
                    bytes: pack.bytes.clone(),
                    element_type: super::element_type(pack.dtype),
                    dims: smallvec::smallvec![pack.count as i64],
                    what: "lifted scalars",
                });
                Counters::bump(&self.counters.host_to_device, 1);
            }
            if compile::trace::on() {
                job = self.trace_launch(job, start, program.ops, "tier1 (graph replay)");
            }
            Counters::bump(&self.counters.executions, 1);
            Counters::bump(&self.counters.graph_replays, 1);
            Counters::bump(&self.counters.donated_buffers, program.donated.len() as u64);
            if !program.checks.is_empty() {
                self.pending_checks.lock().extend(
                    program
                        .checks
                        .iter()
                        .map(|(j, label)| (outputs[*j].clone(), label.clone())),
                );
            }
            self.queue.enqueue(job);
            let mut last = self.last_outputs.lock();
            last.clear();
            last.extend(outputs.iter().map(|v| v.downgrade()));
            Ok(true)
        });
        Counters::add_time(&self.counters.flush_nanos, start);
        if matches!(replayed, Ok(true)) {
            self.note_graph_ran();
        }
        replayed
    }
}

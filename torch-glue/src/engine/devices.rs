//! Several devices in one process (RFC 0046): copies of a value from one device to another, and
//! collectives across the devices (`all_reduce`, `all_gather`, `reduce_scatter`), each one
//! replicated StableHLO program run on all of its devices at once.

use super::{runtime_error, Engine};
use crate::metrics::Counters;
use compile::DeviceValue;
use defer::{EngineError, ReadSource, StorageId, TensorRef};
use ops::DType;
use std::sync::Arc;

/// A collective across the process's devices, one tensor per device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every device gets the reduction of all devices' tensors.
    AllReduce(Reduction),
    /// Every device gets all devices' tensors joined along a dimension, in device-list order.
    AllGather { dim: usize },
    /// Device `i` gets part `i` (along a dimension) of the reduction of all devices' tensors.
    ReduceScatter { reduction: Reduction, dim: usize },
}

/// How a reducing collective combines the devices' elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    Sum,
    Product,
    Max,
    Min,
}

impl Reduction {
    /// The C ABI's code: 0 sum, 1 product, 2 max, 3 min.
    pub fn from_code(code: i32) -> Option<Reduction> {
        Some(match code {
            0 => Reduction::Sum,
            1 => Reduction::Product,
            2 => Reduction::Max,
            3 => Reduction::Min,
            _ => return None,
        })
    }

    fn stablehlo_op(self) -> &'static str {
        match self {
            Reduction::Sum => "stablehlo.add",
            Reduction::Product => "stablehlo.multiply",
            Reduction::Max => "stablehlo.maximum",
            Reduction::Min => "stablehlo.minimum",
        }
    }
}

impl Collective {
    /// The C ABI's kind code (0 all_reduce, 1 all_gather, 2 reduce_scatter) with its
    /// reduction code and dimension.
    pub fn from_codes(kind: i32, reduction: i32, dim: i64) -> Result<Collective, EngineError> {
        let reduction = || {
            Reduction::from_code(reduction).ok_or_else(|| {
                EngineError::runtime(format!(
                    "unknown reduction code {reduction}: use sum, product, max or min"
                ))
            })
        };
        let dim = usize::try_from(dim)
            .map_err(|_| EngineError::runtime(format!("a negative dimension {dim}")));
        Ok(match kind {
            0 => Collective::AllReduce(reduction()?),
            1 => Collective::AllGather { dim: dim? },
            2 => Collective::ReduceScatter {
                reduction: reduction()?,
                dim: dim?,
            },
            _ => {
                return Err(EngineError::runtime(format!(
                    "unknown collective code {kind}"
                )))
            }
        })
    }

    /// Each device's result sizes for inputs of `sizes` across `replicas` devices.
    pub fn result_sizes(&self, sizes: &[i64], replicas: usize) -> Result<Vec<i64>, EngineError> {
        let mut result = sizes.to_vec();
        match *self {
            Collective::AllReduce(_) => {}
            Collective::AllGather { dim } => {
                let extent = result.get_mut(dim).ok_or_else(|| dim_error(dim, sizes))?;
                *extent *= replicas as i64;
            }
            Collective::ReduceScatter { dim, .. } => {
                let extent = result.get_mut(dim).ok_or_else(|| dim_error(dim, sizes))?;
                if *extent % replicas as i64 != 0 {
                    return Err(EngineError::runtime(format!(
                        "reduce_scatter: dimension {dim} of size {extent} does not split into \
                         {replicas} equal parts"
                    )));
                }
                *extent /= replicas as i64;
            }
        }
        Ok(result)
    }

    /// The replicated program: one argument and one result per replica, replica `i` on the
    /// `i`-th device of the list, every replica in one group.
    pub fn module(
        &self,
        dtype: DType,
        sizes: &[i64],
        replicas: usize,
    ) -> Result<String, EngineError> {
        let element = super::element_type(dtype).mlir_name();
        let tensor = |dims: &[i64]| {
            let mut text = String::from("tensor<");
            for d in dims {
                text.push_str(&format!("{d}x"));
            }
            text.push_str(element);
            text.push('>');
            text
        };
        let input = tensor(sizes);
        let output = tensor(&self.result_sizes(sizes, replicas)?);
        let scalar = tensor(&[]);
        let group: Vec<String> = (0..replicas).map(|r| r.to_string()).collect();
        let groups = format!(
            "replica_groups = dense<[[{}]]> : tensor<1x{replicas}xi64>",
            group.join(", ")
        );
        let body = |reduction: Reduction| {
            format!(
                "({{\n    ^bb0(%a: {scalar}, %b: {scalar}):\n      %s = {} %a, %b : {scalar}\n      \
                 stablehlo.return %s : {scalar}\n    }})",
                reduction.stablehlo_op()
            )
        };
        let op = match *self {
            Collective::AllReduce(reduction) => format!(
                "\"stablehlo.all_reduce\"(%x) {} {{{groups}}}",
                body(reduction)
            ),
            Collective::AllGather { dim } => {
                format!("\"stablehlo.all_gather\"(%x) {{all_gather_dim = {dim} : i64, {groups}}}")
            }
            Collective::ReduceScatter { reduction, dim } => format!(
                "\"stablehlo.reduce_scatter\"(%x) {} {{scatter_dimension = {dim} : i64, {groups}}}",
                body(reduction)
            ),
        };
        Ok(format!(
            "module @collective attributes {{mhlo.num_replicas = {replicas} : i32, \
             mhlo.num_partitions = 1 : i32}} {{\n  func.func public @main(%x: {input}) -> \
             {output} {{\n    %r = {op} : ({input}) -> {output}\n    return %r : {output}\n  }}\n}}\n"
        ))
    }
}

fn dim_error(dim: usize, sizes: &[i64]) -> EngineError {
    EngineError::new(
        defer::ErrorKind::Index,
        format!(
            "Dimension out of range (expected to be in range of [0, {}], but got {dim})",
            sizes.len().saturating_sub(1)
        ),
    )
}

/// What a collective's program is cached by: the same program serves the same collective of
/// the same type on the same devices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CollectiveKey {
    collective: Collective,
    dtype: DType,
    sizes: Vec<i64>,
    devices: Vec<u32>,
}

impl Engine {
    /// The device value of whole tensor `t`, launched: what is pending on its device is
    /// launched first (the value may still be computing). `None`: a storage never written
    /// (zeros).
    fn whole_value(&self, t: &TensorRef) -> Result<Option<DeviceValue>, EngineError> {
        {
            let mut graph = self.graph.lock()?;
            let device = graph.storage_device(t.storage)?;
            self.enter_device(&mut graph, device, &[])?;
            graph.make_exact(t.storage)?;
            if !graph.is_whole(t)? {
                return Err(EngineError::runtime(
                    "internal error: a value crossing devices must be a whole contiguous tensor",
                ));
            }
        }
        match self.materialized_source(|graph| graph.read_source(t))? {
            ReadSource::Zeros => Ok(None),
            ReadSource::Device(value, _) => Ok(Some(value)),
        }
    }

    /// A new storage on `device` holding `value` as a tensor of `like`'s dtype and `sizes`.
    fn install_on(
        &self,
        device: u32,
        like: &TensorRef,
        sizes: &[i64],
        value: DeviceValue,
    ) -> Result<StorageId, EngineError> {
        let nbytes = sizes.iter().product::<i64>() as u64 * like.dtype.size_bytes() as u64;
        let mut graph = self.graph.lock()?;
        let storage = graph.new_storage_on(nbytes, device);
        let t = TensorRef::contiguous(storage, like.dtype, sizes);
        if let Err(e) = graph.write_device(&t, value) {
            let _ = graph.release_storage(storage);
            return Err(e);
        }
        Ok(storage)
    }

    /// Copies whole contiguous tensor `src` into `dst`, of the same dtype and sizes on another
    /// device (`tensor.to("pjrt:1")`). The buffer is copied by the plugin from device to
    /// device, or through the host where the plugin cannot, and becomes `dst`'s value (through
    /// a copy on `dst`'s device when `dst` is a view).
    pub fn copy_to_device(&self, src: &TensorRef, dst: &TensorRef) -> Result<(), EngineError> {
        if src.dtype != dst.dtype || src.sizes != dst.sizes {
            return Err(EngineError::runtime(format!(
                "internal error: a copy between devices from {} {:?} into {} {:?}",
                src.dtype.name(),
                src.sizes.as_slice(),
                dst.dtype.name(),
                dst.sizes.as_slice()
            )));
        }
        let device = self.graph.lock()?.storage_device(dst.storage)?;
        let nbytes = src.numel() as usize * src.dtype.size_bytes();
        let start = std::time::Instant::now();
        let source = match self.whole_value(src)? {
            Some(value) => {
                let _hold = self.queue.hold_worker();
                Some(self.wait_device(&value)?)
            }
            None => None,
        };
        let moved = match source {
            Some(buffer) => match buffer.copy_to_device(&self.devices[device as usize]) {
                Ok(moved) => moved,
                Err(e) if e.code() == Some(pjrt::ErrorCode::Unimplemented) => {
                    let bytes = buffer
                        .to_host()
                        .map_err(|e| runtime_error("copying a pjrt tensor to the host", e))?;
                    self.upload_to(&bytes, src.dtype, &src.sizes, device)
                        .map_err(|e| runtime_error("copying a pjrt tensor to another device", e))?
                }
                Err(e) => return Err(runtime_error("copying a pjrt tensor to another device", e)),
            },
            None => self
                .upload_to(&vec![0u8; nbytes], src.dtype, &src.sizes, device)
                .map_err(|e| runtime_error("uploading zeros", e))?,
        };
        Counters::add_time(&self.counters.transfer_nanos, start);
        Counters::bump(&self.counters.device_to_device, 1);
        Counters::bump(&self.counters.device_to_device_bytes, nbytes as u64);
        let value = DeviceValue::ready(Arc::new(moved));
        let mut graph = self.graph.lock()?;
        self.enter_device(&mut graph, device, &[])?;
        if graph.is_whole(dst)? {
            return graph.write_device(dst, value);
        }
        // A strided destination: the moved buffer becomes a temporary, copied in through the view.
        let temp = graph.new_storage_on(nbytes as u64, device);
        let temp_ref = TensorRef::contiguous(temp, dst.dtype, &dst.sizes);
        let result = graph.write_device(&temp_ref, value).and_then(|()| {
            graph.capture(
                ops::OpId::Clone,
                &[temp_ref],
                &[],
                &[],
                std::slice::from_ref(dst),
            )?;
            self.after_capture(&mut graph)
        });
        graph.release_storage(temp)?;
        result
    }

    /// Runs `collective` over `inputs`, whole contiguous tensors of one type, one on each of
    /// several distinct devices, as one replicated program; returns each device's result
    /// storage, in the order of `inputs`. The program runs on the execution thread, in order with
    /// the regions; the results are pending values until it has.
    pub fn collective(
        &self,
        collective: Collective,
        inputs: &[TensorRef],
    ) -> Result<Vec<StorageId>, EngineError> {
        let first = inputs
            .first()
            .ok_or_else(|| EngineError::runtime("a collective needs at least one tensor"))?;
        let mut devices = Vec::with_capacity(inputs.len());
        for t in inputs {
            if t.dtype != first.dtype || t.sizes != first.sizes {
                return Err(EngineError::runtime(format!(
                    "a collective's tensors must have one dtype and shape: got {} {:?} and {} \
                     {:?}",
                    first.dtype.name(),
                    first.sizes.as_slice(),
                    t.dtype.name(),
                    t.sizes.as_slice()
                )));
            }
            let device = self.graph.lock()?.storage_device(t.storage)?;
            if devices.contains(&device) {
                return Err(EngineError::runtime(format!(
                    "a collective takes one tensor per device, but pjrt:{device} has two"
                )));
            }
            devices.push(device);
        }
        let sizes = collective.result_sizes(&first.sizes, inputs.len())?;
        let key = CollectiveKey {
            collective,
            dtype: first.dtype,
            sizes: first.sizes.to_vec(),
            devices: devices.clone(),
        };
        let program = self.collective_program(&key)?;
        let mut arguments = Vec::with_capacity(inputs.len());
        for (t, &device) in inputs.iter().zip(&devices) {
            let value = match self.whole_value(t)? {
                Some(value) => value,
                None => {
                    let zeros = vec![0u8; t.numel() as usize * t.dtype.size_bytes()];
                    DeviceValue::ready(
                        self.upload_to(&zeros, t.dtype, &t.sizes, device)
                            .map_err(|e| runtime_error("uploading zeros", e))?,
                    )
                }
            };
            arguments.push(value);
        }
        // Run in order with the regions, on the execution thread: the inputs' regions were
        // queued before it, and the results are pending values like any region's.
        let results: Vec<DeviceValue> = (0..inputs.len()).map(|_| DeviceValue::pending()).collect();
        let mut storages = Vec::with_capacity(inputs.len());
        for ((value, &device), t) in results.iter().zip(&devices).zip(inputs) {
            match self.install_on(device, t, &sizes, value.clone()) {
                Ok(storage) => storages.push(storage),
                Err(e) => {
                    let mut graph = self.graph.lock()?;
                    for made in storages {
                        let _ = graph.release_storage(made);
                    }
                    return Err(e);
                }
            }
        }
        let label = format!("{collective:?} across {} devices", inputs.len());
        self.queue.enqueue_fn(label, results, move || {
            let mut buffers = Vec::with_capacity(arguments.len());
            for value in &arguments {
                buffers.push(value.wait().map_err(|e| e.to_string())?);
            }
            let lists: Vec<Vec<&pjrt::Buffer>> = buffers.iter().map(|b| vec![b.as_ref()]).collect();
            let replicas = program
                .execute_replicated(&lists)
                .map_err(|e| e.to_string())?;
            Ok(replicas
                .into_iter()
                .flat_map(|replica| replica.into_iter().map(Arc::new))
                .collect())
        });
        Counters::bump(&self.counters.collectives, 1);
        Counters::bump(&self.counters.executions, 1);
        Ok(storages)
    }

    /// The replicated program of a collective, compiled once per key.
    fn collective_program(
        &self,
        key: &CollectiveKey,
    ) -> Result<Arc<pjrt::LoadedExecutable>, EngineError> {
        if let Some(program) = self.collective_programs.lock().get(key) {
            return Ok(program.clone());
        }
        let replicas = key.devices.len();
        let module = key.collective.module(key.dtype, &key.sizes, replicas)?;
        let options = pjrt::CompileOptions {
            num_replicas: replicas as i64,
            replica_devices: key
                .devices
                .iter()
                .map(|&d| i64::from(self.devices[d as usize].id))
                .collect(),
            ..Default::default()
        };
        let program = Arc::new(
            self.client
                .compile_with_options(&module, &options)
                .map_err(|e| runtime_error("compiling a collective across pjrt devices", e))?,
        );
        Counters::bump(&self.counters.collective_compiles, 1);
        self.collective_programs
            .lock()
            .insert(key.clone(), program.clone());
        Ok(program)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_name_their_replica_group_and_result_shape() {
        let text = Collective::AllReduce(Reduction::Sum)
            .module(DType::F32, &[2, 3], 4)
            .unwrap();
        assert!(text.contains("mhlo.num_replicas = 4"));
        assert!(text.contains("replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>"));
        assert!(text.contains("stablehlo.add"));
        assert!(text.contains("(tensor<2x3xf32>) -> tensor<2x3xf32>"));
        let gather = Collective::AllGather { dim: 1 }
            .module(DType::F32, &[2, 3], 2)
            .unwrap();
        assert!(gather.contains("(tensor<2x3xf32>) -> tensor<2x6xf32>"));
        let scatter = Collective::ReduceScatter {
            reduction: Reduction::Max,
            dim: 0,
        };
        assert_eq!(scatter.result_sizes(&[8, 3], 4).unwrap(), vec![2, 3]);
        assert!(scatter.result_sizes(&[6, 3], 4).is_err());
        assert!(Collective::AllGather { dim: 2 }
            .result_sizes(&[2, 3], 2)
            .is_err());
    }
}

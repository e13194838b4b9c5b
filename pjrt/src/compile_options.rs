//! `xla.CompileOptionsProto`, encoded with prost derive structs (only the fields this engine sets).

use prost::Message;

/// `xla.ExecutableBuildOptionsProto` (subset). The CPU plugin aborts the process when
/// `num_replicas`/`num_partitions` are missing, so they are always written.
#[derive(Clone, PartialEq, Message)]
pub struct ExecutableBuildOptionsProto {
    #[prost(int64, tag = "1")]
    pub device_ordinal: i64,
    #[prost(int64, tag = "4")]
    pub num_replicas: i64,
    #[prost(int64, tag = "5")]
    pub num_partitions: i64,
    #[prost(message, optional, tag = "9")]
    pub device_assignment: Option<DeviceAssignmentProto>,
}

/// `xla.DeviceAssignmentProto`: the device of each replica (one computation per replica here).
#[derive(Clone, PartialEq, Message)]
pub struct DeviceAssignmentProto {
    #[prost(int32, tag = "1")]
    pub replica_count: i32,
    #[prost(int32, tag = "2")]
    pub computation_count: i32,
    #[prost(message, repeated, tag = "3")]
    pub computation_devices: Vec<ComputationDevice>,
}

/// `xla.DeviceAssignmentProto.ComputationDevice`: one computation's device id for each replica.
#[derive(Clone, PartialEq, Message)]
pub struct ComputationDevice {
    #[prost(int64, repeated, tag = "1")]
    pub replica_device_ids: Vec<i64>,
}

/// `xla.OptionOverrideProto`: one value of a compile option set by name.
#[derive(Clone, PartialEq, Message)]
pub struct OptionOverrideProto {
    #[prost(oneof = "OptionOverrideValue", tags = "1, 2, 3, 4")]
    pub value: Option<OptionOverrideValue>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum OptionOverrideValue {
    #[prost(string, tag = "1")]
    String(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
    #[prost(double, tag = "4")]
    Double(f64),
}

/// `xla.CompileOptionsProto` (subset).
#[derive(Clone, PartialEq, Message)]
pub struct CompileOptionsProto {
    #[prost(message, optional, tag = "3")]
    pub executable_build_options: Option<ExecutableBuildOptionsProto>,
    /// A portable executable has no device assignment: each execution names its device.
    #[prost(bool, tag = "4")]
    pub compile_portable_executable: bool,
    /// Debug options (`xla_…` flags) by name, applied on top of `XLA_FLAGS`.
    #[prost(btree_map = "string, message", tag = "7")]
    pub env_option_overrides: std::collections::BTreeMap<String, OptionOverrideProto>,
}

/// The value of a compile option set by name (an XLA debug option such as
/// `xla_cpu_enable_fast_math`).
#[derive(Clone, Debug)]
pub enum CompileOverride {
    String(String),
    Bool(bool),
    Int(i64),
    Double(f64),
}

impl PartialEq for CompileOverride {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (CompileOverride::String(a), CompileOverride::String(b)) => a == b,
            (CompileOverride::Bool(a), CompileOverride::Bool(b)) => a == b,
            (CompileOverride::Int(a), CompileOverride::Int(b)) => a == b,
            (CompileOverride::Double(a), CompileOverride::Double(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

impl Eq for CompileOverride {}

impl std::hash::Hash for CompileOverride {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match self {
            CompileOverride::String(v) => v.hash(state),
            CompileOverride::Bool(v) => v.hash(state),
            CompileOverride::Int(v) => v.hash(state),
            CompileOverride::Double(v) => v.to_bits().hash(state),
        }
    }
}

/// What a compile is asked for. One partition; one replica unless a program runs on several
/// devices at once (a collective across a process's devices: `num_replicas` devices, replica
/// `i` on device `replica_devices[i]`, or on addressable device `i` when that is empty).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    pub device_ordinal: i64,
    pub num_replicas: i64,
    /// A single-replica program compiled without a device: every execution names the device
    /// it runs on (`ExecuteOptions::device`), so one executable serves every device.
    pub portable: bool,
    /// The device id of each replica; empty: the plugin's default assignment.
    pub replica_devices: Vec<i64>,
    /// Options set by name; a later entry for the same name wins.
    pub overrides: Vec<(String, CompileOverride)>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            device_ordinal: -1,
            num_replicas: 1,
            portable: false,
            replica_devices: Vec::new(),
            overrides: Vec::new(),
        }
    }
}

impl CompileOptions {
    /// The serialized proto handed to `PJRT_Client_Compile` (deterministic: overrides are
    /// written in name order, so the bytes can key caches).
    pub fn encode(&self) -> Vec<u8> {
        let env_option_overrides = self
            .overrides
            .iter()
            .map(|(name, value)| {
                let value = match value {
                    CompileOverride::String(v) => OptionOverrideValue::String(v.clone()),
                    CompileOverride::Bool(v) => OptionOverrideValue::Bool(*v),
                    CompileOverride::Int(v) => OptionOverrideValue::Int(*v),
                    CompileOverride::Double(v) => OptionOverrideValue::Double(*v),
                };
                (name.clone(), OptionOverrideProto { value: Some(value) })
            })
            .collect();
        let device_assignment = (!self.replica_devices.is_empty()).then(|| DeviceAssignmentProto {
            replica_count: self.replica_devices.len() as i32,
            computation_count: 1,
            computation_devices: vec![ComputationDevice {
                replica_device_ids: self.replica_devices.clone(),
            }],
        });
        CompileOptionsProto {
            executable_build_options: Some(ExecutableBuildOptionsProto {
                device_ordinal: self.device_ordinal,
                num_replicas: self.num_replicas.max(1),
                num_partitions: 1,
                device_assignment,
            }),
            compile_portable_executable: self.portable,
            env_option_overrides,
        }
        .encode_to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_are_encoded_in_name_order_and_decode_back() {
        let options = CompileOptions {
            device_ordinal: -1,
            num_replicas: 1,
            portable: false,
            replica_devices: Vec::new(),
            overrides: vec![
                ("xla_b".to_string(), CompileOverride::Int(3)),
                ("xla_a".to_string(), CompileOverride::Bool(true)),
                ("xla_c".to_string(), CompileOverride::Double(0.5)),
            ],
        };
        let swapped = CompileOptions {
            device_ordinal: -1,
            num_replicas: 1,
            portable: false,
            replica_devices: Vec::new(),
            overrides: vec![
                ("xla_a".to_string(), CompileOverride::Bool(true)),
                ("xla_c".to_string(), CompileOverride::Double(0.5)),
                ("xla_b".to_string(), CompileOverride::Int(3)),
            ],
        };
        assert_eq!(options.encode(), swapped.encode());
        let decoded = CompileOptionsProto::decode(options.encode().as_slice()).unwrap();
        let names: Vec<&String> = decoded.env_option_overrides.keys().collect();
        assert_eq!(names, ["xla_a", "xla_b", "xla_c"]);
        assert_eq!(
            decoded.env_option_overrides["xla_b"].value,
            Some(OptionOverrideValue::Int(3))
        );
        assert_ne!(options.encode(), CompileOptions::default().encode());
    }
}

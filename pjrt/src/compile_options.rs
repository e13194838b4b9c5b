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
}

/// `xla.CompileOptionsProto` (subset).
#[derive(Clone, PartialEq, Message)]
pub struct CompileOptionsProto {
    #[prost(message, optional, tag = "3")]
    pub executable_build_options: Option<ExecutableBuildOptionsProto>,
}

/// What a compile is asked for. One replica, one partition: this engine runs one device per
/// executable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    pub device_ordinal: i64,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { device_ordinal: -1 }
    }
}

impl CompileOptions {
    /// The serialized proto handed to `PJRT_Client_Compile`.
    pub fn encode(&self) -> Vec<u8> {
        CompileOptionsProto {
            executable_build_options: Some(ExecutableBuildOptionsProto {
                device_ordinal: self.device_ordinal,
                num_replicas: 1,
                num_partitions: 1,
            }),
        }
        .encode_to_vec()
    }
}

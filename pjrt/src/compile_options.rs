//! `CompileOptions` and its encoding as the `xla.CompileOptionsProto` bytes `PJRT_Client_Compile` takes.
//!
//! Both CPU plugins abort the whole process (`Check failed: replica_count > 0`) when the options lack
//! `num_replicas` or `num_partitions`, so both are always sent and must be ≥ 1.

use std::collections::BTreeMap;

use prost::{Message, Oneof};

use crate::error::{Error, Result};

/// How to compile a program: replicas × partitions and, optionally, which device runs each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    pub num_replicas: u32,
    pub num_partitions: u32,
    /// Required when `num_partitions > 1` (SPMD programs with `mhlo.sharding` annotations).
    pub use_spmd_partitioning: bool,
    /// `[replica][partition]` global device ids; `None` lets the plugin choose (devices 0, 1, …).
    pub device_assignment: Option<Vec<Vec<i64>>>,
    /// XLA debug options for this compile, by name (`xla_gpu_enable_command_buffer`, …): what `XLA_FLAGS` sets
    /// for a whole process, sent as the proto's option overrides (JAX's `compiler_options`). The plugin rejects an
    /// unknown name with an error. Later entries win.
    pub xla_options: Vec<(String, XlaOption)>,
}

/// The value of one XLA debug option (a list option such as `xla_gpu_enable_command_buffer` is a
/// comma-separated string, as in `XLA_FLAGS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum XlaOption {
    /// A string (also a list, comma-separated).
    Str(String),
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
}

impl XlaOption {
    /// `true`/`false` as a bool, an integer as an int, anything else as a string.
    pub fn parse(s: &str) -> XlaOption {
        match s {
            "true" => XlaOption::Bool(true),
            "false" => XlaOption::Bool(false),
            _ => s.parse::<i64>().map(XlaOption::Int).unwrap_or_else(|_| XlaOption::Str(s.to_string())),
        }
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            device_assignment: None,
            xla_options: Vec::new(),
        }
    }
}

// Field numbers from xla/pjrt/proto/compile_options.proto and xla/xla_data.proto.
#[derive(Clone, PartialEq, Message)]
struct CompileOptionsProto {
    #[prost(message, optional, tag = "3")]
    executable_build_options: Option<ExecutableBuildOptionsProto>,
    /// Ordered, so that equal options encode to equal bytes (the persistent compile cache keys on them).
    #[prost(btree_map = "string, message", tag = "7")]
    env_option_overrides: BTreeMap<String, OptionOverrideProto>,
}

#[derive(Clone, PartialEq, Message)]
struct OptionOverrideProto {
    #[prost(oneof = "OverrideValue", tags = "1, 2, 3")]
    value: Option<OverrideValue>,
}

#[derive(Clone, PartialEq, Oneof)]
enum OverrideValue {
    #[prost(string, tag = "1")]
    Str(String),
    #[prost(bool, tag = "2")]
    Bool(bool),
    #[prost(int64, tag = "3")]
    Int(i64),
}

#[derive(Clone, PartialEq, Message)]
struct ExecutableBuildOptionsProto {
    #[prost(int64, tag = "1")]
    device_ordinal: i64,
    #[prost(int64, tag = "4")]
    num_replicas: i64,
    #[prost(int64, tag = "5")]
    num_partitions: i64,
    #[prost(bool, tag = "6")]
    use_spmd_partitioning: bool,
    #[prost(message, optional, tag = "9")]
    device_assignment: Option<DeviceAssignmentProto>,
}

#[derive(Clone, PartialEq, Message)]
struct DeviceAssignmentProto {
    #[prost(int32, tag = "1")]
    replica_count: i32,
    #[prost(int32, tag = "2")]
    computation_count: i32,
    /// One entry per partition ("computation"), each listing the device of every replica.
    #[prost(message, repeated, tag = "3")]
    computation_devices: Vec<ComputationDevice>,
}

#[derive(Clone, PartialEq, Message)]
struct ComputationDevice {
    #[prost(int64, repeated, tag = "1")]
    replica_device_ids: Vec<i64>,
}

impl CompileOptions {
    /// Options for a program partitioned over `n` devices with SPMD.
    pub fn spmd(n: u32) -> Self {
        CompileOptions { num_partitions: n, use_spmd_partitioning: true, ..Self::default() }
    }

    /// Options that pin a single-device program to the device with global id `device_id`.
    pub fn on_device(device_id: i64) -> Self {
        CompileOptions { device_assignment: Some(vec![vec![device_id]]), ..Self::default() }
    }

    /// Checks the options; see the field docs for the rules.
    pub fn validate(&self) -> Result<()> {
        if self.num_replicas == 0 || self.num_partitions == 0 {
            return Err(Error::invalid(format!(
                "compile options need num_replicas >= 1 and num_partitions >= 1, got {} and {}",
                self.num_replicas, self.num_partitions
            )));
        }
        if i32::try_from(self.num_replicas).is_err() || i32::try_from(self.num_partitions).is_err() {
            return Err(Error::invalid("num_replicas and num_partitions must fit in i32"));
        }
        if self.num_partitions > 1 && !self.use_spmd_partitioning {
            return Err(Error::invalid(format!(
                "num_partitions = {} requires use_spmd_partitioning = true",
                self.num_partitions
            )));
        }
        if let Some(assignment) = &self.device_assignment {
            let shape_ok = assignment.len() == self.num_replicas as usize
                && assignment.iter().all(|row| row.len() == self.num_partitions as usize);
            if !shape_ok {
                return Err(Error::invalid(format!(
                    "device_assignment must be [num_replicas = {}][num_partitions = {}], got {assignment:?}",
                    self.num_replicas, self.num_partitions
                )));
            }
            let mut ids: Vec<i64> = assignment.iter().flatten().copied().collect();
            ids.sort_unstable();
            if ids.windows(2).any(|w| w[0] == w[1]) || ids.first().is_some_and(|&id| id < 0) {
                return Err(Error::invalid(format!(
                    "device_assignment needs distinct non-negative device ids, got {assignment:?}"
                )));
            }
        }
        Ok(())
    }

    /// The serialized `CompileOptionsProto`.
    pub fn to_proto_bytes(&self) -> Result<Vec<u8>> {
        self.validate()?;
        let device_assignment = self.device_assignment.as_ref().map(|assignment| DeviceAssignmentProto {
            replica_count: self.num_replicas as i32,
            computation_count: self.num_partitions as i32,
            computation_devices: (0..self.num_partitions as usize)
                .map(|p| ComputationDevice { replica_device_ids: assignment.iter().map(|row| row[p]).collect() })
                .collect(),
        });
        let proto = CompileOptionsProto {
            executable_build_options: Some(ExecutableBuildOptionsProto {
                device_ordinal: -1, // unset, as XLA's own default
                num_replicas: i64::from(self.num_replicas),
                num_partitions: i64::from(self.num_partitions),
                use_spmd_partitioning: self.use_spmd_partitioning,
                device_assignment,
            }),
            env_option_overrides: self
                .xla_options
                .iter()
                .map(|(name, v)| {
                    let value = match v {
                        XlaOption::Str(s) => OverrideValue::Str(s.clone()),
                        XlaOption::Bool(b) => OverrideValue::Bool(*b),
                        XlaOption::Int(i) => OverrideValue::Int(*i),
                    };
                    (name.clone(), OptionOverrideProto { value: Some(value) })
                })
                .collect(),
        };
        Ok(proto.encode_to_vec())
    }

    /// [`Self::to_proto_bytes`], also checking the program fits the client's devices (`device_ids`).
    pub(crate) fn to_proto_bytes_for(&self, device_ids: &[i64]) -> Result<Vec<u8>> {
        let bytes = self.to_proto_bytes()?;
        let needed = self.num_replicas as usize * self.num_partitions as usize;
        if needed > device_ids.len() {
            return Err(Error::invalid(format!(
                "the program needs {needed} devices (replicas x partitions), the client has {}",
                device_ids.len()
            )));
        }
        if let Some(unknown) = self.device_assignment.iter().flatten().flatten().find(|id| !device_ids.contains(id)) {
            return Err(Error::invalid(format!(
                "device_assignment names device id {unknown}, the client's devices are {device_ids:?}"
            )));
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_and_validation() {
        let bytes = CompileOptions::default().to_proto_bytes().unwrap();
        // field 3 { field 1 = -1 (varint, 10 bytes), field 4 = 1, field 5 = 1 }
        assert_eq!(&bytes[..2], &[0x1a, 15]);
        assert!(bytes.ends_with(&[0x20, 0x01, 0x28, 0x01]));
        let zero = CompileOptions { num_replicas: 0, ..Default::default() };
        assert!(matches!(zero.to_proto_bytes(), Err(Error::InvalidInput(_))));
        let no_spmd = CompileOptions { num_partitions: 2, ..Default::default() };
        assert!(no_spmd.validate().is_err());
        assert!(CompileOptions::spmd(4).validate().is_ok());
        let bad_shape = CompileOptions { device_assignment: Some(vec![vec![0, 1]]), ..Default::default() };
        assert!(bad_shape.validate().is_err());
        let dup = CompileOptions { device_assignment: Some(vec![vec![0, 0]]), ..CompileOptions::spmd(2) };
        assert!(dup.validate().is_err());
        let ok = CompileOptions { device_assignment: Some(vec![vec![2, 3]]), ..CompileOptions::spmd(2) };
        let decoded = CompileOptionsProto::decode(ok.to_proto_bytes().unwrap().as_slice()).unwrap();
        let da = decoded.executable_build_options.unwrap().device_assignment.unwrap();
        assert_eq!((da.replica_count, da.computation_count), (1, 2));
        assert_eq!(da.computation_devices[1].replica_device_ids, vec![3]);
        assert!(decoded.env_option_overrides.is_empty());
    }

    #[test]
    fn xla_options_encode_as_ordered_overrides() {
        let with = |opts: &[(&str, &str)]| CompileOptions {
            xla_options: opts.iter().map(|(k, v)| (k.to_string(), XlaOption::parse(v))).collect(),
            ..Default::default()
        };
        let a = with(&[("xla_b", "true"), ("xla_a", ""), ("xla_c", "12"), ("xla_a", "FUSION,CUBLAS")]);
        let decoded = CompileOptionsProto::decode(a.to_proto_bytes().unwrap().as_slice()).unwrap();
        let got: Vec<(String, Option<OverrideValue>)> =
            decoded.env_option_overrides.into_iter().map(|(k, v)| (k, v.value)).collect();
        assert_eq!(
            got,
            vec![
                ("xla_a".to_string(), Some(OverrideValue::Str("FUSION,CUBLAS".into()))),
                ("xla_b".to_string(), Some(OverrideValue::Bool(true))),
                ("xla_c".to_string(), Some(OverrideValue::Int(12))),
            ]
        );
        // The same options in another order encode to the same bytes (the compile cache keys on them).
        let b = with(&[("xla_c", "12"), ("xla_a", "FUSION,CUBLAS"), ("xla_b", "true")]);
        assert_eq!(a.to_proto_bytes().unwrap(), b.to_proto_bytes().unwrap());
    }
}

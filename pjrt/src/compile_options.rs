//! `CompileOptions` and its encoding as the `xla.CompileOptionsProto` bytes `PJRT_Client_Compile` takes.
//!
//! Both CPU plugins abort the whole process (`Check failed: replica_count > 0`) when the options lack
//! `num_replicas` or `num_partitions`, so both are always sent and must be ≥ 1.

use prost::Message;

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
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions { num_replicas: 1, num_partitions: 1, use_spmd_partitioning: false, device_assignment: None }
    }
}

// Field numbers from xla/pjrt/proto/compile_options.proto and xla/xla_data.proto.
#[derive(Clone, PartialEq, Message)]
struct CompileOptionsProto {
    #[prost(message, optional, tag = "3")]
    executable_build_options: Option<ExecutableBuildOptionsProto>,
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
    }
}

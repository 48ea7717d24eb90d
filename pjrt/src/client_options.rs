//! Typed `PJRT_Client_Create` options. Only names whose type is known are passed on: a wrongly typed
//! `cpu_device_count` aborts the xla-cpu-pjrt 0.0.1 plugin (std::bad_variant_access), so unknown names
//! and type mismatches are refused here, before the plugin sees them.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ffi::NamedValueIn;
use crate::key_value::{KeyValueStore, SharedStore};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int,
    Bool,
}

/// Create options known to the XLA CPU and GPU plugins, with their types and the smallest allowed
/// integer value.
const KNOWN: &[(&str, Kind, i64)] = &[
    // CPU plugin
    ("cpu_device_count", Kind::Int, 1),
    ("asynchronous", Kind::Bool, 0),
    ("process_id", Kind::Int, 0),
    // CUDA/ROCm plugin
    ("preallocate", Kind::Bool, 0),
    ("node_id", Kind::Int, 0),
    ("num_nodes", Kind::Int, 1),
    ("enable_mock_nccl", Kind::Bool, 0),
    ("should_stage_host_to_device_transfers", Kind::Bool, 0),
    ("collective_memory_size", Kind::Int, 0),
];

/// Options for [`crate::Client::new`]. Validated when the client is created.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClientOptions {
    values: Vec<(String, NamedValueIn)>,
    pub(crate) store: Option<SharedStore>,
}

impl ClientOptions {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of virtual CPU devices in one client (CPU plugins; their default is 4). Must be ≥ 1.
    pub fn cpu_device_count(self, n: i64) -> Self {
        self.int_option("cpu_device_count", n)
    }

    /// The key-value store of a multi-process group, through which the processes' clients exchange what they
    /// need (the CUDA plugin: topology and NCCL ids), given to the plugin as `PJRT_Client_Create`'s callbacks.
    pub fn key_value_store(mut self, store: Arc<dyn KeyValueStore>) -> Self {
        self.store = Some(SharedStore(store));
        self
    }

    pub fn bool_option(self, name: &str, v: bool) -> Self {
        self.set(name, NamedValueIn::Bool(v))
    }

    pub fn int_option(self, name: &str, v: i64) -> Self {
        self.set(name, NamedValueIn::Int64(v))
    }

    fn set(mut self, name: &str, value: NamedValueIn) -> Self {
        self.values.retain(|(n, _)| n != name);
        self.values.push((name.to_string(), value));
        self
    }

    /// Checks names, types and ranges; returns the values for `PJRT_Client_Create`.
    pub(crate) fn validated(&self) -> Result<Vec<(&str, NamedValueIn)>> {
        self.values
            .iter()
            .map(|(name, value)| {
                let Some(&(_, kind, min)) = KNOWN.iter().find(|(n, _, _)| n == name) else {
                    let known: Vec<&str> = KNOWN.iter().map(|(n, _, _)| *n).collect();
                    return Err(Error::invalid(format!(
                        "unknown client option {name:?}; known options: {}",
                        known.join(", ")
                    )));
                };
                match (kind, value) {
                    (Kind::Int, NamedValueIn::Int64(v)) if *v < min => {
                        Err(Error::invalid(format!("client option {name:?} must be >= {min}, got {v}")))
                    }
                    (Kind::Int, NamedValueIn::Int64(_)) | (Kind::Bool, NamedValueIn::Bool(_)) => {
                        Ok((name.as_str(), *value))
                    }
                    (Kind::Int, _) => Err(Error::invalid(format!("client option {name:?} takes an integer"))),
                    (Kind::Bool, _) => Err(Error::invalid(format!("client option {name:?} takes a bool"))),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(ClientOptions::new().cpu_device_count(4).validated().is_ok());
        assert!(ClientOptions::new().cpu_device_count(0).validated().is_err());
        assert!(ClientOptions::new().bool_option("cpu_device_count", true).validated().is_err());
        assert!(ClientOptions::new().int_option("asynchronous", 1).validated().is_err());
        assert!(ClientOptions::new().int_option("no_such_option", 1).validated().is_err());
        let o = ClientOptions::new().cpu_device_count(2).cpu_device_count(3);
        assert_eq!(o.validated().unwrap(), vec![("cpu_device_count", NamedValueIn::Int64(3))]);
    }
}

//! The key-value store a multi-process client exchanges its topology through (`PJRT_Client_Create`'s
//! get, try-get and put callbacks). The C callbacks live in `ffi/key_value.rs` and call this trait.

use std::sync::Arc;
use std::time::Duration;

use crate::error::ErrorCode;

/// A store shared by every process of a group. Implementations must be thread-safe: the plugin calls them
/// from its own threads, and `get` blocks.
pub trait KeyValueStore: Send + Sync {
    /// The value of `key`, waiting up to `timeout` for another process to put it.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KeyValueError>;
    /// The value of `key`, or `None` at once if it is not set.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, KeyValueError>;
    fn put(&self, key: &str, value: &[u8]) -> Result<(), KeyValueError>;
}

/// A store's error, handed to the plugin with its status code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValueError {
    pub code: ErrorCode,
    pub message: String,
}

impl KeyValueError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> KeyValueError {
        KeyValueError { code, message: message.into() }
    }
}

/// A store given to [`crate::ClientOptions::key_value_store`]; options compare equal when they hold the same
/// store.
#[derive(Clone)]
pub(crate) struct SharedStore(pub(crate) Arc<dyn KeyValueStore>);

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyValueStore")
    }
}

impl PartialEq for SharedStore {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

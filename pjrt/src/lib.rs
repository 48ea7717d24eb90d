//! Safe Rust over the PJRT C API: load a plugin, create a client, move buffers, compile StableHLO and
//! run it. All `unsafe` lives in the private `ffi` module.
//!
//! ```no_run
//! use lazuli_pjrt::{provision, Client, ClientOptions, CompileOptions, ElementType, Plugin};
//! # fn main() -> lazuli_pjrt::Result<()> {
//! let plugin = Plugin::load(provision::cpu_plugin_path()?)?;
//! let client = Client::new(&plugin, &ClientOptions::new().cpu_device_count(1))?;
//! let device = &client.devices()[0];
//! let exe = client.compile(
//!     "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {
//!        %0 = stablehlo.add %a, %a : tensor<2xf32>
//!        return %0 : tensor<2xf32>
//!      }",
//!     &CompileOptions::default(),
//! )?;
//! let data: Vec<u8> = [1f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
//! let x = client.buffer_from_host(&data, ElementType::F32, &[2], device)?;
//! let out = exe.execute(&[&x])?;
//! assert_eq!(out[0].to_host()?.len(), 8);
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]

mod buffer;
mod client;
mod client_options;
mod compile_options;
mod element_type;
mod error;
mod executable;
#[allow(unsafe_code)]
mod ffi;
mod key_value;
mod plugin;
mod profiler;
pub mod provision;
mod trace;
mod wait;

pub use buffer::{Buffer, HostCopy};
pub use client::{Client, Device, MemoryStats};
pub use client_options::ClientOptions;
pub use compile_options::{CompileOptions, XlaOption};
pub use element_type::ElementType;
pub use error::{Error, ErrorCode, Result};
pub use executable::{CompiledMemoryStats, Completion, LoadedExecutable};
pub use ffi::on_exit;
pub use key_value::{KeyValueError, KeyValueStore};
pub use plugin::{AttrValue, Plugin};
pub use profiler::Profiler;
pub use trace::{Event, Line, Plane, Trace, TraceError};
pub use wait::{set_spin_before_sleeping, DEFAULT_SPIN};

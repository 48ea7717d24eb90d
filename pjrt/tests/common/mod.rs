//! Shared test helpers: the two CPU plugins, loaded once per test binary, and byte conversions.
#![allow(dead_code)]

use std::sync::OnceLock;

use lazuli_pjrt::provision::{self, CpuPluginKind};
use lazuli_pjrt::{Buffer, Client, ClientOptions, Device, ElementType, Plugin};

/// The default plugin (through `cpu_plugin_path()`, so env choices apply) or the xla-cpu-pjrt one.
#[derive(Clone, Copy, Debug)]
pub enum Which {
    Default,
    XlaCpu,
}

pub fn plugin(which: Which) -> Plugin {
    static DEFAULT: OnceLock<Plugin> = OnceLock::new();
    static XLA_CPU: OnceLock<Plugin> = OnceLock::new();
    let (cell, path) = match which {
        Which::Default => (&DEFAULT, provision::cpu_plugin_path as fn() -> _),
        Which::XlaCpu => (&XLA_CPU, (|| provision::cpu_plugin_path_for(CpuPluginKind::XlaCpu001)) as fn() -> _),
    };
    cell.get_or_init(|| {
        let path = path().unwrap_or_else(|e| panic!("cannot provision the {which:?} plugin: {e}"));
        Plugin::load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()))
    })
    .clone()
}

/// Stamps each listed `fn name(plugin: &Plugin)` as one `#[test]` per CPU plugin.
#[allow(unused_macros)]
macro_rules! per_plugin {
    ($($name:ident),* $(,)?) => {
        mod lammps_jax_0_11_2 {
            $( #[test] fn $name() { super::$name(&crate::common::plugin(crate::common::Which::Default)); } )*
        }
        mod xla_cpu_0_0_1 {
            $( #[test] fn $name() { super::$name(&crate::common::plugin(crate::common::Which::XlaCpu)); } )*
        }
    };
}

pub fn client(plugin: &Plugin, devices: i64) -> Client {
    Client::new(plugin, &ClientOptions::new().cpu_device_count(devices)).expect("client")
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub fn to_i32(bytes: &[u8]) -> Vec<i32> {
    bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub fn f32_buffer(client: &Client, v: &[f32], dims: &[i64], device: &Device) -> Buffer {
    client.buffer_from_host(&f32_bytes(v), ElementType::F32, dims, device).expect("buffer_from_host")
}

pub fn read_f32(buffer: &Buffer) -> Vec<f32> {
    to_f32(&buffer.to_host().expect("to_host"))
}

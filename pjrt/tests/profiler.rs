//! The plugin's profiler. The CPU plugins offer no profiler extension: asking is a plain `Unimplemented`
//! error, never a crash. The CUDA plugin's kernels are read back in `tests/gpu.rs`; decoding is unit-tested
//! in `src/trace.rs` on a hand-encoded `XSpace`.
#[macro_use]
mod common;

use lazuli_pjrt::{Error, ErrorCode, Plugin, Profiler};

fn without_a_profiler_extension_starting_is_a_plain_error(plugin: &Plugin) {
    let err = Profiler::start(plugin).err().expect("the CPU plugins have no profiler extension");
    assert!(
        matches!(&err, Error::Pjrt { code: Some(ErrorCode::Unimplemented), message, .. } if message.contains("no profiler")),
        "{err:?}"
    );
}

per_plugin!(without_a_profiler_extension_starting_is_a_plain_error);

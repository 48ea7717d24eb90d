//! A small module system: modules own named [`Param`]s, expose them in a stable order for optimizers and
//! checkpoints, and switch between training and evaluation mode.

pub mod gpt;
pub mod gpt2;
pub mod init;
pub mod layers;
pub mod load;
pub mod param;
pub mod scanned;

pub use gpt::{Block, CausalSelfAttention, Gpt, GptConfig};
pub use init::HostRng;
pub use layers::{Activation, Conv2d, Dropout, Embedding, LayerNorm, Linear, Mlp};
pub use load::{load_named, LoadReport, Mismatch, Strict};
pub use param::Param;
pub use scanned::ScannedBlocks;

/// Something with parameters. Forward passes are inherent methods (their signatures differ by module).
pub trait Module {
    /// Call `f` with every parameter and its dotted name under `prefix` (`"blocks.0.attn.qkv.weight"`), in a
    /// stable order.
    fn visit_params(&self, prefix: &str, f: &mut dyn FnMut(String, &Param));

    /// Training (dropout active) or evaluation mode, recursively. Modules without mode-dependent behaviour
    /// keep the default.
    fn set_training(&self, _training: bool) {}

    /// All parameters with their names.
    fn named_params(&self) -> Vec<(String, Param)> {
        let mut out = Vec::new();
        self.visit_params("", &mut |name, p| out.push((name, p.clone())));
        out
    }

    /// All parameters.
    fn params(&self) -> Vec<Param> {
        self.named_params().into_iter().map(|(_, p)| p).collect()
    }

    /// Total number of parameter elements.
    fn num_params(&self) -> usize {
        self.params().iter().map(|p| p.get().elements()).sum()
    }

    /// Forget every accumulated gradient.
    fn zero_grad(&self) {
        for p in self.params() {
            p.zero_grad();
        }
    }
}

/// `prefix` + `name`, dotted.
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

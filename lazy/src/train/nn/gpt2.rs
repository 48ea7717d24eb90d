//! Hugging Face GPT-2 weights (`model.safetensors` of `GPT2Model` / `GPT2LMHeadModel`) into a [`Gpt`], and a
//! [`Gpt`] back into that layout.
//!
//! The two layouts differ only in names: GPT-2's `Conv1D` stores its weight `[in, out]`, as lazuli's
//! [`Linear`](super::Linear) does, so nothing is transposed; `c_attn`'s output columns are q, k, v, each head
//! by head, which is the `[3, heads, head_dim]` split `CausalSelfAttention` makes. GELU is the tanh form in
//! both, and layer norm's epsilon 1e-5. Names may carry the `transformer.` prefix (`GPT2LMHeadModel`);
//! `lm_head.weight` is the token embedding (tied) and `attn.bias` / `attn.masked_bias` are the causal mask
//! buffers, so all three are skipped.

use std::collections::BTreeMap;
use std::path::Path;

use lazuli_hlo::Loc;

use super::gpt::{Gpt, GptConfig};
use super::init::HostRng;
use super::load::{load_named, Strict};
use super::Module;
use crate::error::{Error, Result};
use crate::graph::tensor::Tensor;
use crate::train::checkpoint::unstack;

/// lazuli's name within a block, and GPT-2's.
const BLOCK_NAMES: [(&str, &str); 6] = [
    ("ln1.", "ln_1."),
    ("attn.qkv.", "attn.c_attn."),
    ("attn.proj.", "attn.c_proj."),
    ("ln2.", "ln_2."),
    ("fc.", "mlp.c_fc."),
    ("fc_proj.", "mlp.c_proj."),
];

/// A [`Gpt`] of `config`'s sizes holding the GPT-2 weights `tensors` (as [`crate::safetensors::load`] returns
/// them). Every parameter must be given with the config's dtype and shapes (`vocab`, `block_size`, `d_model`,
/// `n_layer`); a missing, unknown or mismatched name is an error listing them all. With
/// `GptConfig::scan_blocks` the layers are stacked.
#[track_caller]
pub fn from_hf(tensors: &[(String, Tensor)], config: GptConfig) -> Result<Gpt> {
    let renamed: Vec<(String, Tensor)> =
        tensors.iter().filter_map(|(n, t)| lazuli_name(n).map(|n| (n, t.clone()))).collect();
    // The initial values are replaced at once; drawing them is the simplest way to build the modules.
    let model = Gpt::new(&mut HostRng::new(0), config);
    load_named(&model, &renamed, Strict::Yes).map_err(|e| match e {
        Error::Weights(msg) => Error::Weights(format!("GPT-2 weights into a Gpt (by lazuli's names): {msg}")),
        other => other,
    })?;
    Ok(model)
}

/// The [`GptConfig`] of the GPT-2 weights `tensors`: vocabulary and positions from `wte` and `wpe`, width,
/// depth (the highest `h.N.` + 1) and dtype from the same tensors; the heads, which no shape records, are
/// `n_head` (12 for GPT-2 small). Dropout 0, blocks unrolled: set those fields after, as the run wants.
#[track_caller]
pub fn config_of(tensors: &[(String, Tensor)], n_head: usize) -> Result<GptConfig> {
    let find =
        |name: &str| tensors.iter().find(|(n, _)| n.strip_prefix("transformer.").unwrap_or(n) == name).map(|(_, t)| t);
    let matrix = |name: &str| match find(name) {
        Some(t) if t.dims().len() == 2 => Ok(t),
        Some(t) => Err(Error::Weights(format!("GPT-2 weights: {name} is {}, not a matrix", t.tensor_type()))),
        None => Err(Error::Weights(format!("GPT-2 weights: no {name} among {} tensors", tensors.len()))),
    };
    let (wte, wpe) = (matrix("wte.weight")?, matrix("wpe.weight")?);
    let layers = tensors
        .iter()
        .filter_map(|(n, _)| n.strip_prefix("transformer.").unwrap_or(n).strip_prefix("h.")?.split_once('.'))
        .filter_map(|(layer, _)| layer.parse::<usize>().ok())
        .max()
        .map_or(0, |last| last + 1);
    let d_model = wte.dims()[1];
    if n_head == 0 || d_model % n_head != 0 || wpe.dims()[1] != d_model {
        return Err(Error::Weights(format!(
            "GPT-2 weights: width {d_model} (wte {:?}, wpe {:?}) does not split into {n_head} heads",
            wte.dims(),
            wpe.dims()
        )));
    }
    Ok(GptConfig {
        vocab: wte.dims()[0],
        block_size: wpe.dims()[0],
        n_layer: layers,
        n_head,
        d_model,
        dropout: 0.0,
        dtype: wte.dtype(),
        scan_blocks: false,
        checkpoint_blocks: false,
    })
}

/// [`from_hf`] of the safetensors file at `path`.
#[track_caller]
pub fn load_hf(path: impl AsRef<Path>, config: GptConfig) -> Result<Gpt> {
    let tensors = crate::train::safetensors::load(path)?;
    from_hf(&tensors, config)
}

/// `model`'s parameters under GPT-2's names (`GPT2Model`'s, without prefix), one tensor per layer.
pub fn to_hf(model: &Gpt) -> Vec<(String, Tensor)> {
    let named = model.named_params().into_iter().map(|(n, p)| (n, p.get())).collect();
    unstack(named).into_iter().map(|(n, t)| (hf_name(&n), t)).collect()
}

/// Write `model` to `path` in GPT-2's layout, with `format: pt` metadata as Hugging Face's loaders expect.
#[track_caller]
pub fn save_hf(path: impl AsRef<Path>, model: &Gpt) -> Result<()> {
    let named = to_hf(model);
    let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    crate::train::safetensors::save_at(path.as_ref(), &refs, &meta, Loc::caller())
}

/// lazuli's name of a GPT-2 tensor; `None` for the ones a [`Gpt`] does not hold (tied head, mask buffers).
/// Names GPT-2 does not have are kept, so that loading reports them as unexpected.
fn lazuli_name(hf: &str) -> Option<String> {
    let name = hf.strip_prefix("transformer.").unwrap_or(hf);
    if name == "lm_head.weight" || name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") {
        return None;
    }
    let Some(rest) = name.strip_prefix("h.") else { return Some(name.to_string()) };
    let Some((layer, inner)) = rest.split_once('.') else { return Some(name.to_string()) };
    let ours = BLOCK_NAMES.iter().find_map(|(l, h)| inner.strip_prefix(h).map(|p| format!("blocks.{layer}.{l}{p}")));
    Some(ours.unwrap_or_else(|| name.to_string()))
}

/// GPT-2's name of a lazuli parameter of an unrolled [`Gpt`].
fn hf_name(ours: &str) -> String {
    let Some(rest) = ours.strip_prefix("blocks.") else { return ours.to_string() };
    let Some((layer, inner)) = rest.split_once('.') else { return ours.to_string() };
    let theirs = BLOCK_NAMES.iter().find_map(|(l, h)| inner.strip_prefix(l).map(|p| format!("{h}{p}")));
    format!("h.{layer}.{}", theirs.unwrap_or_else(|| inner.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways() {
        for (hf, ours) in [
            ("wte.weight", "wte.weight"),
            ("h.3.attn.c_attn.bias", "blocks.3.attn.qkv.bias"),
            ("h.0.mlp.c_proj.weight", "blocks.0.fc_proj.weight"),
            ("h.11.ln_2.weight", "blocks.11.ln2.weight"),
            ("ln_f.bias", "ln_f.bias"),
        ] {
            assert_eq!(lazuli_name(hf).as_deref(), Some(ours));
            assert_eq!(lazuli_name(&format!("transformer.{hf}")).as_deref(), Some(ours));
            assert_eq!(hf_name(ours), hf);
        }
        assert_eq!(lazuli_name("lm_head.weight"), None);
        assert_eq!(lazuli_name("transformer.h.0.attn.masked_bias"), None);
        assert_eq!(lazuli_name("h.0.attn.bias"), None);
        assert_eq!(lazuli_name("h.0.mlp.gate.weight").as_deref(), Some("h.0.mlp.gate.weight"));
    }
}

//! Checkpoints as safetensors files: parameters, optimizer state and metadata.
//!
//! Saving materializes what it saves (in one program), stores a sha256 of every tensor's bytes and of the
//! metadata in the file (`integrity.rs` says why sha256 and what it costs), and writes atomically: a temp file
//! `<target>.lazuli-tmp-<pid>-<n>` next to the target, fsync, rename (`files.rs`). A save interrupted by SIGINT
//! or SIGTERM removes its temp file before the process dies of the signal (`signals.rs`); one killed outright
//! (SIGKILL, a crash) leaves it, and the next save of the same target removes it. Loading checks the checksums,
//! then every name, dtype and shape, before changing anything, so a bad file leaves the model as it was. Errors
//! name the file and the line that called [`save`] or [`load`].
//!
//! Formats: files are written as `lazuli-checkpoint-2`, which must carry all its checksums. Files of the
//! earlier `lazuli-checkpoint-1` (written before checksums existed) still load, unverified, with a warning;
//! saving again writes them with checksums. The marker changed with the checksums so that a current file
//! stripped of them is refused rather than loaded unverified; a marker newer than these is refused too.

pub(crate) mod files;
mod integrity;
mod signals;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::path::Path;
use std::sync::Arc;

use lazuli_hlo::{DType, Loc, TensorType};
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::graph::tensor::Tensor;
use crate::train::nn::Module;
use crate::train::optim::Optimizer;

/// Format marker written in the file's metadata.
const FORMAT: &str = "lazuli-checkpoint-2";
/// The format before checksums: loaded without verification.
const FORMAT_UNCHECKED: &str = "lazuli-checkpoint-1";
/// safetensors refuses to read headers longer than this.
pub(crate) const MAX_HEADER: usize = 100_000_000;

/// Everything a checkpoint holds besides tensors: the optimizer's step count and free-form user entries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointMeta {
    /// The optimizer's step count when the checkpoint was saved.
    pub optimizer_steps: u64,
    /// The free-form entries the caller saved with it.
    pub user: BTreeMap<String, String>,
}

/// A save or load in progress: its errors name the file and the user's line.
pub(crate) struct Call<'a> {
    pub doing: &'static str,
    pub path: &'a Path,
    pub at: Loc,
    /// The error kind: `Error::Checkpoint` here, `Error::Weights` for plain safetensors files.
    pub kind: fn(String) -> Error,
}

impl Call<'_> {
    pub fn err(&self, msg: impl Display) -> Error {
        (self.kind)(format!("{} {} (at {}): {msg}", self.doing, self.path.display(), self.at))
    }
}

/// Write `model`'s parameters (`model.<name>`), `optimizer`'s state (`optim.<name>`), `extra` tensors (`extra.<name>`,
/// e.g. the random generator's state) and `user` metadata to `path`, with checksums, atomically.
#[track_caller]
pub fn save(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    extra: &[(&str, Tensor)],
    user: &BTreeMap<String, String>,
) -> Result<()> {
    let call = Call { doing: "saving", path: path.as_ref(), at: Loc::caller(), kind: Error::Checkpoint };
    let _span = tracing::info_span!(target: "lazuli", "checkpoint_save", path = %call.path.display()).entered();
    let mut named: Vec<(String, Tensor)> =
        model.named_params().into_iter().map(|(n, p)| (format!("model.{n}"), p.get())).collect();
    if let Some(opt) = optimizer {
        named.extend(opt.state().into_iter().map(|(n, t)| (format!("optim.{n}"), t)));
    }
    named.extend(extra.iter().map(|(n, t)| (format!("extra.{n}"), t.clone())));
    let blobs = read_all(unstack(named), call.at)?;

    let mut meta: HashMap<String, String> = user.iter().map(|(k, v)| (format!("user.{k}"), v.clone())).collect();
    meta.insert("format".into(), FORMAT.into());
    let steps = optimizer.map(|o| o.steps_applied()).transpose()?.unwrap_or(0);
    meta.insert("optimizer_steps".into(), steps.to_string());
    integrity::seal(&blobs.iter().map(Blob::described).collect::<Vec<_>>(), &mut meta);
    let header = header(&blobs, Some(meta)).map_err(|e| call.err(e))?;
    let parts: Vec<&[u8]> = blobs.iter().map(|b| b.bytes.as_slice()).collect();
    files::write_atomically(call.path, &header, &parts).map_err(|e| call.err(e))
}

/// A tensor read back for saving.
pub(crate) struct Blob {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    pub bytes: Arc<Vec<u8>>,
}

impl Blob {
    fn described(&self) -> integrity::Described<'_> {
        integrity::Described { name: &self.name, dtype: self.dtype, shape: &self.shape, bytes: &self.bytes }
    }
}

/// Compute whatever is still pending in one program, then read each tensor once, in file order
/// (safetensors' own: larger dtypes first, then by name).
pub(crate) fn read_all(named: Vec<(String, Tensor)>, at: Loc) -> Result<Vec<Blob>> {
    let nodes: Vec<_> = named.iter().map(|(_, t)| t.node.clone()).collect();
    crate::exec::materialize(&nodes, crate::Cause::Checkpoint, at)?;
    let mut blobs = Vec::with_capacity(named.len());
    for (name, t) in named {
        blobs.push(Blob { dtype: st_dtype(t.dtype()), shape: t.dims().to_vec(), bytes: t.raw_bytes(at)?, name });
    }
    blobs.sort_by(|a, b| b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name)));
    Ok(blobs)
}

/// The file's header for `blobs` (in file order) and `meta`: length (u64, little-endian), then JSON padded with
/// spaces to a multiple of 8 bytes, as safetensors writes it.
pub(crate) fn header(blobs: &[Blob], meta: Option<HashMap<String, String>>) -> std::result::Result<Vec<u8>, String> {
    let mut offset = 0;
    let mut infos = Vec::with_capacity(blobs.len());
    for b in blobs {
        let end = offset + b.bytes.len();
        infos
            .push((b.name.clone(), TensorInfo { dtype: b.dtype, shape: b.shape.clone(), data_offsets: (offset, end) }));
        offset = end;
    }
    let layout = Metadata::new(meta, infos).map_err(|e| format!("{e}"))?;
    let mut json = serde_json::to_vec(&layout).map_err(|e| format!("{e}"))?;
    json.resize(json.len().next_multiple_of(8), b' ');
    if json.len() > MAX_HEADER {
        return Err(format!("the header would be {} bytes, more than safetensors reads ({MAX_HEADER})", json.len()));
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    Ok(out)
}

pub(crate) fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
        DType::U32 => Dtype::U32,
        DType::U64 => Dtype::U64,
    }
}

fn from_st_dtype(d: Dtype) -> Option<DType> {
    DType::ALL.into_iter().find(|&x| st_dtype(x) == d)
}

/// Load a checkpoint written by [`save`] into `model` (and `optimizer`), returning the extra tensors by name and
/// the metadata. The checksums are verified, then every name, dtype and shape is checked: on any mismatch
/// nothing is changed. Files of the format before checksums (`lazuli-checkpoint-1`) load without verification.
#[track_caller]
pub fn load(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&mut dyn Optimizer>,
) -> Result<(HashMap<String, Tensor>, CheckpointMeta)> {
    let call = Call { doing: "loading", path: path.as_ref(), at: Loc::caller(), kind: Error::Checkpoint };
    let data = std::fs::read(call.path).map_err(|e| call.err(format!("reading failed: {e}")))?;
    let st = SafeTensors::deserialize(&data)
        .map_err(|e| call.err(format!("not a valid safetensors file ({e}); is it truncated?")))?;
    let (_, header) = SafeTensors::read_metadata(&data).map_err(|e| call.err(e))?;
    let meta = header.metadata().clone().unwrap_or_default();
    check_format(&call, &meta, &st)?;
    let optimizer_steps = meta
        .get("optimizer_steps")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| call.err("the metadata has no optimizer_steps"))?;
    let user = meta.iter().filter_map(|(k, v)| k.strip_prefix("user.").map(|k| (k.to_string(), v.clone()))).collect();

    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = from_st_dtype(view.dtype())
            .ok_or_else(|| call.err(format!("tensor {name:?}: dtype {:?} is not supported", view.dtype())))?;
        let ty = TensorType::new(dtype, view.shape());
        tensors.insert(name, Tensor::host(ty, view.data().to_vec(), call.at));
    }
    let mut stacked: Vec<(String, TensorType)> =
        model.named_params().into_iter().map(|(n, p)| (format!("model.{n}"), p.get().tensor_type().clone())).collect();
    if let Some(opt) = optimizer.as_deref() {
        stacked.extend(opt.state().into_iter().map(|(n, t)| (format!("optim.{n}"), t.tensor_type().clone())));
    }
    for (name, ty) in &stacked {
        restack(&mut tensors, name, ty).map_err(|e| call.err(e))?;
    }
    let optim_state: HashMap<String, Tensor> =
        tensors.iter().filter_map(|(k, t)| k.strip_prefix("optim.").map(|k| (k.to_string(), t.clone()))).collect();
    check_fit(&call, &tensors, model, optimizer.as_deref(), &optim_state)?;

    // All checked: apply.
    for (name, p) in model.named_params() {
        p.set(tensors[&format!("model.{name}")].clone());
    }
    if let Some(opt) = optimizer {
        opt.load_state(&optim_state, optimizer_steps).map_err(|e| match e {
            Error::Checkpoint(msg) => call.err(msg),
            other => other,
        })?;
    }
    let extra =
        tensors.iter().filter_map(|(k, t)| k.strip_prefix("extra.").map(|k| (k.to_string(), t.clone()))).collect();
    Ok((extra, CheckpointMeta { optimizer_steps, user }))
}

/// The format marker, and for the current format the checksums.
fn check_format(call: &Call<'_>, meta: &HashMap<String, String>, st: &SafeTensors<'_>) -> Result<()> {
    match meta.get("format").map(String::as_str) {
        Some(FORMAT) => integrity::verify(meta, st).map_err(|e| call.err(format!("{e}; the file is corrupt"))),
        Some(FORMAT_UNCHECKED) => {
            tracing::warn!(
                "checkpoint {} predates checksums ({FORMAT_UNCHECKED}): loaded without verifying its contents; \
                 saving it again adds them",
                call.path.display()
            );
            Ok(())
        }
        Some(other) if other.starts_with("lazuli-checkpoint-") => Err(call.err(format!(
            "its format {other:?} is unknown to this lazuli, which reads {FORMAT} and {FORMAT_UNCHECKED}; \
             was it written by a newer version?"
        ))),
        _ => Err(call.err("not written by lazuli's checkpoint::save")),
    }
}

/// Every parameter of `model` and all of `optimizer`'s state are in the file with the same dtypes and shapes,
/// and the file has no parameters the model lacks.
fn check_fit(
    call: &Call<'_>,
    tensors: &HashMap<String, Tensor>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    optim_state: &HashMap<String, Tensor>,
) -> Result<()> {
    let mut expected: Vec<String> = Vec::new();
    for (name, p) in model.named_params() {
        let key = format!("model.{name}");
        let t = tensors.get(&key).ok_or_else(|| call.err(format!("parameter {name:?} is missing")))?;
        let want = p.get();
        if t.tensor_type() != want.tensor_type() {
            return Err(call.err(format!(
                "parameter {name:?} is {} in the file, {} in the model",
                t.tensor_type(),
                want.tensor_type()
            )));
        }
        expected.push(key);
    }
    for (name, t) in optimizer.map(|o| o.state()).unwrap_or_default() {
        let got = optim_state.get(&name).ok_or_else(|| call.err(format!("optimizer state {name:?} is missing")))?;
        if got.tensor_type() != t.tensor_type() {
            return Err(call.err(format!(
                "optimizer state {name:?} is {} in the file, {} in the optimizer",
                got.tensor_type(),
                t.tensor_type()
            )));
        }
    }
    let mut unknown: Vec<&String> =
        tensors.keys().filter(|k| k.starts_with("model.") && !expected.contains(k)).collect();
    unknown.sort_unstable();
    if !unknown.is_empty() {
        return Err(call.err(format!("the model has no parameters named {unknown:?}")));
    }
    Ok(())
}

/// The `*` segment of a stacked parameter's name (`blocks.*.ln1.weight`, `nn::ScannedBlocks`), as layer `i`.
pub(crate) fn layer_name(name: &str, i: usize) -> Option<String> {
    let star = crate::train::nn::scanned::STACKED;
    let parts: Vec<&str> = name.split('.').collect();
    parts.contains(&star).then(|| {
        let layer = i.to_string();
        parts.iter().map(|p| if *p == star { layer.as_str() } else { p }).collect::<Vec<&str>>().join(".")
    })
}

/// Stacked tensors (names with a `*` segment) as one tensor per layer, under the unrolled model's names.
pub(crate) fn unstack(named: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    let mut out = Vec::with_capacity(named.len());
    for (name, t) in named {
        if layer_name(&name, 0).is_none() || t.rank() == 0 {
            out.push((name, t));
            continue;
        }
        let per_layer: Vec<isize> = t.dims()[1..].iter().map(|&d| d as isize).collect();
        for i in 0..t.dims()[0] {
            let layer = crate::graph::autodiff::no_grad(|| t.narrow(0, i, 1).reshape(&per_layer));
            out.push((layer_name(&name, i).expect("a stacked name"), layer));
        }
    }
    out
}

/// Where `name` is stacked and the file holds it per layer (a checkpoint of the unrolled model, or of a scanned
/// one), replace those layers in `tensors` with their stack under `name`.
fn restack(tensors: &mut HashMap<String, Tensor>, name: &str, ty: &TensorType) -> std::result::Result<(), String> {
    if layer_name(name, 0).is_none() || ty.rank() == 0 || tensors.contains_key(name) {
        return Ok(());
    }
    let layer_ty = TensorType::new(ty.dtype, &ty.dims[1..]);
    let mut layers = Vec::with_capacity(ty.dims[0]);
    for i in 0..ty.dims[0] {
        let key = layer_name(name, i).expect("a stacked name");
        let t = tensors.get(&key).ok_or_else(|| format!("{key:?} is missing"))?;
        if *t.tensor_type() != layer_ty {
            return Err(format!("{key:?} is {} in the file, {layer_ty} in the model", t.tensor_type()));
        }
        layers.push(t.clone());
    }
    for i in 0..ty.dims[0] {
        tensors.remove(&layer_name(name, i).expect("a stacked name"));
    }
    let refs: Vec<&Tensor> = layers.iter().collect();
    // Every layer has the same checked type, so the stack fits.
    tensors.insert(name.to_string(), crate::graph::autodiff::no_grad(|| Tensor::stack(&refs, 0)));
    Ok(())
}

//! Checkpoints as safetensors files: parameters, optimizer state and metadata. Saving materializes what it
//! saves (in one program) and writes atomically (temp file, fsync, rename); loading verifies names, dtypes and
//! shapes of everything before changing anything, so a bad file leaves the model as it was.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use lazuli_hlo::{DType, Loc, TensorType};
use safetensors::{tensor::TensorView, Dtype, SafeTensors};

use crate::error::{Error, Result};
use crate::nn::Module;
use crate::optim::Optimizer;
use crate::tensor::Tensor;

/// Format marker stored in the file's metadata.
const FORMAT: &str = "lazuli-checkpoint-1";

fn st_dtype(d: DType) -> Dtype {
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

fn err(msg: impl Into<String>) -> Error {
    Error::Checkpoint(msg.into())
}

/// Everything a checkpoint holds besides tensors: the optimizer's step count and free-form user entries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckpointMeta {
    pub optimizer_steps: u64,
    pub user: BTreeMap<String, String>,
}

/// Write `model`'s parameters (`model.<name>`), `optimizer`'s state (`optim.<name>`), `extra` tensors (`extra.<name>`,
/// e.g. the random generator's state) and `user` metadata to `path`.
#[track_caller]
pub fn save(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    extra: &[(&str, Tensor)],
    user: &BTreeMap<String, String>,
) -> Result<()> {
    let at = Loc::caller();
    let path = path.as_ref();
    let mut named: Vec<(String, Tensor)> =
        model.named_params().into_iter().map(|(n, p)| (format!("model.{n}"), p.get())).collect();
    if let Some(opt) = optimizer {
        named.extend(opt.state().into_iter().map(|(n, t)| (format!("optim.{n}"), t)));
    }
    named.extend(extra.iter().map(|(n, t)| (format!("extra.{n}"), t.clone())));
    // One program computes whatever is still pending, then each tensor is read once.
    let nodes: Vec<_> = named.iter().map(|(_, t)| t.node.clone()).collect();
    crate::materialize::materialize(&nodes, crate::Cause::Checkpoint, at)?;
    let mut bytes = Vec::with_capacity(named.len());
    for (name, t) in &named {
        bytes.push((name.clone(), t.clone(), t.raw_bytes(at)?));
    }
    let views = bytes
        .iter()
        .map(|(n, t, b)| Ok((n.clone(), TensorView::new(st_dtype(t.dtype()), t.dims().to_vec(), b)?)))
        .collect::<std::result::Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| err(format!("{e}")))?;
    let mut meta: HashMap<String, String> = user.iter().map(|(k, v)| (format!("user.{k}"), v.clone())).collect();
    meta.insert("format".into(), FORMAT.into());
    meta.insert("optimizer_steps".into(), optimizer.map(|o| o.steps()).unwrap_or(0).to_string());
    let data = safetensors::serialize(views, Some(meta)).map_err(|e| err(format!("{e}")))?;
    write_atomically(path, &data).map_err(|e| err(format!("writing {}: {e}", path.display())))
}

/// Temp file in the same directory, fsync, rename: a crash leaves either the old file or the new one.
fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Load a checkpoint written by [`save`] into `model` (and `optimizer`), returning the extra tensors by name and
/// the metadata. Every name, dtype and shape is checked first: on any mismatch nothing is changed.
#[track_caller]
pub fn load(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&mut dyn Optimizer>,
) -> Result<(HashMap<String, Tensor>, CheckpointMeta)> {
    let at = Loc::caller();
    let path = path.as_ref();
    let data = std::fs::read(path).map_err(|e| err(format!("reading {}: {e}", path.display())))?;
    let st = SafeTensors::deserialize(&data)
        .map_err(|e| err(format!("{} is not a valid safetensors file ({e}); is it truncated?", path.display())))?;
    let (_, header) = SafeTensors::read_metadata(&data).map_err(|e| err(format!("{e}")))?;
    let meta = header.metadata().clone().unwrap_or_default();
    if meta.get("format").map(String::as_str) != Some(FORMAT) {
        return Err(err(format!("{} was not written by lazuli's checkpoint::save", path.display())));
    }
    let optimizer_steps = meta
        .get("optimizer_steps")
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| err(format!("{}: missing optimizer_steps", path.display())))?;
    let user = meta.iter().filter_map(|(k, v)| k.strip_prefix("user.").map(|k| (k.to_string(), v.clone()))).collect();

    // Read and check every tensor before touching the model.
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = from_st_dtype(view.dtype())
            .ok_or_else(|| err(format!("{name}: dtype {:?} is not supported", view.dtype())))?;
        let ty = TensorType::new(dtype, view.shape());
        tensors.insert(name, Tensor::host(ty, view.data().to_vec(), at));
    }
    let params = model.named_params();
    let mut expected: Vec<String> = Vec::new();
    for (name, p) in &params {
        let key = format!("model.{name}");
        let t = tensors.get(&key).ok_or_else(|| err(format!("{}: parameter {name:?} is missing", path.display())))?;
        let want = p.get();
        if t.tensor_type() != want.tensor_type() {
            return Err(err(format!(
                "{}: parameter {name:?} is {} in the file, {} in the model",
                path.display(),
                t.tensor_type(),
                want.tensor_type()
            )));
        }
        expected.push(key);
    }
    let optim_state: HashMap<String, Tensor> =
        tensors.iter().filter_map(|(k, t)| k.strip_prefix("optim.").map(|k| (k.to_string(), t.clone()))).collect();
    if let Some(opt) = &optimizer {
        for (name, t) in opt.state() {
            let got = optim_state
                .get(&name)
                .ok_or_else(|| err(format!("{}: optimizer state {name:?} is missing", path.display())))?;
            if got.tensor_type() != t.tensor_type() {
                return Err(err(format!(
                    "{}: optimizer state {name:?} is {} in the file, {} in the optimizer",
                    path.display(),
                    got.tensor_type(),
                    t.tensor_type()
                )));
            }
        }
    }
    let unknown: Vec<&String> = tensors.keys().filter(|k| k.starts_with("model.") && !expected.contains(k)).collect();
    if !unknown.is_empty() {
        return Err(err(format!("{}: the model has no parameters named {unknown:?}", path.display())));
    }

    // All checked: apply.
    for (name, p) in &params {
        p.set(tensors[&format!("model.{name}")].clone());
    }
    if let Some(opt) = optimizer {
        opt.load_state(&optim_state, optimizer_steps)?;
    }
    let extra =
        tensors.iter().filter_map(|(k, t)| k.strip_prefix("extra.").map(|k| (k.to_string(), t.clone()))).collect();
    Ok((extra, CheckpointMeta { optimizer_steps, user }))
}

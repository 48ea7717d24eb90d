//! Any safetensors file as named tensors, and named tensors as a standard safetensors file: weights from other
//! frameworks (a Hugging Face `model.safetensors`), or for them. lazuli's own checkpoints (`checkpoint`) are such
//! files with checksums and a format marker; this module reads and writes plain ones and checks only what the
//! format itself promises.
//!
//! Loading reads the header, checks every entry (dtype, shape, offsets inside the file, sizes) before reading any
//! data, then reads each tensor's bytes straight from its offset into the tensor's own buffer: the file is never
//! held in memory whole, so the peak is the tensors themselves. (A memory map would save nothing more, since each
//! tensor owns its bytes, and would need code outside Rust's safety checks, which this crate forbids, and turn a file truncated under it
//! into SIGBUS.) Saving writes atomically, as checkpoints do.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use lazuli_hlo::{DType, Loc, TensorType};
use serde::Deserialize;

use super::checkpoint::{files, header, read_all, st_dtype, Call, MAX_HEADER};
use crate::error::{Error, Result};
use crate::graph::tensor::Tensor;

/// Tensors by name, in the order their bytes lie in the file, with the file's free-form metadata.
#[derive(Clone, Default)]
pub struct NamedTensors {
    tensors: Vec<(String, Tensor)>,
    index: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
}

impl NamedTensors {
    /// `tensors` in this order, without metadata. A repeated name keeps its first tensor for [`Self::get`].
    pub fn new(tensors: Vec<(String, Tensor)>) -> NamedTensors {
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, (name, _)) in tensors.iter().enumerate() {
            index.entry(name.clone()).or_insert(i);
        }
        NamedTensors { tensors, index, metadata: BTreeMap::new() }
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.index.get(name).map(|&i| &self.tensors[i].1)
    }

    /// The names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|(n, _)| n.as_str())
    }

    /// The file's `__metadata__` entries (empty if it had none).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The pairs, in order.
    pub fn into_vec(self) -> Vec<(String, Tensor)> {
        self.tensors
    }
}

impl std::ops::Deref for NamedTensors {
    type Target = [(String, Tensor)];
    fn deref(&self) -> &Self::Target {
        &self.tensors
    }
}

impl FromIterator<(String, Tensor)> for NamedTensors {
    fn from_iter<I: IntoIterator<Item = (String, Tensor)>>(iter: I) -> Self {
        NamedTensors::new(iter.into_iter().collect())
    }
}

impl std::fmt::Debug for NamedTensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.tensors.iter().map(|(n, t)| (n, t.tensor_type().to_string()))).finish()
    }
}

/// One header entry as the format spells it.
#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (usize, usize),
}

/// A checked header entry: where its bytes lie in the data section.
struct Located {
    name: String,
    ty: TensorType,
    start: usize,
    end: usize,
}

/// Every tensor of the safetensors file at `path`, in file order, with its metadata. Any file in the format
/// loads, whichever framework wrote it, if its dtypes are lazuli's (F32, F64, F16, BF16, I32, I64, U8, U32,
/// U64, BOOL); an error names the file, the caller's line and what is wrong (the tensor, for a bad entry).
#[track_caller]
pub fn load(path: impl AsRef<Path>) -> Result<NamedTensors> {
    let call = Call { doing: "loading", path: path.as_ref(), at: Loc::caller(), kind: Error::Weights };
    let mut file = File::open(call.path).map_err(|e| call.err(format!("opening failed: {e}")))?;
    let len = file.metadata().map_err(|e| call.err(format!("reading its size failed: {e}")))?.len();
    let json = read_header(&mut file, len).map_err(|e| call.err(e))?;
    let data_len = len - 8 - json.len() as u64;
    let (entries, metadata) = parse_header(&json, data_len).map_err(|e| call.err(e))?;
    let mut tensors = Vec::with_capacity(entries.len());
    for e in entries {
        let bytes = read_at(&mut file, 8 + json.len() as u64 + e.start as u64, e.end - e.start)
            .map_err(|err| call.err(format!("tensor {:?}: reading its bytes failed: {err}", e.name)))?;
        check_bools(&e, &bytes).map_err(|err| call.err(err))?;
        tensors.push((e.name, Tensor::host(e.ty, bytes, call.at)));
    }
    let mut named = NamedTensors::new(tensors);
    named.metadata = metadata;
    Ok(named)
}

/// The header's JSON: its length (u64, little-endian) then that many bytes, inside a file of `len` bytes.
fn read_header(file: &mut File, len: u64) -> std::result::Result<Vec<u8>, String> {
    let truncated = || format!("it is {len} bytes, too short for a safetensors header; is it truncated?");
    if len < 8 {
        return Err(truncated());
    }
    let mut n = [0u8; 8];
    file.read_exact(&mut n).map_err(|e| format!("reading the header failed: {e}"))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER as u64 {
        return Err(format!(
            "its header claims {n} bytes, more than safetensors allows ({MAX_HEADER}): not a \
                            safetensors file, or a corrupt one"
        ));
    }
    if 8 + n > len {
        return Err(format!(
            "its header claims {n} bytes but the file has {} after the length; is it truncated?",
            len - 8
        ));
    }
    let mut json = vec![0u8; n as usize];
    file.read_exact(&mut json).map_err(|e| format!("reading the header failed: {e}"))?;
    Ok(json)
}

/// Every entry of the header checked against lazuli's dtypes and a data section of `data_len` bytes, ordered
/// by offset; and the metadata.
fn parse_header(json: &[u8], data_len: u64) -> std::result::Result<(Vec<Located>, BTreeMap<String, String>), String> {
    let top: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(json).map_err(|e| format!("its header is not valid JSON ({e}): the file is corrupt"))?;
    let mut metadata = BTreeMap::new();
    let mut entries = Vec::with_capacity(top.len());
    for (name, value) in top {
        if name == "__metadata__" {
            metadata =
                serde_json::from_value(value).map_err(|e| format!("its __metadata__ is not a map of strings ({e})"))?;
            continue;
        }
        let entry: Entry = serde_json::from_value(value)
            .map_err(|e| format!("tensor {name:?}: its header entry is malformed ({e})"))?;
        entries.push(locate(name, entry, data_len)?);
    }
    entries.sort_by_key(|e| (e.start, e.end));
    if let Some(w) = entries.windows(2).find(|w| w[1].start < w[0].end) {
        return Err(format!("tensors {:?} and {:?} overlap in the file: the header is corrupt", w[0].name, w[1].name));
    }
    Ok((entries, metadata))
}

/// One entry's dtype, and its offsets inside the data and matching its shape.
fn locate(name: String, e: Entry, data_len: u64) -> std::result::Result<Located, String> {
    let dtype = dtype_named(&e.dtype).ok_or_else(|| {
        let known: Vec<String> = DType::ALL.iter().map(|&d| format!("{:?}", st_dtype(d))).collect();
        format!("tensor {name:?}: dtype {} is not one lazuli has ({})", e.dtype, known.join(", "))
    })?;
    let (start, end) = e.data_offsets;
    if start > end || end as u64 > data_len {
        return Err(format!(
            "tensor {name:?}: its bytes {start}..{end} lie outside the file's {data_len} bytes of data; is it \
             truncated?"
        ));
    }
    let bytes = e.shape.iter().try_fold(dtype.byte_size(), |n, &d| n.checked_mul(d));
    if bytes != Some(end - start) {
        return Err(format!(
            "tensor {name:?}: {} {:?} needs {} bytes but its offsets {start}..{end} hold {}: the header is corrupt",
            e.dtype,
            e.shape,
            bytes.map_or("more than usize".to_string(), |b| b.to_string()),
            end - start
        ));
    }
    Ok(Located { name, ty: TensorType::new(dtype, &e.shape), start, end })
}

/// lazuli's dtype of a safetensors dtype name.
fn dtype_named(name: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|&d| format!("{:?}", st_dtype(d)) == name)
}

fn read_at(file: &mut File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(offset))?;
    let mut bytes = vec![0u8; len];
    file.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// A bool is one byte, 0 or 1; any other byte would be a value XLA's PRED does not have.
fn check_bools(e: &Located, bytes: &[u8]) -> std::result::Result<(), String> {
    if e.ty.dtype != DType::Bool {
        return Ok(());
    }
    match bytes.iter().position(|&b| b > 1) {
        Some(i) => Err(format!("tensor {:?}: element {i} is byte {}, not a bool (0 or 1)", e.name, bytes[i])),
        None => Ok(()),
    }
}

/// Write `tensors` to `path` as a standard safetensors file, atomically (a temp file renamed over the target).
/// Pending tensors are computed in one program first.
#[track_caller]
pub fn save(path: impl AsRef<Path>, tensors: &[(&str, &Tensor)]) -> Result<()> {
    save_at(path.as_ref(), tensors, &BTreeMap::new(), Loc::caller())
}

/// [`save`] with `metadata` in the file's `__metadata__` (Hugging Face's loaders want `format: pt`).
#[track_caller]
pub fn save_with_metadata(
    path: impl AsRef<Path>,
    tensors: &[(&str, &Tensor)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    save_at(path.as_ref(), tensors, metadata, Loc::caller())
}

pub(crate) fn save_at(
    path: &Path,
    tensors: &[(&str, &Tensor)],
    metadata: &BTreeMap<String, String>,
    at: Loc,
) -> Result<()> {
    let call = Call { doing: "saving", path, at, kind: Error::Weights };
    let mut seen = std::collections::HashSet::new();
    if let Some((name, _)) = tensors.iter().find(|(n, _)| !seen.insert(*n)) {
        return Err(call.err(format!("the name {name:?} is given twice")));
    }
    let blobs = read_all(tensors.iter().map(|(n, t)| (n.to_string(), (*t).clone())).collect(), at)?;
    let meta = (!metadata.is_empty()).then(|| metadata.clone().into_iter().collect());
    let header = header(&blobs, meta).map_err(|e| call.err(e))?;
    let parts: Vec<&[u8]> = blobs.iter().map(|b| b.bytes.as_slice()).collect();
    files::write_atomically(path, &header, &parts).map_err(|e| call.err(e))
}

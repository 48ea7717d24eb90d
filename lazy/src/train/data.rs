//! Training data: token ids in a flat binary file, and batches of `(inputs, targets)` windows read at random
//! offsets.
//!
//! A [`TokenFile`] is a file of little-endian `u16` or `u32` token ids and nothing else (the layout of
//! nanoGPT's `train.bin`). It is read with positional reads rather than memory-mapped: mapping a file needs
//! code outside Rust's safety checks (a file truncated under the mapping faults on access), and a batch reads only `B` windows of
//! `T + 1` ids, so the whole file never has to be in memory either way.
//!
//! [`Batches`] yields batch after batch; batch `k` depends only on the seed and `k` (its generator is
//! [`HostRng`] seeded from both), so the same seed gives the same batches, and a resumed run continues with
//! [`Batches::starting_at`]. [`Batches::prefetch`] reads the next batches on a background thread. A `Tensor`
//! belongs to the thread that made it, so that thread prepares host arrays ([`HostBatch`]) and the tensors are
//! made on the training thread as each batch is taken.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use lazuli_hlo::Loc;

use crate::nn::HostRng;
use crate::{Error, Result, Tensor};

/// How many bytes each token id takes in a [`TokenFile`] (little-endian).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenWidth {
    /// Ids below 65536 (GPT-2's 50257-token vocabulary fits).
    U16,
    /// Ids up to `i32::MAX` (the tensors are `i32`).
    U32,
}

impl TokenWidth {
    /// Bytes per token id.
    pub fn bytes(self) -> usize {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }

    /// The largest id this width stores and an `i32` tensor holds.
    fn max_id(self) -> u32 {
        match self {
            TokenWidth::U16 => u16::MAX as u32,
            TokenWidth::U32 => i32::MAX as u32,
        }
    }
}

/// A file of token ids, opened for reading at any offset. Cloning shares the open file.
#[derive(Clone, Debug)]
pub struct TokenFile {
    file: Arc<File>,
    path: PathBuf,
    width: TokenWidth,
    len: usize,
}

impl TokenFile {
    /// Open `path` as token ids of `width`. Its size must be a non-zero multiple of the width.
    #[track_caller]
    pub fn open(path: impl AsRef<Path>, width: TokenWidth) -> Result<TokenFile> {
        let (path, at) = (path.as_ref(), Loc::caller());
        let err = |msg: String| Error::Config(format!("token file {} (opened at {at}): {msg}", path.display()));
        let file = File::open(path).map_err(|e| err(e.to_string()))?;
        let bytes = file.metadata().map_err(|e| err(e.to_string()))?.len();
        let w = width.bytes() as u64;
        if bytes % w != 0 {
            return Err(err(format!(
                "{bytes} bytes is not a multiple of {w} (the size of a {width:?} token id): a different width, or a \
                 truncated file?"
            )));
        }
        if bytes == 0 {
            return Err(err("the file is empty".into()));
        }
        let len = usize::try_from(bytes / w).map_err(|_| err(format!("{bytes} bytes is too large to index")))?;
        Ok(TokenFile { file: Arc::new(file), path: path.to_path_buf(), width, len })
    }

    /// Write `tokens` to `path` as ids of `width` (replacing the file). An id the width cannot hold is an error.
    #[track_caller]
    pub fn write(path: impl AsRef<Path>, tokens: &[u32], width: TokenWidth) -> Result<()> {
        let (path, at) = (path.as_ref(), Loc::caller());
        let err = |msg: String| Error::Config(format!("writing token file {} (at {at}): {msg}", path.display()));
        if let Some((i, id)) = tokens.iter().enumerate().find(|(_, &id)| id > width.max_id()) {
            return Err(err(format!("token {i} is {id}, more than {width:?} holds ({})", width.max_id())));
        }
        let mut bytes = Vec::with_capacity(tokens.len() * width.bytes());
        for &id in tokens {
            match width {
                TokenWidth::U16 => bytes.extend_from_slice(&(id as u16).to_le_bytes()),
                TokenWidth::U32 => bytes.extend_from_slice(&id.to_le_bytes()),
            }
        }
        let mut file = File::create(path).map_err(|e| err(e.to_string()))?;
        file.write_all(&bytes).and_then(|()| file.flush()).map_err(|e| err(e.to_string()))
    }

    /// Number of token ids in the file.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the file holds no ids (never true of an opened file).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The width the file was opened with.
    pub fn width(&self) -> TokenWidth {
        self.width
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ids `start..start + count` as `i32`s.
    #[track_caller]
    pub fn read(&self, start: usize, count: usize) -> Result<Vec<i32>> {
        let mut out = Vec::with_capacity(count);
        self.read_into(start, count, &mut out, Loc::caller())?;
        Ok(out)
    }

    /// Append ids `start..start + count` to `out`; errors name `at`.
    fn read_into(&self, start: usize, count: usize, out: &mut Vec<i32>, at: Loc) -> Result<()> {
        let err = |msg: String| {
            Error::Config(format!(
                "token file {}, ids {start}..{} (at {at}): {msg}",
                self.path.display(),
                start as u128 + count as u128 // past `usize` when the range overflows
            ))
        };
        if !matches!(start.checked_add(count), Some(end) if end <= self.len) {
            return Err(err(format!("past the end of the file's {} ids", self.len)));
        }
        let w = self.width.bytes();
        let mut bytes = vec![0u8; count * w];
        read_exact_at(&self.file, &mut bytes, (start * w) as u64).map_err(|e| err(e.to_string()))?;
        let max = self.width.max_id();
        for (i, chunk) in bytes.chunks_exact(w).enumerate() {
            let id = match self.width {
                TokenWidth::U16 => u16::from_le_bytes([chunk[0], chunk[1]]) as u32,
                TokenWidth::U32 => u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]),
            };
            if id > max {
                return Err(err(format!("id {} is {id}, more than an i32 tensor holds", start + i)));
            }
            out.push(id as i32);
        }
        Ok(())
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}

/// One batch as host arrays, row-major `[batch, seq]`: `targets` is `inputs` shifted by one token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostBatch {
    /// The batch's index in its sequence of batches.
    pub index: u64,
    /// Rows.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
    /// Where each row starts in the file.
    pub offsets: Vec<usize>,
    /// Ids `offsets[b]..offsets[b] + seq` of each row.
    pub inputs: Vec<i32>,
    /// Ids `offsets[b] + 1..offsets[b] + seq + 1` of each row.
    pub targets: Vec<i32>,
}

impl HostBatch {
    /// The `(inputs, targets)` tensors, `i32[batch, seq]` each, made on the calling thread.
    #[track_caller]
    pub fn tensors(&self) -> (Tensor, Tensor) {
        let dims = [self.batch, self.seq];
        (Tensor::from_slice(&self.inputs, &dims), Tensor::from_slice(&self.targets, &dims))
    }
}

/// What makes batch `k`: the file, the shape, the seed, and the line that asked (for errors). `Send`, so a
/// prefetching thread can own a copy.
#[derive(Clone, Debug)]
struct Sampler {
    file: TokenFile,
    batch: usize,
    seq: usize,
    /// The seed's stream: batch `k` draws from `HostRng::new(base + k)`.
    base: u64,
    at: Loc,
}

impl Sampler {
    /// Batch `index`: `batch` offsets drawn uniformly from every window of `seq + 1` ids that fits the file.
    fn host(&self, index: u64) -> Result<HostBatch> {
        let mut rng = HostRng::new(self.base.wrapping_add(index));
        let windows = (self.file.len() - self.seq) as u64;
        let offsets: Vec<usize> = (0..self.batch).map(|_| rng.below(windows) as usize).collect();
        let (mut inputs, mut targets) =
            (Vec::with_capacity(self.batch * self.seq), Vec::with_capacity(self.batch * self.seq));
        let mut window = Vec::with_capacity(self.seq + 1);
        for &o in &offsets {
            window.clear();
            self.file.read_into(o, self.seq + 1, &mut window, self.at)?;
            inputs.extend_from_slice(&window[..self.seq]);
            targets.extend_from_slice(&window[1..]);
        }
        Ok(HostBatch { index, batch: self.batch, seq: self.seq, offsets, inputs, targets })
    }
}

/// Batches of `(inputs, targets)`, `i32[batch, seq]` each, at random offsets of a [`TokenFile`]; endless (take
/// as many as the run has steps). Each item is a `Result`: reading the file can fail.
///
/// Batch `k` draws its offsets from `HostRng::new(HostRng::new(seed).next_u64() + k)` (wrapping), each uniform
/// over the file's `len - seq` windows, so it depends on nothing but the seed and `k`.
#[derive(Clone, Debug)]
pub struct Batches {
    sampler: Sampler,
    next: u64,
}

impl Batches {
    /// Batches of `batch` rows of `seq` tokens from `file`, from the generator seeded with `seed`. The file
    /// must hold at least one window of `seq + 1` ids (inputs and the targets one token on).
    #[track_caller]
    pub fn new(file: &TokenFile, batch: usize, seq: usize, seed: u64) -> Result<Batches> {
        let at = Loc::caller();
        let err = |msg: String| Error::Config(format!("batches of {} (at {at}): {msg}", file.path().display()));
        if batch == 0 || seq == 0 {
            return Err(err(format!("batch ({batch}) and sequence length ({seq}) must be positive")));
        }
        if file.len() <= seq {
            return Err(err(format!(
                "the file holds {} token ids, shorter than one sequence: {seq} inputs and a target need {}",
                file.len(),
                seq + 1
            )));
        }
        // Each batch is two host arrays of batch × seq ids: sizes the host cannot hold are refused here, where a
        // failed allocation at the first batch would end the process.
        let bytes = batch.checked_mul(seq).and_then(|ids| ids.checked_mul(2 * std::mem::size_of::<i32>()));
        let Some(bytes) = bytes else {
            return Err(err(format!("{batch} × {seq} ids a batch are more than an address space holds")));
        };
        if let Some(short) = crate::runtime::host_shortfall(bytes) {
            return Err(err(format!("a batch of {batch} × {seq} ids needs {short}")));
        }
        let base = HostRng::new(seed).next_u64();
        Ok(Batches { sampler: Sampler { file: file.clone(), batch, seq, base, at }, next: 0 })
    }

    /// Continue from batch `index` (a resumed run's step), as if `index` batches had been taken.
    pub fn starting_at(mut self, index: u64) -> Batches {
        self.next = index;
        self
    }

    /// The index of the batch the next call returns.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Batch `index` as host arrays, without moving the iterator.
    pub fn host(&self, index: u64) -> Result<HostBatch> {
        self.sampler.host(index)
    }

    /// The next batch as host arrays.
    pub fn next_host(&mut self) -> Result<HostBatch> {
        let b = self.sampler.host(self.next);
        self.next += 1;
        b
    }

    /// The same batches, with the next `depth` read ahead on a background thread, so that a step does not wait
    /// for the file. The thread stops when the [`Prefetch`] is dropped.
    pub fn prefetch(self, depth: usize) -> Prefetch {
        Prefetch::start(self.sampler, self.next, depth.max(1))
    }
}

impl Iterator for Batches {
    type Item = Result<(Tensor, Tensor)>;

    #[track_caller]
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_host().map(|b| b.tensors()))
    }
}

/// [`Batches`] read ahead on a background thread through a bounded channel; yields the same batches in the
/// same order.
#[derive(Debug)]
pub struct Prefetch {
    /// `None` only while dropping: dropping it first unblocks the thread's `send`.
    rx: Option<Receiver<Result<HostBatch>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    at: Loc,
}

impl Prefetch {
    fn start(sampler: Sampler, first: u64, depth: usize) -> Prefetch {
        let at = sampler.at;
        let (tx, rx) = std::sync::mpsc::sync_channel(depth);
        let thread = std::thread::Builder::new()
            .name("lazuli-prefetch".into())
            .spawn(move || read_ahead(&sampler, first, &tx))
            .ok();
        Prefetch { rx: thread.is_some().then_some(rx), thread, at }
    }

    /// The next batch as host arrays.
    pub fn next_host(&mut self) -> Result<HostBatch> {
        let stopped = || Error::Internal(format!("the prefetching thread of the batches made at {} stopped", self.at));
        let rx = self.rx.as_ref().ok_or_else(stopped)?;
        rx.recv().map_err(|_| stopped())?
    }
}

/// The prefetching thread: batch after batch until the consumer hangs up, or after the first error (sent on).
fn read_ahead(sampler: &Sampler, first: u64, tx: &SyncSender<Result<HostBatch>>) {
    for index in first.. {
        let batch = sampler.host(index);
        let failed = batch.is_err();
        if tx.send(batch).is_err() || failed {
            return;
        }
    }
}

impl Iterator for Prefetch {
    type Item = Result<(Tensor, Tensor)>;

    #[track_caller]
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_host().map(|b| b.tensors()))
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        drop(self.rx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

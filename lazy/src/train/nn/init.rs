//! Parameter initialisation on the host, from a seeded generator: reproducible across runs and plugins.

use lazuli_hlo::{DType, TensorType};

use crate::graph::element::put_scalar;
use crate::graph::record::fail;
use crate::graph::tensor::Tensor;

/// A small, fast, seedable host generator (splitmix64) for initial weights and synthetic data.
#[derive(Clone, Debug)]
pub struct HostRng(u64);

impl HostRng {
    /// A generator seeded with `seed`: the same seed gives the same numbers on every run and machine.
    pub fn new(seed: u64) -> HostRng {
        HostRng(seed ^ 0x6A09_E667_F3BC_C909)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// An integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The bytes of a host tensor of these dimensions, or a panic at the caller's line where the host cannot hold them:
/// a size past the address space, or (from [`CHECKED_FROM_BYTES`]) more than the host has available. A failed
/// allocation would end the process without a word of where it was asked for.
#[track_caller]
fn host_bytes(dims: &[usize], dtype: DType) -> usize {
    let ty = TensorType::new(dtype, dims);
    let loc = crate::Loc::caller();
    if let Some(why) = ty.addressable() {
        fail(loc, why);
    }
    let bytes = ty.byte_size();
    if let Some(short) = (bytes >= CHECKED_FROM_BYTES).then(|| crate::runtime::host_shortfall(bytes)).flatten() {
        fail(loc, format!("{ty} needs {short}"));
    }
    bytes
}

/// Host tensors of at least this many bytes are checked against the host's available memory (reading it costs a
/// file read; smaller ones are every model's biases and norms).
const CHECKED_FROM_BYTES: usize = 1 << 30;

/// A host tensor of `dtype` with values from `f`.
#[track_caller]
pub fn host_tensor(dims: &[usize], dtype: DType, mut f: impl FnMut() -> f64) -> Tensor {
    // Checked first: past it the element count cannot overflow.
    let mut bytes = Vec::with_capacity(host_bytes(dims, dtype));
    let n: usize = dims.iter().product();
    for _ in 0..n {
        put_scalar(dtype, f(), &mut bytes);
    }
    Tensor::host(lazuli_hlo::TensorType::new(dtype, dims), bytes, crate::Loc::caller())
}

/// A host tensor of zeros. Zero is all-zero bytes in every dtype, so the bytes come zeroed from the allocator
/// without a write per element: a large tensor's pages (an optimizer's moments) are not touched until they are
/// read, which the upload does once.
#[track_caller]
pub fn host_zeros(dims: &[usize], dtype: DType) -> Tensor {
    let bytes = vec![0u8; host_bytes(dims, dtype)];
    Tensor::host(lazuli_hlo::TensorType::new(dtype, dims), bytes, crate::Loc::caller())
}

/// Normal(0, std²) values.
#[track_caller]
pub fn normal(rng: &mut HostRng, dims: &[usize], std: f64, dtype: DType) -> Tensor {
    host_tensor(dims, dtype, || rng.normal() * std)
}

/// Uniform(-bound, bound) values (PyTorch's default for Linear with bound = 1/sqrt(fan_in)).
#[track_caller]
pub fn uniform(rng: &mut HostRng, dims: &[usize], bound: f64, dtype: DType) -> Tensor {
    host_tensor(dims, dtype, || (rng.uniform() * 2.0 - 1.0) * bound)
}

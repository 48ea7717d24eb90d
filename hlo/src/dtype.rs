//! Element types of the IR and how each one is spelled, stored and rounded.

use std::fmt;

/// The element type of a tensor. One runtime enum for the whole graph; typed Rust values only exist at the host
/// boundary (see `lazuli_lazy::Element`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 16-bit IEEE float (`half::f16`).
    F16,
    /// 16-bit brain float (`half::bf16`): f32's range, 8 bits of mantissa.
    BF16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 8-bit unsigned integer.
    U8,
    /// 32-bit unsigned integer.
    U32,
    /// 64-bit unsigned integer.
    U64,
    /// Boolean (one byte per element on the host).
    Bool,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// The element type as MLIR spells it inside `tensor<…>`.
    pub fn mlir(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "ui8",
            DType::U32 => "ui32",
            DType::U64 => "ui64",
            DType::Bool => "i1",
        }
    }

    /// Bytes per element in a dense host buffer (bool is one byte, as PJRT stores PRED).
    pub fn byte_size(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// The type floats of `dtypes` are computed in where precision matters (statistics, sums, softmax): f64 when
    /// any is f64, else f32 (16-bit inputs are widened).
    pub fn computing(dtypes: impl IntoIterator<Item = DType>) -> DType {
        if dtypes.into_iter().any(|d| d == DType::F64) {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// A floating-point type (f32, f64, f16, bf16).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// An integer type, signed or not (bool is neither).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64 | DType::U8 | DType::U32 | DType::U64)
    }

    /// A signed integer or floating-point type.
    pub fn is_signed(self) -> bool {
        matches!(self, DType::I32 | DType::I64) || self.is_float()
    }

    /// Comparison type StableHLO wants for `compare` on this element type.
    pub fn compare_type(self) -> &'static str {
        match self {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => "FLOAT",
            DType::I32 | DType::I64 => "SIGNED",
            DType::U8 | DType::U32 | DType::U64 | DType::Bool => "UNSIGNED",
        }
    }

    /// Round an f64 to the nearest value this type can hold, the way the device stores an op's result: floats
    /// round to nearest even; i32, u8 and u32 wrap (two's complement, as integer arithmetic overflows on the
    /// device); i64 saturates and u64 saturates above its maximum (f64 reads `i64::MAX` as 2^63, so wrapping there
    /// would turn it negative; ops that can overflow wrap in integers first, `to_int`/`wrap`); bool is `x != 0`.
    /// The reference interpreter computes in f64 and rounds through this after every op. A conversion from a float
    /// is [`DType::convert_float`] instead (`docs/numerics.md`).
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::F64 => x,
            DType::F32 => x as f32 as f64,
            DType::F16 => half::f16::from_f64(x).to_f64(),
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::I32 => (x.trunc() as i64) as i32 as f64,
            DType::I64 => x.trunc() as i64 as f64,
            DType::U8 => (x.trunc() as i64) as u8 as f64,
            DType::U32 => (x.trunc() as i64) as u32 as f64,
            // Negative values wrap (two's complement); values above u64::MAX saturate.
            DType::U64 => {
                if x < 0.0 {
                    (x.trunc() as i64) as u64 as f64
                } else {
                    x.trunc() as u64 as f64
                }
            }
            DType::Bool => (x != 0.0) as u8 as f64,
        }
    }

    /// A floating-point value converted to this type, as lazuli defines `convert` from a float (JAX's `astype`,
    /// what XLA's CPU emitter does): to an integer type NaN is 0, other values truncate toward zero and saturate
    /// at the type's bounds (±inf included); to bool, `x != 0` (NaN is true); to a float, round to nearest even.
    pub fn convert_float(self, x: f64) -> f64 {
        match self {
            DType::I32 | DType::I64 | DType::U8 | DType::U32 | DType::U64 if x.is_nan() => 0.0,
            DType::I32 | DType::I64 | DType::U8 | DType::U32 | DType::U64 => {
                x.trunc().clamp(self.lowest(), self.highest())
            }
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::Bool => self.round(x),
        }
    }

    /// The integer an integer-typed reference value stands for. The 64-bit types saturate: `i64::MAX` and
    /// `u64::MAX` read back as 2^63 and 2^64 in f64, which stand for them.
    pub fn to_int(self, x: f64) -> i128 {
        match self {
            DType::U64 => x as u64 as i128,
            _ => x as i64 as i128,
        }
    }

    /// `v` reduced to this integer type's width (two's complement wrap-around), as an f64; other types take `v`.
    pub fn wrap(self, v: i128) -> f64 {
        match self {
            DType::I32 => v as i32 as f64,
            DType::I64 => v as i64 as f64,
            DType::U8 => v as u8 as f64,
            DType::U32 => v as u32 as f64,
            DType::U64 => v as u64 as f64,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::Bool => v as f64,
        }
    }

    /// Significand bits and the largest finite value of a float type; `None` for the others.
    fn float_format(self) -> Option<(u32, f64)> {
        match self {
            DType::F32 => Some((24, f32::MAX as f64)),
            DType::F64 => Some((53, f64::MAX)),
            DType::F16 => Some((11, half::f16::MAX.to_f64())),
            DType::BF16 => Some((8, half::bf16::MAX.to_f64())),
            DType::I32 | DType::I64 | DType::U8 | DType::U32 | DType::U64 | DType::Bool => None,
        }
    }

    /// The smallest and largest values of this float type inside the range of the integer type `to`: a clamp to
    /// them keeps a float → integer conversion in range on any device (the lowering of `convert`). Both are
    /// integers this float type holds exactly. `None` unless float → integer.
    pub fn int_range_in(self, to: DType) -> Option<(f64, f64)> {
        let (p, fmax) = self.float_format()?;
        // `to` holds [-2^m, 2^m - 1] when signed, [0, 2^m - 1] when not.
        let m: i32 = match to {
            DType::I32 => 31,
            DType::I64 => 63,
            DType::U8 => 8,
            DType::U32 => 32,
            DType::U64 => 64,
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::Bool => return None,
        };
        // The largest float below 2^m: 2^m - 1 when p bits hold it, else the p-bit number 2^m - 2^(m-p).
        let hi = if m as u32 <= p { 2f64.powi(m) - 1.0 } else { 2f64.powi(m) - 2f64.powi(m - p as i32) };
        let lo = if to.is_signed() { -(2f64.powi(m)) } else { 0.0 };
        Some((lo.max(-fmax), hi.min(fmax)))
    }

    /// A scalar as an MLIR `dense<…>` literal body: floats as exact hex bit patterns (also covers ±inf and NaN).
    pub fn literal(self, x: f64) -> String {
        match self {
            DType::F64 => format!("0x{:016X}", x.to_bits()),
            DType::F32 => format!("0x{:08X}", (x as f32).to_bits()),
            DType::F16 => format!("0x{:04X}", half::f16::from_f64(x).to_bits()),
            DType::BF16 => format!("0x{:04X}", half::bf16::from_f64(x).to_bits()),
            DType::I32 | DType::I64 | DType::U8 | DType::U32 => format!("{}", self.round(x) as i64),
            DType::U64 => format!("{}", self.round(x) as u64),
            DType::Bool => (if x != 0.0 { "true" } else { "false" }).to_string(),
        }
    }

    /// The smallest value of the type (the identity of `max`): -inf for floats.
    pub fn lowest(self) -> f64 {
        match self {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => f64::NEG_INFINITY,
            DType::I32 => i32::MIN as f64,
            DType::I64 => i64::MIN as f64,
            DType::U8 | DType::U32 | DType::U64 | DType::Bool => 0.0,
        }
    }

    /// The largest value of the type (the identity of `min`): +inf for floats.
    pub fn highest(self) -> f64 {
        match self {
            DType::F32 | DType::F64 | DType::F16 | DType::BF16 => f64::INFINITY,
            DType::I32 => i32::MAX as f64,
            DType::I64 => i64::MAX as f64,
            DType::U8 => 255.0,
            DType::U32 => u32::MAX as f64,
            // 2^64 in f64; `literal` saturates it to u64::MAX.
            DType::U64 => u64::MAX as f64,
            DType::Bool => 1.0,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
            other => other.mlir(),
        };
        f.write_str(s)
    }
}

/// Dimensions, stored inline up to rank 4: every graph node has a type, and a separate allocation per shape cost
/// an allocation and a cache miss per node (`trace` in docs/perf-log/2026-11-29-per-node-work.md).
pub type Dims = smallvec::SmallVec<[usize; 4]>;

/// A tensor's static type: element type and dimensions. Displayed as `f32[2,3]`, lowered as `tensor<2x3xf32>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// The element type.
    pub dtype: DType,
    /// The dimensions, outermost first (empty for a scalar).
    pub dims: Dims,
}

impl TensorType {
    /// A tensor of `dtype` with dimensions `dims`.
    pub fn new(dtype: DType, dims: impl AsRef<[usize]>) -> Self {
        TensorType { dtype, dims: Dims::from_slice(dims.as_ref()) }
    }

    /// A scalar (rank 0) of `dtype`.
    pub fn scalar(dtype: DType) -> Self {
        TensorType { dtype, dims: Dims::new() }
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The element count, saturating at `usize::MAX` (a shape that large is refused when it is recorded: see
    /// [`TensorType::addressable`]), so size comparisons of absurd shapes never wrap to small numbers.
    pub fn elements(&self) -> usize {
        self.dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Bytes in a dense host buffer of this type, saturating like `elements`.
    pub fn byte_size(&self) -> usize {
        self.elements().saturating_mul(self.dtype.byte_size())
    }

    /// Why no device could hold this type (its bytes overflow 64 bits or exceed `i64::MAX`, XLA's limit), or
    /// `None`. The bytes are counted over the nonzero dimensions: XLA's CPU compiler counts an empty type's bytes
    /// so too, and a product past `i64::MAX` (`f32[2^40, 2^21, 0]`) ended the process with an uncaught C++
    /// exception while compiling.
    pub fn addressable(&self) -> Option<String> {
        // Every node's type passes here: 64-bit products first, 128-bit ones only where those overflow.
        let nonzero = || self.dims.iter().filter(|&&d| d != 0);
        let small = nonzero().try_fold(self.dtype.byte_size() as u64, |n, &d| n.checked_mul(d as u64));
        let bytes = small
            .map(u128::from)
            .or_else(|| nonzero().try_fold(self.dtype.byte_size() as u128, |n, &d| n.checked_mul(d as u128)));
        match bytes {
            Some(b) if b <= i64::MAX as u128 => None,
            _ if self.elements() == 0 => Some(format!(
                "{self} has no elements, but its nonzero dimensions span more bytes than a 64-bit address space \
                 holds, which XLA cannot compile"
            )),
            _ => Some(format!("{self} has more bytes than a 64-bit address space holds")),
        }
    }

    /// The same dimensions with another element type.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        TensorType { dtype, dims: self.dims.clone() }
    }

    /// `tensor<2x3xf32>`; a scalar is `tensor<f32>`.
    pub fn mlir(&self) -> String {
        let mut s = String::with_capacity(16 + 4 * self.dims.len());
        s.push_str("tensor<");
        for d in &self.dims {
            s.push_str(&d.to_string());
            s.push('x');
        }
        s.push_str(self.dtype.mlir());
        s.push('>');
        s
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limit is `i64::MAX` bytes; a product past 64 bits is over it unless a zero dimension empties the type.
    #[test]
    fn addressable_types_stop_at_i64_max_bytes() {
        let t = |dims: &[usize]| TensorType::new(DType::U8, dims);
        assert!(t(&[i64::MAX as usize]).addressable().is_none());
        assert!(t(&[i64::MAX as usize + 1]).addressable().is_some());
        assert!(TensorType::new(DType::F32, [1 << 31, 1 << 30]).addressable().is_some(), "2^63 bytes");
        assert!(TensorType::new(DType::F32, [1 << 30, 1 << 30]).addressable().is_none(), "2^62 bytes");
        assert!(t(&[1 << 40, 1 << 40]).addressable().is_some(), "past 64 bits");
        assert!(t(&[1 << 40, 1 << 40, 0]).addressable().is_some(), "empty, but XLA counts the nonzero dimensions");
        assert!(TensorType::new(DType::F32, [1 << 40, 1 << 21, 0]).addressable().is_some(), "2^63 bytes, empty");
        assert!(TensorType::new(DType::F32, [1 << 40, 1 << 20, 0]).addressable().is_none(), "2^62 bytes, empty");
        assert!(t(&[1 << 40, 0, 5]).addressable().is_none());
    }
}

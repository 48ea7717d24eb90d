//! Random bits on the device (`rng_bit_generator`) and bit reinterpretation (`bitcast_convert`).
//!
//! `rng_bit_generator` has two results, the next state and the bits, but a node of the IR has one. The op is
//! therefore recorded as two nodes on the same state operand, one per result ([`RngOutput`]). Each lowers to the
//! same generator call and picks its result; XLA's common-subexpression pass merges the two calls, and the
//! generator is a pure function of its state, so they agree in any case.
//!
//! The reference implements XLA's THREE_FRY expansion (Threefry-2x32, 20 rounds, with XLA's split of the output
//! into two halves), so the interpreter reproduces the device's bits exactly as long as the state's two u64 words
//! are below 2^53 (the interpreter holds values as f64); seeds from `manual_seed` below 2^53 stay there.

use crate::infer_error::InferError;
use half::{bf16, f16};
use ndarray::{ArrayD, Dimension, IxDyn};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::LowerCx;
use crate::op::{arity, OpRules};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RngAlgorithm {
    /// Threefry-2x32 keyed by state word 0, counter in state word 1.
    ThreeFry,
}

/// Which result of the generator a node stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RngOutput {
    /// u32 bits of shape `dims`.
    Bits,
    /// The state after drawing `dims` bits (`u64[2]`).
    NextState,
}

/// `stablehlo.rng_bit_generator` on a `u64[2]` state, drawing u32 bits of shape `dims`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RngBitGenerator {
    pub algorithm: RngAlgorithm,
    pub dims: Vec<usize>,
    pub output: RngOutput,
}

impl RngBitGenerator {
    pub fn state_type() -> TensorType {
        TensorType::new(DType::U64, [2])
    }

    fn bits_type(&self) -> TensorType {
        TensorType::new(DType::U32, self.dims.clone())
    }
}

impl OpRules for RngBitGenerator {
    fn name(&self) -> &'static str {
        match self.output {
            RngOutput::Bits => "rng_bits",
            RngOutput::NextState => "rng_next_state",
        }
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity(self.name(), operands, 1)?;
        let state = Self::state_type();
        if operands[0] != &state {
            return Err(InferError::Shape(format!(
                "{}: the generator state must be {state}, got {}",
                self.name(),
                operands[0]
            )));
        }
        Ok(match self.output {
            RngOutput::Bits => self.bits_type(),
            RngOutput::NextState => state,
        })
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let state = Self::state_type();
        let bits = self.bits_type();
        let algorithm = match self.algorithm {
            RngAlgorithm::ThreeFry => "THREE_FRY",
        };
        let attrs = format!("rng_algorithm = #stablehlo<rng_algorithm {algorithm}>");
        let operands = [cx.arg(0).to_string()];
        let results = cx.op_multi("stablehlo.rng_bit_generator", &operands, &[&state], &attrs, None, &[&state, &bits]);
        match self.output {
            RngOutput::NextState => results[0].clone(),
            RngOutput::Bits => results[1].clone(),
        }
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let key = x[0][[0]] as u64;
        let counter = x[0][[1]] as u64;
        match self.output {
            RngOutput::Bits => threefry_bits(key, counter, &self.dims),
            RngOutput::NextState => {
                let (half, _) = split_in_halves(&self.dims);
                let drawn: usize = half.iter().product();
                let next = counter.wrapping_add(drawn as u64);
                ArrayD::from_shape_vec(IxDyn(&[2]), vec![key as f64, next as f64]).expect("two words")
            }
        }
    }
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        vec![None]
    }
    fn shard(&self, _x: &[crate::shard::ShardIn<'_>], _out: &TensorType) -> Option<crate::shard::DimShards> {
        None
    }
}

/// XLA draws u32 bits two at a time: it picks a dimension (the first of even size, else the first largest),
/// halves it (rounding up), runs Threefry once per element of that half shape, and interleaves the two output
/// words along the split dimension. Returns the half shape (same rank) and the split dimension; a scalar draws
/// one pair.
fn split_in_halves(dims: &[usize]) -> (Vec<usize>, usize) {
    if dims.is_empty() {
        return (vec![1], 0);
    }
    let split = match dims.iter().position(|d| d % 2 == 0) {
        Some(d) => d,
        None => (0..dims.len()).fold(0, |best, d| if dims[d] > dims[best] { d } else { best }),
    };
    let mut half = dims.to_vec();
    half[split] = dims[split].div_ceil(2);
    (half, split)
}

/// The bits `rng_bit_generator` (THREE_FRY) returns for this key and counter.
fn threefry_bits(key: u64, counter: u64, dims: &[usize]) -> ArrayD<f64> {
    let (half, split) = split_in_halves(dims);
    let key = [key as u32, (key >> 32) as u32];
    let word = |ix: &[usize]| -> u32 {
        // Row-major linear index of the element's pair in the half shape; the pair's input is counter + index.
        let mut linear = 0u64;
        for (d, &size) in half.iter().enumerate().take(ix.len()) {
            let i = if d == split { ix[d] / 2 } else { ix[d] };
            linear = linear * size as u64 + i as u64;
        }
        let input = counter.wrapping_add(linear);
        let out = threefry2x32([input as u32, (input >> 32) as u32], key);
        let which = if ix.is_empty() { 0 } else { ix[split] % 2 };
        out[which]
    };
    ArrayD::from_shape_fn(IxDyn(dims), |ix| word(ix.slice()) as f64)
}

/// Threefry-2x32 with 20 rounds (Salmon et al., SC 2011), as XLA's prng library computes it.
fn threefry2x32(input: [u32; 2], key: [u32; 2]) -> [u32; 2] {
    const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
    let ks = [key[0], key[1], 0x1BD1_1BDA ^ key[0] ^ key[1]];
    let mut x = [input[0].wrapping_add(ks[0]), input[1].wrapping_add(ks[1])];
    for block in 0..5u32 {
        for &r in &ROTATIONS[(block % 2) as usize] {
            x[0] = x[0].wrapping_add(x[1]);
            x[1] = x[1].rotate_left(r) ^ x[0];
        }
        // Key injection after every four rounds.
        let b = block as usize;
        x[0] = x[0].wrapping_add(ks[(b + 1) % 3]);
        x[1] = x[1].wrapping_add(ks[(b + 2) % 3]).wrapping_add(block + 1);
    }
    x
}

/// Reinterpret each element's bits as another type of the same width (`f32` ↔ `u32`/`i32`, `f64` ↔ `u64`/`i64`,
/// `f16` ↔ `bf16`). `from` is the operand's dtype: the reference needs it to rebuild the bit pattern.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BitcastConvert {
    pub from: DType,
    pub to: DType,
}

impl OpRules for BitcastConvert {
    fn name(&self) -> &'static str {
        "bitcast"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("bitcast", operands, 1)?;
        let t = operands[0];
        if t.dtype != self.from {
            return Err(InferError::DType(format!("bitcast: the operand is {t}, not {}", self.from)));
        }
        if t.dtype == DType::Bool || self.to == DType::Bool || t.dtype.byte_size() != self.to.byte_size() {
            return Err(InferError::DType(format!(
                "bitcast: cannot reinterpret {t} as {}; the widths must match",
                self.to
            )));
        }
        Ok(t.with_dtype(self.to))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args("stablehlo.bitcast_convert", "")
    }
    /// Exact for every pair of 8-, 16- and 32-bit types; 64-bit integers are exact below 2^53 (f64 values).
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let (from, to) = (self.from, self.to);
        x[0].mapv(|v| from_bits(to, to_bits(from, v)))
    }
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        vec![None]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::elementwise(x, out)
    }
}

/// The bit pattern of a value of `dt` (already representable in `dt`), zero-extended to 64 bits.
fn to_bits(dt: DType, v: f64) -> u64 {
    match dt {
        DType::F64 => v.to_bits(),
        DType::F32 => (v as f32).to_bits() as u64,
        DType::F16 => f16::from_f64(v).to_bits() as u64,
        DType::BF16 => bf16::from_f64(v).to_bits() as u64,
        DType::I32 => v as i32 as u32 as u64,
        DType::I64 => v as i64 as u64,
        DType::U8 => v as u8 as u64,
        DType::U32 => v as u32 as u64,
        DType::U64 => v as u64,
        DType::Bool => (v != 0.0) as u64,
    }
}

/// The value of `dt` whose bit pattern is the low bits of `bits`.
fn from_bits(dt: DType, bits: u64) -> f64 {
    match dt {
        DType::F64 => f64::from_bits(bits),
        DType::F32 => f32::from_bits(bits as u32) as f64,
        DType::F16 => f16::from_bits(bits as u16).to_f64(),
        DType::BF16 => bf16::from_bits(bits as u16).to_f64(),
        DType::I32 => bits as u32 as i32 as f64,
        DType::I64 => bits as i64 as f64,
        DType::U8 => bits as u8 as f64,
        DType::U32 => bits as u32 as f64,
        DType::U64 => bits as f64,
        DType::Bool => (bits & 1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bits of `rng_bit_generator` (THREE_FRY, state [42, 7], u32[3,5]) as both CPU plugins return them.
    #[test]
    fn threefry_reference_matches_xla() {
        let want: [u32; 15] = [
            2642642533, 3437982737, 356970675, 1736384518, 4222757798, 563344011, 4074627445, 653491321, 3185375099,
            2676170827, 1532797651, 4222029849, 1855476965, 944181238, 1747370287,
        ];
        let got = threefry_bits(42, 7, &[3, 5]);
        let got: Vec<u32> = got.iter().map(|&v| v as u32).collect();
        assert_eq!(got, want);
        let (half, _) = split_in_halves(&[3, 5]);
        assert_eq!(half, vec![3, 3], "the state advances by 9 for 15 draws");
    }
}

//! Random numbers drawn on the device, and the bit ops they are built from.
//!
//! Each thread's generator holds its state as a `u64[2]` tensor (Threefry key and counter). Each draw records
//! `rng_bit_generator` on the current state and replaces the state with the generator's next state, so the state
//! is a program parameter that stays on the device: every training step draws new numbers from the same compiled
//! program. [`manual_seed`] resets the generator; [`rng_state`] and [`set_rng_state`] save and restore it (for
//! checkpoints). Like the graph it records into, the generator is per thread: each thread has its own stream,
//! seeded alike unless [`manual_seed`] is called on it.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use lazuli_hlo::{
    BinaryKind, BitcastConvert, Constant, DType, Loc, Op, RngAlgorithm, RngBitGenerator, RngOutput, TensorType,
};

use crate::graph::record::{apply, fail, Operand};
use crate::graph::tensor::{Node, Tensor};

/// The seed of a generator nobody seeded (PyTorch's default seed; below 2^53, so the reference interpreter
/// reproduces its stream).
const DEFAULT_SEED: u64 = 67_280_421_310_721;

struct Generator {
    /// `u64[2]`: key, counter.
    state: Tensor,
    /// The bits of the latest draw, to tell whether the state was left behind by a materialization.
    last_bits: Option<Weak<Node>>,
}

thread_local! {
    static GENERATOR: RefCell<Option<Generator>> = const { RefCell::new(None) };
}

fn seeded(seed: u64, loc: Loc) -> Generator {
    let bytes = crate::graph::element::to_bytes(&[seed, 0u64]);
    Generator { state: Tensor::host(RngBitGenerator::state_type(), bytes, loc), last_bits: None }
}

fn with_generator<R>(loc: Loc, f: impl FnOnce(&mut Generator) -> R) -> R {
    // Borrowed while `f` runs: `f` records ops (and may materialize), which never draw numbers themselves. A
    // panic in `f` leaves the generator where it was (each update is one assignment).
    GENERATOR.with_borrow_mut(|g| f(g.get_or_insert_with(|| seeded(DEFAULT_SEED, loc))))
}

/// Reset the generator: the same seed gives the same numbers, on every run and plugin.
#[track_caller]
pub fn manual_seed(seed: u64) {
    let loc = Loc::caller();
    GENERATOR.set(Some(seeded(seed, loc)));
}

/// The generator's state, a `u64[2]` tensor (possibly pending); save it to resume the stream later.
#[track_caller]
pub fn rng_state() -> Tensor {
    with_generator(Loc::caller(), |g| g.state.clone())
}

/// Continue the stream from a state returned by [`rng_state`] (or read back from a checkpoint).
#[track_caller]
pub fn set_rng_state(state: &Tensor) {
    let loc = Loc::caller();
    if state.tensor_type() != &RngBitGenerator::state_type() {
        fail(loc, format!("set_rng_state: the state must be u64[2], got {}", state.tensor_type()));
    }
    with_generator(loc, |g| {
        g.state = state.clone();
        g.last_bits = None;
    });
}

/// Where the latest draw's bits are: compared before and after recording a checkpointed block.
pub(crate) fn latest_draw() -> *const Node {
    GENERATOR.with_borrow(|g| g.as_ref().and_then(|g| g.last_bits.as_ref()).map_or(std::ptr::null(), Weak::as_ptr))
}

/// A checkpointed block drew numbers while it was recorded, whose bits nodes died with the recording: `result`
/// computes them now (pending until the step's program, which computes the state too), so it tells from now on
/// whether the state was left behind.
pub(crate) fn drawn_into(result: &Tensor) {
    GENERATOR.with_borrow_mut(|g| {
        if let Some(g) = g {
            g.last_bits = Some(Rc::downgrade(&result.node));
        }
    })
}

/// Record one draw of u32 bits and advance the state.
fn draw_bits(dims: &[usize], loc: Loc) -> Tensor {
    with_generator(loc, |g| {
        // Normally the state is computed in the same program as the bits (at `sync()`). If the bits were read
        // (or dropped) without it, the next draw would chain onto the pending state, each program would be one
        // link longer than the last and none would hit the cache: compute the state now instead (a small program,
        // compiled once). An error here resurfaces when the numbers are read.
        let behind = match g.last_bits.as_ref().and_then(Weak::upgrade) {
            Some(bits) => !bits.is_pending(),
            None => true,
        };
        if behind && g.state.is_pending() {
            let _ = g.state.materialize();
        }
        let rng = |output| {
            Op::RngBitGenerator(RngBitGenerator { algorithm: RngAlgorithm::ThreeFry, dims: dims.to_vec(), output })
        };
        let bits = apply(rng(RngOutput::Bits), &[&g.state], loc);
        g.state = apply(rng(RngOutput::NextState), &[&g.state], loc);
        g.last_bits = Some(Rc::downgrade(&bits.node));
        bits
    })
}

/// A constant of `dtype` with every element `value` (structure, not data).
fn constant(value: f64, dtype: DType, dims: &[usize], loc: Loc) -> Tensor {
    apply(Op::Constant(Constant::new(value, TensorType::new(dtype, dims))), &[], loc)
}

/// `t * factor` with the factor a constant (it defines the distribution, so it is structure).
fn scale(t: &Tensor, factor: f64, loc: Loc) -> Tensor {
    let c = constant(factor, t.dtype(), t.dims(), loc);
    apply(Op::Binary(lazuli_hlo::Binary { kind: BinaryKind::Mul }), &[t, &c], loc)
}

/// The top `32 - shift` bits of each word as `dtype`, times 2^exponent; exact in `dtype` when `32 - shift` is at
/// most its significand width.
fn top_bits(bits: &Tensor, shift: u32, dtype: DType, exponent: i32, loc: Loc) -> Tensor {
    let by = constant(shift as f64, DType::U32, bits.dims(), loc);
    let top = apply(Op::Binary(lazuli_hlo::Binary { kind: BinaryKind::ShiftRightLogical }), &[bits, &by], loc);
    let top = apply(Op::Convert(lazuli_hlo::Convert { from: top.dtype(), to: dtype }), &[&top], loc);
    scale(&top, 2f64.powi(exponent), loc)
}

/// Uniform [0, 1) numbers of a floating-point dtype: as many random bits as the dtype's significand holds, so every
/// value is exact and 1 is never reached.
fn uniform(dims: &[usize], dtype: DType, loc: Loc) -> Tensor {
    let significand = match dtype {
        DType::F32 => 24,
        DType::F16 => 11,
        DType::BF16 => 8,
        DType::F64 => {
            // 27 + 26 bits from two words (the interpreter's f64 holds every step exactly).
            let hi = top_bits(&draw_bits(dims, loc), 5, DType::F64, -27, loc);
            let lo = top_bits(&draw_bits(dims, loc), 6, DType::F64, -53, loc);
            return hi.binary_at(&lo, BinaryKind::Add, loc);
        }
        other => fail(loc, format!("rand: needs a floating-point dtype, got {other}")),
    };
    top_bits(&draw_bits(dims, loc), 32 - significand, dtype, -(significand as i32), loc)
}

impl Tensor {
    /// Uniform random numbers in [0, 1) of a floating-point dtype, drawn on the device.
    #[track_caller]
    pub fn rand(dims: &[usize], dtype: DType) -> Tensor {
        uniform(dims, dtype, Loc::caller())
    }

    /// Standard normal random numbers (Box–Muller; computed in f32, or f64 for f64).
    #[track_caller]
    pub fn randn(dims: &[usize], dtype: DType) -> Tensor {
        let loc = Loc::caller();
        if !dtype.is_float() {
            fail(loc, format!("randn: needs a floating-point dtype, got {dtype}"));
        }
        let work = DType::computing([dtype]);
        let u1 = uniform(dims, work, loc);
        let u2 = uniform(dims, work, loc);
        // 1 - u1 lies in (0, 1], so the log is finite.
        let one = constant(1.0, work, dims, loc);
        let r = one.binary_at(&u1, BinaryKind::Sub, loc);
        let r = apply(Op::Unary(lazuli_hlo::Unary { kind: lazuli_hlo::UnaryKind::Log }), &[&r], loc);
        let r = scale(&r, -2.0, loc);
        let r = apply(Op::Unary(lazuli_hlo::Unary { kind: lazuli_hlo::UnaryKind::Sqrt }), &[&r], loc);
        let angle = scale(&u2, std::f64::consts::TAU, loc);
        let c = apply(Op::Unary(lazuli_hlo::Unary { kind: lazuli_hlo::UnaryKind::Cos }), &[&angle], loc);
        let z = r.binary_at(&c, BinaryKind::Mul, loc);
        if dtype == work {
            z
        } else {
            apply(Op::Convert(lazuli_hlo::Convert { from: z.dtype(), to: dtype }), &[&z], loc)
        }
    }

    /// Raw random bits: u32 words straight from the generator.
    #[track_caller]
    pub fn rand_bits(dims: &[usize]) -> Tensor {
        draw_bits(dims, Loc::caller())
    }

    /// A bool tensor, each element true with probability `p` (a program parameter: a new `p` does not recompile).
    #[track_caller]
    pub fn bernoulli(dims: &[usize], p: f64) -> Tensor {
        let loc = Loc::caller();
        if !(0.0..=1.0).contains(&p) {
            fail(loc, format!("bernoulli: p = {p} is not a probability"));
        }
        let u = uniform(dims, DType::F32, loc);
        let p = p.into_tensor(DType::F32, loc).broadcast_at(dims, loc);
        apply(Op::Compare(lazuli_hlo::Compare { dir: lazuli_hlo::CompareDir::Lt }), &[&u, &p], loc)
    }

    /// Dropout: in training, zero each element with probability `p` and scale the rest by 1/(1-p), so the
    /// expectation is unchanged; in evaluation (`train == false`) the identity. `p` is a program parameter.
    #[track_caller]
    pub fn dropout(&self, p: f64, train: bool) -> Tensor {
        let loc = Loc::caller();
        if !self.dtype().is_float() {
            fail(loc, format!("dropout: needs a floating-point tensor, got {}", self.tensor_type()));
        }
        if !(0.0..=1.0).contains(&p) {
            fail(loc, format!("dropout: p = {p} is not a probability"));
        }
        if !train || p == 0.0 {
            return self.clone();
        }
        if p == 1.0 {
            // Everything is dropped; scaling by 1/(1-p) would put inf * 0 = NaN into the gradient.
            return constant(0.0, self.dtype(), self.dims(), loc);
        }
        let u = uniform(self.dims(), DType::F32, loc);
        let keep_p = p.into_tensor(DType::F32, loc).broadcast_at(self.dims(), loc);
        let keep = apply(Op::Compare(lazuli_hlo::Compare { dir: lazuli_hlo::CompareDir::Ge }), &[&u, &keep_p], loc);
        let scaled = self.binary_at(1.0 / (1.0 - p), BinaryKind::Mul, loc);
        let zero = constant(0.0, self.dtype(), self.dims(), loc);
        apply(Op::Select(lazuli_hlo::Select), &[&keep, &scaled, &zero], loc)
    }

    /// `self << by` on integers (broadcasting); shifting by the bit width or more gives 0.
    #[track_caller]
    pub fn shift_left(&self, by: impl Operand) -> Tensor {
        self.binary_at(by, BinaryKind::ShiftLeft, Loc::caller())
    }

    /// `self >> by` on integers, filling with zeros (also for signed types); by the bit width or more gives 0.
    #[track_caller]
    pub fn shift_right_logical(&self, by: impl Operand) -> Tensor {
        self.binary_at(by, BinaryKind::ShiftRightLogical, Loc::caller())
    }

    /// Reinterpret the bits of each element as `dtype` of the same width (e.g. `u32` → `f32`).
    #[track_caller]
    pub fn bitcast(&self, dtype: DType) -> Tensor {
        apply(Op::BitcastConvert(BitcastConvert { from: self.dtype(), to: dtype }), &[self], Loc::caller())
    }
}

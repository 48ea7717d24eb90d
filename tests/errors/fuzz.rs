//! A fuzz harness over the public API: random op sequences on random shapes, dtypes and values (valid and
//! invalid: empty and huge shapes, NaN and ±inf, out-of-range axes, slices and indices, mismatched operands).
//! Each case must either match the reference interpreter or fail with a clear error naming the test's line, and
//! never abort. Cases run in child processes (an abort or a signal takes only the child down; the parent then
//! finds the first failing case alone and prints it), from seeds, so a failure reproduces with
//! `LAZULI_FUZZ_SEEDS=N..N+1 cargo test --test errors -- --ignored --exact fuzz::fuzz_child --nocapture`.

use crate::common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::{child, Rng};
use lazuli::{DType, Tensor};

/// Cases per CI run (about 5 s on two cores), in children of this many cases each.
const CASES: u64 = 600;
const PER_CHILD: u64 = 200;

/// What a case did.
enum Outcome {
    /// Computed: the device's values and the reference interpreter's, as f64 (NaN for NaN).
    Values { got: Vec<f64>, want: Vec<f64>, dtype: DType },
    /// Refused at recording with a panic message.
    Refused(String),
    /// Recorded, but reading failed with an error.
    Failed(String),
}

struct Case {
    rng: Rng,
    log: Vec<String>,
    /// A bf16 value was computed on the way: XLA may keep more precision than bf16 in between (as JAX allows by
    /// default), while the reference rounds after every op, so the comparison uses bf16's tolerance.
    bf16: bool,
    /// An f32 value was computed on the way: an f64 result converted from it carries f32's rounding (a product's
    /// or a softmax's last bit, which XLA's order of summation and fast exponentials set), so the comparison
    /// uses f32's tolerance.
    f32: bool,
    /// The last op is an argmax of floats (its operand and axis): where rounding (bf16's, or XLA's excess precision)
    /// splits a near-tie, the device may pick another index than the reference, each right to its own rounding.
    argmax_of: Option<(Tensor, isize)>,
    /// A sum was taken on the way (a reduction, a product, a running sum): in bf16 its error follows the size of
    /// what was added, not of the result, so a sum that cancels is compared at the scale of the largest result.
    summed: bool,
    /// An exponential was taken of a bf16 sum: XLA's excess precision (the sum's addends kept in f32) and the
    /// reference's rounding after every op then differ by more than any fixed tolerance of the result, so only
    /// the kinds of the values are compared (finite, NaN, which infinity).
    amplified: bool,
    /// The last op was a product (elementwise or matmul) or a quotient (read by the next op).
    product: bool,
    /// A softmax of a product or quotient with values beyond 1e20: XLA contracts the product and the subtraction
    /// of the maximum into one fused multiply-add, whose one rounding leaves the shift off by up to 1e22 there and
    /// turns the row NaN (`docs/numerics.md`; JAX's jit gives the same). Its values are not compared.
    contracted: bool,
    /// A float was converted to an integer: a value that rounding puts on the other side of an integer moves by
    /// one, so integers are compared within 1.
    truncated: bool,
    /// A convolution with padding swept a kernel holding ±inf or NaN: XLA's CPU convolution for f32, f16 and
    /// bf16 multiplies the padded zeros by the kernel (0 × inf is NaN), its loop for f64 and small shapes leaves
    /// padded taps out as the reference does (`docs/numerics.md`), so a NaN of the device's is accepted there.
    padded_nonfinite: bool,
    /// The reference values of `argmax_of`'s operand, and its axis (nonnegative), taken before the device's read.
    argmax_values: Option<(ndarray::ArrayD<f64>, usize)>,
}

const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::I32, DType::BF16];

impl Case {
    fn pick(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    fn dims(&mut self) -> Vec<usize> {
        let rank = self.pick(4);
        (0..rank)
            .map(|_| {
                let choices = if self.pick(25) == 0 { 6 } else { 5 }; // now and then a vast dimension
                [0, 1, 2, 3, 5, 1 << 40][self.pick(choices)]
            })
            .collect()
    }

    /// A leaf of `dims` with values that are sometimes NaN, ±inf or huge.
    fn leaf(&mut self, dims: &[usize], dtype: DType) -> Tensor {
        self.bf16 |= dtype == DType::BF16;
        self.f32 |= dtype == DType::F32;
        let n: usize = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX);
        if n > 1 << 16 {
            // Host data of a huge shape is not allocated: an overflowing or vast shape goes through `zeros`.
            return Tensor::zeros(dims, dtype);
        }
        let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e30, -0.0, 300.0];
        let v: Vec<f64> = (0..n)
            .map(|_| if self.pick(8) == 0 { specials[self.pick(specials.len())] } else { self.rng.uniform(-3.0, 3.0) })
            .collect();
        let v: Vec<f64> =
            v.into_iter().map(|x| if dtype.is_float() { x } else { x.clamp(-1e6, 1e6).round() }).collect();
        common::tensor_of(dtype, &v.iter().map(|&x| dtype.round(x)).collect::<Vec<_>>(), dims)
    }

    /// One op on `x` (sometimes with a second operand); may panic, which is the point.
    fn step(&mut self, x: &Tensor) -> Tensor {
        let rank = x.rank() as isize;
        let axis = self.pick(x.rank() + 2) as isize - 1; // sometimes out of range
        self.argmax_of = None;
        let product = std::mem::take(&mut self.product);
        match self.pick(31) {
            21.. => self.step_more(x, axis, product),
            0 => {
                let f = self.pick(6);
                self.log.push(format!("unary {f}"));
                // An exponential of a bf16 sum multiplies its rounding error by the sum's size.
                self.amplified |= f == 0 && self.bf16 && self.summed;
                match f {
                    0 => x.exp(),
                    1 => x.log(),
                    2 => x.sqrt(),
                    3 => x.tanh(),
                    4 => x.abs(),
                    _ => x.neg(),
                }
            }
            1 | 2 => {
                let dims = if self.pick(4) == 0 { self.dims() } else { x.dims().to_vec() };
                let y = self.leaf(&dims, x.dtype());
                let f = self.pick(6);
                self.log.push(format!("binary {f} with {dims:?}"));
                self.product = matches!(f, 2 | 3);
                match f {
                    0 => x + &y,
                    1 => x - &y,
                    2 => x * &y,
                    3 => x / &y,
                    4 => x.maximum(&y),
                    _ => x.minimum(&y),
                }
            }
            3 => {
                let f = self.pick(4);
                self.log.push(format!("reduce {f} axis {axis}"));
                self.summed = true;
                match f {
                    0 => x.sum(&[axis]),
                    1 => x.max(&[axis]),
                    2 => x.min(&[axis]),
                    _ => x.mean(&[axis]),
                }
            }
            4 => {
                let dims: Vec<isize> = self.dims().iter().map(|&d| d as isize).collect();
                let dims = if self.pick(3) == 0 { vec![-1] } else { dims };
                self.log.push(format!("reshape {dims:?}"));
                x.reshape(&dims)
            }
            5 => {
                let mut perm: Vec<isize> = (0..rank).rev().collect();
                if self.pick(4) == 0 {
                    perm.push(0);
                }
                self.log.push(format!("permute {perm:?}"));
                x.permute(&perm)
            }
            6 => {
                let (start, end) = (self.pick(4), self.pick(6));
                self.log.push(format!("slice axis {axis} {start}..{end}"));
                x.slice(axis, start, end)
            }
            7 => {
                let n = self.pick(4);
                let ids: Vec<i32> = (0..n).map(|_| self.pick(8) as i32 - 2).collect();
                self.log.push(format!("index_select axis {axis} {ids:?}"));
                x.index_select(axis, &Tensor::from_slice(&ids, &[n]))
            }
            8 => {
                let dims = if self.pick(3) == 0 { self.dims() } else { x.dims().iter().rev().copied().collect() };
                let y = self.leaf(&dims, x.dtype());
                self.log.push(format!("matmul with {dims:?}"));
                self.summed = true;
                self.product = true; // a product over one element is an elementwise product to XLA
                x.matmul(&y)
            }
            9 => {
                let to = DTYPES[self.pick(DTYPES.len())];
                self.bf16 |= to == DType::BF16;
                self.f32 |= to == DType::F32;
                self.log.push(format!("to_dtype {to}"));
                self.truncated |= x.dtype().is_float() && !to.is_float();
                x.to_dtype(to)
            }
            10 => {
                self.log.push(format!("argmax axis {axis}"));
                let y = x.argmax(axis);
                self.argmax_of = x.dtype().is_float().then(|| (x.clone(), axis));
                y
            }
            11 => {
                self.log.push(format!("cumsum axis {axis}"));
                self.summed = true;
                x.cumsum(axis)
            }
            12 => {
                self.log.push(format!("softmax axis {axis}"));
                self.contracted |= product && beyond_1e20(x);
                x.softmax(axis)
            }
            13 => {
                let k = self.pick(6);
                if self.pick(2) == 0 {
                    self.log.push(format!("sort axis {axis}"));
                    x.sort(axis, k.is_multiple_of(2))
                } else {
                    self.log.push(format!("topk {k} axis {axis}"));
                    x.topk(k, axis).0
                }
            }
            14 => {
                let n = x.rank() + usize::from(self.pick(5) == 0); // now and then one pair too many
                let pads: Vec<(usize, usize)> = (0..n).map(|_| (self.pick(3), self.pick(3))).collect();
                self.log.push(format!("pad {pads:?}"));
                x.pad(&pads, 0.5)
            }
            15 => {
                let mut dims = x.dims().to_vec();
                if let Some(d) = dims.get_mut(axis.rem_euclid(rank.max(1)) as usize) {
                    *d = self.pick(4);
                }
                let dims = if self.pick(4) == 0 { self.dims() } else { dims };
                let y = self.leaf(&dims, x.dtype());
                self.log.push(format!("concat axis {axis} with {dims:?}"));
                Tensor::concat(&[x, &y], axis)
            }
            16 => {
                // Indices of the operand's shape (one size sometimes another), some out of range or negative.
                let mut dims = x.dims().to_vec();
                if let Some(d) = dims.get_mut(self.pick(rank.max(1) as usize)) {
                    *d = [*d, 1, 2][self.pick(3)];
                }
                let n: usize = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX);
                let ids = if n > 1 << 16 {
                    Tensor::zeros(&dims, DType::I64)
                } else {
                    let v: Vec<i64> = (0..n).map(|_| self.pick(9) as i64 - 3).collect();
                    Tensor::from_slice(&v, &dims)
                };
                self.log.push(format!("take_along_axis axis {axis} with {dims:?}"));
                x.take_along_axis(&ids, axis)
            }
            17 => {
                let (k, st) = ([1 + self.pick(3), 1 + self.pick(3)], [1 + self.pick(3), 1 + self.pick(3)]);
                self.summed = true;
                if self.pick(2) == 0 {
                    self.log.push(format!("max_pool2d {k:?} {st:?}"));
                    x.max_pool2d(k, st)
                } else {
                    self.log.push(format!("avg_pool2d {k:?} {st:?}"));
                    x.avg_pool2d(k, st)
                }
            }
            18 => {
                let n = x.dims().get(axis.rem_euclid(rank.max(1)) as usize).copied().unwrap_or(1).min(4);
                let ids: Vec<i64> = (0..n).map(|_| self.pick(7) as i64 - 2).collect();
                let mut dims = x.dims().to_vec();
                if let Some(d) = dims.get_mut(axis.rem_euclid(rank.max(1)) as usize) {
                    *d = n;
                }
                let updates = self.leaf(&dims, x.dtype());
                let ids = Tensor::from_slice(&ids, &[n]);
                let f = self.pick(5);
                self.log.push(format!("scatter {f} axis {axis} {ids:?}"));
                self.summed |= f < 2;
                match f {
                    0 => x.index_add(axis, &ids, &updates),
                    1 => x.scatter_add(axis, &ids, &updates),
                    2 => x.scatter(axis, &ids, &updates),
                    3 => x.scatter_max(axis, &ids, &updates),
                    _ => x.scatter_min(axis, &ids, &updates),
                }
            }
            19 => {
                let (lo, hi) = (self.rng.uniform(-2.0, 1.0), self.rng.uniform(-1.0, 2.0));
                self.log.push(format!("clamp {lo} {hi}"));
                x.clamp(lo, hi)
            }
            20 => {
                self.log.push(format!("layer_norm axis {axis}"));
                self.summed = true;
                x.layer_norm(&[axis], 0.1)
            }
        }
    }

    /// The ops after the first 21 (`step` holds those): what models record besides.
    fn step_more(&mut self, x: &Tensor, axis: isize, product: bool) -> Tensor {
        match self.pick(10) {
            0 => {
                let dims = self.dims();
                self.log.push(format!("broadcast_to {dims:?}"));
                x.broadcast_to(&dims)
            }
            1 => {
                let axes: Vec<isize> = (0..1 + self.pick(2)).map(|_| self.pick(x.rank() + 2) as isize - 1).collect();
                self.log.push(format!("flip {axes:?}"));
                x.flip(&axes)
            }
            2 => {
                let (start, end, step) = (self.pick(4), self.pick(6), self.pick(4)); // a step of 0 now and then
                self.log.push(format!("slice_step axis {axis} {start}..{end} by {step}"));
                x.slice_step(axis, start, end, step)
            }
            3 => {
                let f = self.pick(4);
                self.log.push(format!("nn {f} axis {axis}"));
                self.summed |= f < 2;
                self.amplified |= f < 2 && self.bf16;
                self.contracted |= f < 2 && product && beyond_1e20(x);
                match f {
                    0 => x.logsumexp(&[axis]),
                    1 => x.log_softmax(axis),
                    2 => x.gelu(),
                    _ => x.erf(),
                }
            }
            4 => {
                let k = self.pick(5) as isize - 2;
                self.log.push(format!("triangle {k}"));
                if self.pick(2) == 0 {
                    x.tril(k)
                } else {
                    x.triu(k)
                }
            }
            5 => {
                let (n, to) = (self.pick(5), DTYPES[self.pick(DTYPES.len())]);
                self.bf16 |= to == DType::BF16;
                self.log.push(format!("one_hot {n} {to}"));
                x.one_hot(n, to)
            }
            6 => self.convolution(x),
            7 => {
                let dims = if self.pick(4) == 0 { self.dims() } else { x.dims().to_vec() };
                let y = self.leaf(&dims, x.dtype());
                let f = self.pick(3);
                self.log.push(format!("stack {f} axis {axis} with {dims:?}"));
                match f {
                    0 => Tensor::stack(&[x, &y], axis),
                    1 => x.unsqueeze(axis),
                    _ => x.squeeze(axis),
                }
            }
            8 => {
                let sorts = self.pick(2) == 0;
                self.log.push(format!("{} axis {axis}", if sorts { "argsort" } else { "argmin" }));
                if sorts {
                    x.argsort(axis, self.pick(2) == 0)
                } else {
                    let y = x.argmin(axis);
                    self.argmax_of = x.dtype().is_float().then(|| (x.clone(), axis));
                    y
                }
            }
            _ => self.einsum(x),
        }
    }

    /// A 2-D convolution of `x` (made `[1, 1, 1, n]` now and then) by a random kernel; some shapes are refused.
    fn convolution(&mut self, x: &Tensor) -> Tensor {
        let input = if x.rank() == 4 || self.pick(3) == 0 { x.clone() } else { x.reshape(&[1, 1, 1, -1]) };
        let channels = input.dims().get(1).copied().unwrap_or(1);
        let dims = [1 + self.pick(2), [channels, 2][usize::from(self.pick(6) == 0)], self.pick(3), self.pick(3)];
        let weight = self.leaf(&dims, x.dtype());
        let (stride, padding) = ([self.pick(3), 1 + self.pick(2)], [self.pick(2), self.pick(2)]);
        let nonfinite = weight.evaluate_reference().is_ok_and(|a| a.iter().any(|v| !v.is_finite()));
        self.padded_nonfinite |= padding != [0, 0] && nonfinite;
        self.log.push(format!("conv2d with {dims:?} stride {stride:?} padding {padding:?}"));
        self.summed = true;
        self.product = true;
        input.conv2d(&weight, stride, padding)
    }

    /// An einsum of `x` with a second operand, by a spec from a list (some malformed, some not fitting `x`).
    fn einsum(&mut self, x: &Tensor) -> Tensor {
        const SPECS: [&str; 9] =
            ["ij,jk->ik", "ij,kj->ik", "i,i->", "ij,j->i", "bij,bjk->bik", "ij->ji", "ii->i", "ij,ij->", "i->ii"];
        let spec = SPECS[self.pick(SPECS.len())];
        let dims = if self.pick(3) == 0 { self.dims() } else { x.dims().iter().rev().copied().collect() };
        let y = self.leaf(&dims, x.dtype());
        self.log.push(format!("einsum {spec} with {dims:?}"));
        self.summed = true;
        self.product = spec.contains(',');
        let operands: Vec<&Tensor> = if spec.contains(',') { vec![x, &y] } else { vec![x] };
        lazuli::einsum(spec, &operands)
    }

    /// Record and read the case's program.
    fn run(&mut self) -> Outcome {
        let recorded = catch_unwind(AssertUnwindSafe(|| {
            let dims = self.dims();
            let dtype = DTYPES[self.pick(DTYPES.len())];
            self.log.push(format!("leaf {dtype}{dims:?}"));
            let mut x = self.leaf(&dims, dtype);
            for _ in 0..1 + self.pick(5) {
                x = self.step(&x);
            }
            x
        }));
        let x = match recorded {
            Ok(x) => x,
            Err(e) => {
                let msg =
                    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                return Outcome::Refused(msg.unwrap_or_default());
            }
        };
        // The reference first: reading computes the tensor and drops its recipe.
        let want = match x.evaluate_reference() {
            Ok(a) => a.iter().copied().collect(),
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        // Dropped before the read, so that the operand is not one more output of the device's program.
        if let Some((operand, axis)) = self.argmax_of.take() {
            let axis = if axis < 0 { axis + operand.rank() as isize } else { axis } as usize;
            self.argmax_values = operand.evaluate_reference().ok().map(|v| (v, axis));
        }
        match x.to_f64_vec() {
            Ok(got) => Outcome::Values { got, want, dtype: x.dtype() },
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// Whether the reference values of `x` hold a finite value beyond 1e20 (see `Case::contracted`).
fn beyond_1e20(x: &Tensor) -> bool {
    x.evaluate_reference().is_ok_and(|a| a.iter().any(|v| v.is_finite() && v.abs() > 1e20))
}

/// The dtype whose tolerance a result of `dtype` is compared with: the coarsest float computed on the way.
fn tolerance_of(case: &Case, dtype: DType) -> DType {
    match dtype {
        _ if case.bf16 => DType::BF16,
        DType::F64 if case.f32 => DType::F32,
        _ => dtype,
    }
}

/// Whether two results agree: equal, both NaN, or within the dtype's tolerance (XLA's fast transcendentals) of
/// each value's size, or with `at_largest` of the largest finite reference value's.
fn agree(got: &[f64], want: &[f64], dtype: DType, at_largest: bool) -> bool {
    let tol = match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 2e-5,
        DType::BF16 => 2e-2,
        _ => 0.0,
    };
    let largest = want.iter().filter(|w| w.is_finite()).fold(0.0f64, |m, w| m.max(w.abs()));
    let size = |g: f64, w: f64| if at_largest { largest.max(w.abs()).max(g.abs()) } else { w.abs().max(g.abs()) };
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(&g, &w)| (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + size(g, w)))
}

/// Whether the values agree as [`agree`] has it wherever the device's value is not NaN.
fn agree_but_device_nan(got: &[f64], want: &[f64], dtype: DType, at_largest: bool) -> bool {
    let (got_, want_): (Vec<f64>, Vec<f64>) = got.iter().zip(want).filter(|(g, _)| !g.is_nan()).unzip();
    got.len() == want.len() && agree(&got_, &want_, dtype, at_largest)
}

/// Whether each pair of values differs by at most 1 (or both are NaN).
fn within_one(got: &[f64], want: &[f64]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(&g, &w)| (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1.0)
}

/// Whether each pair of values is of one kind: both finite, both NaN, or the same infinity.
fn same_kinds(got: &[f64], want: &[f64]) -> bool {
    let kind = |v: f64| {
        if v.is_nan() {
            0.0
        } else if v.is_infinite() {
            v
        } else {
            1.0
        }
    };
    got.len() == want.len() && got.iter().zip(want).all(|(&g, &w)| kind(g) == kind(w))
}

/// Whether an argmax's indices that differ pick values within the tolerance of `dtype` of each other in every lane
/// of `values` along `axis` (the reference's values of the operand): a near-tie split by rounding. A NaN picked by
/// one side only is not one.
fn a_near_tie(got: &[f64], want: &[f64], (values, axis): &(ndarray::ArrayD<f64>, usize), dtype: DType) -> bool {
    let tol = if dtype == DType::BF16 { 2e-2 } else { 2e-5 };
    let lanes: Vec<_> = values.lanes(ndarray::Axis(*axis)).into_iter().collect();
    got.len() == want.len()
        && lanes.len() == want.len()
        && got.iter().zip(want).zip(&lanes).all(|((&g, &w), lane)| {
            let (Some(&a), Some(&b)) = (lane.get(g as usize), lane.get(w as usize)) else { return false };
            g == w || (!a.is_nan() && !b.is_nan() && (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs())))
        })
}

/// Whether the device's values `got` keep the promise against the reference's `want`: equal within the tolerance,
/// or different only as one of the case's flags allows.
fn accepted(case: &Case, got: &[f64], want: &[f64], dtype: DType) -> bool {
    let (tolerance, at_largest) = (tolerance_of(case, dtype), case.bf16 && case.summed);
    let near_tie = |v: &(ndarray::ArrayD<f64>, usize)| a_near_tie(got, want, v, tolerance_of(case, DType::F32));
    case.contracted
        || agree(got, want, tolerance, at_largest)
        || (case.amplified && same_kinds(got, want))
        || (case.truncated && within_one(got, want))
        || (case.padded_nonfinite && agree_but_device_nan(got, want, tolerance, at_largest))
        || case.argmax_values.as_ref().is_some_and(near_tie)
}

/// The verdict on one seed: `None` when it kept lazuli's promise; `tally` counts computed, refused and failed
/// cases.
fn check(seed: u64, tally: &mut [usize; 3]) -> Option<String> {
    let mut case = Case {
        rng: Rng::new(seed),
        log: Vec::new(),
        bf16: false,
        f32: false,
        summed: false,
        amplified: false,
        product: false,
        contracted: false,
        truncated: false,
        padded_nonfinite: false,
        argmax_of: None,
        argmax_values: None,
    };
    let outcome = case.run();
    tally[match outcome {
        Outcome::Values { .. } => 0,
        Outcome::Refused(_) => 1,
        Outcome::Failed(_) => 2,
    }] += 1;
    let problem = match &outcome {
        Outcome::Values { got, want, dtype } if !accepted(&case, got, want, *dtype) => {
            format!("device {got:?} but reference {want:?} ({dtype})")
        }
        Outcome::Refused(msg) if !(msg.starts_with("lazuli") && msg.contains("tests/errors/fuzz.rs:")) => {
            format!("refused without naming the line: {msg:?}")
        }
        Outcome::Failed(msg) if !msg.contains("tests/errors/fuzz.rs:") => {
            format!("failed without naming the line: {msg}")
        }
        _ => return None,
    };
    Some(format!("seed {seed}: {problem}\n  program: {}", case.log.join("; ")))
}

/// The cases of `LAZULI_FUZZ_SEEDS=a..b`, run by the parent test in a child process.
#[test]
#[ignore = "run by fuzz_never_aborts_and_matches_the_reference in a child process"]
fn fuzz_child() {
    let seeds = std::env::var("LAZULI_FUZZ_SEEDS").expect("LAZULI_FUZZ_SEEDS=a..b");
    let (a, b) = seeds.split_once("..").expect("a..b");
    let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // refusals are expected; their messages are checked
    let mut tally = [0; 3];
    let failures: Vec<String> = (a..b).filter_map(|seed| check(seed, &mut tally)).collect();
    std::panic::set_hook(quiet);
    println!("cases {a}..{b}: {} computed, {} refused at recording, {} failed when read", tally[0], tally[1], tally[2]);
    assert!(failures.is_empty(), "{} of {} cases broke a promise:\n{}", failures.len(), b - a, failures.join("\n"));
}

#[test]
fn fuzz_never_aborts_and_matches_the_reference() {
    let fuzz_child = child::test_name(module_path!(), "fuzz_child");
    let mut problems = Vec::new();
    for start in (0..CASES).step_by(PER_CHILD as usize) {
        let seeds = format!("{start}..{}", start + PER_CHILD);
        let out = child::run(&fuzz_child, &[("LAZULI_FUZZ_SEEDS", seeds.as_str()), ("LAZULI_COMPILE_CACHE", "off")]);
        if out.status.success() {
            assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the child ran the cases");
            continue;
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        if out.status.code() == Some(101) && stdout.contains("broke a promise") {
            problems.push(
                stdout
                    .lines()
                    .filter(|l| l.starts_with("seed ") || l.starts_with("  program"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
            continue;
        }
        // The child died (an abort, a signal): find the case, alone in a child of its own.
        let culprit = (start..start + PER_CHILD).find(|s| {
            let one = format!("{s}..{}", s + 1);
            let out = child::run(&fuzz_child, &[("LAZULI_FUZZ_SEEDS", one.as_str()), ("LAZULI_COMPILE_CACHE", "off")]);
            !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("broke a promise")
        });
        problems.push(format!("seeds {seeds}: a child died ({}), first at seed {culprit:?}", out.status));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

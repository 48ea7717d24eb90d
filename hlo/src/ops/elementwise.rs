//! Elementwise ops: unary math, binary arithmetic, comparisons, select and convert. Operands have identical
//! shapes here; numpy broadcasting is made explicit by the recorder (`broadcast_in_dim`) before these see them.
//!
//! Numerics (`docs/numerics.md`), the same on every device and in the reference:
//! - integer add, sub, mul, neg and abs wrap (two's complement); the reference computes them in integers;
//! - integer division truncates; `x / 0` is all ones (-1 signed, the maximum unsigned) and `MIN / -1` is `MIN`,
//!   both made explicit in the lowering (XLA's CPU emitter does the same, but StableHLO leaves them open);
//! - `max` and `min` propagate NaN (the runtime turns XLA's fast min/max off, as JAX does); their gradient goes to
//!   the operand the result came from (the left one on ties), and is NaN for a NaN operand, 0 for the other;
//! - comparisons are IEEE: with a NaN, `eq`, `lt`, `le`, `gt`, `ge` are false and `ne` is true;
//! - float → integer `convert` truncates toward zero, saturates at the type's bounds (±inf too) and maps NaN to 0
//!   (JAX's `astype`), made explicit in the lowering; integer → integer wraps; x → bool is `x != 0`.

use crate::infer_error::InferError;
use ndarray::{ArrayD, Zip};

use crate::builder::Builder;
use crate::dtype::{DType, TensorType};
use crate::emit::LowerCx;
use crate::op::{arity, OpRules};

/// A unary elementwise op (a step of a fused expression; `Tensor` has a method for each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryKind {
    /// `-x`.
    Neg,
    /// `|x|`.
    Abs,
    /// `e^x` (floating point).
    Exp,
    /// Natural logarithm (floating point).
    Log,
    /// Square root (floating point).
    Sqrt,
    /// `1 / sqrt(x)` (floating point).
    Rsqrt,
    /// Hyperbolic tangent (floating point).
    Tanh,
    /// Sine (floating point).
    Sin,
    /// Cosine (floating point).
    Cos,
    /// The logistic sigmoid `1 / (1 + e^-x)` (floating point).
    Logistic,
}

/// One row per unary op: name, StableHLO op, whether it needs a float operand, and its reference.
fn unary_row(k: UnaryKind) -> (&'static str, &'static str, bool, fn(f64) -> f64) {
    use UnaryKind::*;
    match k {
        Neg => ("neg", "stablehlo.negate", false, |x| -x),
        Abs => ("abs", "stablehlo.abs", false, f64::abs),
        Exp => ("exp", "stablehlo.exponential", true, f64::exp),
        Log => ("log", "stablehlo.log", true, f64::ln),
        Sqrt => ("sqrt", "stablehlo.sqrt", true, f64::sqrt),
        Rsqrt => ("rsqrt", "stablehlo.rsqrt", true, |x| 1.0 / x.sqrt()),
        Tanh => ("tanh", "stablehlo.tanh", true, f64::tanh),
        Sin => ("sin", "stablehlo.sine", true, f64::sin),
        Cos => ("cos", "stablehlo.cosine", true, f64::cos),
        Logistic => ("sigmoid", "stablehlo.logistic", true, |x| 1.0 / (1.0 + (-x).exp())),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Unary {
    pub kind: UnaryKind,
}

impl OpRules for Unary {
    fn name(&self) -> &'static str {
        unary_row(self.kind).0
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let (name, _, float_only, _) = unary_row(self.kind);
        arity(name, operands, 1)?;
        let t = operands[0];
        if float_only && !t.dtype.is_float() {
            return Err(InferError::DType(format!("{name} needs a floating-point operand, got {t}")));
        }
        // StableHLO's negate and abs reject unsigned integers.
        let signed_only = matches!(self.kind, UnaryKind::Neg | UnaryKind::Abs);
        if t.dtype == DType::Bool || (signed_only && !t.dtype.is_signed()) {
            return Err(InferError::DType(format!("{name} is not defined for {t}")));
        }
        Ok(t.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args(unary_row(self.kind).1, "")
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let t = out.dtype;
        match self.kind {
            // In integers, so that `-MIN` and `abs(MIN)` wrap to `MIN` for i64 too (f64 would saturate them).
            UnaryKind::Neg if t.is_int() => x[0].mapv(|v| t.wrap(-t.to_int(v))),
            UnaryKind::Abs if t.is_int() => x[0].mapv(|v| t.wrap(t.to_int(v).abs())),
            k => x[0].mapv(unary_row(k).3),
        }
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        use UnaryKind::*;
        let x = &x[0];
        let dx = match self.kind {
            Neg => b.neg(g),
            Abs => {
                let zero = b.full_like(x, 0.0);
                let neg = b.neg(g);
                let p = b.compare(CompareDir::Ge, x, &zero);
                b.select(&p, g, &neg)
            }
            Exp => b.mul(g, out),
            Log => b.div(g, x),
            // d sqrt(x) = 1 / (2 sqrt(x))
            Sqrt => {
                let two_out = b.scale(out, 2.0);
                b.div(g, &two_out)
            }
            // d x^-1/2 = -1/2 x^-3/2 = -out / (2x)
            Rsqrt => {
                let t = b.div(out, x);
                let t = b.scale(&t, -0.5);
                b.mul(g, &t)
            }
            Tanh => {
                let sq = b.mul(out, out);
                let one = b.full_like(out, 1.0);
                let d = b.sub(&one, &sq);
                b.mul(g, &d)
            }
            Sin => {
                let c = b.unary(Cos, x);
                b.mul(g, &c)
            }
            Cos => {
                let s = b.unary(Sin, x);
                let ns = b.neg(&s);
                b.mul(g, &ns)
            }
            Logistic => {
                let one = b.full_like(out, 1.0);
                let d = b.sub(&one, out);
                let d = b.mul(out, &d);
                b.mul(g, &d)
            }
        };
        vec![Some(dx)]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::elementwise(x, out)
    }
}

/// A binary elementwise op (a step of a fused expression; `Tensor` has a method or operator for each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryKind {
    /// `a + b` (integers wrap).
    Add,
    /// `a - b` (integers wrap).
    Sub,
    /// `a * b` (integers wrap).
    Mul,
    /// `a / b` (integers truncate; see docs/numerics.md for division by zero).
    Div,
    /// The larger of `a` and `b`; NaN if either is NaN.
    Max,
    /// The smaller of `a` and `b`; NaN if either is NaN.
    Min,
    /// `a` to the power `b`.
    Pow,
    /// Logical and of bools, bitwise and of integers.
    And,
    /// Logical or of bools, bitwise or of integers.
    Or,
    /// Bit shifts of integers; a shift by the bit width or more gives 0.
    ShiftLeft,
    /// Logical right shift: zeros come in from the left.
    ShiftRightLogical,
}

/// Which element types a binary op accepts.
#[derive(Clone, Copy, PartialEq)]
enum Accepts {
    Numbers,
    Any,
    Logical,
    Integers,
}

type BinaryRow = (&'static str, &'static str, Accepts, fn(f64, f64, DType) -> f64);

/// One row per binary op: name, StableHLO op, accepted types, reference (the dtype decides integer division).
fn binary_row(k: BinaryKind) -> BinaryRow {
    use BinaryKind::*;
    match k {
        Add => ("add", "stablehlo.add", Accepts::Numbers, |a, b, t| int_or(t, a, b, |x, y| x + y, a + b)),
        Sub => ("sub", "stablehlo.subtract", Accepts::Numbers, |a, b, t| int_or(t, a, b, |x, y| x - y, a - b)),
        // i128's wrapping product keeps the low 64 bits exact, which is all `wrap` reads.
        Mul => ("mul", "stablehlo.multiply", Accepts::Numbers, |a, b, t| int_or(t, a, b, i128::wrapping_mul, a * b)),
        Div => ("div", "stablehlo.divide", Accepts::Numbers, |a, b, t| int_or(t, a, b, int_div, a / b)),
        Max => (
            "max",
            "stablehlo.maximum",
            Accepts::Any,
            |a, b, _| {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.max(b)
                }
            },
        ),
        Min => (
            "min",
            "stablehlo.minimum",
            Accepts::Any,
            |a, b, _| {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.min(b)
                }
            },
        ),
        Pow => ("pow", "stablehlo.power", Accepts::Numbers, |a, b, _| a.powf(b)),
        And => ("and", "stablehlo.and", Accepts::Logical, |a, b, t| logical(a, b, t, |x, y| x & y)),
        Or => ("or", "stablehlo.or", Accepts::Logical, |a, b, t| logical(a, b, t, |x, y| x | y)),
        ShiftLeft => ("shift_left", "stablehlo.shift_left", Accepts::Integers, |a, b, t| shift(a, b, t, true)),
        ShiftRightLogical => {
            ("shift_right_logical", "stablehlo.shift_right_logical", Accepts::Integers, |a, b, t| shift(a, b, t, false))
        }
    }
}

/// `d` with NaN wherever `x` is NaN: the cotangent of a NaN operand of max and min (reductions, elementwise,
/// pooling), whose derivative there is undefined, so that the NaN shows in the gradient (`docs/numerics.md`).
pub(crate) fn nan_where_nan<B: Builder>(b: &mut B, x: &B::V, d: &B::V) -> B::V {
    let nan = b.compare(CompareDir::Ne, x, x);
    b.select(&nan, x, d)
}

/// An arithmetic reference: on integer types `int` in exact integers, wrapped to the type (f64 would round products
/// of 32-bit operands before wrapping); on floats the f64 result.
fn int_or(t: DType, a: f64, b: f64, int: fn(i128, i128) -> i128, float: f64) -> f64 {
    if t.is_int() {
        t.wrap(int(t.to_int(a), t.to_int(b)))
    } else {
        float
    }
}

/// Integer division as lazuli defines it: truncating; `x / 0` is -1 (all ones once wrapped to the type); `MIN / -1`
/// is 2^(n-1), which wraps to `MIN`.
fn int_div(a: i128, b: i128) -> i128 {
    if b == 0 {
        -1
    } else {
        a / b
    }
}

/// A shift on the `t`-wide bit pattern of `a` (two's complement for signed types), read back as `t`.
fn shift(a: f64, by: f64, t: DType, left: bool) -> f64 {
    let bits = 8 * t.byte_size() as u32;
    let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
    let pattern = (a as i128 as u64) & mask;
    let by = by as i128;
    let shifted = if by < 0 || by >= bits as i128 {
        0
    } else if left {
        (pattern << by) & mask
    } else {
        pattern >> by
    };
    let sign_bit = 1u64 << (bits - 1);
    if t.is_signed() && shifted & sign_bit != 0 {
        (shifted as i128 - (mask as i128 + 1)) as f64
    } else {
        shifted as f64
    }
}

fn logical(a: f64, b: f64, _t: DType, f: fn(i64, i64) -> i64) -> f64 {
    f(a as i64, b as i64) as f64
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Binary {
    pub kind: BinaryKind,
}

/// Both operands of an elementwise op must have one type; the message shows both.
fn same_type(name: &str, a: &TensorType, b: &TensorType) -> Result<(), InferError> {
    let message = || format!("{name}: operand types differ: {a} vs {b}");
    if a == b {
        Ok(())
    } else if a.dtype != b.dtype {
        Err(InferError::DType(message()))
    } else {
        Err(InferError::Shape(message()))
    }
}

impl OpRules for Binary {
    fn name(&self) -> &'static str {
        binary_row(self.kind).0
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let (name, _, accepts, _) = binary_row(self.kind);
        arity(name, operands, 2)?;
        same_type(name, operands[0], operands[1])?;
        let dt = operands[0].dtype;
        let ok = match accepts {
            Accepts::Numbers => dt != DType::Bool,
            Accepts::Any => true,
            Accepts::Logical => !dt.is_float(),
            Accepts::Integers => dt.is_int(),
        };
        if !ok {
            return Err(InferError::DType(format!("{name} is not defined for {}", operands[0])));
        }
        Ok(operands[0].clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        if self.kind == BinaryKind::Div && cx.arg_ty(0).dtype.is_int() {
            return lower_int_div(cx);
        }
        cx.op_on_args(binary_row(self.kind).1, "")
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let f = binary_row(self.kind).3;
        let dt = out.dtype;
        Zip::from(x[0]).and(x[1]).map_collect(|&a, &b| f(a, b, dt))
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], out: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        use BinaryKind::*;
        let (l, r) = (&x[0], &x[1]);
        let (want_l, want_r) = (b.needs_grad(l), b.needs_grad(r));
        // Only the cotangents that are wanted are recorded (a constant factor's would be dead nodes).
        let (dl, dr) = match self.kind {
            Add => (g.clone(), g.clone()),
            Sub => {
                let dr = want_r.then(|| b.neg(g));
                return vec![Some(g.clone()), dr];
            }
            Mul => {
                let dl = want_l.then(|| b.mul(g, r));
                let dr = want_r.then(|| b.mul(g, l));
                return vec![dl, dr];
            }
            // d(l/r) = g/r, -g l/r² = -g out/r
            Div => {
                let dl = b.div(g, r);
                if !want_r {
                    return vec![Some(dl), None];
                }
                let t = b.mul(&dl, out);
                (dl, b.neg(&t))
            }
            // The gradient goes to the operand the result came from, the left one on ties (a subgradient choice).
            // A NaN result does not depend on the other operand (0); a NaN operand's derivative is NaN.
            Max | Min => {
                let dir = if self.kind == Max { CompareDir::Ge } else { CompareDir::Le };
                let mut p = b.compare(dir, l, r);
                let float = b.ty(l).dtype.is_float();
                if float {
                    let nan = b.compare(CompareDir::Ne, l, l);
                    p = b.binary(Or, &p, &nan);
                }
                let zero = b.full_like(g, 0.0);
                let (dl, dr) = (b.select(&p, g, &zero), b.select(&p, &zero, g));
                if !float {
                    return vec![Some(dl), Some(dr)];
                }
                (nan_where_nan(b, l, &dl), nan_where_nan(b, r, &dr))
            }
            // d l^r = r l^(r-1) dl + ln(l) l^r dr; the log term is taken as 0 where l ≤ 0.
            Pow => {
                let one = b.full_like(r, 1.0);
                let rm1 = b.sub(r, &one);
                let p = b.binary(Pow, l, &rm1);
                let dl = b.mul(&p, r);
                let dl = b.mul(g, &dl);
                let zero = b.full_like(l, 0.0);
                let pos = b.compare(CompareDir::Gt, l, &zero);
                let safe = b.select(&pos, l, &one);
                let ln = b.unary(UnaryKind::Log, &safe);
                let dr = b.mul(&ln, out);
                let dr = b.mul(g, &dr);
                (dl, b.mask(&pos, &dr))
            }
            And | Or | ShiftLeft | ShiftRightLogical => return vec![None, None],
        };
        vec![Some(dl), Some(dr)]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::elementwise(x, out)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareDir {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareDir {
    fn row(self) -> (&'static str, &'static str, fn(f64, f64) -> bool) {
        match self {
            CompareDir::Eq => ("eq", "EQ", |a, b| a == b),
            CompareDir::Ne => ("ne", "NE", |a, b| a != b),
            CompareDir::Lt => ("lt", "LT", |a, b| a < b),
            CompareDir::Le => ("le", "LE", |a, b| a <= b),
            CompareDir::Gt => ("gt", "GT", |a, b| a > b),
            CompareDir::Ge => ("ge", "GE", |a, b| a >= b),
        }
    }
}

/// An elementwise comparison. Floats compare as IEEE: any comparison with a NaN is false except `ne`, which is
/// true (StableHLO's `FLOAT` comparison type; Rust's operators in the reference).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Compare {
    pub dir: CompareDir,
}

impl OpRules for Compare {
    fn name(&self) -> &'static str {
        self.dir.row().0
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        let name = self.name();
        arity(name, operands, 2)?;
        same_type(name, operands[0], operands[1])?;
        Ok(operands[0].with_dtype(DType::Bool))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        let ct = cx.arg_ty(0).dtype.compare_type();
        let attrs = format!(
            "comparison_direction = #stablehlo<comparison_direction {}>, compare_type = #stablehlo<comparison_type {ct}>",
            self.dir.row().1
        );
        cx.op_on_args("stablehlo.compare", &attrs)
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let f = self.dir.row().2;
        Zip::from(x[0]).and(x[1]).map_collect(|&a, &b| f(a, b) as u8 as f64)
    }
    fn vjp<B: Builder>(&self, _: &mut B, _: &[B::V], _: &B::V, _: &B::V) -> Vec<Option<B::V>> {
        vec![None, None]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::elementwise(x, out)
    }
}

/// `where(pred, on_true, on_false)`, all one shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Select;

impl OpRules for Select {
    fn name(&self) -> &'static str {
        "select"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("select", operands, 3)?;
        let (p, a, b) = (operands[0], operands[1], operands[2]);
        if p.dtype != DType::Bool || p.dims != a.dims {
            let message = format!("select: the predicate must be bool of the operands' shape, got {p} for {a}");
            return Err(if p.dtype != DType::Bool { InferError::DType(message) } else { InferError::Shape(message) });
        }
        same_type("select", a, b)?;
        Ok(a.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args("stablehlo.select", "")
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        Zip::from(x[0]).and(x[1]).and(x[2]).map_collect(|&p, &a, &b| if p != 0.0 { a } else { b })
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let zero = b.full_like(g, 0.0);
        let dt = b.needs_grad(&x[1]).then(|| b.select(&x[0], g, &zero));
        let df = b.needs_grad(&x[2]).then(|| b.select(&x[0], &zero, g));
        vec![None, dt, df]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::elementwise(x, out)
    }
}

/// Element type conversion: floats round to nearest even; float → integer truncates toward zero, saturates at the
/// type's bounds and maps NaN to 0 (`DType::convert_float`); integer → integer wraps; x → bool is `x != 0`.
/// It carries its operand's type too, so the reference can tell an integer narrowing (which wraps) from a float
/// conversion (which saturates).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Convert {
    pub from: DType,
    pub to: DType,
}

impl OpRules for Convert {
    fn name(&self) -> &'static str {
        "convert"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, InferError> {
        arity("convert", operands, 1)?;
        if operands[0].dtype != self.from {
            return Err(InferError::DType(format!("convert from {} got {}", self.from, operands[0])));
        }
        Ok(operands[0].with_dtype(self.to))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        match cx.arg_ty(0).dtype.int_range_in(self.to) {
            Some(range) => lower_float_to_int(cx, self.to, range),
            None => cx.op_on_args("stablehlo.convert", ""),
        }
    }
    /// Integer → integer wraps (`DType::round` keeps the low bits); from a float or bool, the float rule.
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let to = self.to;
        if self.from.is_int() && to.is_int() {
            return x[0].mapv(|v| to.round(v));
        }
        x[0].mapv(|v| to.convert_float(v))
    }
    fn vjp<B: Builder>(&self, b: &mut B, x: &[B::V], _: &B::V, g: &B::V) -> Vec<Option<B::V>> {
        let from = b.ty(&x[0]).dtype;
        if !from.is_float() || !self.to.is_float() {
            return vec![None];
        }
        vec![Some(b.convert(g, from))]
    }
    fn shard(&self, x: &[crate::shard::ShardIn<'_>], out: &TensorType) -> Option<crate::shard::DimShards> {
        crate::shard::elementwise(x, out)
    }
}

/// A splat constant of type `ty` holding `v`.
fn splat(cx: &mut LowerCx<'_>, ty: &TensorType, v: f64) -> String {
    let attrs = format!("value = dense<{}> : {}", ty.dtype.literal(v), ty.mlir());
    cx.op("stablehlo.constant", &[], &[], &attrs, None, ty)
}

/// `compare(a, b)` of two values of type `ty`.
fn compare(cx: &mut LowerCx<'_>, dir: &str, a: &str, b: &str, ty: &TensorType) -> String {
    let attrs = format!(
        "comparison_direction = #stablehlo<comparison_direction {dir}>, compare_type = #stablehlo<comparison_type {}>",
        ty.dtype.compare_type()
    );
    cx.op("stablehlo.compare", &[a.to_string(), b.to_string()], &[ty, ty], &attrs, None, &ty.with_dtype(DType::Bool))
}

/// `select(p, a, b)` over values of type `ty`.
fn select(cx: &mut LowerCx<'_>, p: &str, a: &str, b: &str, ty: &TensorType) -> String {
    let pt = ty.with_dtype(DType::Bool);
    cx.op("stablehlo.select", &[p.to_string(), a.to_string(), b.to_string()], &[&pt, ty, ty], "", None, ty)
}

/// Integer division with its edge cases spelled out, so that no device's choice shows: a zero divisor (and
/// `MIN / -1`, which traps on x86) is replaced by 1 before dividing, then `x / 0` becomes all ones. `MIN / 1` is
/// `MIN`, the wrapped quotient.
fn lower_int_div(cx: &mut LowerCx<'_>) -> String {
    let ty = cx.arg_ty(0).clone();
    let (a, b) = (cx.arg(0).to_string(), cx.arg(1).to_string());
    let zero = splat(cx, &ty, 0.0);
    let by_zero = compare(cx, "EQ", &b, &zero, &ty);
    let mut bad_divisor = by_zero.clone();
    if ty.dtype.is_signed() {
        let (min, minus_one) = (splat(cx, &ty, ty.dtype.lowest()), splat(cx, &ty, -1.0));
        let a_min = compare(cx, "EQ", &a, &min, &ty);
        let b_minus_one = compare(cx, "EQ", &b, &minus_one, &ty);
        let pt = ty.with_dtype(DType::Bool);
        let overflow = cx.op("stablehlo.and", &[a_min, b_minus_one], &[&pt, &pt], "", None, &pt);
        bad_divisor = cx.op("stablehlo.or", &[by_zero.clone(), overflow], &[&pt, &pt], "", None, &pt);
    }
    let one = splat(cx, &ty, 1.0);
    let divisor = select(cx, &bad_divisor, &one, &b, &ty);
    let q = cx.op("stablehlo.divide", &[a, divisor], &[&ty, &ty], "", None, &ty);
    let all_ones = splat(cx, &ty, ty.dtype.wrap(-1));
    select(cx, &by_zero, &all_ones, &q, &ty)
}

/// Float → integer conversion with lazuli's semantics on any device: clamp into the range both types hold, convert
/// (in range now, so it only truncates), then set values beyond a bound the float type cannot hold exactly to that
/// bound, and NaN to 0. XLA's CPU emitter saturates the same way, but StableHLO leaves out-of-range conversions open.
fn lower_float_to_int(cx: &mut LowerCx<'_>, to: DType, (lo, hi): (f64, f64)) -> String {
    let from = cx.arg_ty(0).clone();
    let out = from.with_dtype(to);
    let x = cx.arg(0).to_string();
    let scalar = TensorType::scalar(from.dtype);
    let (lo_c, hi_c) = (splat(cx, &scalar, lo), splat(cx, &scalar, hi));
    let clamped = cx.op("stablehlo.clamp", &[lo_c, x.clone(), hi_c], &[&scalar, &from, &scalar], "", None, &from);
    let mut r = cx.op("stablehlo.convert", &[clamped], &[&from], "", None, &out);
    // Bounds the float type cannot hold exactly (i32::MAX in f32, i32::MIN in f16): compare with the nearest
    // float inside and saturate beyond it.
    for (dir, bound, reached) in [("GT", hi, hi >= to.highest()), ("LT", lo, lo <= to.lowest())] {
        if !reached {
            let b = splat(cx, &from, bound);
            let beyond = compare(cx, dir, &x, &b, &from);
            let sat = splat(cx, &out, if dir == "GT" { to.highest() } else { to.lowest() });
            r = select(cx, &beyond, &sat, &r, &out);
        }
    }
    let nan = compare(cx, "NE", &x, &x, &from);
    let zero = splat(cx, &out, 0.0);
    select(cx, &nan, &zero, &r, &out)
}

//! Elementwise ops: unary math, binary arithmetic, comparisons, select and convert. Operands have identical
//! shapes here; numpy broadcasting is made explicit by the recorder (`broadcast_in_dim`) before these see them.

use ndarray::{ArrayD, Zip};

use crate::dtype::{DType, TensorType};
use crate::emit::LowerCx;
use crate::op::{arity, OpRules};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryKind {
    Neg,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sin,
    Cos,
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
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, String> {
        let (name, _, float_only, _) = unary_row(self.kind);
        arity(name, operands, 1)?;
        let t = operands[0];
        if float_only && !t.dtype.is_float() {
            return Err(format!("{name} needs a floating-point operand, got {t}"));
        }
        if t.dtype == DType::Bool || (self.kind == UnaryKind::Neg && t.dtype == DType::U8) {
            return Err(format!("{name} is not defined for {t}"));
        }
        Ok(t.clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args(unary_row(self.kind).1, "")
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        x[0].mapv(unary_row(self.kind).3)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
    And,
    Or,
}

/// Which element types a binary op accepts.
#[derive(Clone, Copy, PartialEq)]
enum Accepts {
    Numbers,
    Any,
    Logical,
}

/// One row per binary op: name, StableHLO op, accepted types, reference (the dtype decides integer division).
fn binary_row(k: BinaryKind) -> (&'static str, &'static str, Accepts, fn(f64, f64, DType) -> f64) {
    use BinaryKind::*;
    match k {
        Add => ("add", "stablehlo.add", Accepts::Numbers, |a, b, _| a + b),
        Sub => ("sub", "stablehlo.subtract", Accepts::Numbers, |a, b, _| a - b),
        Mul => ("mul", "stablehlo.multiply", Accepts::Numbers, |a, b, _| a * b),
        Div => {
            ("div", "stablehlo.divide", Accepts::Numbers, |a, b, t| if t.is_float() { a / b } else { (a / b).trunc() })
        }
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
fn same_type(name: &str, a: &TensorType, b: &TensorType) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("{name}: operand types differ: {a} vs {b}"))
    }
}

impl OpRules for Binary {
    fn name(&self) -> &'static str {
        binary_row(self.kind).0
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, String> {
        let (name, _, accepts, _) = binary_row(self.kind);
        arity(name, operands, 2)?;
        same_type(name, operands[0], operands[1])?;
        let dt = operands[0].dtype;
        let ok = match accepts {
            Accepts::Numbers => dt != DType::Bool,
            Accepts::Any => true,
            Accepts::Logical => !dt.is_float(),
        };
        if !ok {
            return Err(format!("{name} is not defined for {}", operands[0]));
        }
        Ok(operands[0].clone())
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args(binary_row(self.kind).1, "")
    }
    fn reference(&self, out: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let f = binary_row(self.kind).3;
        let dt = out.dtype;
        Zip::from(x[0]).and(x[1]).map_collect(|&a, &b| f(a, b, dt))
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

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Compare {
    pub dir: CompareDir,
}

impl OpRules for Compare {
    fn name(&self) -> &'static str {
        self.dir.row().0
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, String> {
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
}

/// `where(pred, on_true, on_false)`, all one shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Select;

impl OpRules for Select {
    fn name(&self) -> &'static str {
        "select"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, String> {
        arity("select", operands, 3)?;
        let (p, a, b) = (operands[0], operands[1], operands[2]);
        if p.dtype != DType::Bool || p.dims != a.dims {
            return Err(format!("select: the predicate must be bool of the operands' shape, got {p} for {a}"));
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
}

/// Element type conversion (floats round to nearest even, float → int truncates, x → bool is `x != 0`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Convert {
    pub to: DType,
}

impl OpRules for Convert {
    fn name(&self) -> &'static str {
        "convert"
    }
    fn infer(&self, operands: &[&TensorType]) -> Result<TensorType, String> {
        arity("convert", operands, 1)?;
        Ok(operands[0].with_dtype(self.to))
    }
    fn lower(&self, cx: &mut LowerCx<'_>) -> String {
        cx.op_on_args("stablehlo.convert", "")
    }
    fn reference(&self, _: &TensorType, x: &[&ArrayD<f64>]) -> ArrayD<f64> {
        let to = self.to;
        x[0].mapv(|v| to.round(v))
    }
}

//! A small builder of Triton IR (TTIR) as MLIR text, in the syntax Triton 3.6 prints and parses.
//!
//! A [`Kernel`] holds one `tt.func` being written: its pointer arguments and its body. Each op method appends
//! one line and returns the SSA [`Value`] it defines, which carries its [`Type`] so that the next op can print
//! its operand types and check shapes. Regions (`scf.for`, `scf.if`, the combiner of `tt.reduce`) are
//! written by closures that receive the kernel and return what their terminator yields.
//!
//! The builder knows nothing about any particular kernel. It checks what a wrong generator would get wrong
//! (mismatched shapes or element types) with assertions: those panics are bugs of the generator, never of its
//! caller, and every generator's tests run all its paths.

use std::fmt;

/// A number type of TTIR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    I1,
    I32,
    I64,
    F16,
    BF16,
    F32,
}

impl Scalar {
    pub fn mlir(self) -> &'static str {
        match self {
            Scalar::I1 => "i1",
            Scalar::I32 => "i32",
            Scalar::I64 => "i64",
            Scalar::F16 => "f16",
            Scalar::BF16 => "bf16",
            Scalar::F32 => "f32",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Scalar::F16 | Scalar::BF16 | Scalar::F32)
    }

    /// Size of one element in bytes (an `i1` takes a byte in memory).
    pub fn bytes(self) -> usize {
        match self {
            Scalar::I1 => 1,
            Scalar::F16 | Scalar::BF16 => 2,
            Scalar::I32 | Scalar::F32 => 4,
            Scalar::I64 => 8,
        }
    }
}

/// What one element of a value is: a number, or a pointer to numbers in global memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    Num(Scalar),
    Ptr(Scalar),
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Num(s) => f.write_str(s.mlir()),
            Elem::Ptr(s) => write!(f, "!tt.ptr<{}>", s.mlir()),
        }
    }
}

/// A scalar (empty shape) or a tensor (a block of a kernel instance) of [`Elem`]s.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    pub elem: Elem,
    pub shape: Vec<usize>,
}

impl Type {
    pub fn scalar(s: Scalar) -> Type {
        Type { elem: Elem::Num(s), shape: Vec::new() }
    }

    pub fn tensor(s: Scalar, shape: &[usize]) -> Type {
        Type { elem: Elem::Num(s), shape: shape.to_vec() }
    }

    /// Another shape with the same element.
    pub fn with_shape(&self, shape: &[usize]) -> Type {
        Type { elem: self.elem, shape: shape.to_vec() }
    }

    /// The same shape with another element.
    pub fn with_elem(&self, elem: Elem) -> Type {
        Type { elem, shape: self.shape.clone() }
    }

    /// The number type of the elements (the pointee for pointers).
    pub fn scalar_of(&self) -> Scalar {
        match self.elem {
            Elem::Num(s) | Elem::Ptr(s) => s,
        }
    }

    pub fn is_ptr(&self) -> bool {
        matches!(self.elem, Elem::Ptr(_))
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.shape.is_empty() {
            return write!(f, "{}", self.elem);
        }
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}

/// An SSA value: its name as printed (`%x_3`, or `%for_7#1` for one result of several) and its type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    name: String,
    ty: Type,
}

impl Value {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ty(&self) -> &Type {
        &self.ty
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }
}

/// Predicates of `arith.cmpi` (signed) and `arith.cmpf` (ordered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Cmp {
    fn int(self) -> &'static str {
        match self {
            Cmp::Eq => "eq",
            Cmp::Ne => "ne",
            Cmp::Lt => "slt",
            Cmp::Le => "sle",
            Cmp::Gt => "sgt",
            Cmp::Ge => "sge",
        }
    }

    fn float(self) -> &'static str {
        match self {
            Cmp::Eq => "oeq",
            Cmp::Ne => "one",
            Cmp::Lt => "olt",
            Cmp::Le => "ole",
            Cmp::Gt => "ogt",
            Cmp::Ge => "oge",
        }
    }
}

/// How `tt.dot` multiplies f32 operands on tensor cores (ignored for 16-bit operands).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DotPrecision {
    Tf32,
    Ieee,
}

/// The combiner of a `tt.reduce` over one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// `arith.maxnumf` (floats) or `arith.maxsi` (integers).
    Max,
    /// `arith.addf` or `arith.addi`.
    Sum,
}

/// One `tt.func public` being written, printed inside `module { ... }` by [`Kernel::finish`].
pub struct Kernel {
    name: String,
    args: Vec<String>,
    body: String,
    depth: usize,
    next_id: usize,
    /// The name the next defined value gets instead of its op's (see [`Kernel::named`]).
    pending_name: Option<String>,
}

impl Kernel {
    /// A kernel named `name` (a valid MLIR identifier: letters, digits, `_`).
    pub fn new(name: &str) -> Kernel {
        assert!(is_identifier(name), "kernel name {name:?} is not an MLIR identifier");
        Kernel {
            name: name.to_string(),
            args: Vec::new(),
            body: String::new(),
            depth: 2,
            next_id: 0,
            pending_name: None,
        }
    }

    /// Names the value the next op defines (`%hint_N`), for readable text: `k.named("m0").mul(&pid, &bm)`.
    pub fn named(&mut self, hint: &str) -> &mut Kernel {
        self.pending_name = Some(hint.to_string());
        self
    }

    /// Appends a pointer argument, marked 16-byte aligned (`tt.divisibility = 16`), as XLA's buffers are.
    pub fn ptr_arg(&mut self, hint: &str, pointee: Scalar) -> Value {
        let value = Value { name: self.fresh(hint), ty: Type { elem: Elem::Ptr(pointee), shape: Vec::new() } };
        self.args.push(format!("{}: {} {{tt.divisibility = 16 : i32}}", value.name, value.ty));
        value
    }

    /// The module text: `module { tt.func public @name(args) { body tt.return } }`.
    pub fn finish(mut self) -> String {
        self.line("tt.return");
        format!("module {{\n  tt.func public @{}({}) {{\n{}  }}\n}}\n", self.name, self.args.join(", "), self.body)
    }

    fn fresh(&mut self, hint: &str) -> String {
        let hint = self.pending_name.take().unwrap_or_else(|| hint.to_string());
        assert!(is_identifier(&hint), "value name {hint:?} is not an MLIR identifier");
        self.next_id += 1;
        format!("%{hint}_{}", self.next_id)
    }

    fn line(&mut self, text: &str) {
        for _ in 0..self.depth {
            self.body.push_str("  ");
        }
        self.body.push_str(text);
        self.body.push('\n');
    }

    /// Appends `%new = <rhs>` and returns `%new` with type `ty`.
    fn def(&mut self, hint: &str, ty: Type, rhs: &str) -> Value {
        let name = self.fresh(hint);
        self.line(&format!("{name} = {rhs}"));
        Value { name, ty }
    }

    // ---- constants and indices ------------------------------------------------------------------------------

    pub fn const_i32(&mut self, v: i32) -> Value {
        self.def("c", Type::scalar(Scalar::I32), &format!("arith.constant {v} : i32"))
    }

    pub fn const_i64(&mut self, v: i64) -> Value {
        self.def("c", Type::scalar(Scalar::I64), &format!("arith.constant {v} : i64"))
    }

    /// A float scalar of type `s`, rounded to it (f32 is written as its exact bit pattern).
    pub fn const_float(&mut self, s: Scalar, v: f64) -> Value {
        assert!(s.is_float(), "const_float of an integer type");
        let ty = Type::scalar(s);
        self.def("cst", ty, &format!("arith.constant {} : {}", float_literal(s, v), s.mlir()))
    }

    /// A tensor of `shape` filled with the integer `v` (of an integer type `s`, `i1` taking 0 or 1).
    pub fn full_int(&mut self, s: Scalar, shape: &[usize], v: i64) -> Value {
        assert!(!s.is_float(), "full_int of a float type");
        let ty = Type::tensor(s, shape);
        let lit = if s == Scalar::I1 { (if v != 0 { "true" } else { "false" }).to_string() } else { v.to_string() };
        self.def("cst", ty.clone(), &format!("arith.constant dense<{lit}> : {ty}"))
    }

    /// A tensor of `shape` filled with the float `v` of type `s`.
    pub fn full_float(&mut self, s: Scalar, shape: &[usize], v: f64) -> Value {
        assert!(s.is_float(), "full_float of an integer type");
        let ty = Type::tensor(s, shape);
        self.def("cst", ty.clone(), &format!("arith.constant dense<{}> : {ty}", float_literal(s, v)))
    }

    /// `tt.get_program_id` along axis 0, 1 or 2 (x, y, z of the grid).
    pub fn program_id(&mut self, axis: usize) -> Value {
        let axis = ["x", "y", "z"][axis];
        self.def("pid", Type::scalar(Scalar::I32), &format!("tt.get_program_id {axis} : i32"))
    }

    /// `[start, end)` as a 1-D `i32` tensor (its length must be a power of two).
    pub fn make_range(&mut self, start: u32, end: u32) -> Value {
        let len = (end - start) as usize;
        assert!(len.is_power_of_two(), "tt.make_range of length {len}");
        let ty = Type::tensor(Scalar::I32, &[len]);
        self.def("range", ty.clone(), &format!("tt.make_range {{end = {end} : i32, start = {start} : i32}} : {ty}"))
    }

    // ---- shapes ---------------------------------------------------------------------------------------------

    /// A scalar repeated into a tensor of `shape`.
    pub fn splat(&mut self, x: &Value, shape: &[usize]) -> Value {
        assert!(x.ty.shape.is_empty(), "tt.splat of a tensor {}", x.ty);
        let ty = x.ty.with_shape(shape);
        self.def("splat", ty.clone(), &format!("tt.splat {} : {} -> {ty}", x.name, x.ty))
    }

    /// A tensor with a new axis of size 1 at `axis`.
    pub fn expand_dims(&mut self, x: &Value, axis: usize) -> Value {
        let mut shape = x.ty.shape.clone();
        shape.insert(axis, 1);
        let ty = x.ty.with_shape(&shape);
        self.def("expand", ty.clone(), &format!("tt.expand_dims {} {{axis = {axis} : i32}} : {} -> {ty}", x.name, x.ty))
    }

    /// Axes of size 1 stretched to `shape` (same rank).
    pub fn broadcast(&mut self, x: &Value, shape: &[usize]) -> Value {
        let from = &x.ty.shape;
        let ok = from.len() == shape.len() && from.iter().zip(shape).all(|(&a, &b)| a == b || a == 1);
        assert!(ok, "tt.broadcast of {} to {shape:?}", x.ty);
        if from == shape {
            self.pending_name = None;
            return x.clone();
        }
        let ty = x.ty.with_shape(shape);
        self.def("bcast", ty.clone(), &format!("tt.broadcast {} : {} -> {ty}", x.name, x.ty))
    }

    /// A 1-D tensor `[m]` as a column `[m, n]` (each row constant).
    pub fn as_column(&mut self, x: &Value, n: usize) -> Value {
        let m = x.ty.shape[0];
        let col = self.expand_dims(x, 1);
        self.broadcast(&col, &[m, n])
    }

    /// A 1-D tensor `[n]` as a row-repeated `[m, n]` (each column constant).
    pub fn as_row(&mut self, x: &Value, m: usize) -> Value {
        let n = x.ty.shape[0];
        let row = self.expand_dims(x, 0);
        self.broadcast(&row, &[m, n])
    }

    /// The transpose of a 2-D tensor.
    pub fn trans(&mut self, x: &Value) -> Value {
        assert_eq!(x.ty.shape.len(), 2, "tt.trans of {}", x.ty);
        let ty = x.ty.with_shape(&[x.ty.shape[1], x.ty.shape[0]]);
        let rhs = format!("tt.trans {} {{order = array<i32: 1, 0>}} : {} -> {ty}", x.name, x.ty);
        self.def("trans", ty, &rhs)
    }

    // ---- memory ---------------------------------------------------------------------------------------------

    /// Pointers advanced by element offsets (`i32` or `i64`) of the same shape.
    pub fn addptr(&mut self, ptr: &Value, offset: &Value) -> Value {
        assert!(ptr.ty.is_ptr() && !offset.ty.is_ptr(), "tt.addptr {} + {}", ptr.ty, offset.ty);
        assert_eq!(ptr.ty.shape, offset.ty.shape, "tt.addptr shapes");
        let rhs = format!("tt.addptr {}, {} : {}, {}", ptr.name, offset.name, ptr.ty, offset.ty);
        self.def("ptr", ptr.ty.clone(), &rhs)
    }

    /// Loads a block through a block of pointers; where `mask` is false, `other` (default: undefined).
    pub fn load(&mut self, ptrs: &Value, mask: Option<&Value>, other: Option<&Value>) -> Value {
        let ty = ptrs.ty.with_elem(Elem::Num(ptrs.ty.scalar_of()));
        let mut operands = ptrs.name.clone();
        if let Some(mask) = mask {
            self.check_mask(mask, &ptrs.ty);
            operands = format!("{operands}, {}", mask.name);
            if let Some(other) = other {
                assert_eq!(other.ty, ty, "tt.load other");
                operands = format!("{operands}, {}", other.name);
            }
        } else {
            assert!(other.is_none(), "tt.load with other but no mask");
        }
        self.def("ld", ty, &format!("tt.load {operands} : {}", ptrs.ty))
    }

    /// Stores `value` through `ptrs` where `mask` holds.
    pub fn store(&mut self, ptrs: &Value, value: &Value, mask: Option<&Value>) {
        assert_eq!(ptrs.ty.with_elem(Elem::Num(ptrs.ty.scalar_of())), value.ty, "tt.store value type");
        let mask = match mask {
            Some(m) => {
                self.check_mask(m, &ptrs.ty);
                format!(", {}", m.name)
            }
            None => String::new(),
        };
        self.line(&format!("tt.store {}, {}{mask} : {}", ptrs.name, value.name, ptrs.ty));
    }

    fn check_mask(&self, mask: &Value, of: &Type) {
        assert!(mask.ty.elem == Elem::Num(Scalar::I1) && mask.ty.shape == of.shape, "mask {} for {of}", mask.ty);
    }

    // ---- arithmetic -----------------------------------------------------------------------------------------

    /// `a @ b + acc` for 2-D blocks: `[m, k] x [k, n] + [m, n]`, accumulated in `acc`'s type.
    pub fn dot(&mut self, a: &Value, b: &Value, acc: &Value, precision: DotPrecision) -> Value {
        let (sa, sb, sc) = (&a.ty.shape, &b.ty.shape, &acc.ty.shape);
        let ok = sa.len() == 2 && sb.len() == 2 && sa[1] == sb[0] && sc[..] == [sa[0], sb[1]];
        assert!(ok, "tt.dot {} * {} -> {}", a.ty, b.ty, acc.ty);
        assert_eq!(a.ty.elem, b.ty.elem, "tt.dot operand types");
        let precision = match precision {
            DotPrecision::Tf32 => "tf32",
            DotPrecision::Ieee => "ieee",
        };
        let rhs = format!(
            "tt.dot {}, {}, {}, inputPrecision = {precision} : {} * {} -> {}",
            a.name, b.name, acc.name, a.ty, b.ty, acc.ty
        );
        self.def("dot", acc.ty.clone(), &rhs)
    }

    /// A binary `arith` op on operands of one type (`addi`, `mulf`, `maxnumf`, `andi`, ...).
    pub fn binary(&mut self, op: &str, a: &Value, b: &Value) -> Value {
        assert_eq!(a.ty, b.ty, "arith.{op} operand types");
        self.def(op, a.ty.clone(), &format!("arith.{op} {}, {} : {}", a.name, b.name, a.ty))
    }

    pub fn add(&mut self, a: &Value, b: &Value) -> Value {
        let op = if a.ty.scalar_of().is_float() { "addf" } else { "addi" };
        self.binary(op, a, b)
    }

    pub fn sub(&mut self, a: &Value, b: &Value) -> Value {
        let op = if a.ty.scalar_of().is_float() { "subf" } else { "subi" };
        self.binary(op, a, b)
    }

    pub fn mul(&mut self, a: &Value, b: &Value) -> Value {
        let op = if a.ty.scalar_of().is_float() { "mulf" } else { "muli" };
        self.binary(op, a, b)
    }

    /// Division (signed and truncating for integers).
    pub fn div(&mut self, a: &Value, b: &Value) -> Value {
        let op = if a.ty.scalar_of().is_float() { "divf" } else { "divsi" };
        self.binary(op, a, b)
    }

    /// Signed remainder of integers.
    pub fn rem(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("remsi", a, b)
    }

    /// Maximum (for floats, of the numbers when one is NaN).
    pub fn max(&mut self, a: &Value, b: &Value) -> Value {
        let op = if a.ty.scalar_of().is_float() { "maxnumf" } else { "maxsi" };
        self.binary(op, a, b)
    }

    pub fn min(&mut self, a: &Value, b: &Value) -> Value {
        let op = if a.ty.scalar_of().is_float() { "minnumf" } else { "minsi" };
        self.binary(op, a, b)
    }

    /// Logical and of `i1` values.
    pub fn and(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("andi", a, b)
    }

    /// A comparison giving `i1` values of the operands' shape (signed for integers, ordered for floats).
    pub fn cmp(&mut self, pred: Cmp, a: &Value, b: &Value) -> Value {
        assert_eq!(a.ty, b.ty, "compare operand types");
        let (op, pred) = if a.ty.scalar_of().is_float() { ("cmpf", pred.float()) } else { ("cmpi", pred.int()) };
        let ty = a.ty.with_elem(Elem::Num(Scalar::I1));
        self.def(op, ty, &format!("arith.{op} {pred}, {}, {} : {}", a.name, b.name, a.ty))
    }

    /// `cond ? a : b`, elementwise (`cond` has the shape of `a` and `b`).
    pub fn select(&mut self, cond: &Value, a: &Value, b: &Value) -> Value {
        assert_eq!(a.ty, b.ty, "arith.select operand types");
        assert_eq!(cond.ty, a.ty.with_elem(Elem::Num(Scalar::I1)), "arith.select condition");
        let types = if cond.ty.shape.is_empty() { a.ty.to_string() } else { format!("{}, {}", cond.ty, a.ty) };
        self.def("sel", a.ty.clone(), &format!("arith.select {}, {}, {} : {types}", cond.name, a.name, b.name))
    }

    /// A numeric conversion to `to`: sign extension or truncation of integers, extension or rounding (to
    /// nearest even) of floats, signed integer to float. Returns `x` itself when it already has type `to`.
    pub fn convert(&mut self, x: &Value, to: Scalar) -> Value {
        let from = x.ty.scalar_of();
        if from == to {
            self.pending_name = None;
            return x.clone();
        }
        let op = match (from.is_float(), to.is_float()) {
            (true, true) if from.bytes() < to.bytes() => "extf",
            (true, true) => "truncf",
            (false, false) if from.bytes() < to.bytes() => "extsi",
            (false, false) => "trunci",
            (false, true) => "sitofp",
            (true, false) => "fptosi",
        };
        assert!(from.bytes() != to.bytes() || from.is_float() != to.is_float(), "{from:?} -> {to:?} in one step");
        let ty = x.ty.with_elem(Elem::Num(to));
        self.def(op, ty.clone(), &format!("arith.{op} {} : {} to {ty}", x.name, x.ty))
    }

    /// A unary `math` op on floats (`exp2`, `log2`, `exp`, `log`, `sqrt`, ...).
    pub fn math(&mut self, op: &str, x: &Value) -> Value {
        assert!(x.ty.scalar_of().is_float() && !x.ty.is_ptr(), "math.{op} of {}", x.ty);
        self.def(op, x.ty.clone(), &format!("math.{op} {} : {}", x.name, x.ty))
    }

    // ---- regions --------------------------------------------------------------------------------------------

    /// `tt.reduce` of a tensor along `axis` with a standard combiner.
    pub fn reduce(&mut self, x: &Value, axis: usize, kind: Reduction) -> Value {
        self.reduce_with(x, axis, |k, a, b| match kind {
            Reduction::Max => k.max(a, b),
            Reduction::Sum => k.add(a, b),
        })
    }

    /// `tt.reduce` of a tensor along `axis`; `combine` writes the combiner of two scalars.
    pub fn reduce_with(
        &mut self,
        x: &Value,
        axis: usize,
        combine: impl FnOnce(&mut Kernel, &Value, &Value) -> Value,
    ) -> Value {
        let mut shape = x.ty.shape.clone();
        assert!(axis < shape.len(), "tt.reduce axis {axis} of {}", x.ty);
        shape.remove(axis);
        let ty = x.ty.with_shape(&shape);
        let scalar = Type { elem: x.ty.elem, shape: Vec::new() };
        let name = self.fresh("reduce");
        let (a, b) = (self.fresh("a"), self.fresh("b"));
        self.line(&format!("{name} = \"tt.reduce\"({}) <{{axis = {axis} : i32}}> ({{", x.name));
        self.line(&format!("^bb0({a}: {scalar}, {b}: {scalar}):"));
        self.depth += 1;
        let a = Value { name: a, ty: scalar.clone() };
        let b = Value { name: b, ty: scalar.clone() };
        let r = combine(self, &a, &b);
        assert_eq!(r.ty, scalar, "tt.reduce combiner type");
        self.line(&format!("tt.reduce.return {} : {scalar}", r.name));
        self.depth -= 1;
        self.line(&format!("}}) : ({}) -> {ty}", x.ty));
        Value { name, ty }
    }

    /// `scf.for %iv = lo to hi step step` (all `i32`) carrying `inits`; `body` gets the induction variable
    /// and the carried values and returns the values to carry on (same types). Returns the final values.
    pub fn for_loop(
        &mut self,
        (lo, hi, step): (&Value, &Value, &Value),
        inits: &[Value],
        body: impl FnOnce(&mut Kernel, &Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        for bound in [lo, hi, step] {
            assert_eq!(bound.ty, Type::scalar(Scalar::I32), "scf.for bound");
        }
        let types: Vec<Type> = inits.iter().map(|v| v.ty.clone()).collect();
        let (results, lhs) = self.results("for", &types);
        let iv = Value { name: self.fresh("iv"), ty: Type::scalar(Scalar::I32) };
        let args: Vec<Value> =
            inits.iter().map(|v| Value { name: self.fresh(base_name(&v.name)), ty: v.ty.clone() }).collect();
        let bind: Vec<String> = args.iter().zip(inits).map(|(a, v)| format!("{} = {}", a.name, v.name)).collect();
        let header = format!("scf.for {} = {} to {} step {}", iv.name, lo.name, hi.name, step.name);
        if types.is_empty() {
            self.line(&format!("{header} : i32 {{"));
        } else {
            let bind = bind.join(", ");
            self.line(&format!("{lhs}{header} iter_args({bind}) -> ({}) : i32 {{", type_list(&types)));
        }
        self.depth += 1;
        let yields = body(self, &iv, &args);
        self.yield_(&yields, &types);
        self.depth -= 1;
        self.line("}");
        results
    }

    /// `scf.if cond` (an `i1` scalar) with both branches, each returning values of `types`.
    pub fn if_else(
        &mut self,
        cond: &Value,
        types: &[Type],
        then: impl FnOnce(&mut Kernel) -> Vec<Value>,
        otherwise: impl FnOnce(&mut Kernel) -> Vec<Value>,
    ) -> Vec<Value> {
        assert_eq!(cond.ty, Type::scalar(Scalar::I1), "scf.if condition");
        let (results, lhs) = self.results("if", types);
        let arrow = if types.is_empty() { String::new() } else { format!(" -> ({})", type_list(types)) };
        self.line(&format!("{lhs}scf.if {}{arrow} {{", cond.name));
        self.depth += 1;
        let yields = then(self);
        self.yield_(&yields, types);
        self.depth -= 1;
        self.line("} else {");
        self.depth += 1;
        let yields = otherwise(self);
        self.yield_(&yields, types);
        self.depth -= 1;
        self.line("}");
        results
    }

    /// Names for the results of a region op: `%r` for one, `%r#0`, `%r#1`, ... (declared `%r:n`) for several.
    fn results(&mut self, hint: &str, types: &[Type]) -> (Vec<Value>, String) {
        let name = self.fresh(hint);
        match types.len() {
            0 => (Vec::new(), String::new()),
            1 => (vec![Value { name: name.clone(), ty: types[0].clone() }], format!("{name} = ")),
            n => {
                let values =
                    types.iter().enumerate().map(|(i, t)| Value { name: format!("{name}#{i}"), ty: t.clone() });
                (values.collect(), format!("{name}:{n} = "))
            }
        }
    }

    fn yield_(&mut self, values: &[Value], types: &[Type]) {
        let got: Vec<Type> = values.iter().map(|v| v.ty.clone()).collect();
        assert_eq!(got, types, "scf.yield types");
        if values.is_empty() {
            self.line("scf.yield");
        } else {
            let names: Vec<&str> = values.iter().map(|v| v.name.as_str()).collect();
            self.line(&format!("scf.yield {} : {}", names.join(", "), type_list(types)));
        }
    }
}

fn type_list(types: &[Type]) -> String {
    types.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
}

/// The hint a value's name was made from: `%acc_12` -> `acc`, `%for_3#1` -> `for`.
fn base_name(name: &str) -> &str {
    let name = name.trim_start_matches('%');
    let name = name.split('#').next().unwrap_or(name);
    match name.rsplit_once('_') {
        Some((hint, id)) if !hint.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) => hint,
        _ => name,
    }
}

fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// An MLIR float literal of type `s` for `v`: the exact bit pattern for f32 and for infinities and NaN,
/// otherwise a decimal that MLIR rounds to `s`.
fn float_literal(s: Scalar, v: f64) -> String {
    if s == Scalar::F32 {
        return format!("0x{:08X}", (v as f32).to_bits());
    }
    if v.is_finite() {
        return format!("{v:.17e}");
    }
    // Infinity's exponent bits, and the top mantissa bit for a quiet NaN.
    let (inf, quiet): (u16, u16) = if s == Scalar::BF16 { (0x7F80, 0x0040) } else { (0x7C00, 0x0200) };
    let bits = if v.is_nan() {
        inf | quiet
    } else if v > 0.0 {
        inf
    } else {
        inf | 0x8000
    };
    format!("0x{bits:04X}")
}

#[cfg(test)]
mod tests;

//! A user's own Triton kernel, called like an op: [`TritonKernel`]. The user brings the Triton IR (text), its
//! launch (grid, warps, stages) and result types, plus a composite (the same function written with lazuli's ops,
//! as a closure over tensors) and optionally a gradient (a closure too, which may call other kernels). The
//! closures are traced once per input signature into programs the kernel carries
//! (`lazuli_kernels::custom`); the Triton call runs on NVIDIA GPUs, the composite everywhere else.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use lazuli_hlo::{DType, Gradient, KernelDef, KernelOp, Loc, Op, TensorType};
use lazuli_kernels::custom::{define, CustomKernel};
use lazuli_kernels::triton::TritonCall;
use lazuli_kernels::{Implementation, Target};

use crate::error::{Error, Result};
use crate::graph::record::{raise, try_apply};
use crate::graph::tensor::Tensor;
use crate::graph::trace::{trace, Captures};
use crate::runtime::runtime;

type Composite = Rc<dyn Fn(&[Tensor]) -> Vec<Tensor>>;
type GradientFn = Rc<dyn Fn(&[Tensor], usize, &Tensor, &Tensor) -> Vec<Option<Tensor>>>;

/// A custom Triton kernel. Build it once, call it like an op:
///
/// ```no_run
/// use lazuli_lazy::{DType, Tensor, TritonKernel};
/// # let ttir = String::new();
/// let softmax = TritonKernel::new("row_softmax", ttir)
///     .grid([1024, 1, 1])
///     .warps(4)
///     .output(DType::F32, &[1024, 512])
///     .composite(|x| vec![x[0].softmax(-1)]);
/// # let x = Tensor::zeros(&[1024, 512], DType::F32);
/// let y = softmax.call(&[&x]).remove(0);
/// ```
///
/// The kernel's arguments are pointers: the inputs in order, then the outputs. On an NVIDIA GPU (compute
/// capability 8.0+) the Triton call runs; elsewhere, or with [`TritonKernel::implementation`] set to
/// `Composite`, the composite does. Without a gradient the composite's gradient is used. Every launch parameter
/// is checked in Rust before XLA sees it; a mistake panics naming the line of the call.
#[derive(Clone)]
pub struct TritonKernel {
    name: &'static str,
    ir: String,
    grid: [u32; 3],
    warps: u32,
    stages: u32,
    outputs: Vec<TensorType>,
    composite: Option<Composite>,
    gradient: Option<GradientFn>,
    implementation: Implementation,
    /// Definitions made so far, by input types.
    made: Rc<RefCell<HashMap<Vec<TensorType>, Arc<KernelDef>>>>,
}

impl TritonKernel {
    /// The kernel `tt.func @name` in `ir` (Triton IR as MLIR text); grid `[1, 1, 1]`, 4 warps, 2 stages.
    pub fn new(name: &str, ir: impl Into<String>) -> TritonKernel {
        TritonKernel {
            name: intern(name),
            ir: ir.into(),
            grid: [1, 1, 1],
            warps: 4,
            stages: 2,
            outputs: Vec::new(),
            composite: None,
            gradient: None,
            implementation: Implementation::Auto,
            made: Rc::default(),
        }
    }

    /// Programs launched along x, y and z.
    pub fn grid(mut self, grid: [u32; 3]) -> Self {
        self.grid = grid;
        self
    }

    /// Warps per program (Triton's `num_warps`; default 4).
    pub fn warps(mut self, n: u32) -> Self {
        self.warps = n;
        self
    }

    /// Software-pipelining stages (Triton's `num_stages`; default 2).
    pub fn stages(mut self, n: u32) -> Self {
        self.stages = n;
        self
    }

    /// Add an output of this dtype and shape (in the kernel's pointer order, after the inputs).
    pub fn output(mut self, dtype: DType, dims: &[usize]) -> Self {
        self.outputs.push(TensorType::new(dtype, dims));
        self
    }

    /// What the kernel computes, with lazuli's ops: runs where Triton cannot, and is the reference for tests.
    pub fn composite(mut self, f: impl Fn(&[Tensor]) -> Vec<Tensor> + 'static) -> Self {
        self.composite = Some(Rc::new(f));
        self
    }

    /// The gradient: `f(inputs, r, output_r, cotangent_r)` returns one cotangent per input (`None`: none) for
    /// output `r`'s cotangent. It may call other kernels (a backward kernel). Without it, the composite's.
    pub fn gradient(mut self, f: impl Fn(&[Tensor], usize, &Tensor, &Tensor) -> Vec<Option<Tensor>> + 'static) -> Self {
        self.gradient = Some(Rc::new(f));
        self
    }

    /// Force the Triton call (an error off NVIDIA GPUs) or the composite; `Auto` by default.
    pub fn implementation(mut self, implementation: Implementation) -> Self {
        self.implementation = implementation;
        self
    }

    /// Call the kernel on `inputs`; one tensor per output. Panics at the caller's line if a launch parameter, the
    /// IR's signature, or the composite does not fit; [`TritonKernel::try_call`] returns that as an error.
    #[track_caller]
    pub fn call(&self, inputs: &[&Tensor]) -> Vec<Tensor> {
        self.call_at(inputs, Loc::caller()).unwrap_or_else(|e| raise(e))
    }

    /// [`TritonKernel::call`], with [`Error::InvalidArgument`] when the kernel's definition does not fit the
    /// inputs, [`Error::Unsupported`] when the Triton call is forced off an NVIDIA GPU.
    #[track_caller]
    pub fn try_call(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.call_at(inputs, Loc::caller())
    }

    fn call_at(&self, inputs: &[&Tensor], loc: Loc) -> Result<Vec<Tensor>> {
        let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type().clone()).collect();
        // Looked up first and the borrow ended: defining traces the closures, which may call kernels too.
        let made = self.made.borrow().get(&types).cloned();
        let def = match made {
            Some(def) => def,
            None => {
                let def = self.define(&types, loc).map_err(|why| self.definition_error(why, loc))?;
                self.made.borrow_mut().insert(types, def.clone());
                def
            }
        };
        (0..def.results.len()).map(|r| try_apply(Op::Kernel(KernelOp::new(def.clone(), r)), inputs, loc)).collect()
    }

    /// Why the kernel could not be defined, as the error for its kind: a Triton call forced where none runs, or
    /// a definition that does not fit its inputs.
    fn definition_error(&self, why: String, loc: Loc) -> Error {
        let backend = runtime().map(|rt| rt.target.clone());
        match backend {
            Ok(target) if self.implementation == Implementation::Triton && !matches!(target, Target::Cuda { .. }) => {
                Error::Unsupported { op: "custom_kernel", backend: target.to_string(), why, at: loc }
            }
            _ => Error::InvalidArgument { op: "custom_kernel", why, at: loc },
        }
    }

    /// Trace the closures on inputs of `types` and make the kernel for the runtime's device.
    fn define(&self, types: &[TensorType], loc: Loc) -> Result<Arc<KernelDef>, String> {
        let name = self.name;
        if self.outputs.is_empty() {
            return Err(format!("{name}: the kernel has no outputs; declare them with .output(dtype, dims)"));
        }
        let composite = self.composite.as_ref().ok_or_else(|| {
            format!("{name}: a custom kernel needs a composite (.composite(|x| …)): it runs where Triton cannot")
        })?;
        let composite = trace(types, loc, Captures::Refuse, |x| composite(x).into_iter().map(Some).collect())
            .map(|t| t.program)
            .map_err(|e| format!("{name}: in the composite: {e}"))?;
        let gradients = (0..self.outputs.len())
            .map(|r| match &self.gradient {
                None => Ok(Gradient::Composite),
                Some(f) => {
                    let mut inputs = types.to_vec();
                    inputs.extend([self.outputs[r].clone(), self.outputs[r].clone()]);
                    let n = types.len();
                    let p = trace(&inputs, loc, Captures::Refuse, |x| f(&x[..n], r, &x[n], &x[n + 1]))
                        .map(|t| t.program)
                        .map_err(|e| format!("{name}: in the gradient of output {r}: {e}"))?;
                    Ok(Gradient::Program(p))
                }
            })
            .collect::<Result<Vec<_>, String>>()?;
        let call = TritonCall {
            name: name.to_string(),
            ir: self.ir.clone(),
            grid: self.grid,
            num_warps: self.warps,
            num_stages: self.stages,
        };
        let kernel =
            CustomKernel { name, call, operands: types.to_vec(), results: self.outputs.clone(), composite, gradients };
        let rt = runtime().map_err(|e| e.to_string())?;
        define(kernel, &rt.target, self.implementation)
    }
}

/// A kernel name as the `&'static str` every op name is; each distinct name is kept once for the process.
fn intern(name: &str) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let n: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.push(n);
    n
}

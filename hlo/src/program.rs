//! Programs: small recorded graphs that a custom kernel carries as data (`ops/kernel.rs`). A kernel's composite
//! (what it computes, written with lazuli's ops), its device implementation (custom calls and the ops around
//! them) and its gradients are each a `Program`, so the kernel is a value the graph hash, the emitter, the
//! reference interpreter and autodiff can all read, with no code of the kernel's own behind a trait object.
//!
//! A program is recorded once per kernel signature through [`Recorder`], a [`Builder`]; it is replayed through
//! any other builder (lowering, evaluation, autodiff's recorder), or lowered directly when it holds custom calls.

use std::sync::Arc;

use ndarray::ArrayD;

use crate::builder::Builder;
use crate::dtype::TensorType;
use crate::emit::{LowerCx, MlirString};
use crate::op::Op;
use crate::ops::kernel::{KernelDef, KernelOp};
use crate::shard::{DimShards, ShardIn};

/// A value of a program: input `i` is value `i`; each step's results follow in order.
pub type ValueId = usize;

/// One step of a program.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// An op of the op table, with one result.
    Op(Op),
    /// A custom call, with one result per declared result type. Device programs only: a custom call has no
    /// reference semantics and no gradient of its own (the kernel's composite and gradients stand for it).
    Call(CustomCall),
    /// Result `r` of the kernel this program is a gradient of, on that kernel's operands (the first inputs).
    /// A gradient reads the forward's other results this way (attention's softmax statistics), and the emitter
    /// lowers the forward kernel once for both nodes.
    Sibling(usize),
}

impl Step {
    fn result_count(&self) -> usize {
        match self {
            Step::Call(call) => call.results.len(),
            Step::Op(_) | Step::Sibling(_) => 1,
        }
    }
}

/// A `stablehlo.custom_call` as data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CustomCall {
    /// `call_target_name`, e.g. `__cudnn$fmhaSoftmax` or `__gpu$xla.gpu.triton`.
    pub target: String,
    pub api_version: i32,
    /// The `backend_config` attribute as MLIR text: a string literal (JSON configs) or a dictionary attribute.
    pub backend_config: BackendConfig,
    pub results: Vec<TensorType>,
    /// Minor-to-major dimension order per operand and per result; empty lists mean row-major for all.
    pub operand_layouts: Vec<Vec<usize>>,
    pub result_layouts: Vec<Vec<usize>>,
}

/// How a custom call's `backend_config` is spelled.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BackendConfig {
    /// A string attribute (cuDNN's JSON), escaped when emitted.
    String(String),
    /// A dictionary attribute, emitted verbatim (`{name = "…", grid_x = 4 : i32, …}`); its maker escapes it.
    Dictionary(String),
}

impl CustomCall {
    /// The generic attribute dictionary's inside.
    fn attrs(&self, operand_tys: &[&TensorType]) -> String {
        let config = match &self.backend_config {
            BackendConfig::String(s) => MlirString(s).to_string(),
            BackendConfig::Dictionary(d) => d.clone(),
        };
        let row_major = |t: &TensorType| (0..t.rank()).rev().collect::<Vec<usize>>();
        let layouts = |given: &[Vec<usize>], tys: &[&TensorType]| -> String {
            let items: Vec<String> = tys
                .iter()
                .enumerate()
                .map(|(i, t)| layout_attr(given.get(i).cloned().unwrap_or_else(|| row_major(t))))
                .collect();
            format!("[{}]", items.join(", "))
        };
        let results: Vec<&TensorType> = self.results.iter().collect();
        format!(
            "api_version = {} : i32, backend_config = {config}, call_target_name = {}, operand_layouts = {}, \
             result_layouts = {}",
            self.api_version,
            MlirString(&self.target),
            layouts(&self.operand_layouts, operand_tys),
            layouts(&self.result_layouts, &results),
        )
    }
}

/// `dense<[3, 2, 1, 0]> : tensor<4xindex>` (rank 0: `dense<> : tensor<0xindex>`).
fn layout_attr(minor_to_major: Vec<usize>) -> String {
    let items: Vec<String> = minor_to_major.iter().map(|d| d.to_string()).collect();
    match items.len() {
        0 => "dense<> : tensor<0xindex>".to_string(),
        n => format!("dense<[{}]> : tensor<{n}xindex>", items.join(", ")),
    }
}

/// A recorded program: typed inputs, steps on earlier values, and outputs (`None`: no value, e.g. an operand
/// without a cotangent in a gradient program).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    pub inputs: Vec<TensorType>,
    pub steps: Vec<(Step, Vec<ValueId>)>,
    /// The type of every value: the inputs', then each step's results'.
    pub types: Vec<TensorType>,
    pub outputs: Vec<Option<ValueId>>,
}

impl Program {
    /// Record a program on inputs of types `inputs`; `body` returns its outputs. The ops' shape rules check every
    /// step as it is recorded; a step that does not fit is an error naming the op.
    pub fn record(
        inputs: &[TensorType],
        body: impl FnOnce(&mut Recorder, &[Value]) -> Vec<Option<Value>>,
    ) -> Result<Program, String> {
        let mut r = Recorder {
            program: Program {
                inputs: inputs.to_vec(),
                steps: Vec::new(),
                types: inputs.to_vec(),
                outputs: Vec::new(),
            },
            error: None,
        };
        let args: Vec<Value> = inputs.iter().enumerate().map(|(i, t)| Value(i, t.clone())).collect();
        let outputs = body(&mut r, &args);
        if let Some(e) = r.error {
            return Err(e);
        }
        r.program.outputs = outputs.into_iter().map(|o| o.map(|v| v.0)).collect();
        Ok(r.program)
    }

    /// The types of the outputs (`None` for missing ones).
    pub fn output_types(&self) -> Vec<Option<&TensorType>> {
        self.outputs.iter().map(|o| o.map(|v| &self.types[v])).collect()
    }

    /// Whether any step is a custom call (the program can then only be lowered, not evaluated or differentiated).
    pub fn has_calls(&self) -> bool {
        self.steps.iter().any(|(s, _)| matches!(s, Step::Call(_)))
    }

    /// Record this program's ops through `b` on `inputs`. `parent` is the kernel a gradient program belongs to
    /// (with its operands), for [`Step::Sibling`]. Panics on a custom call: callers check [`Program::has_calls`].
    pub fn replay<B: Builder>(
        &self,
        b: &mut B,
        inputs: &[B::V],
        parent: Option<(&Arc<KernelDef>, &[B::V])>,
    ) -> Vec<Option<B::V>> {
        let values = self.replay_values(b, inputs, parent);
        self.outputs.iter().map(|o| o.map(|v| values[v].clone())).collect()
    }

    /// [`Program::replay`], returning every value (inputs first, then each step's results) instead of the outputs.
    pub fn replay_values<B: Builder>(
        &self,
        b: &mut B,
        inputs: &[B::V],
        parent: Option<(&Arc<KernelDef>, &[B::V])>,
    ) -> Vec<B::V> {
        let mut values: Vec<B::V> = inputs.to_vec();
        for (step, args) in &self.steps {
            let operands: Vec<&B::V> = args.iter().map(|&a| &values[a]).collect();
            let v = match step {
                Step::Op(op) => b.op(op.clone(), &operands),
                Step::Sibling(r) => {
                    let (def, kernel_operands) = parent.expect("a sibling step belongs to a gradient program");
                    let kernel_operands: Vec<&B::V> = kernel_operands.iter().collect();
                    b.op(Op::Kernel(KernelOp::new(def.clone(), *r)), &kernel_operands)
                }
                Step::Call(call) => panic!("{} is a custom call: it has no reference and no gradient", call.target),
            };
            values.push(v);
        }
        values
    }

    /// The outputs' reference values on `inputs` (each op's reference semantics, rounded to its dtype).
    pub fn evaluate(&self, inputs: &[&ArrayD<f64>]) -> Vec<Option<ArrayD<f64>>> {
        let args: Vec<(ArrayD<f64>, TensorType)> =
            inputs.iter().zip(&self.inputs).map(|(a, t)| ((*a).clone(), t.clone())).collect();
        let outs = self.replay(&mut crate::ops::composite::Evaluating, &args, None);
        outs.into_iter().map(|o| o.map(|v| v.0)).collect()
    }

    /// How each output is split over a mesh when the inputs are split as `x`, through each op's sharding rule;
    /// `None` (whole) from a custom call on.
    pub fn shard_outputs(&self, x: &[ShardIn<'_>]) -> Vec<Option<DimShards>> {
        let mut dims: Vec<Option<DimShards>> = x.iter().map(|s| s.dims.cloned()).collect();
        for (step, args) in &self.steps {
            let Step::Op(op) = step else { return vec![None; self.outputs.len()] };
            let ins: Vec<ShardIn<'_>> =
                args.iter().map(|&a| ShardIn { ty: &self.types[a], dims: dims[a].as_ref() }).collect();
            let split = op.shard(&ins, &self.types[dims.len()]);
            dims.push(split);
        }
        self.outputs.iter().map(|o| o.and_then(|v| dims[v].clone())).collect()
    }

    /// Write the program's StableHLO as part of the node being lowered; returns the outputs' SSA names.
    pub(crate) fn lower(&self, cx: &mut LowerCx<'_>, inputs: Vec<String>) -> Vec<Option<String>> {
        let names = self.lower_values(cx, inputs);
        self.outputs.iter().map(|o| o.map(|v| names[v].clone())).collect()
    }

    /// [`Program::lower`], returning the SSA name of every value instead of the outputs'.
    pub(crate) fn lower_values(&self, cx: &mut LowerCx<'_>, inputs: Vec<String>) -> Vec<String> {
        let mut names = inputs;
        for (step, args) in &self.steps {
            let arg_names: Vec<String> = args.iter().map(|&a| names[a].clone()).collect();
            let arg_tys: Vec<&TensorType> = args.iter().map(|&a| &self.types[a]).collect();
            match step {
                Step::Op(op) => {
                    let out = &self.types[names.len()];
                    let named = arg_names.into_iter().zip(arg_tys).collect();
                    names.push(cx.lower_op(op, named, out));
                }
                Step::Call(call) => {
                    let results: Vec<&TensorType> = call.results.iter().collect();
                    let attrs = call.attrs(&arg_tys);
                    names.extend(cx.op_multi("stablehlo.custom_call", &arg_names, &arg_tys, &attrs, None, &results));
                }
                Step::Sibling(_) => panic!("a sibling step is replayed through a builder, never lowered directly"),
            }
        }
        names
    }

    /// The value id of each step's first result.
    fn step_starts(&self) -> Vec<ValueId> {
        let mut next = self.inputs.len();
        self.steps
            .iter()
            .map(|(s, _)| {
                next += s.result_count();
                next - s.result_count()
            })
            .collect()
    }

    /// Which values the outputs depend on, by value id.
    pub fn live(&self) -> Vec<bool> {
        let mut live = vec![false; self.types.len()];
        for &v in self.outputs.iter().flatten() {
            live[v] = true;
        }
        for ((step, args), start) in self.steps.iter().zip(self.step_starts()).rev() {
            if live[start..start + step.result_count()].iter().any(|&l| l) {
                for &a in args {
                    live[a] = true;
                }
            }
        }
        live
    }

    /// The program on inputs `keep` (ids of this program's inputs, in the new order) with only the steps its
    /// outputs need; an error names a dropped input that one of them reads.
    pub fn restrict(&self, keep: &[ValueId]) -> Result<Program, String> {
        let live = self.live();
        let mut new_id: Vec<Option<ValueId>> = vec![None; self.types.len()];
        for (j, &i) in keep.iter().enumerate() {
            new_id[i] = Some(j);
        }
        let map = |v: ValueId, new_id: &[Option<ValueId>]| {
            new_id[v].ok_or_else(|| format!("value {v} ({}) is read but not kept", self.types[v]))
        };
        let mut p = Program {
            inputs: keep.iter().map(|&i| self.types[i].clone()).collect(),
            steps: Vec::new(),
            types: keep.iter().map(|&i| self.types[i].clone()).collect(),
            outputs: Vec::new(),
        };
        for ((step, args), start) in self.steps.iter().zip(self.step_starts()) {
            let results = start..start + step.result_count();
            if !live[results.clone()].iter().any(|&l| l) {
                continue;
            }
            let args = args.iter().map(|&a| map(a, &new_id)).collect::<Result<Vec<_>, _>>()?;
            for v in results {
                new_id[v] = Some(p.types.len());
                p.types.push(self.types[v].clone());
            }
            p.steps.push((step.clone(), args));
        }
        p.outputs = self.outputs.iter().map(|o| o.map(|v| map(v, &new_id)).transpose()).collect::<Result<_, _>>()?;
        Ok(p)
    }
}

/// A program value while recording: its id and type.
#[derive(Clone, Debug)]
pub struct Value(pub ValueId, pub TensorType);

/// Records a [`Program`]; a [`Builder`], so formulas written for the composites record here unchanged.
pub struct Recorder {
    program: Program,
    /// The first shape-rule failure; recording goes on with a placeholder type and the program is refused.
    error: Option<String>,
}

impl Recorder {
    fn push(&mut self, step: Step, args: &[&Value], results: Vec<TensorType>) -> Vec<Value> {
        let first = self.program.types.len();
        debug_assert_eq!(step.result_count(), results.len());
        self.program.steps.push((step, args.iter().map(|v| v.0).collect()));
        self.program.types.extend(results.iter().cloned());
        results.into_iter().enumerate().map(|(i, t)| Value(first + i, t)).collect()
    }

    /// A custom call on `args`, one value per declared result.
    pub fn call(&mut self, call: CustomCall, args: &[&Value]) -> Vec<Value> {
        let results = call.results.clone();
        self.push(Step::Call(call), args, results)
    }

    /// Result `r` (of type `ty`) of the kernel this gradient program belongs to, on its operands.
    pub fn sibling(&mut self, r: usize, ty: TensorType) -> Value {
        self.push(Step::Sibling(r), &[], vec![ty]).remove(0)
    }
}

impl Builder for Recorder {
    type V = Value;
    fn ty<'a>(&'a self, v: &'a Value) -> &'a TensorType {
        &v.1
    }
    fn op(&mut self, op: Op, operands: &[&Value]) -> Value {
        let tys: Vec<&TensorType> = operands.iter().map(|v| &v.1).collect();
        let ty = match op.infer(&tys) {
            Ok(ty) => ty,
            Err(e) => {
                self.error.get_or_insert(e.into());
                tys.first().map_or(TensorType::scalar(crate::DType::F32), |t| (*t).clone())
            }
        };
        self.push(Step::Op(op), operands, vec![ty]).remove(0)
    }
}

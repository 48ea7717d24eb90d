//! Gradient checkpointing: [`checkpoint`] runs a block as usual in the forward pass, but its gradient recomputes
//! the block from its inputs instead of keeping the block's activations alive until the backward pass. Memory
//! for activations then grows with the number of blocks rather than with the number of ops in them, for about
//! one more forward pass of compute.
//!
//! The closure is recorded once per call into a program (`lazuli_hlo::BlockDef`), and each result becomes one
//! node of the `checkpoint` op family (`hlo/src/ops/checkpoint.rs`), whose gradient rule replays the program
//! behind an optimization barrier.

use std::rc::Rc;

use lazuli_hlo::{BlockDef, Checkpoint, Loc, Op, Parameter, Program, TensorType, Value};

use crate::graph::autodiff::grad_enabled;
use crate::graph::record::{apply, fail};
use crate::graph::tensor::{Node, NodeMap, Tensor};
use crate::ops::random;

/// Run `f` on `inputs` as a checkpointed block: the forward pass computes what `f` computes, and the backward
/// pass recomputes it from `inputs` (and the tensors `f` reads from outside) instead of keeping its
/// intermediate values. Like `torch.utils.checkpoint`:
///
/// ```no_run
/// use lazuli_lazy::{checkpoint, DType, Tensor};
/// let w = Tensor::full(&[4, 4], 0.1, DType::F32).requires_grad();
/// let x = Tensor::full(&[2, 4], 1.0, DType::F32);
/// let y = checkpoint(&[&x], |x| vec![x[0].matmul(&w).tanh().matmul(&w)]).remove(0);
/// y.sum(&[0, 1]).backward();
/// let _ = w.grad(); // as without `checkpoint`
/// ```
///
/// - `f` is called once, at once, on stand-ins for `inputs` (their types, no values: reading a value inside
///   fails). Pass the activations the block starts from as `inputs`.
/// - Tensors from outside that `f` reads are lifted to inputs of the block when they hold a value or are
///   gradient leaves (parameters: they get their gradients as usual); a pending tensor from outside is part of
///   the block and recomputed with it, so pass a large pending one as an input instead.
/// - Random numbers drawn inside (dropout) are drawn once: the recomputation replays the same generator state.
/// - Under [`no_grad`](crate::no_grad) there is nothing to save memory for: `f` just runs.
/// - A block with several results is recomputed once for each result that receives a gradient.
///
/// Panics at the caller's line if `f` returns no tensor.
#[track_caller]
pub fn checkpoint(inputs: &[&Tensor], f: impl FnOnce(&[Tensor]) -> Vec<Tensor>) -> Vec<Tensor> {
    let loc = Loc::caller();
    if !grad_enabled() {
        let inputs: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
        return f(&inputs);
    }
    let drawn = random::latest_draw();
    let (program, operands) = trace(inputs, f, loc).unwrap_or_else(|why| fail(loc, format!("checkpoint: {why}")));
    let def = BlockDef::new(program).unwrap_or_else(|why| fail(loc, format!("checkpoint: {why}")));
    let operands: Vec<&Tensor> = operands.iter().collect();
    let results: Vec<Tensor> = (0..def.program.outputs.len())
        .map(|result| apply(Op::Checkpoint(Checkpoint::block(def.clone(), result)), &operands, loc))
        .collect();
    if random::latest_draw() != drawn {
        random::drawn_into(&results[0]);
    }
    results
}

impl Tensor {
    /// [`checkpoint`] of a block with one input and one result: `x.checkpoint(|x| block.forward(x))`.
    #[track_caller]
    pub fn checkpoint(&self, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        // `checkpoint` tracks its caller too, so the block's nodes carry the user's line.
        checkpoint(&[self], |x| vec![f(&x[0])]).remove(0)
    }
}

/// Record `f` on stand-ins for `inputs` and read what it recorded back as a program whose inputs are `inputs`
/// followed by the tensors it lifted from outside; returns the program and those operands.
fn trace(
    inputs: &[&Tensor],
    f: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
    loc: Loc,
) -> Result<(Program, Vec<Tensor>), String> {
    let stand_ins: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(index, t)| {
            let ty = t.tensor_type().clone();
            Tensor::structural(Tensor::record_node(Op::Parameter(Parameter { index }), Default::default(), ty, loc))
        })
        .collect();
    let outputs = f(&stand_ins);
    if outputs.is_empty() {
        return Err("the block returned no tensor".into());
    }
    let walked = walk(&outputs, &stand_ins)?;
    let mut operands: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
    operands.extend(walked.lifted.iter().map(|n| Tensor::from_node(n.clone())));
    let types: Vec<TensorType> = operands.iter().map(|t| t.tensor_type().clone()).collect();
    let program = Program::record(&types, |b, x| {
        let mut value: NodeMap<Value> = NodeMap::default();
        let sources = stand_ins.iter().map(|t| &t.node).chain(&walked.lifted);
        for (node, v) in sources.zip(x) {
            value.insert(Rc::as_ptr(node), v.clone());
        }
        for node in &walked.order {
            let (op, args) = {
                let state = node.lock();
                let recipe = state.recipe.as_ref().expect("the walk kept only nodes with a recipe");
                (recipe.op.clone(), recipe.operands.iter().map(|o| value[&Rc::as_ptr(o)].clone()).collect::<Vec<_>>())
            };
            let refs: Vec<&Value> = args.iter().collect();
            let v = lazuli_hlo::Builder::op(b, op, &refs);
            value.insert(Rc::as_ptr(node), v);
        }
        outputs.iter().map(|o| Some(value[&Rc::as_ptr(&o.node)].clone())).collect()
    })?;
    Ok((program, operands))
}

/// What a block's outputs are made of: the nodes to record into its program, operands first, and the nodes from
/// outside it lifts to inputs, in the order first met.
struct Walked {
    order: Vec<Rc<Node>>,
    lifted: Vec<Rc<Node>>,
}

/// Walk down from `outputs` to the stand-ins, without recursion (a block may be thousands of ops deep). A node
/// with a value, a gradient leaf, or the stand-in of an enclosing checkpoint is lifted; any other node is
/// recorded.
fn walk(outputs: &[Tensor], stand_ins: &[Tensor]) -> Result<Walked, String> {
    let mut seen: NodeMap<()> = stand_ins.iter().map(|t| (Rc::as_ptr(&t.node), ())).collect();
    let mut walked = Walked { order: Vec::new(), lifted: Vec::new() };
    // (node, operands already pushed?)
    let mut stack: Vec<(Rc<Node>, bool)> = outputs.iter().rev().map(|t| (t.node.clone(), false)).collect();
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            walked.order.push(node);
            continue;
        }
        if seen.insert(Rc::as_ptr(&node), ()).is_some() {
            continue;
        }
        let operands = {
            let state = node.lock();
            match &state.recipe {
                _ if node.requires_grad() || !node.is_pending() => None,
                Some(r) if matches!(r.op, Op::Parameter(_)) => None,
                Some(r) => Some(r.operands.to_vec()),
                None => return Err(format!("a tensor recorded at {} has no value (it was given up)", node.loc)),
            }
        };
        let Some(operands) = operands else {
            walked.lifted.push(node);
            continue;
        };
        stack.push((node, true));
        stack.extend(operands.into_iter().rev().filter(|o| !seen.contains_key(&Rc::as_ptr(o))).map(|o| (o, false)));
    }
    Ok(walked)
}

//! Sharding in the user's terms: meshes over the runtime's devices, placing tensors on them, constraints inside
//! the graph, and placing a module's parameters by a rule.

use std::sync::Arc;

use lazuli_hlo::{DimShards, Graph, Loc, Op, ShardIn, ShardingConstraint};
pub use lazuli_sharding::plan::{Candidate, DeviceModel, ParamInfo, Plan, Role, StepInfo, Work};
pub use lazuli_sharding::{Mesh, PartitionSpec, Sharding, ShardingError};

use crate::error::{Error, Result};
use crate::graph::record::{apply, fail};
use crate::graph::tensor::Tensor;
use crate::train::nn::Module;

/// A mesh over the runtime's devices `0..size`, e.g. `mesh(&[("data", 4), ("model", 2)])`. The CPU plugin has
/// as many virtual devices as `LAZULI_CPU_DEVICES` (or `Config::cpu_device_count`) says.
#[track_caller]
pub fn mesh(axes: &[(&str, usize)]) -> Result<Mesh> {
    let at = Loc::caller();
    let m = Mesh::new(axes).map_err(|e| Error::Sharding(format!("{e} (at {at})")))?;
    let have = crate::runtime::runtime()?.client.devices().len();
    if m.size() > have {
        return Err(Error::Sharding(format!(
            "{m} needs {} devices, the runtime has {have} (at {at}); for virtual CPU devices set LAZULI_CPU_DEVICES={} or Config::cpu_device_count",
            m.size(),
            m.size()
        )));
    }
    Ok(m)
}

fn resolve(t: &Tensor, mesh: &Mesh, spec: &PartitionSpec, what: &str, at: Loc) -> Sharding {
    Sharding::new(mesh, spec, t.dims())
        .unwrap_or_else(|e| fail(at, format!("{what} {spec} of {}: {e}", t.tensor_type())))
}

impl Tensor {
    /// Lay this tensor out on `mesh` as `spec` says. Host data and computed values become leaves placed that way
    /// (each device gets its piece at the next materialization, and keeps it); a pending value gets a sharding
    /// constraint inside the graph. Programs using sharded tensors run on every device of the mesh.
    #[track_caller]
    pub fn shard(&self, mesh: &Mesh, spec: &PartitionSpec) -> Tensor {
        let at = Loc::caller();
        let sharding = Arc::new(resolve(self, mesh, spec, "shard", at));
        if self.node.sharding().as_deref() == Some(&sharding) {
            return self.clone();
        }
        let data = self.node.lock().data.clone();
        match data {
            Some(d) => {
                let t = Tensor::placed(self.tensor_type().clone(), d, sharding, at);
                if self.is_requires_grad() {
                    t.set_requires_grad(true);
                }
                t
            }
            None => self.constrain(sharding, at),
        }
    }

    /// A sharding constraint inside the graph: XLA lays the value out this way at this point.
    #[track_caller]
    pub fn with_sharding_constraint(&self, mesh: &Mesh, spec: &PartitionSpec) -> Tensor {
        let at = Loc::caller();
        let sharding = resolve(self, mesh, spec, "with_sharding_constraint", at);
        self.constrain(Arc::new(sharding), at)
    }

    /// The constraint's node carries its sharding: a program with no input on the mesh (a value made from
    /// constants, as `Tensor::zeros`) runs on the constraint's mesh.
    fn constrain(&self, s: Arc<Sharding>, at: Loc) -> Tensor {
        let t = apply(Op::ShardingConstraint(ShardingConstraint { attr: s.hlo(), dims: s.dims.clone() }), &[self], at);
        let _ = t.node.placement.set(s);
        t
    }

    /// How this tensor's value is split over a mesh, if it is (pending values: decided when they are computed).
    pub fn sharding(&self) -> Option<Arc<Sharding>> {
        self.node.sharding()
    }
}

/// Place every parameter of `module` by `rule(name, value)`; returns the placements for printing.
#[track_caller]
pub fn shard_params(
    module: &dyn Module,
    mesh: &Mesh,
    mut rule: impl FnMut(&str, &Tensor) -> PartitionSpec,
) -> Vec<(String, PartitionSpec)> {
    let mut out = Vec::new();
    for (name, p) in module.named_params() {
        let v = p.get();
        let spec = rule(&name, &v);
        p.set(v.shard(mesh, &spec));
        out.push((name, spec));
    }
    out
}

/// The planner's view of a parameter, guessed from its name: `qkv`/`fc` layers split their outputs (column),
/// `proj`/`fc_proj` their inputs (row), as in Megatron; an `Mlp`'s layers alternate column/row.
fn role(name: &str, rank: usize) -> Role {
    let parts: Vec<&str> = name.split('.').collect();
    let last = parts.last().copied().unwrap_or("");
    let layer = parts.iter().rev().nth(1).copied().unwrap_or("");
    let column = match layer {
        "qkv" | "fc" => Some(true),
        "proj" | "fc_proj" => Some(false),
        n => n.parse::<usize>().ok().filter(|_| parts.contains(&"layers")).map(|i| i % 2 == 0),
    };
    match (column, last, rank) {
        (Some(true), _, _) => Role::Column,
        (Some(false), "weight", 2) => Role::Row,
        (None, "weight", 2) if parts.iter().any(|p| *p == "wte" || *p == "wpe") => Role::Embedding,
        _ => Role::Other,
    }
}

/// The recorded step as the planner reads it: the forward pass and its backward, and which forward results the
/// backward reads.
struct StepGraph {
    graph: Graph,
    leaves: Vec<std::rc::Rc<crate::graph::tensor::Node>>,
    forward: Vec<bool>,
    saved: Vec<bool>,
}

impl StepGraph {
    /// Records the backward of `loss` with respect to `weights` (without running or accumulating anything) and
    /// walks both. Parameters and constants are never "saved": they are counted as state, or are free.
    fn record(loss: &Tensor, weights: &[Tensor]) -> StepGraph {
        let grads = crate::graph::autodiff::grad(loss, &weights.iter().collect::<Vec<_>>());
        let mut targets = vec![loss.node.clone()];
        targets.extend(grads.iter().map(|g| g.node.clone()));
        let traced = crate::graph::walk::trace(&targets);
        let g = &traced.graph;
        // Everything the loss depends on.
        let forward = g.ancestors(&[g.outputs[0]]);
        // A reshape or broadcast read by the backward is not kept itself (XLA makes it a view or fuses it into
        // its reader): its source is.
        let source = |mut o: usize| {
            while matches!(g.nodes[o].op, Op::Reshape(_) | Op::BroadcastInDim(_)) {
                o = g.nodes[o].operands[0];
            }
            o
        };
        let mut saved = vec![false; g.nodes.len()];
        for (_, node) in g.nodes.iter().enumerate().filter(|(id, _)| !forward[*id]) {
            for &o in &node.operands {
                let o = source(o);
                saved[o] |= forward[o] && !matches!(g.nodes[o].op, Op::Parameter(_) | Op::Constant(_));
            }
        }
        StepGraph { graph: traced.graph, leaves: traced.leaves, forward, saved }
    }

    /// One device's forward work when the parameters lie as `dims` says: matmul FLOPs, the bytes of every other
    /// result, and the bytes of the saved results; each op split as its `shard` rule propagates (a dimension an
    /// axis does not divide is padded, as XLA pads it). Reshapes and broadcasts are not counted as work: XLA makes
    /// them free or fuses them into their users.
    fn forward_work(&self, mesh: Option<&Mesh>, dims: Vec<Option<DimShards>>) -> Work {
        forward_work(&self.graph, mesh, dims, &self.forward, &self.saved)
    }
}

fn forward_work(
    g: &Graph,
    mesh: Option<&Mesh>,
    mut dims: Vec<Option<DimShards>>,
    forward: &[bool],
    saved: &[bool],
) -> Work {
    let size = |axes: &[usize]| -> usize { axes.iter().map(|&a| mesh.map_or(1, |m| m.axis_size(a))).product() };
    let mut w = Work::default();
    for (id, node) in g.nodes.iter().enumerate() {
        if matches!(node.op, Op::Parameter(_)) || !forward[id] {
            continue;
        }
        let x: Vec<ShardIn<'_>> =
            node.operands.iter().map(|&o| ShardIn { ty: &g.nodes[o].ty, dims: dims[o].as_ref() }).collect();
        let (out, elems) = op_work(&node.op, &x, &node.ty, &size, &mut w);
        if saved[id] {
            w.saved_bytes += (elems * node.ty.dtype.byte_size()) as f64;
        }
        dims[id] = out;
    }
    w
}

/// Add one op's work to `w` (a custom kernel's as the ops of its composite, so fused attention costs what it
/// computes, and a checkpointed block's as its ops); returns how its result is split and its elements per device.
fn op_work(
    op: &Op,
    x: &[ShardIn<'_>],
    ty: &lazuli_hlo::TensorType,
    size: &dyn Fn(&[usize]) -> usize,
    w: &mut Work,
) -> (Option<DimShards>, usize) {
    let out = op.shard(x, ty);
    let split = |d: usize| out.as_ref().map_or(&[][..], |o| &o[d][..]);
    let elems: usize = ty.dims.iter().enumerate().map(|(d, &n)| n.div_ceil(size(split(d)))).product();
    match op {
        Op::DotGeneral(dot) => {
            // A split contraction (row-parallel layer) divides the work too, by the axes the result does not use.
            let used: Vec<usize> = out.iter().flatten().flatten().copied().collect();
            let k: usize = dot
                .lhs_contract
                .iter()
                .map(|&c| {
                    let axes = x[0].dims.map_or(&[][..], |d| &d[c][..]);
                    let free: Vec<usize> = axes.iter().copied().filter(|a| !used.contains(a)).collect();
                    x[0].ty.dims[c].div_ceil(size(&free))
                })
                .product();
            w.matmul_flops += 2.0 * (elems * k) as f64;
        }
        Op::Kernel(k) => kernel_work(&k.def.composite, x, size, w),
        Op::Checkpoint(lazuli_hlo::Checkpoint::Block { def, .. }) => kernel_work(&def.program, x, size, w),
        Op::Constant(_) | Op::Reshape(_) | Op::BroadcastInDim(_) => {}
        _ => w.elementwise_bytes += (op.cost_weight() * elems * ty.dtype.byte_size()) as f64,
    }
    (out, elems)
}

/// The work of a kernel's composite on operands split as `x`. Counted per result node in the forward pass; the
/// attention kernel has one there (its statistics are read by the backward only).
fn kernel_work(p: &lazuli_hlo::Program, x: &[ShardIn<'_>], size: &dyn Fn(&[usize]) -> usize, w: &mut Work) {
    let mut dims: Vec<Option<DimShards>> = x.iter().map(|s| s.dims.cloned()).collect();
    for (step, args) in &p.steps {
        let lazuli_hlo::Step::Op(op) = step else { return };
        let ins: Vec<ShardIn<'_>> = args.iter().map(|&a| ShardIn { ty: &p.types[a], dims: dims[a].as_ref() }).collect();
        let (out, _) = op_work(op, &ins, &p.types[dims.len()], size, w);
        dims.push(out);
    }
}

/// Plan the sharding of `model`'s training step whose (pending, not yet computed) loss is `loss`: FLOPs and
/// activation sizes come from the recorded graph, parameter roles from their names, and each candidate's work per
/// device from propagating its placements through the graph with the ops' `shard` rules (inputs whose first
/// dimension is `batch` split over the data axis). The backward pass is counted as twice the forward.
pub fn plan(
    model: &dyn Module,
    loss: &Tensor,
    batch: usize,
    devices: usize,
    memory_limit: f64,
    device: DeviceModel,
) -> Plan {
    let named = model.named_params();
    let weights: Vec<Tensor> = named.iter().map(|(_, p)| p.get()).filter(|t| t.is_requires_grad()).collect();
    let step_graph = StepGraph::record(loss, &weights);
    let g = &step_graph.graph;
    // Which model parameter (index into `named`) each graph parameter is.
    let leaf_param: Vec<Option<usize>> = step_graph
        .leaves
        .iter()
        .map(|leaf| named.iter().position(|(_, p)| std::rc::Rc::ptr_eq(&p.get().node, leaf)))
        .collect();
    let param_of = |id: usize| -> Option<usize> { leaf_param[g.params.iter().position(|&p| p == id)?] };
    let params: Vec<ParamInfo> = named
        .iter()
        .map(|(n, p)| {
            let v = p.get();
            ParamInfo {
                name: n.clone(),
                shape: v.dims().to_vec(),
                bytes_per_element: v.dtype().byte_size(),
                role: role(n, v.rank()),
            }
        })
        .collect();
    let mut boundary: f64 = 0.0;
    for (_, node) in g.nodes.iter().enumerate().filter(|(id, _)| step_graph.forward[*id]) {
        if matches!(node.op, Op::DotGeneral(_))
            && param_of(node.operands[1]).is_some_and(|i| params[i].role == Role::Row)
        {
            boundary = boundary.max(node.ty.byte_size() as f64);
        }
    }
    let whole = step_graph.forward_work(None, vec![None; g.nodes.len()]);
    let step = StepInfo {
        tp_pairs: params.iter().filter(|p| p.role == Role::Row).count(),
        params,
        flops: 3.0 * whole.matmul_flops,
        elementwise_bytes: 3.0 * whole.elementwise_bytes,
        activation_bytes: whole.saved_bytes,
        boundary_bytes: boundary,
        batch,
        optimizer_state_factor: 2.0,
        update_traffic: StepInfo::ADAMW_UPDATE_TRAFFIC,
    };
    let work = |axes: &[(String, usize)], placements: &[(String, PartitionSpec)]| -> Option<Work> {
        let names: Vec<(&str, usize)> = axes.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let m = Mesh::new(&names).ok()?;
        let data = m.axis_index("data").is_ok();
        let mut dims: Vec<Option<DimShards>> = vec![None; g.nodes.len()];
        for (i, &id) in g.params.iter().enumerate() {
            let ty = &g.nodes[id].ty;
            let spec = match leaf_param[i] {
                // Splits of a parameter over the data axis are storage (FSDP): it is gathered before use, and the
                // compute follows the batch.
                Some(k) => PartitionSpec(
                    placements[k].1 .0.iter().map(|a| a.iter().filter(|a| *a != "data").cloned().collect()).collect(),
                ),
                None if data && ty.rank() > 0 && ty.dims[0] == batch => PartitionSpec::split(ty.rank(), 0, "data"),
                None => continue,
            };
            let d = Sharding::new(&m, &spec, &ty.dims).ok()?.dims;
            dims[id] = Some(d).filter(|d| d.iter().any(|a| !a.is_empty()));
        }
        let w = step_graph.forward_work(Some(&m), dims);
        Some(Work { matmul_flops: 3.0 * w.matmul_flops, elementwise_bytes: 3.0 * w.elementwise_bytes, ..w })
    };
    lazuli_sharding::plan::plan_with(&step, devices, memory_limit, device, &work)
}

/// Build the chosen candidate's mesh and place `model`'s parameters as it says.
#[track_caller]
pub fn apply_plan(plan: &Plan, model: &dyn Module) -> Result<Mesh> {
    let c = plan.chosen();
    let axes: Vec<(&str, usize)> = c.mesh.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let m = mesh(&axes)?;
    shard_params(model, &m, |name, t| {
        c.placements
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| PartitionSpec::replicated(t.rank()))
    });
    Ok(m)
}

/// The planner's count of the work in `t`'s pending graph on one device (forward only, nothing split): matmul
/// FLOPs and the bytes of every other result. For calibrating a `DeviceModel` against measured times.
pub fn recorded_work(t: &Tensor) -> Work {
    let traced = crate::graph::walk::trace(std::slice::from_ref(&t.node));
    let n = traced.graph.nodes.len();
    // Everything here is forward; with no backward recorded, nothing is saved for one.
    forward_work(&traced.graph, None, vec![None; n], &vec![true; n], &vec![false; n])
}

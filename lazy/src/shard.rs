//! Sharding in the user's terms: meshes over the runtime's devices, placing tensors on them, constraints inside
//! the graph, and placing a module's parameters by a rule.

use std::sync::Arc;

use lazuli_hlo::{Loc, Op, ShardingConstraint};
pub use lazuli_sharding::plan::{Candidate, DeviceModel, ParamInfo, Plan, Role, StepInfo};
pub use lazuli_sharding::{Mesh, PartitionSpec, Sharding, ShardingError};

use crate::error::{Error, Result};
use crate::nn::Module;
use crate::record::{apply, fail};
use crate::tensor::Tensor;

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

    fn constrain(&self, s: Arc<Sharding>, at: Loc) -> Tensor {
        apply(Op::ShardingConstraint(ShardingConstraint { attr: s.hlo(), dims: s.dims.clone() }), &[self], at)
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
        n => n.parse::<usize>().ok().filter(|_| parts.iter().any(|p| *p == "layers")).map(|i| i % 2 == 0),
    };
    match (column, last, rank) {
        (Some(true), _, _) => Role::Column,
        (Some(false), "weight", 2) => Role::Row,
        (None, "weight", 2) if parts.iter().any(|p| *p == "wte" || *p == "wpe") => Role::Embedding,
        _ => Role::Other,
    }
}

/// Plan the sharding of `model`'s training step whose (pending, not yet computed) loss is `loss`: FLOPs and
/// activation sizes come from the recorded graph, parameter roles from their names. `batch` is what the data
/// axis will split.
pub fn plan(
    model: &dyn Module,
    loss: &Tensor,
    batch: usize,
    devices: usize,
    memory_limit: f64,
    device: DeviceModel,
) -> Plan {
    let named = model.named_params();
    let traced = crate::materialize::trace(std::slice::from_ref(&loss.node));
    let g = &traced.graph;
    let param_of = |id: usize| -> Option<&str> {
        let i = g.params.iter().position(|&p| p == id)?;
        let leaf = &traced.leaves[i];
        named.iter().find(|(_, p)| Arc::ptr_eq(&p.get().node, leaf)).map(|(n, _)| n.as_str())
    };
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
    let mut forward_flops = 0.0;
    let mut boundary: f64 = 0.0;
    let mut activations = 0.0;
    for node in &g.nodes {
        if let Op::DotGeneral(d) = &node.op {
            let k: usize = d.lhs_contract.iter().map(|&c| g.nodes[node.operands[0]].ty.dims[c]).product();
            forward_flops += 2.0 * (node.ty.elements() * k) as f64;
            let is_row =
                param_of(node.operands[1]).is_some_and(|n| params.iter().any(|p| p.name == n && p.role == Role::Row));
            if is_row {
                boundary = boundary.max(node.ty.byte_size() as f64);
            }
        }
        if !matches!(node.op, Op::Parameter(_) | Op::Constant(_)) {
            activations += node.ty.byte_size() as f64;
        }
    }
    let step = StepInfo {
        tp_pairs: params.iter().filter(|p| p.role == Role::Row).count(),
        params,
        // Backward costs about twice the forward.
        flops: 3.0 * forward_flops,
        activation_bytes: activations,
        boundary_bytes: boundary,
        batch,
        optimizer_state_factor: 2.0,
    };
    lazuli_sharding::plan::plan(&step, devices, memory_limit, device)
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

//! Sharding in the user's terms: meshes over the runtime's devices, placing tensors on them, constraints inside
//! the graph, and placing a module's parameters by a rule.

use std::sync::Arc;

use lazuli_hlo::{Loc, Op, ShardingConstraint};
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

//! Optimizers whose updates are recorded into the step's graph. Their state lives on the device as tensors;
//! hyperparameters enter as host scalars (program parameters), so a learning-rate schedule changes values, never
//! the compiled program (AdamW's bias corrections are computed in the program from a step count on the device).
//! At the step boundary the new parameters and state are computed in place: the old buffers are donated to the
//! outputs (see `exec/plan`). The optimizers read each parameter's gradient and write its new value through
//! `Param` alone: the copies a parameter keeps in other dtypes (`Param::get_as`) add their gradients there and are
//! rewritten there, in the same program as the update.

pub mod adamw;
mod clip;
pub mod schedule;
pub mod sgd;

use std::collections::HashMap;

use lazuli_hlo::{DType, Loc};

pub use adamw::AdamW;
pub use clip::clip_grad_norm;
pub use schedule::Schedule;
pub use sgd::Sgd;

use crate::error::Result;
use crate::graph::tensor::Tensor;
use crate::train::nn::Param;

/// A gradient-based optimizer over a fixed list of named parameters.
pub trait Optimizer {
    /// Record the update of every parameter that has a gradient (lazily; nothing runs here). The update's nodes
    /// carry the caller's line, so reports and errors point at the training loop's `step()`.
    #[track_caller]
    fn step(&mut self);
    /// Forget the parameters' gradients.
    fn zero_grad(&self);
    /// The learning rate of the next `step()`.
    fn lr(&self) -> f64;
    /// Set the learning rate (a host scalar: no recompile).
    fn set_lr(&mut self, lr: f64);
    /// Number of `step()` calls so far.
    fn steps(&self) -> u64;
    /// Number of steps whose update was applied: [`Optimizer::steps`] less the steps that
    /// `LAZULI_CHECK_FINITE=skip` skipped, where the optimizer counts them on the device (AdamW; reading that
    /// count waits for the last step). A checkpoint saves this count.
    fn steps_applied(&self) -> Result<u64> {
        Ok(self.steps())
    }
    /// Named state tensors (for checkpoints), e.g. `"layers.0.weight.exp_avg"`.
    fn state(&self) -> Vec<(String, Tensor)>;
    /// Restore state saved by `state()` and the step count.
    fn load_state(&mut self, state: &HashMap<String, Tensor>, steps: u64) -> Result<()>;
}

/// One host scalar per dtype and value for one step, shared by every parameter's update (one upload each); the
/// fused updates broadcast it inside.
pub(crate) struct Scalars(HashMap<(DType, u64), Tensor>);

impl Scalars {
    pub fn new() -> Scalars {
        Scalars(HashMap::new())
    }

    /// `value` as a rank-0 host scalar of `dtype`.
    #[track_caller]
    pub fn scalar(&mut self, dtype: DType, value: f64) -> Tensor {
        self.0.entry((dtype, value.to_bits())).or_insert_with(|| Tensor::scalar_of(dtype, value)).clone()
    }
}

/// What a hyperparameter must be.
#[derive(Clone, Copy)]
pub(crate) enum Bound {
    /// Finite and at least 0 (a learning rate, a weight decay, eps, a momentum).
    NonNegative,
    /// In `[0, 1)` (a moment's decay: 1 would divide by a zero bias correction).
    Fraction,
}

/// Panic at `at` (the user's line) naming the first of `optimizer`'s hyperparameters outside its bound: a
/// programmer error that would otherwise make every weight NaN or send it the wrong way at the first step.
#[track_caller]
pub(crate) fn check_hyperparameters(optimizer: &str, values: &[(&str, f64, Bound)], at: Loc) {
    for &(name, value, bound) in values {
        let (fits, want) = match bound {
            Bound::NonNegative => (value.is_finite() && value >= 0.0, "finite and at least 0"),
            Bound::Fraction => ((0.0..1.0).contains(&value), "in [0, 1)"),
        };
        if !fits {
            crate::graph::record::fail(at, format!("{optimizer}: {name} is {value}, but it must be {want}"));
        }
    }
}

/// Replace a state tensor by its next value, noting the succession so that the step's program updates the old
/// buffer in place (donation pairs each old value with its own new value).
pub(crate) fn replace(slot: &mut Tensor, next: Tensor) {
    slot.node.hand_over(&next.node);
    *slot = next;
}

/// A zero state tensor like `p`, as host data (so it is a program parameter from the first step on, and step 2
/// has the same structure as step 1).
#[track_caller]
pub(crate) fn zeros_like_host(p: &Param) -> Tensor {
    let v = p.get();
    crate::train::nn::init::host_zeros(v.dims(), v.dtype())
}

/// Look up a named state tensor and check its type against the parameter's.
pub(crate) fn take_state(state: &HashMap<String, Tensor>, name: &str, like: &Param) -> Result<Tensor> {
    let t = state
        .get(name)
        .ok_or_else(|| crate::error::Error::Checkpoint(format!("optimizer state {name:?} is missing")))?;
    let want = like.get();
    if t.tensor_type() != want.tensor_type() {
        return Err(crate::error::Error::Checkpoint(format!(
            "optimizer state {name:?} is {}, the parameter is {}",
            t.tensor_type(),
            want.tensor_type()
        )));
    }
    Ok(t.clone())
}

/// Lay `state` out like parameter `p` when `p` lives on a mesh (sharded or replicated optimizer state follows its
/// parameter, so FSDP shards the Adam moments too and updates stay local). For a pending new state this is a
/// constraint, so the step's output keeps the layout across steps.
pub(crate) fn follow(state: &Tensor, p: &Tensor) -> Tensor {
    match p.sharding() {
        Some(s) if state.sharding().as_deref() != Some(&*s) => {
            if state.is_pending() {
                state.with_sharding_constraint(&s.mesh, &s.spec())
            } else {
                state.shard(&s.mesh, &s.spec())
            }
        }
        _ => state.clone(),
    }
}

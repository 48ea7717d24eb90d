//! A user's own Triton kernel as a lazuli op: the Triton IR and its launch (a [`TritonCall`]), the result types,
//! and a composite (the same function with lazuli's ops) that runs where Triton cannot and serves as the
//! reference, plus per result a gradient (a program of the user's, which may call further kernels) or autodiff
//! through the composite.

use std::sync::Arc;

use lazuli_hlo::{Choice, Gradient, KernelDef, Program, TensorType};

use crate::triton::TritonCall;
use crate::{Implementation, Target};

/// Everything a custom Triton kernel is made of, for one signature.
#[derive(Clone, Debug)]
pub struct CustomKernel {
    /// The op's name in diagnostics (usually the `tt.func`'s).
    pub name: &'static str,
    pub call: TritonCall,
    pub operands: Vec<TensorType>,
    pub results: Vec<TensorType>,
    /// The kernel's meaning with lazuli's ops, on `operands`, returning `results`.
    pub composite: Program,
    /// One rule per result.
    pub gradients: Vec<Gradient>,
}

/// The kernel definition for `target`: the Triton call on NVIDIA GPUs (compute capability 8.0+) unless `want`
/// is `Composite`, else the composite. Every launch parameter is checked first; forcing Triton where it cannot
/// run is an error.
pub fn define(kernel: CustomKernel, target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    let CustomKernel { name, call, operands, results, composite, gradients } = kernel;
    call.validate(operands.len(), results.len()).map_err(|e| format!("{name}: {e}"))?;
    let no_gpu = target.no_gpu_kernels();
    let (device, choice) = match (want, no_gpu) {
        (Implementation::Composite, _) => (None, Choice { implementation: "composite", reason: "asked for".into() }),
        (Implementation::Cudnn, _) => return Err(format!("{name}: a custom Triton kernel has no cuDNN form")),
        (Implementation::Triton, Some(why)) => return Err(format!("{name}: Triton was asked for but {why}")),
        (Implementation::Auto, Some(why)) => (None, Choice { implementation: "composite", reason: why }),
        (Implementation::Triton | Implementation::Auto, None) => {
            let device = Program::record(&operands, |b, x| {
                let args: Vec<&lazuli_hlo::Value> = x.iter().collect();
                b.call(call.custom_call(results.clone()), &args).into_iter().map(Some).collect()
            })?;
            let reason = format!("grid {:?}, {} warps, {} stages", call.grid, call.num_warps, call.num_stages);
            (Some(device), Choice { implementation: "triton", reason })
        }
    };
    KernelDef::new(name, operands, results, device, composite, gradients, choice)
}

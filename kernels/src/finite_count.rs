//! How many elements of a list of float tensors are NaN or infinite, as one `i32[1]`: the count a guarded step's
//! finite check takes over its loss and gradients. On NVIDIA GPUs one launch of lazuli's Triton kernel
//! (`triton/finite_count.rs`) over every tensor and a sum of its programs' counts, where XLA's program counted each
//! tensor in a reduction kernel of its own (a hundred launches for GPT-2 small, each too short to read at the
//! memory's speed). Elsewhere the composite, also the reference: each tensor's flags summed, the sums added.

use std::sync::{Arc, Mutex};

use lazuli_hlo::{Builder, CompareDir, DType, Gradient, KernelDef, Program, TensorType, UnaryKind};

use crate::choice::{made_once, triton_or_composite, triton_scalar, Made};
use crate::triton::finite_count::{self as ttfc, CountSpec, CountTiling};
use crate::{Implementation, Target};

const KERNEL: &str = "count_nonfinite";

/// The count's result: one `i32`.
pub fn count_type() -> TensorType {
    TensorType::new(DType::I32, [1])
}

/// The kernel counting the non-finite elements of tensors of types `operands` on `target`, as `want` asks. Made
/// once per (types, target, setting).
pub fn count_nonfinite(
    operands: &[TensorType],
    target: &Target,
    want: Implementation,
) -> Result<Arc<KernelDef>, String> {
    static MADE: Made<(Vec<TensorType>, Target, Implementation)> = Mutex::new(None);
    made_once(&MADE, (operands.to_vec(), target.clone(), want), || make(operands, target, want))
}

fn make(operands: &[TensorType], target: &Target, want: Implementation) -> Result<Arc<KernelDef>, String> {
    if let Some(ty) = operands.iter().find(|t| !t.dtype.is_float()) {
        return Err(format!("{KERNEL}: counts non-finite values of float tensors, not {ty}"));
    }
    let operands = operands.to_vec();
    let composite = Program::record(&operands, |b, x| vec![Some(composite(b, x))])?;
    let elements: usize = operands.iter().map(TensorType::elements).sum();
    let what = format!("{} tensors, {elements} elements", operands.len());
    let (launches, choice) = triton_or_composite(KERNEL, what, (target, want), || triton_launches(&operands))?;
    let device = launches.map(|launches| device_program(&operands, &launches)).transpose()?;
    KernelDef::new(KERNEL, operands, vec![count_type()], device, composite, vec![Gradient::None], choice)
}

/// At most this many tensors a launch: a kernel's arguments are its tensors' pointers, and CUDA takes 32 KB of
/// them (4 KB before CUDA 12.1).
pub const LAUNCH_TENSORS: usize = 480;

/// One launch of the kernel: the operands it counts (a range of them) and its signature.
type Launch = (std::ops::Range<usize>, CountSpec);

/// The launches counting `operands`: runs of up to [`LAUNCH_TENSORS`] tensors, those with elements to count.
fn triton_launches(operands: &[TensorType]) -> Result<Vec<Launch>, String> {
    let tensors = operands.iter().map(|t| Ok((triton_scalar(t.dtype, KERNEL)?, t.elements())));
    let tensors: Vec<_> = tensors.collect::<Result<_, String>>()?;
    let whole = CountSpec { tensors: tensors.clone() };
    if let Some(why) = whole.unsupported() {
        return Err(why);
    }
    let mut launches = Vec::new();
    for start in (0..tensors.len()).step_by(LAUNCH_TENSORS) {
        let range = start..(start + LAUNCH_TENSORS).min(tensors.len());
        let spec = CountSpec { tensors: tensors[range.clone()].to_vec() };
        if spec.unsupported().is_none() {
            launches.push((range, spec));
        }
    }
    Ok(launches)
}

/// Each launch's programs' counts, summed, and the launches' sums added.
fn device_program(operands: &[TensorType], launches: &[Launch]) -> Result<Program, String> {
    let calls = launches.iter().map(|(range, spec)| {
        let triton = ttfc::count(spec, CountTiling::DEFAULT);
        triton.validate(range.len(), 1)?;
        Ok((range.clone(), triton))
    });
    let calls: Vec<_> = calls.collect::<Result<_, String>>()?;
    Program::record(operands, |b, x| {
        let mut total = b.constant(0.0, TensorType::scalar(DType::I32));
        for (range, triton) in &calls {
            let programs = TensorType::new(DType::I32, [triton.grid[0] as usize]);
            let args: Vec<_> = x[range.clone()].iter().collect();
            let counts = b.call(triton.custom_call(vec![programs]), &args).remove(0);
            let sum = b.sum(&counts, &[0]);
            total = b.add(&total, &sum);
        }
        vec![Some(b.reshape(&total, &[1]))]
    })
}

/// Each tensor's elements tested by `|x| < inf` (false for NaN and ±inf), the failures counted, the counts added.
fn composite<B: Builder>(b: &mut B, xs: &[B::V]) -> B::V {
    let mut total = b.constant(0.0, TensorType::scalar(DType::I32));
    for x in xs {
        let ty = b.ty(x).clone();
        if ty.elements() == 0 {
            continue;
        }
        let flat = b.reshape(x, &[ty.elements()]);
        let magnitude = b.unary(UnaryKind::Abs, &flat);
        let inf = b.full_like(&magnitude, f64::INFINITY);
        let finite = b.compare(CompareDir::Lt, &magnitude, &inf);
        let flags_ty = TensorType::new(DType::I32, [ty.elements()]);
        let (no, yes) = (b.constant(0.0, flags_ty.clone()), b.constant(1.0, flags_ty));
        let flags = b.select(&finite, &no, &yes);
        let count = b.sum(&flags, &[0]);
        total = b.add(&total, &count);
    }
    b.reshape(&total, &[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types() -> Vec<TensorType> {
        vec![
            TensorType::scalar(DType::F32),
            TensorType::new(DType::BF16, [3, 5]),
            TensorType::new(DType::F32, [0, 4]),
            TensorType::new(DType::F16, [7]),
        ]
    }

    #[test]
    fn the_gpu_gets_one_triton_launch_and_a_sum() {
        let hopper = Target::Cuda { compute_capability: Some((9, 0)) };
        let def = count_nonfinite(&types(), &hopper, Implementation::Auto).unwrap();
        assert_eq!(def.choice.implementation, "triton");
        assert_eq!(def.results, vec![count_type()]);
        let device = format!("{:?}", def.device.as_ref().expect("a device program"));
        assert_eq!(device.matches("__gpu$xla.gpu.triton").count(), 1, "{device}");
    }

    #[test]
    fn many_tensors_are_counted_in_launches_of_a_few_hundred() {
        let hopper = Target::Cuda { compute_capability: Some((9, 0)) };
        let mut types = vec![TensorType::new(DType::F32, [0]); LAUNCH_TENSORS];
        types.extend(vec![TensorType::new(DType::BF16, [3]); LAUNCH_TENSORS + 1]);
        let def = count_nonfinite(&types, &hopper, Implementation::Auto).unwrap();
        let device = format!("{:?}", def.device.as_ref().expect("a device program"));
        // The first run has nothing to count and no launch; the rest takes two.
        assert_eq!(device.matches("__gpu$xla.gpu.triton").count(), 2, "{device}");
        let launches = triton_launches(&types).unwrap();
        let ranges: Vec<_> = launches.iter().map(|(r, _)| r.clone()).collect();
        let n = LAUNCH_TENSORS;
        assert_eq!(ranges, vec![n..2 * n, 2 * n..2 * n + 1]);
        assert!(launches.iter().all(|(r, spec)| spec.tensors.len() == r.len()));
    }

    #[test]
    fn elsewhere_the_composite_and_a_forced_triton_says_why_not() {
        let def = count_nonfinite(&types(), &Target::Cpu, Implementation::Auto).unwrap();
        assert!(def.device.is_none());
        assert_eq!(def.choice.implementation, "composite");
        let err = count_nonfinite(&types(), &Target::Cpu, Implementation::Triton).unwrap_err();
        assert!(err.contains("not an NVIDIA GPU"), "{err}");
        let ints = [TensorType::new(DType::I32, [2])];
        let err = count_nonfinite(&ints, &Target::Cpu, Implementation::Auto).unwrap_err();
        assert!(err.contains("float tensors"), "{err}");
    }
}

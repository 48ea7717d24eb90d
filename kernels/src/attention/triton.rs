//! Attention through lazuli's Triton flash kernels (`triton/flash.rs`): a forward kernel (output and row
//! log-sum-exp) and two backward kernels (dq; dk and dv), with `delta = rowsum(dO · O)` computed by XLA between
//! them. Used where cuDNN does not apply (f32, sliding windows, head dims cuDNN refuses).

use lazuli_hlo::{Builder, DType, Precision, Program};

use super::{AttentionSpec, Device, Dims, Layout};
use crate::triton::flash::{self, FlashDtype, FlashLayout, FlashSpec};

/// The flash kernels' spec of an attention call, or why they do not take it.
fn flash_spec(spec: &AttentionSpec, d: &Dims) -> Result<FlashSpec, String> {
    let dtype = match spec.q.dtype {
        DType::F32 => FlashDtype::F32,
        DType::F16 => FlashDtype::F16,
        DType::BF16 => FlashDtype::BF16,
        other => return Err(format!("lazuli's Triton attention takes f32, f16 or bf16, not {other}")),
    };
    if spec.bias.is_some() {
        return Err("lazuli's Triton attention takes no bias".into());
    }
    if d.value_dim != d.head_dim {
        return Err(format!("value head dim {} differs from the query's {}", d.value_dim, d.head_dim));
    }
    let fs = FlashSpec {
        batch: d.batch,
        heads: d.heads,
        seq_q: d.seq_q,
        seq_kv: d.seq_kv,
        head_dim: d.head_dim,
        dtype,
        layout: match spec.layout {
            Layout::Bhtd => FlashLayout::Bhtd,
            Layout::Bthd => FlashLayout::Bthd,
        },
        causal: spec.causal,
        window: spec.window,
        scale_bits: spec.scale().to_bits(),
        tf32: spec.precision == Precision::Default,
        packed: spec.packed,
    };
    match flash::unsupported(&fs) {
        Some(why) => Err(why),
        None => Ok(fs),
    }
}

/// Why the Triton kernels do not take this call (`None`: they do).
pub(super) fn unsupported(spec: &AttentionSpec, d: &Dims) -> Option<String> {
    flash_spec(spec, d).err()
}

/// The forward program (q, k, v → output, log-sum-exp) and the backward program; packed, (qkv → output,
/// log-sum-exp) and one backward launch writing dqkv.
pub(super) fn device(spec: &AttentionSpec, d: &Dims) -> Result<Device, String> {
    let fs = flash_spec(spec, d)?;
    let qkv = spec.qkv_operands();
    let n = qkv.len();
    let out = spec.output(d);
    let stats = AttentionSpec::stats(d);
    // (operands, results) of each kernel: lazuli's generators are checked like a user's kernel.
    let checked = |call: crate::triton::TritonCall, operands, results| call.validate(operands, results).map(|()| call);
    let forward_call = checked(flash::forward(&fs), n, 2)?;
    let forward = Program::record(&qkv, |b, x| {
        let args: Vec<&_> = x.iter().collect();
        b.call(forward_call.custom_call(vec![out.clone(), stats.clone()]), &args).into_iter().map(Some).collect()
    })?;
    let mut inputs = qkv.clone();
    inputs.extend([out.clone(), out.clone(), stats.clone()]);
    let backward = if spec.packed {
        let call = checked(flash::backward_packed(&fs), 4, 1)?;
        Program::record(&inputs, |b, x| {
            let (qkv_, o, g, lse) = (&x[0], &x[1], &x[2], &x[3]);
            let delta = row_dot(b, spec, o, g);
            vec![Some(b.call(call.custom_call(qkv.clone()), &[qkv_, g, lse, &delta]).remove(0))]
        })?
    } else {
        let dq_call = checked(flash::backward_dq(&fs), 6, 1)?;
        let dkdv_call = checked(flash::backward_dkdv(&fs), 6, 2)?;
        Program::record(&inputs, |b, x| {
            let (q_, k_, v_, o, g, lse) = (&x[0], &x[1], &x[2], &x[3], &x[4], &x[5]);
            let delta = row_dot(b, spec, o, g);
            let args = [q_, k_, v_, g, lse, &delta];
            let dq = b.call(dq_call.custom_call(vec![spec.q.clone()]), &args).remove(0);
            let mut dkdv = b.call(dkdv_call.custom_call(vec![spec.k.clone(), spec.v.clone()]), &args);
            let dv = dkdv.remove(1);
            vec![Some(dq), Some(dkdv.remove(0)), Some(dv)]
        })?
    };
    Ok(Device { forward, backward })
}

/// `Σ_d dO · O` per query row, in f32, as `[B, H, Tq]`.
fn row_dot<B: Builder>(b: &mut B, spec: &AttentionSpec, o: &B::V, g: &B::V) -> B::V {
    let o = b.convert(o, DType::F32);
    let g = b.convert(g, DType::F32);
    let og = b.mul(&o, &g);
    let rows = b.sum(&og, &[3]);
    match spec.layout {
        Layout::Bhtd => rows,
        Layout::Bthd => b.transpose(&rows, &[0, 2, 1]),
    }
}

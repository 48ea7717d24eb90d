//! cuDNN's flash attention through XLA's CUDA plugin: the custom calls `__cudnn$fmhaSoftmax` (forward: output,
//! softmax statistics, workspace) and `__cudnn$fmhaSoftmaxBackward` (dq, dk, dv, workspace), whose JSON
//! `backend_config` describes the cuDNN graph XLA builds. The fields are those XLA's cuDNN rewriter reads (the
//! same JAX's `dot_product_attention(implementation="cudnn")` sends).
//!
//! The results are declared `[B, H, T, D]`; in the `Bthd` layout their physical order is `[B, T, H, D]`
//! (minor-to-major 3, 1, 2, 0), so the transposes after the call are relabelings XLA turns into bitcasts.

use lazuli_hlo::{BackendConfig, Builder, CustomCall, DType, Program, TensorType};

use super::{AttentionSpec, Device, Dims, Layout};
use crate::Target;

/// Why cuDNN's flash attention does not take this call (`None`: it does), on a GPU that can run it.
pub(super) fn unsupported(spec: &AttentionSpec, d: &Dims, target: &Target) -> Option<String> {
    let hopper = target.compute_capability().is_some_and(|cc| cc >= (9, 0));
    let max_head = if hopper { 256 } else { 128 };
    if !matches!(spec.q.dtype, DType::BF16 | DType::F16) {
        return Some(format!("cuDNN's flash attention takes bf16 or f16, not {}", spec.q.dtype));
    }
    if !d.head_dim.is_multiple_of(8) || d.head_dim > max_head {
        return Some(format!("head dim {} is not supported by cuDNN (a multiple of 8 up to {max_head})", d.head_dim));
    }
    if d.value_dim != d.head_dim {
        return Some(format!("value head dim {} differs from the query's {}", d.value_dim, d.head_dim));
    }
    if spec.packed {
        // Copying them apart (and joining the gradients) would cost the two passes the packed kernels save.
        return Some("cuDNN's call reads q, k and v as tensors of their own, not as slots of one packed tensor".into());
    }
    if spec.bias.is_some() {
        return Some("lazuli calls cuDNN without a bias".into());
    }
    if spec.window.is_some() {
        return Some("lazuli calls cuDNN without sliding windows".into());
    }
    if spec.causal && d.seq_q != d.seq_kv {
        return Some("causal attention with different query and key lengths".into());
    }
    None
}

/// The forward and backward programs around the two custom calls.
pub(super) fn device(spec: &AttentionSpec, d: &Dims) -> Result<Device, String> {
    let operands = [spec.q.clone(), spec.k.clone(), spec.v.clone()];
    let stats = AttentionSpec::stats(d);
    let forward = Program::record(&operands, |b, x| {
        let call = call(spec, d, false, vec![declared(spec, d, d.seq_q), AttentionSpec::stats(d), workspace()]);
        let r = b.call(call, &[&x[0], &x[1], &x[2]]);
        vec![Some(relabel(b, spec, &r[0])), Some(r[1].clone())]
    })?;
    let out = spec.output(d);
    let inputs = [operands[0].clone(), operands[1].clone(), operands[2].clone(), out.clone(), out, stats];
    let backward = Program::record(&inputs, |b, x| {
        let (q, k, v, o, g, stats) = (&x[0], &x[1], &x[2], &x[3], &x[4], &x[5]);
        let results =
            vec![declared(spec, d, d.seq_q), declared(spec, d, d.seq_kv), declared(spec, d, d.seq_kv), workspace()];
        let r = b.call(call(spec, d, true, results), &[q, k, v, stats, g, o]);
        (0..3).map(|i| Some(relabel(b, spec, &r[i]))).collect()
    })?;
    Ok(Device { forward, backward })
}

/// `[B, H, seq, D]` of the operands' dtype: how cuDNN's results are declared.
fn declared(spec: &AttentionSpec, d: &Dims, seq: usize) -> TensorType {
    TensorType::new(spec.q.dtype, [d.batch, d.heads, seq, d.head_dim])
}

fn workspace() -> TensorType {
    TensorType::new(DType::U8, [0])
}

/// A declared `[B, H, T, D]` result in the spec's layout.
fn relabel(b: &mut lazuli_hlo::Recorder, spec: &AttentionSpec, r: &lazuli_hlo::Value) -> lazuli_hlo::Value {
    match spec.layout {
        Layout::Bhtd => r.clone(),
        Layout::Bthd => b.transpose(r, &[0, 2, 1, 3]),
    }
}

/// The forward or backward custom call with `results` (the last one the workspace).
fn call(spec: &AttentionSpec, d: &Dims, backward: bool, results: Vec<TensorType>) -> CustomCall {
    let tensor_layout = match spec.layout {
        Layout::Bhtd => vec![3, 2, 1, 0],
        Layout::Bthd => vec![3, 1, 2, 0],
    };
    let row_major = |t: &TensorType| (0..t.rank()).rev().collect::<Vec<usize>>();
    let result_layouts =
        results.iter().map(|t| if t.rank() == 4 { tensor_layout.clone() } else { row_major(t) }).collect();
    CustomCall {
        target: if backward { "__cudnn$fmhaSoftmaxBackward" } else { "__cudnn$fmhaSoftmax" }.to_string(),
        api_version: 2,
        backend_config: BackendConfig::String(backend_config(spec, d, backward)),
        results,
        operand_layouts: Vec::new(),
        result_layouts,
    }
}

/// XLA's `CudnnfMHABackendConfig` as JSON (wrapped in a `GpuBackendConfig`).
fn backend_config(spec: &AttentionSpec, d: &Dims, backward: bool) -> String {
    let element = if spec.q.dtype == DType::BF16 { "BF16" } else { "F16" };
    let dims = format!("[\"{}\", \"{}\", \"{}\", \"{}\"]", d.batch, d.heads, d.seq_q, d.seq_kv);
    let mask = if spec.causal { "CAUSAL" } else { "NO_MASK" };
    let products: String = dot_dimensions(spec.layout, backward)
        .iter()
        .map(|(key, (lc, rc), (lb, rb))| {
            format!(
                ", \"{key}\": {{\"lhs_contracting_dimensions\": [\"{lc}\"], \"rhs_contracting_dimensions\": \
                 [\"{rc}\"], \"lhs_batch_dimensions\": [\"{}\", \"{}\"], \"rhs_batch_dimensions\": [\"{}\", \"{}\"]}}",
                lb.0, lb.1, rb.0, rb.1
            )
        })
        .collect();
    format!(
        "{{\"operation_queue_id\": \"0\", \"cudnn_fmha_backend_config\": {{\"algorithm\": {{\"algo_id\": \"0\", \
         \"math_type\": \"TENSOR_OP_MATH\", \"tuning_knobs\": {{\"17\": \"1\", \"24\": \"0\"}}, \
         \"is_cudnn_frontend\": true, \"workspace_size\": \"0\"}}, \"fmha_scale\": {scale}, \
         \"intermediate_tensor_shape\": {{\"element_type\": \"{element}\", \"dimensions\": {dims}, \
         \"tuple_shapes\": [], \"layout\": {{\"dim_level_types\": [], \"dim_unique\": [], \"dim_ordered\": [], \
         \"minor_to_major\": [\"3\", \"2\", \"1\", \"0\"], \"tiles\": [], \"element_size_in_bits\": \"0\", \
         \"memory_space\": \"0\", \"index_primitive_type\": \"PRIMITIVE_TYPE_INVALID\", \
         \"pointer_primitive_type\": \"PRIMITIVE_TYPE_INVALID\", \"dynamic_shape_metadata_prefix_bytes\": \"0\"}}, \
         \"is_dynamic_dimension\": [false, false, false, false]}}, \"is_flash_attention\": true, \
         \"mask_type\": \"{mask}\"{products}, \"dropout_rate\": 0.0, \"seed\": 42, \"sliding_window_length\": 0, \
         \"max_seg_per_batch\": 1, \"is_paged_attention\": false}}}}",
        scale = json_number(spec.scale()),
    )
}

/// A JSON number: the shortest decimal that reads back as the same f64, with a fraction part.
fn json_number(x: f64) -> String {
    let s = format!("{x:?}");
    if s.contains(['.', 'e', 'E']) {
        s
    } else {
        format!("{s}.0")
    }
}

type DotDims = (&'static str, (usize, usize), ((usize, usize), (usize, usize)));

/// The six products of flash attention (two forward, four backward) as (lhs, rhs) contracting dimensions and
/// (lhs, rhs) batch dimensions, for the layout: `BMM1: Q·K → P`, `BMM2: P·V → O`, and their gradients.
fn dot_dimensions(layout: Layout, backward: bool) -> Vec<DotDims> {
    let all: [DotDims; 6] = match layout {
        Layout::Bhtd => [
            ("bmm1_dot_dimension_numbers", (3, 3), ((0, 1), (0, 1))),
            ("bmm2_dot_dimension_numbers", (3, 2), ((0, 1), (0, 1))),
            ("bmm1_grad_gemm1_dot_dimension_numbers", (2, 2), ((0, 1), (0, 1))),
            ("bmm1_grad_gemm2_dot_dimension_numbers", (3, 2), ((0, 1), (0, 1))),
            ("bmm2_grad_gemm1_dot_dimension_numbers", (2, 2), ((0, 1), (0, 1))),
            ("bmm2_grad_gemm2_dot_dimension_numbers", (3, 3), ((0, 1), (0, 1))),
        ],
        Layout::Bthd => [
            ("bmm1_dot_dimension_numbers", (3, 3), ((0, 2), (0, 2))),
            ("bmm2_dot_dimension_numbers", (3, 1), ((0, 1), (0, 2))),
            ("bmm1_grad_gemm1_dot_dimension_numbers", (2, 1), ((0, 1), (0, 2))),
            ("bmm1_grad_gemm2_dot_dimension_numbers", (3, 1), ((0, 1), (0, 2))),
            ("bmm2_grad_gemm1_dot_dimension_numbers", (2, 1), ((0, 1), (0, 2))),
            ("bmm2_grad_gemm2_dot_dimension_numbers", (3, 3), ((0, 2), (0, 2))),
        ],
    };
    let (fwd, bwd) = all.split_at(2);
    (if backward { bwd } else { fwd }).to_vec()
}

//! What the attention kernel emits for an NVIDIA GPU, checked as text: the cuDNN calls with the backend config
//! XLA's cuDNN rewriter reads (byte for byte what JAX 0.10's `dot_product_attention(implementation="cudnn")`
//! sends for the same call), the forward lowered once for its two results, the Triton calls with their seven
//! keys; and on the CPU, the composite with no custom call at all.

use std::sync::Arc;

use lazuli_hlo::{emit, Builder, DType, Graph, KernelDef, KernelOp, Loc, NodeId, Op, OpRules, TensorType};
use lazuli_kernels::attention::{attention, AttentionSpec, Layout};
use lazuli_kernels::{Implementation, Target};

const HERE: Loc = Loc { file: "emit.rs", line: 1, col: 1 };

struct GraphBuilder(Graph);

impl Builder for GraphBuilder {
    type V = NodeId;
    fn ty<'a>(&'a self, v: &'a NodeId) -> &'a TensorType {
        &self.0.nodes[*v].ty
    }
    fn op(&mut self, op: Op, operands: &[&NodeId]) -> NodeId {
        self.0.push(op, operands.iter().map(|&&o| o).collect(), HERE).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// The program of a training step's attention: forward output, and dq, dk, dv for a cotangent parameter.
fn forward_and_backward(def: &Arc<KernelDef>) -> String {
    let mut g = GraphBuilder(Graph::new());
    let inputs: Vec<NodeId> = def.operands.iter().map(|t| g.0.parameter(t.clone(), HERE)).collect();
    let cotangent = g.0.parameter(def.results[0].clone(), HERE);
    let refs: Vec<&NodeId> = inputs.iter().collect();
    let forward = KernelOp::new(def.clone(), 0);
    let out = g.op(Op::Kernel(forward.clone()), &refs);
    let grads = forward.vjp(&mut g, &inputs, &out, &cotangent);
    g.0.outputs = std::iter::once(out).chain(grads.into_iter().map(|d| d.expect("a cotangent per operand"))).collect();
    emit(&g.0, &Default::default())
}

fn spec(dtype: DType, layout: Layout, (b, t, h, d): (usize, usize, usize, usize)) -> AttentionSpec {
    let ty = match layout {
        Layout::Bhtd => TensorType::new(dtype, [b, h, t, d]),
        Layout::Bthd => TensorType::new(dtype, [b, t, h, d]),
    };
    AttentionSpec { causal: true, layout, ..AttentionSpec::new(ty.clone(), ty.clone(), ty) }
}

const HOPPER: Target = Target::Cuda { compute_capability: Some((9, 0)) };

/// JAX 0.10.2's backend config for `dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")` on
/// bf16 `[2, 128, 4, 64]` (BTNH) operands, forward, as it prints it in the StableHLO text.
const JAX_FORWARD_CONFIG: &str = r#"backend_config = "{\22operation_queue_id\22: \220\22, \22cudnn_fmha_backend_config\22: {\22algorithm\22: {\22algo_id\22: \220\22, \22math_type\22: \22TENSOR_OP_MATH\22, \22tuning_knobs\22: {\2217\22: \221\22, \2224\22: \220\22}, \22is_cudnn_frontend\22: true, \22workspace_size\22: \220\22}, \22fmha_scale\22: 0.125, \22intermediate_tensor_shape\22: {\22element_type\22: \22BF16\22, \22dimensions\22: [\222\22, \224\22, \22128\22, \22128\22], \22tuple_shapes\22: [], \22layout\22: {\22dim_level_types\22: [], \22dim_unique\22: [], \22dim_ordered\22: [], \22minor_to_major\22: [\223\22, \222\22, \221\22, \220\22], \22tiles\22: [], \22element_size_in_bits\22: \220\22, \22memory_space\22: \220\22, \22index_primitive_type\22: \22PRIMITIVE_TYPE_INVALID\22, \22pointer_primitive_type\22: \22PRIMITIVE_TYPE_INVALID\22, \22dynamic_shape_metadata_prefix_bytes\22: \220\22}, \22is_dynamic_dimension\22: [false, false, false, false]}, \22is_flash_attention\22: true, \22mask_type\22: \22CAUSAL\22, \22bmm1_dot_dimension_numbers\22: {\22lhs_contracting_dimensions\22: [\223\22], \22rhs_contracting_dimensions\22: [\223\22], \22lhs_batch_dimensions\22: [\220\22, \222\22], \22rhs_batch_dimensions\22: [\220\22, \222\22]}, \22bmm2_dot_dimension_numbers\22: {\22lhs_contracting_dimensions\22: [\223\22], \22rhs_contracting_dimensions\22: [\221\22], \22lhs_batch_dimensions\22: [\220\22, \221\22], \22rhs_batch_dimensions\22: [\220\22, \222\22]}, \22dropout_rate\22: 0.0, \22seed\22: 42, \22sliding_window_length\22: 0, \22max_seg_per_batch\22: 1, \22is_paged_attention\22: false}}""#;

/// The same for the backward call: its four gradient products.
const JAX_BACKWARD_PRODUCTS: &str = r#"\22bmm1_grad_gemm1_dot_dimension_numbers\22: {\22lhs_contracting_dimensions\22: [\222\22], \22rhs_contracting_dimensions\22: [\221\22], \22lhs_batch_dimensions\22: [\220\22, \221\22], \22rhs_batch_dimensions\22: [\220\22, \222\22]}, \22bmm1_grad_gemm2_dot_dimension_numbers\22: {\22lhs_contracting_dimensions\22: [\223\22], \22rhs_contracting_dimensions\22: [\221\22], \22lhs_batch_dimensions\22: [\220\22, \221\22], \22rhs_batch_dimensions\22: [\220\22, \222\22]}, \22bmm2_grad_gemm1_dot_dimension_numbers\22: {\22lhs_contracting_dimensions\22: [\222\22], \22rhs_contracting_dimensions\22: [\221\22], \22lhs_batch_dimensions\22: [\220\22, \221\22], \22rhs_batch_dimensions\22: [\220\22, \222\22]}, \22bmm2_grad_gemm2_dot_dimension_numbers\22: {\22lhs_contracting_dimensions\22: [\223\22], \22rhs_contracting_dimensions\22: [\223\22], \22lhs_batch_dimensions\22: [\220\22, \222\22], \22rhs_batch_dimensions\22: [\220\22, \222\22]}, \22dropout_rate\22: 0.0"#;

#[test]
fn cudnn_calls_carry_the_config_xla_reads_and_the_forward_is_lowered_once() {
    let def = attention(&spec(DType::BF16, Layout::Bthd, (2, 128, 4, 64)), &HOPPER, Implementation::Cudnn).unwrap();
    assert_eq!(def.choice.implementation, "cudnn", "{:?}", def.choice);
    let text = forward_and_backward(&def);
    assert_eq!(text.matches("call_target_name = \"__cudnn$fmhaSoftmax\"").count(), 1, "{text}");
    assert_eq!(text.matches("call_target_name = \"__cudnn$fmhaSoftmaxBackward\"").count(), 1, "{text}");
    assert!(text.contains(JAX_FORWARD_CONFIG), "forward config differs from JAX's:\n{text}");
    assert!(text.contains(JAX_BACKWARD_PRODUCTS), "backward products differ from JAX's:\n{text}");
    // Results declared [B, H, T, D] with the physical order [B, T, H, D], then relabeled.
    assert!(text.contains(
        "result_layouts = [dense<[3, 1, 2, 0]> : tensor<4xindex>, dense<[2, 1, 0]> : tensor<3xindex>, dense<[0]> : \
         tensor<1xindex>]"
    ));
    assert!(text.contains("-> (tensor<2x4x128x64xbf16>, tensor<2x4x128xf32>, tensor<0xui8>)"), "{text}");
    assert!(
        text.contains("-> (tensor<2x4x128x64xbf16>, tensor<2x4x128x64xbf16>, tensor<2x4x128x64xbf16>, tensor<0xui8>)")
    );
    assert!(text.contains("api_version = 2 : i32"));
}

#[test]
fn cudnn_takes_the_bhtd_layout_without_transposes() {
    let def = attention(&spec(DType::F16, Layout::Bhtd, (1, 256, 2, 128)), &HOPPER, Implementation::Cudnn).unwrap();
    let text = forward_and_backward(&def);
    assert!(text.contains("\\22element_type\\22: \\22F16\\22"), "{text}");
    assert!(text.contains("\\22bmm2_dot_dimension_numbers\\22: {\\22lhs_contracting_dimensions\\22: [\\223\\22], \\22rhs_contracting_dimensions\\22: [\\222\\22]"), "{text}");
    assert!(!text.contains("stablehlo.transpose"), "{text}");
}

#[test]
fn cudnn_gradients_of_keys_and_values_have_the_keys_length() {
    let (q, kv) = (TensorType::new(DType::BF16, [1, 2, 64, 64]), TensorType::new(DType::BF16, [1, 2, 96, 64]));
    let def = attention(&AttentionSpec::new(q, kv.clone(), kv), &HOPPER, Implementation::Cudnn).unwrap();
    let text = forward_and_backward(&def);
    assert!(
        text.contains("-> (tensor<1x2x64x64xbf16>, tensor<1x2x96x64xbf16>, tensor<1x2x96x64xbf16>, tensor<0xui8>)"),
        "{text}"
    );
    assert!(text.contains("\\22dimensions\\22: [\\221\\22, \\222\\22, \\2264\\22, \\2296\\22]"), "{text}");
}

/// Where both apply, `Auto` takes the one measured faster on an H200: Triton for causal attention with head dim up
/// to 64 and up to 1,024 keys, cuDNN elsewhere and on GPUs not measured.
#[test]
fn auto_takes_the_kernel_measured_faster_where_both_apply() {
    let ampere = Target::Cuda { compute_capability: Some((8, 0)) };
    let no_mask = |s: AttentionSpec| AttentionSpec { causal: false, ..s };
    let cases = [
        ("GPT-2 small", spec(DType::BF16, Layout::Bthd, (8, 1024, 12, 64)), &HOPPER, "triton"),
        ("512 keys, f16", spec(DType::F16, Layout::Bhtd, (16, 512, 12, 64)), &HOPPER, "triton"),
        ("no mask", no_mask(spec(DType::BF16, Layout::Bthd, (8, 1024, 12, 64))), &HOPPER, "cudnn"),
        ("4,096 keys", spec(DType::BF16, Layout::Bthd, (2, 4096, 12, 64)), &HOPPER, "cudnn"),
        ("head dim 128", spec(DType::BF16, Layout::Bthd, (4, 2048, 16, 128)), &HOPPER, "cudnn"),
        ("head dim 96", spec(DType::BF16, Layout::Bthd, (8, 1024, 8, 96)), &HOPPER, "cudnn"),
        ("Ampere", spec(DType::BF16, Layout::Bthd, (8, 1024, 12, 64)), &ampere, "cudnn"),
    ];
    for (what, s, target, want) in cases {
        let def = attention(&s, target, Implementation::Auto).unwrap();
        assert_eq!(def.choice.implementation, want, "{what}: {:?}", def.choice);
        let says_why = def.choice.reason.contains("Triton before cuDNN: measured faster on Hopper");
        assert_eq!(says_why, want == "triton", "{what}: {:?}", def.choice);
    }
}

/// An empty batch has nothing for a kernel to launch: the composite's, and forcing a kernel says why not.
#[test]
fn an_empty_batch_is_the_composites() {
    let empty = spec(DType::BF16, Layout::Bthd, (0, 1024, 12, 64));
    let def = attention(&empty, &HOPPER, Implementation::Auto).unwrap();
    assert_eq!(def.choice.implementation, "composite", "{:?}", def.choice);
    assert!(def.choice.reason.contains("an empty result"), "{:?}", def.choice);
    for forced in [Implementation::Cudnn, Implementation::Triton] {
        let err = attention(&empty, &HOPPER, forced).unwrap_err();
        assert!(err.contains("was asked for but an empty result"), "{err}");
    }
}

#[test]
fn triton_takes_what_cudnn_does_not_and_passes_all_seven_keys() {
    let def = attention(&spec(DType::F32, Layout::Bhtd, (2, 100, 3, 64)), &HOPPER, Implementation::Auto).unwrap();
    assert_eq!(def.choice.implementation, "triton");
    assert!(
        def.choice.reason.contains("not cuDNN: cuDNN's flash attention takes bf16 or f16, not f32"),
        "{:?}",
        def.choice
    );
    let text = forward_and_backward(&def);
    assert_eq!(text.matches("call_target_name = \"__gpu$xla.gpu.triton\"").count(), 3, "forward, dq, dk+dv:\n{text}");
    for key in [
        "debug = false",
        "grid_x = ",
        "grid_y = ",
        "grid_z = ",
        "ir = \"",
        "\", name = \"",
        "num_stages = ",
        "num_warps = ",
    ] {
        assert_eq!(text.matches(key).count(), 3, "{key}");
    }
    assert!(text.contains("api_version = 4 : i32"));
    assert!(!text.contains("cudnn"));
}

#[test]
fn head_dims_cudnn_refuses_go_to_triton_and_the_reason_says_so() {
    let ampere = Target::Cuda { compute_capability: Some((8, 0)) };
    let def = attention(&spec(DType::BF16, Layout::Bhtd, (1, 64, 2, 160)), &ampere, Implementation::Auto).unwrap();
    assert_eq!(def.choice.implementation, "triton", "{:?}", def.choice);
    assert!(def.choice.reason.contains("head dim 160 is not supported by cuDNN (a multiple of 8 up to 128)"));
    let def = attention(&spec(DType::BF16, Layout::Bhtd, (1, 64, 2, 36)), &HOPPER, Implementation::Auto).unwrap();
    assert!(def.choice.reason.contains("head dim 36 is not supported by cuDNN"), "{:?}", def.choice);
    let err = attention(&spec(DType::BF16, Layout::Bhtd, (1, 64, 2, 36)), &HOPPER, Implementation::Cudnn).unwrap_err();
    assert!(err.contains("cuDNN was asked for but head dim 36 is not supported"), "{err}");
}

#[test]
fn the_cpu_gets_the_composite_and_no_custom_call() {
    let s = spec(DType::BF16, Layout::Bthd, (2, 16, 2, 64));
    let def = attention(&s, &Target::Cpu, Implementation::Auto).unwrap();
    assert_eq!(def.choice.implementation, "composite");
    assert!(def.choice.reason.contains("the device is cpu, not an NVIDIA GPU"), "{:?}", def.choice);
    let text = forward_and_backward(&def);
    assert!(!text.contains("custom_call"), "{text}");
    assert!(text.contains("stablehlo.dot_general"));
    let err = attention(&s, &Target::Cpu, Implementation::Triton).unwrap_err();
    assert!(err.contains("Triton was asked for but the device is cpu"), "{err}");
}

#[test]
fn one_kernel_is_made_per_signature_and_shared() {
    let s = spec(DType::BF16, Layout::Bthd, (2, 32, 2, 64));
    let a = attention(&s, &HOPPER, Implementation::Auto).unwrap();
    let b = attention(&s, &HOPPER, Implementation::Auto).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let c = attention(&s, &HOPPER, Implementation::Composite).unwrap();
    assert_ne!(*a, *c, "another implementation is another kernel (and another program)");
}

#[test]
fn packed_q_k_v_go_to_triton_in_two_launches_and_read_their_slots_in_place() {
    let packed = AttentionSpec { packed: true, ..spec(DType::BF16, Layout::Bthd, (8, 1024, 12, 64)) };
    let def = attention(&packed, &HOPPER, Implementation::Auto).unwrap();
    assert_eq!(def.choice.implementation, "triton", "{:?}", def.choice);
    assert!(def.choice.reason.contains("q, k, v packed; not cuDNN: cuDNN's call reads q, k and v"), "{:?}", def.choice);
    assert_eq!(def.operands, [TensorType::new(DType::BF16, [8, 1024, 3, 12, 64])]);
    let text = forward_and_backward(&def);
    // The forward, and one backward for dq, dk and dv, on a grid whose third axis picks the job.
    assert_eq!(text.matches("call_target_name = \"__gpu$xla.gpu.triton\"").count(), 2, "{text}");
    assert!(text.contains("grid_z = 2"), "{text}");
    assert!(text.contains("lazuli_flash_bwd_bf16_bt3hd_causal_d64") && !text.contains("bwd_dq"), "{text}");
    // The operand is read in place: no slices, and the gradient comes out whole: no concatenation.
    assert!(!text.contains("stablehlo.slice") && !text.contains("stablehlo.concatenate"), "{text}");
    let err = attention(&packed, &HOPPER, Implementation::Cudnn).unwrap_err();
    assert!(err.contains("not as slots of one packed tensor"), "{err}");
    let composite = attention(&packed, &Target::Cpu, Implementation::Auto).unwrap();
    assert_eq!(composite.choice.implementation, "composite");
    let bad = AttentionSpec { packed: true, ..spec(DType::BF16, Layout::Bhtd, (1, 16, 2, 64)) };
    let err = attention(&bad, &HOPPER, Implementation::Auto).unwrap_err();
    assert!(err.contains("packed q, k and v must be three [batch, seq, heads, head_dim] slots"), "{err}");
}

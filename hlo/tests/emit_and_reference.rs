//! The emitter writes one generic op per line, each with the recording location; the reference interpreter
//! follows each op's rule. (Compiling the text is tested against real plugins in the root `tests/`.)

use lazuli_hlo::{
    emit, Binary, BinaryKind, DType, DotGeneral, EmitOptions, Graph, Loc, Op, Reduce, ReduceKind, TensorType,
};
use ndarray::{array, ArrayD};

fn matmul_sum_graph() -> (Graph, Loc) {
    let at = Loc { file: "src/model.rs", line: 12, col: 5 };
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, [2, 3]), at);
    let w = g.parameter(TensorType::new(DType::F32, [3, 2]), at);
    let dot = DotGeneral::new(&[], &[], &[1], &[0]);
    let y = g.push(Op::DotGeneral(dot), vec![x, w], at).unwrap();
    let s = g.push(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: vec![1], keep: false }), vec![y], at).unwrap();
    let z = g.push(Op::Binary(Binary { kind: BinaryKind::Mul }), vec![s, s], at).unwrap();
    g.outputs = vec![z, y];
    (g, at)
}

#[test]
fn every_op_line_carries_the_users_location() {
    let (g, _) = matmul_sum_graph();
    let text = emit(&g, &EmitOptions::default());
    let ops: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("%t")).collect();
    assert_eq!(ops.len(), 4, "dot, init constant, reduce, mul:\n{text}");
    // One-line ops end with the location; the reduce's closing line (after its reducer region) does too.
    for l in ops.iter().filter(|l| !l.ends_with("({")) {
        assert!(l.ends_with("loc(\"src/model.rs\":12:5)"), "{l}");
    }
    assert_eq!(text.matches("loc(\"src/model.rs\":12:5)").count(), 2 + 4, "2 parameters and 4 ops:\n{text}");
    assert!(text.contains("func.func @main(%arg0: tensor<2x3xf32>"), "{text}");
    assert!(text.contains("-> (tensor<2xf32>, tensor<2x2xf32>)"), "{text}");
    assert!(text.contains("dimensions = array<i64: 1>"), "{text}");
}

#[test]
fn reference_interpreter_follows_the_rules() {
    let (g, _) = matmul_sum_graph();
    let x: ArrayD<f64> = array![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]].into_dyn();
    let w: ArrayD<f64> = array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]].into_dyn();
    let out = g.evaluate(&[x, w]).unwrap();
    assert_eq!(out[1], array![[4.0, 5.0], [10.0, 11.0]].into_dyn());
    assert_eq!(out[0], array![81.0, 441.0].into_dyn());
}

#[test]
fn shape_rules_explain_what_does_not_fit() {
    let at = Loc { file: "x.rs", line: 1, col: 1 };
    let mut g = Graph::new();
    let a = g.parameter(TensorType::new(DType::F32, [2, 3]), at);
    let b = g.parameter(TensorType::new(DType::F32, [3]), at);
    let err = g.push(Op::Binary(Binary { kind: BinaryKind::Add }), vec![a, b], at).unwrap_err();
    assert_eq!(err, "add: operand types differ: f32[2,3] vs f32[3]");
    let err =
        g.push(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: vec![2], keep: false }), vec![a], at).unwrap_err();
    assert!(err.contains("axes [2]"), "{err}");
}

#[test]
fn literals_are_exact_bit_patterns() {
    assert_eq!(DType::F32.literal(1.0), "0x3F800000");
    assert_eq!(DType::F32.literal(f64::NEG_INFINITY), "0xFF800000");
    assert_eq!(DType::BF16.literal(1.0), "0x3F80");
    assert_eq!(DType::F16.literal(1.0), "0x3C00");
    assert_eq!(DType::I32.literal(-3.0), "-3");
    assert_eq!(DType::Bool.literal(1.0), "true");
    assert_eq!(TensorType::new(DType::U8, [4, 1]).mlir(), "tensor<4x1xui8>");
    assert_eq!(TensorType::scalar(DType::Bool).mlir(), "tensor<i1>");
}

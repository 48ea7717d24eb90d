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

/// A chain of `n` elementwise ops on one value, with a sum in the middle after `before` of them.
fn chain_graph(n: usize, sum_after: Option<usize>) -> String {
    use lazuli_hlo::{Unary, UnaryKind};
    let at = Loc { file: "src/loop.rs", line: 3, col: 9 };
    let mut g = Graph::new();
    let mut x = g.parameter(TensorType::new(DType::F32, [4]), at);
    for i in 0..n {
        if sum_after == Some(i) {
            let reduce = Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: vec![0], keep: true });
            x = g.push(reduce, vec![x], at).unwrap();
        }
        x = g.push(Op::Unary(Unary { kind: UnaryKind::Sin }), vec![x], at).unwrap();
    }
    g.outputs = vec![x];
    emit(&g, &EmitOptions::default())
}

/// XLA would fuse an elementwise chain into one loop however long, and its compile time grows faster than the
/// chain; the emitter cuts it every `FUSION_CUT` ops with an optimization barrier that keeps the user's line.
/// Short chains, and chains broken by an op whose result starts a new loop (a reduction), are not cut.
#[test]
fn long_elementwise_chains_are_cut_for_the_compiler() {
    let cut = lazuli_hlo::emit::FUSION_CUT;
    let barriers = |text: &str| text.matches("stablehlo.optimization_barrier").count();
    assert_eq!(barriers(&chain_graph(cut - 1, None)), 0);
    let text = chain_graph(3 * cut + 5, None);
    assert_eq!(barriers(&text), 3, "{}", &text[..2000.min(text.len())]);
    for l in text.lines().filter(|l| l.contains("optimization_barrier")) {
        assert!(l.ends_with("loc(\"src/loop.rs\":3:9)"), "{l}");
    }
    // The value after the barrier is what the chain continues with.
    let first = text.lines().find(|l| l.contains("optimization_barrier")).unwrap();
    let name = first.trim_start().split(' ').next().unwrap();
    assert!(text.contains(&format!("\"stablehlo.sine\"({name})")), "the chain reads the barrier's result");
    // A reduction in the middle: two chains shorter than the cut.
    assert_eq!(barriers(&chain_graph(2 * cut - 10, Some(cut - 5))), 0);
}

#[test]
fn values_and_indices_of_one_sort_lower_to_one_device_sort() {
    use lazuli_hlo::{Sort, SortResult};
    let at = Loc { file: "src/rank.rs", line: 7, col: 3 };
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, [2, 3]), at);
    let sort = |result| Op::Sort(Sort { axis: 1, descending: true, result });
    let v = g.push(sort(SortResult::Values), vec![x], at).unwrap();
    let i = g.push(sort(SortResult::Indices), vec![x], at).unwrap();
    let up = g.push(Op::Sort(Sort { axis: 0, descending: false, result: SortResult::Values }), vec![x], at).unwrap();
    g.outputs = vec![v, i, up];
    let text = emit(&g, &EmitOptions::default());
    assert_eq!(text.matches("\"stablehlo.sort\"").count(), 2, "one sort per (axis, order):\n{text}");
    assert!(text.contains("is_stable = true"), "{text}");

    let x: ArrayD<f64> = array![[1.0, f64::NAN, 3.0], [2.0, 2.0, -1.0]].into_dyn();
    let out = g.evaluate(&[x]).unwrap();
    let v: Vec<f64> = out[0].iter().copied().collect();
    assert!(v[0].is_nan() && v[1..] == [3.0, 1.0, 2.0, 2.0, -1.0], "NaN first descending: {v:?}");
    assert_eq!(out[1], array![[1.0, 2.0, 0.0], [0.0, 1.0, 2.0]].into_dyn(), "ties keep their order");
    let up: Vec<f64> = out[2].iter().copied().collect();
    assert!(up[4].is_nan() && [up[0], up[1], up[2], up[3], up[5]] == [1.0, 2.0, -1.0, 2.0, 3.0], "NaN last: {up:?}");
}

/// A 16-bit sum is reduced in f32 and rounded once (the CPU plugin widens it on its own, so only the text shows
/// it there); max stays in the element type, which loses nothing.
#[test]
fn sixteen_bit_sums_reduce_in_f32() {
    let at = Loc { file: "src/model.rs", line: 3, col: 1 };
    for dt in [DType::BF16, DType::F16] {
        let mut g = Graph::new();
        let x = g.parameter(TensorType::new(dt, [4096, 3]), at);
        let sum = |kind| Op::Reduce(Reduce { kind, axes: vec![0], keep: false });
        let s = g.push(sum(ReduceKind::Sum), vec![x], at).unwrap();
        let m = g.push(sum(ReduceKind::Max), vec![x], at).unwrap();
        g.outputs = vec![s, m];
        let text = emit(&g, &EmitOptions::default());
        let e = dt.mlir();
        let widen = format!("\"stablehlo.convert\"(%arg0) : (tensor<4096x3x{e}>) -> tensor<4096x3xf32>");
        assert!(text.contains(&widen), "{text}");
        assert!(text.contains("(tensor<4096x3xf32>, tensor<f32>) -> tensor<3xf32>"), "{text}");
        assert!(text.contains(&format!(": (tensor<3xf32>) -> tensor<3x{e}>")), "{text}");
        assert!(text.contains(&format!("(tensor<4096x3x{e}>, tensor<{e}>) -> tensor<3x{e}>")), "the max:\n{text}");
    }
}

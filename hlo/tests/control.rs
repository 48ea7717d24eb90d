//! Control flow at the IR level: the lowering's text (a `stablehlo.while` with a counter, `dynamic_slice` of the
//! xs and `dynamic_update_slice` of the ys; a `stablehlo.case` on the predicate), one op per call for several
//! result nodes, the reference interpreter's values, and the scan's and cond's gradient rules against finite
//! differences of the reference.

use lazuli_hlo::{
    emit, Binary, BinaryKind, Builder, Control, ControlDef, ControlOp, DType, DotGeneral, EmitOptions, Graph, Loc, Op,
    OpRules, Program, ScanForm, ScanGrad, Step, TensorType, Unary, UnaryKind,
};
use ndarray::{array, ArrayD};

const AT: Loc = Loc { file: "src/loop.rs", line: 7, col: 3 };

fn f64t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F64, dims)
}

/// Body: (c, x_t, w) -> (sin(c * w + x_t), c * x_t): a carry f64[2], xs f64[3,2], captured w f64[2].
fn body() -> Program {
    Program::record(&[f64t(&[2]), f64t(&[2]), f64t(&[2])], |b, a| {
        let cw = b.mul(&a[0], &a[2]);
        let s = b.add(&cw, &a[1]);
        let next = b.unary(UnaryKind::Sin, &s);
        let y = b.mul(&a[0], &a[1]);
        vec![Some(next), Some(y)]
    })
    .unwrap()
}

/// A graph computing the scan's two results from three parameters.
fn scan_graph(form: ScanForm) -> Graph {
    let mut g = Graph::new();
    let c = g.parameter(f64t(&[2]), AT);
    let xs = g.parameter(f64t(&[3, 2]), AT);
    let w = g.parameter(f64t(&[2]), AT);
    let def = ControlDef::scan(body(), vec![f64t(&[2]), f64t(&[3, 2]), f64t(&[2])], 1, 1, 3, form, ScanGrad::default())
        .unwrap();
    let carry = g.push(Op::Control(ControlOp::new(def.clone(), 0)), vec![c, xs, w], AT).unwrap();
    let ys = g.push(Op::Control(ControlOp::new(def, 1)), vec![c, xs, w], AT).unwrap();
    g.outputs = vec![carry, ys];
    g
}

/// The same loop in Rust on ndarray.
fn scan_by_hand(c: &ArrayD<f64>, xs: &ArrayD<f64>, w: &ArrayD<f64>, reverse: bool) -> (ArrayD<f64>, ArrayD<f64>) {
    let mut c = c.clone();
    let mut ys = ArrayD::zeros(xs.raw_dim());
    for s in 0..3 {
        let t = if reverse { 2 - s } else { s };
        let x = xs.index_axis(ndarray::Axis(0), t).to_owned();
        ys.index_axis_mut(ndarray::Axis(0), t).assign(&(&c * &x));
        c = (&(&c * w) + &x).mapv(f64::sin);
    }
    (c, ys)
}

fn inputs() -> [ArrayD<f64>; 3] {
    [
        array![0.3, -0.4].into_dyn(),
        array![[0.1, 0.2], [0.5, -0.3], [-0.7, 0.9]].into_dyn(),
        array![1.5, -0.8].into_dyn(),
    ]
}

#[test]
fn a_scan_lowers_to_one_while_with_a_counter_slices_and_updates() {
    let text = emit(&scan_graph(ScanForm::looped(false)), &EmitOptions::default());
    assert_eq!(text.matches("\"stablehlo.while\"").count(), 1, "two result nodes, one loop:\n{text}");
    // State: counter, carry, xs, captured w, ys being filled.
    assert!(
        text.contains(
            "= \"stablehlo.while\"(%t1, %arg0, %arg1, %arg2, %t2) ({\n    ^bb0(%t3: tensor<i64>, %t4: tensor<2xf64>, \
             %t5: tensor<3x2xf64>, %t6: tensor<2xf64>, %t7: tensor<3x2xf64>):"
        ),
        "{text}"
    );
    assert!(text.contains("comparison_direction LT"), "{text}");
    assert!(text.contains("\"stablehlo.dynamic_slice\"(%t"), "{text}");
    assert!(
        text.contains(
            "{slice_sizes = array<i64: 1, 2>} : (tensor<3x2xf64>, tensor<i64>, tensor<i64>) -> tensor<1x2xf64>"
        ),
        "{text}"
    );
    assert!(text.contains("\"stablehlo.dynamic_update_slice\"("), "{text}");
    assert!(!text.contains("stablehlo.subtract"), "a forward scan counts up:\n{text}");
    // Every line of the loop carries the location, the return too.
    assert!(text.contains("\"stablehlo.return\"(%t"), "{text}");
    let reversed = emit(&scan_graph(ScanForm::looped(true)), &EmitOptions::default());
    assert!(
        reversed.contains("value = dense<2> : tensor<i64>") && reversed.contains("stablehlo.subtract"),
        "{reversed}"
    );
}

#[test]
fn an_unrolled_scan_is_written_out_step_by_step() {
    for reverse in [false, true] {
        let text = emit(&scan_graph(ScanForm { reverse, unroll: true }), &EmitOptions::default());
        assert!(!text.contains("stablehlo.while") && !text.contains("dynamic_slice"), "{text}");
        // One static slice per step, in the order the steps run.
        let starts: Vec<&str> = text
            .match_indices("start_indices = array<i64: ")
            .map(|(i, m)| &text[i + m.len()..i + m.len() + 1])
            .collect();
        let want = if reverse { ["2", "1", "0"] } else { ["0", "1", "2"] };
        assert_eq!(starts, want, "{text}");
        // The ys stacked by one concatenate of the three steps, in the xs' order whichever way the scan ran.
        assert_eq!(text.matches("\"stablehlo.concatenate\"").count(), 1, "{text}");
        assert!(text.contains("(tensor<1x2xf64>, tensor<1x2xf64>, tensor<1x2xf64>) -> tensor<3x2xf64>"), "{text}");
    }
}

#[test]
fn the_reference_interpreter_runs_the_loop() {
    for reverse in [false, true] {
        let [c, xs, w] = inputs();
        let out = scan_graph(ScanForm::looped(reverse)).evaluate(&[c.clone(), xs.clone(), w.clone()]).unwrap();
        let (want_c, want_ys) = scan_by_hand(&c, &xs, &w, reverse);
        for (got, want) in [(&out[0], &want_c), (&out[1], &want_ys)] {
            assert!(got.iter().zip(want.iter()).all(|(a, b)| (a - b).abs() < 1e-15), "{got} vs {want}");
        }
    }
}

/// A builder that evaluates each op's reference rule (what the tests of the op families use).
struct Eval;

impl Builder for Eval {
    type V = (ArrayD<f64>, TensorType);
    fn ty<'a>(&'a self, v: &'a Self::V) -> &'a TensorType {
        &v.1
    }
    fn op(&mut self, op: Op, operands: &[&Self::V]) -> Self::V {
        let tys: Vec<&TensorType> = operands.iter().map(|v| &v.1).collect();
        let ty = op.infer(&tys).unwrap();
        let xs: Vec<&ArrayD<f64>> = operands.iter().map(|v| &v.0).collect();
        (op.reference(&ty, &xs), ty)
    }
}

/// `op`'s gradient rule for the objective `sum(op(x) * w)` against central differences of its reference.
fn check_vjp(op: &Op, inputs: &[ArrayD<f64>], tys: &[TensorType]) {
    let eval = |xs: &[ArrayD<f64>]| {
        let ty = op.infer(&tys.iter().collect::<Vec<_>>()).unwrap();
        op.reference(&ty, &xs.iter().collect::<Vec<_>>())
    };
    let out = eval(inputs);
    let w = ArrayD::from_shape_vec(out.raw_dim(), (0..out.len()).map(|k| 0.3 + 0.1 * k as f64).collect()).unwrap();
    let x: Vec<(ArrayD<f64>, TensorType)> = inputs.iter().cloned().zip(tys.iter().cloned()).collect();
    let out_ty = TensorType::new(DType::F64, out.shape());
    let grads = op.vjp(&mut Eval, &x, &(out.clone(), out_ty.clone()), &(w.clone(), out_ty));
    for (i, g) in grads.iter().enumerate() {
        let Some((g, _)) = g else {
            assert!(!tys[i].dtype.is_float(), "{}: float operand {i} has a cotangent", op.name());
            continue;
        };
        for k in 0..inputs[i].len() {
            let (mut plus, mut minus) = (inputs.to_vec(), inputs.to_vec());
            plus[i].as_slice_mut().unwrap()[k] += 1e-6;
            minus[i].as_slice_mut().unwrap()[k] -= 1e-6;
            let fd = ((eval(&plus) * &w).sum() - (eval(&minus) * &w).sum()) / 2e-6;
            let got = g.as_standard_layout().as_slice().unwrap()[k];
            assert!((got - fd).abs() < 1e-7 * (1.0 + fd.abs()), "{}: d/d {i}[{k}]: {got} vs {fd}", op.name());
        }
    }
}

#[test]
fn the_scan_gradient_rule_matches_finite_differences() {
    let tys = [f64t(&[2]), f64t(&[3, 2]), f64t(&[2])];
    for reverse in [false, true] {
        for (save, remat) in [(false, false), (true, false), (false, true), (true, true)] {
            let def =
                ControlDef::scan(body(), tys.to_vec(), 1, 1, 3, ScanForm::looped(reverse), ScanGrad { save, remat })
                    .unwrap();
            for result in 0..2 {
                check_vjp(&Op::Control(ControlOp::new(def.clone(), result)), &inputs(), &tys);
            }
        }
    }
}

/// cond(p, x, w): x * w if p else exp(x).
fn cond_def() -> std::sync::Arc<ControlDef> {
    let on_true = Program::record(&[f64t(&[2]), f64t(&[2])], |b, a| vec![Some(b.mul(&a[0], &a[1]))]).unwrap();
    let on_false = Program::record(&[f64t(&[2])], |b, a| vec![Some(b.unary(UnaryKind::Exp, &a[0]))]).unwrap();
    let tys = vec![TensorType::scalar(DType::Bool), f64t(&[2]), f64t(&[2])];
    ControlDef::cond(on_true, on_false, tys, 1, 1).unwrap()
}

#[test]
fn a_cond_lowers_to_a_case_on_the_predicate_and_differentiates_the_branch_taken() {
    let mut g = Graph::new();
    let p = g.parameter(TensorType::scalar(DType::Bool), AT);
    let x = g.parameter(f64t(&[2]), AT);
    let w = g.parameter(f64t(&[2]), AT);
    let y = g.push(Op::Control(ControlOp::new(cond_def(), 0)), vec![p, x, w], AT).unwrap();
    let z = g.push(Op::Binary(Binary { kind: BinaryKind::Add }), vec![y, y], AT).unwrap();
    g.outputs = vec![z];
    let text = emit(&g, &EmitOptions::default());
    assert!(text.contains("\"stablehlo.convert\"(%arg0) : (tensor<i1>) -> tensor<i32>"), "{text}");
    // Branch 0 is the false branch (exp), branch 1 the true one (multiply), each reading the outer values.
    let case = text.split("\"stablehlo.case\"(%t1) ({").nth(1).expect("a case");
    let (exp, mul) = (case.find("stablehlo.exponential").unwrap(), case.find("stablehlo.multiply").unwrap());
    assert!(exp < mul, "{text}");
    assert!(case.contains("\"stablehlo.multiply\"(%arg1, %arg2)"), "{text}");
    assert!(
        text.contains("%t4:1 = \"stablehlo.case\"(%t1)") && text.contains(": (tensor<i32>) -> (tensor<2xf64>)"),
        "{text}"
    );
    let (x, w) = (array![0.5, -1.0].into_dyn(), array![2.0, 3.0].into_dyn());
    let truth = |b: bool| ArrayD::from_elem(ndarray::IxDyn(&[]), b as u8 as f64);
    assert_eq!(g.evaluate(&[truth(true), x.clone(), w.clone()]).unwrap()[0], array![2.0, -6.0].into_dyn());
    assert_eq!(g.evaluate(&[truth(false), x.clone(), w.clone()]).unwrap()[0], (x.mapv(f64::exp) * 2.0));
    let tys = [TensorType::scalar(DType::Bool), f64t(&[2]), f64t(&[2])];
    for p in [true, false] {
        check_vjp(&Op::Control(ControlOp::new(cond_def(), 0)), &[truth(p), x.clone(), w.clone()], &tys);
    }
}

#[test]
fn a_body_that_changes_its_carry_is_refused_by_the_shape_rule() {
    let grow = Program::record(&[f64t(&[2]), f64t(&[])], |b, a| {
        let y = b.reshape(&a[0], &[1, 2]);
        vec![Some(y)]
    })
    .unwrap();
    let err = ControlDef::scan(grow, vec![f64t(&[2]), f64t(&[4])], 1, 1, 4, ScanForm::default(), ScanGrad::default())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "scan: the body turns carry 0 from f64[2] into f64[1,2]; a loop's carry keeps its shape and dtype"
    );
}

/// Body: (h, x_t, w) -> tanh(h @ w + x_t), the new carry and the step's y: a carry f64[2], xs f64[3,2], captured w
/// f64[2,2].
fn tanh_body() -> Program {
    Program::record(&[f64t(&[2]), f64t(&[2]), f64t(&[2, 2])], |b, a| {
        let hw = b.op(Op::DotGeneral(DotGeneral::new(&[], &[], &[0], &[0])), &[&a[0], &a[2]]);
        let s = b.add(&hw, &a[1]);
        let next = b.unary(UnaryKind::Tanh, &s);
        vec![Some(next.clone()), Some(next)]
    })
    .unwrap()
}

/// A graph of the cotangents of (h0, xs, w) for `sum(final h * g)`, the scan recorded with `remat` as given:
/// the forward scan and its gradient rule, recorded as one program.
fn tanh_gradient_graph(remat: bool, form: ScanForm) -> (Graph, Program) {
    let tys = [f64t(&[2]), f64t(&[3, 2]), f64t(&[2, 2]), f64t(&[2])];
    let def = ControlDef::scan(tanh_body(), tys[..3].to_vec(), 1, 1, 3, form, ScanGrad { save: true, remat }).unwrap();
    let op = ControlOp::new(def, 0);
    let grads = Program::record(&tys, |r, a| {
        let h = r.op(Op::Control(op.clone()), &[&a[0], &a[1], &a[2]]);
        op.vjp(r, &a[..3], &h, &a[3])
    })
    .unwrap();
    let mut g = Graph::new();
    let mut nodes: Vec<_> = tys.iter().map(|t| g.parameter(t.clone(), AT)).collect();
    for (step, args) in &grads.steps {
        let Step::Op(op) = step else { unreachable!("ops only") };
        nodes.push(g.push(op.clone(), args.iter().map(|&a| nodes[a]).collect(), AT).unwrap());
    }
    g.outputs = grads.outputs.iter().map(|o| nodes[o.unwrap()]).collect();
    (g, grads)
}

/// The scans of a program, each with whether its body computes a tanh: (forward, backward) by direction.
fn scan_bodies_with_tanh(p: &Program) -> Vec<(bool, bool)> {
    let tanh = |b: &Program| b.steps.iter().any(|(s, _)| *s == Step::Op(Op::Unary(Unary { kind: UnaryKind::Tanh })));
    let mut seen = Vec::new();
    for (s, _) in &p.steps {
        if let Step::Op(Op::Control(c)) = s {
            if let Control::Scan { body, reverse, .. } = &c.def.control {
                if !seen.iter().any(|(r, _)| r == reverse) {
                    seen.push((*reverse, tanh(body)));
                }
            }
        }
    }
    seen
}

#[test]
fn the_scan_gradient_reads_saved_residuals_and_recomputes_nothing_unless_asked() {
    let (xs, h0, w, cot) = (
        array![[0.1, 0.2], [0.5, -0.3], [-0.7, 0.9]].into_dyn(),
        array![0.3, -0.4].into_dyn(),
        array![[0.8, -0.5], [0.3, 1.1]].into_dyn(),
        array![1.0, -2.0].into_dyn(),
    );
    // sum(final h * cot), unrolled by hand.
    let objective = |h0: &ArrayD<f64>, xs: &ArrayD<f64>, w: &ArrayD<f64>| {
        let mut h = h0.clone().into_dimensionality::<ndarray::Ix1>().unwrap();
        let w = w.clone().into_dimensionality::<ndarray::Ix2>().unwrap();
        for t in 0..3 {
            let x = xs.index_axis(ndarray::Axis(0), t).into_dimensionality::<ndarray::Ix1>().unwrap();
            h = (h.dot(&w) + x).mapv(f64::tanh);
        }
        (h.into_dyn() * &cot).sum()
    };
    for remat in [false, true] {
        let (graph, program) = tanh_gradient_graph(remat, ScanForm::default());
        // The forward scan's body computes tanh; the backward's reads the saved tanh, or recomputes it with remat.
        assert_eq!(scan_bodies_with_tanh(&program), [(false, true), (true, remat)], "remat {remat}");
        let text = emit(&graph, &EmitOptions::default());
        assert_eq!(text.matches("\"stablehlo.while\"").count(), 2, "{text}");
        assert_eq!(text.matches("\"stablehlo.tanh\"").count(), if remat { 2 } else { 1 }, "remat {remat}:\n{text}");
        let got = graph.evaluate(&[h0.clone(), xs.clone(), w.clone(), cot.clone()]).unwrap();
        for (i, x) in [&h0, &xs, &w].into_iter().enumerate() {
            for k in 0..x.len() {
                let nudge = |d: f64| {
                    let mut ins = [h0.clone(), xs.clone(), w.clone()];
                    ins[i].as_slice_mut().unwrap()[k] += d;
                    objective(&ins[0], &ins[1], &ins[2])
                };
                let fd = (nudge(1e-6) - nudge(-1e-6)) / 2e-6;
                let g = got[i].as_standard_layout().as_slice().unwrap()[k];
                assert!((g - fd).abs() < 1e-7 * (1.0 + fd.abs()), "remat {remat}: d/d {i}[{k}]: {g} vs {fd}");
            }
        }
    }
}

/// Written out, a recomputing gradient passes each step's inputs through an optimization barrier, so that XLA
/// cannot merge the recomputed step with the forward step (the same ops on the same values) and keep every
/// activation alive after all; a saving gradient needs none.
#[test]
fn a_written_out_recomputing_gradient_keeps_its_steps_behind_barriers() {
    for remat in [false, true] {
        let (graph, _) = tanh_gradient_graph(remat, ScanForm { reverse: false, unroll: true });
        let text = emit(&graph, &EmitOptions::default());
        assert!(!text.contains("stablehlo.while"), "{text}");
        let barriers = text.matches("\"stablehlo.optimization_barrier\"").count();
        assert_eq!(barriers, if remat { 3 } else { 0 }, "remat {remat}:\n{text}");
        // Three forward steps, and with remat three recomputed ones.
        assert_eq!(text.matches("\"stablehlo.tanh\"").count(), if remat { 6 } else { 3 }, "remat {remat}:\n{text}");
    }
}

#[test]
fn a_program_restricted_to_some_inputs_keeps_the_steps_its_outputs_need() {
    // (a, b, c) -> a * c; `b` and the sine of `b` are unused.
    let p = Program::record(&[f64t(&[2]), f64t(&[2]), f64t(&[2])], |r, a| {
        let _dead = r.unary(UnaryKind::Sin, &a[1]);
        vec![Some(r.mul(&a[0], &a[2]))]
    })
    .unwrap();
    assert_eq!(p.live(), [true, false, true, false, true]);
    let q = p.restrict(&[2, 0]).unwrap();
    assert_eq!((q.inputs.len(), q.steps.len()), (2, 1));
    let (a, c) = (array![1.5, -2.0].into_dyn(), array![3.0, 0.5].into_dyn());
    assert_eq!(q.evaluate(&[&c, &a])[0].as_ref().unwrap(), &array![4.5, -1.0].into_dyn());
    let err = p.restrict(&[0, 1]).unwrap_err();
    assert!(err.contains("value 2 (f64[2]) is read but not kept"), "{err}");
}

//! XLA's own errors name the user's Rust line: every emitted op carries `loc("file.rs":line:col)`. The graph here is
//! built by hand with a type the shape rules would never produce, so that XLA (not lazuli) rejects it.

use lazuli_hlo::{emit, Binary, BinaryKind, DType, EmitOptions, Graph, Loc, Op, TensorType};
use lazuli_pjrt::{provision, Client, ClientOptions, CompileOptions, Plugin};

#[test]
fn an_xla_verifier_error_names_the_rust_line_of_the_op() {
    let mut g = Graph::new();
    let a = g.parameter(TensorType::new(DType::F32, [2]), Loc::caller());
    let b = g.parameter(TensorType::new(DType::F32, [2]), Loc::caller());
    let at = Loc::caller();
    let line = at.line;
    let bad =
        g.push_typed(Op::Binary(Binary { kind: BinaryKind::Add }), vec![a, b], TensorType::new(DType::F32, [3]), at);
    g.outputs.push(bad);
    let text = emit(&g, &EmitOptions::default());
    assert!(text.contains(&format!("loc(\"{}\":{line}:", file!())), "{text}");

    let plugin = Plugin::load(provision::cpu_plugin_path().unwrap()).unwrap();
    let client = Client::new(&plugin, &ClientOptions::new().cpu_device_count(1)).unwrap();
    let err = client.compile(&text, &CompileOptions::default()).expect_err("XLA must reject the program").to_string();
    assert!(err.contains(&format!("{}:{line}", file!())), "the error names {}:{line}:\n{err}", file!());
}

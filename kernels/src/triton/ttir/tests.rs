//! The builder's own checks; `flash/tests.rs` checks the kernels written with it.

use super::*;

#[test]
fn types_print_as_mlir() {
    assert_eq!(Type::scalar(Scalar::I32).to_string(), "i32");
    assert_eq!(Type::tensor(Scalar::F32, &[128, 64]).to_string(), "tensor<128x64xf32>");
    let ptrs = Type { elem: Elem::Ptr(Scalar::BF16), shape: vec![64, 1] };
    assert_eq!(ptrs.to_string(), "tensor<64x1x!tt.ptr<bf16>>");
}

#[test]
fn float_literals_are_exact_or_decimal() {
    assert_eq!(float_literal(Scalar::F32, f64::NEG_INFINITY), "0xFF800000");
    assert_eq!(float_literal(Scalar::F32, 1.0), "0x3F800000");
    assert_eq!(float_literal(Scalar::BF16, f64::NEG_INFINITY), "0xFF80");
    assert_eq!(float_literal(Scalar::F16, f64::INFINITY), "0x7C00");
    let zero = float_literal(Scalar::BF16, 0.0);
    assert!(zero.contains('.') && zero.contains('e'), "{zero}");
}

/// A row-wise softmax over one `[rows, 64]` block, written as a second kernel would be.
fn softmax_kernel() -> String {
    let mut k = Kernel::new("softmax_rows");
    let x = k.ptr_arg("x", Scalar::F32);
    let y = k.ptr_arg("y", Scalar::F32);
    let pid = k.program_id(0);
    let cols = k.make_range(0, 64);
    let c64 = k.const_i32(64);
    let row0 = k.mul(&pid, &c64);
    let base = k.splat(&row0, &[64]);
    let offs = k.add(&base, &cols);
    let xs = k.splat(&x, &[64]);
    let ptrs = k.addptr(&xs, &offs);
    let v = k.load(&ptrs, None, None);
    let m = k.reduce(&v, 0, Reduction::Max);
    let m = k.splat(&m, &[64]);
    let e = k.sub(&v, &m);
    let e = k.math("exp", &e);
    let s = k.reduce(&e, 0, Reduction::Sum);
    let s = k.splat(&s, &[64]);
    let out = k.div(&e, &s);
    let ys = k.splat(&y, &[64]);
    let ptrs = k.addptr(&ys, &offs);
    k.store(&ptrs, &out, None);
    k.finish()
}

#[test]
fn a_small_kernel_prints_a_module() {
    let text = softmax_kernel();
    assert!(text.starts_with("module {\n  tt.func public @softmax_rows(%x_1: !tt.ptr<f32> {tt.divisibility"));
    assert!(text.contains("\"tt.reduce\"("));
    assert!(text.contains("arith.maxnumf"));
    assert!(text.contains("tt.reduce.return"));
    assert!(text.contains("tt.store"));
    assert!(text.trim_end().ends_with("tt.return\n  }\n}"));
    assert!(text.is_ascii());
}

#[test]
fn loops_carry_and_return_values() {
    let mut k = Kernel::new("loop");
    let lo = k.const_i32(0);
    let hi = k.const_i32(10);
    let step = k.const_i32(1);
    let acc = k.full_float(Scalar::F32, &[16], 0.0);
    let n = k.const_i32(0);
    let out = k.for_loop((&lo, &hi, &step), &[acc, n], |k, iv, args| {
        let one = k.full_float(Scalar::F32, &[16], 1.0);
        let acc = k.add(&args[0], &one);
        let n = k.add(&args[1], iv);
        vec![acc, n]
    });
    assert_eq!(out.len(), 2);
    assert!(out[0].name().ends_with("#0") && out[1].name().ends_with("#1"));
    assert_eq!(out[1].ty(), &Type::scalar(Scalar::I32));
    let cond = k.cmp(Cmp::Gt, &out[1], &lo);
    let picked = k.if_else(&cond, &[Type::scalar(Scalar::I32)], |_| vec![out[1].clone()], |_| vec![lo.clone()]);
    assert_eq!(picked.len(), 1);
    let text = k.finish();
    assert!(text.contains("iter_args("), "{text}");
    assert!(text.contains("-> (tensor<16xf32>, i32) : i32 {"), "{text}");
    assert!(text.contains("scf.yield"), "{text}");
    assert!(text.contains("} else {"), "{text}");
}

#[test]
#[should_panic(expected = "operand types")]
fn mismatched_shapes_are_a_generator_bug() {
    let mut k = Kernel::new("bad");
    let a = k.full_float(Scalar::F32, &[16], 0.0);
    let b = k.full_float(Scalar::F32, &[32], 0.0);
    k.add(&a, &b);
}

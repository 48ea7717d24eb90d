//! A custom fused kernel: a row softmax written in Triton IR, called like an op, checked against its composite.
//!
//!   cargo run --release --example custom_kernel                        # CPU: the composite runs
//!   LAZULI_DEVICE=gpu cargo run --release --example custom_kernel      # NVIDIA GPU: the Triton kernel runs
//!
//! The kernel is one program per row: it loads the row (padded to a power of two with -inf), takes its maximum,
//! exponentiates, sums and divides, and stores the row: one read and one write of the data, where the composite
//! (max, subtract, exp, sum, divide) may take several passes. The composite gives the kernel its meaning
//! everywhere else and its gradient; the example checks both against it, and shows what a broken kernel
//! reports.

use lazuli::{DType, Implementation, Tensor, TritonKernel};

/// lazuli sets no allocator; an application picks one. mimalloc, also as C's malloc (its `override` feature),
/// serves recording's many small allocations and the plugin's much faster than glibc's malloc (README, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Triton IR of the row softmax of an f32 `[rows, cols]` array, `block` ≥ `cols` a power of two. Arguments: the
/// input and the output pointer; program `i` does row `i`.
fn row_softmax_ir(cols: usize, block: usize) -> String {
    let v = format!("tensor<{block}xf32>");
    let i = format!("tensor<{block}xi32>");
    let p = format!("tensor<{block}x!tt.ptr<f32>>");
    let reduce = |name: &str, input: &str, combine: &str| {
        format!(
            "    %{name} = \"tt.reduce\"(%{input}) <{{axis = 0 : i32}}> ({{\n    ^bb0(%a: f32, %b: f32):\n      \
             %c = {combine} %a, %b : f32\n      tt.reduce.return %c : f32\n    }}) : ({v}) -> f32\n"
        )
    };
    [
        "module {\n".to_string(),
        "  tt.func public @row_softmax(%x: !tt.ptr<f32> {tt.divisibility = 16 : i32}, \
         %y: !tt.ptr<f32> {tt.divisibility = 16 : i32}) {\n"
            .to_string(),
        "    %row = tt.get_program_id x : i32\n".to_string(),
        format!("    %cols = arith.constant {cols} : i32\n"),
        "    %start = arith.muli %row, %cols : i32\n".to_string(),
        format!("    %offs = tt.make_range {{end = {block} : i32, start = 0 : i32}} : {i}\n"),
        format!("    %limit = tt.splat %cols : i32 -> {i}\n"),
        format!("    %inside = arith.cmpi slt, %offs, %limit : {i}\n"),
        format!("    %base = tt.splat %start : i32 -> {i}\n"),
        format!("    %idx = arith.addi %base, %offs : {i}\n"),
        format!("    %xp = tt.splat %x : !tt.ptr<f32> -> {p}\n"),
        format!("    %xs = tt.addptr %xp, %idx : {p}, {i}\n"),
        format!("    %ninf = arith.constant dense<0xFF800000> : {v}\n"),
        format!("    %v = tt.load %xs, %inside, %ninf : {p}\n"),
        reduce("m", "v", "arith.maxnumf"),
        format!("    %ms = tt.splat %m : f32 -> {v}\n"),
        format!("    %d = arith.subf %v, %ms : {v}\n"),
        format!("    %e = math.exp %d : {v}\n"),
        reduce("s", "e", "arith.addf"),
        format!("    %ss = tt.splat %s : f32 -> {v}\n"),
        format!("    %q = arith.divf %e, %ss : {v}\n"),
        format!("    %yp = tt.splat %y : !tt.ptr<f32> -> {p}\n"),
        format!("    %ys = tt.addptr %yp, %idx : {p}, {i}\n"),
        format!("    tt.store %ys, %q, %inside : {p}\n"),
        "    tt.return\n  }\n}\n".to_string(),
    ]
    .concat()
}

/// The softmax kernel for `[rows, cols]`, with its composite.
fn row_softmax(rows: usize, cols: usize, implementation: Implementation) -> TritonKernel {
    TritonKernel::new("row_softmax", row_softmax_ir(cols, cols.next_power_of_two()))
        .grid([rows as u32, 1, 1])
        .warps(4)
        .stages(1)
        .output(DType::F32, &[rows, cols])
        .composite(|x| vec![x[0].softmax(-1)])
        .implementation(implementation)
}

/// Deterministic data in [-4, 4).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
        })
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn main() -> lazuli::Result<()> {
    let (rows, cols) = (4096, 1000);
    let x = Tensor::from_slice(&data(rows * cols, 1), &[rows, cols]).requires_grad();
    let w = Tensor::from_slice(&data(rows * cols, 2), &[rows, cols]);

    lazuli::diagnostics::events::start_capture();
    let fused = row_softmax(rows, cols, Implementation::Auto).call(&[&x]).remove(0);
    let loss = (&fused * &w).sum_all();
    let grad = lazuli::grad(&loss, &[&x]).remove(0);
    let (y, dy) = (fused.to_vec::<f32>()?, grad.to_vec::<f32>()?);

    let reference = row_softmax(rows, cols, Implementation::Composite).call(&[&x]).remove(0);
    let grad_reference = lazuli::grad(&(&reference * &w).sum_all(), &[&x]).remove(0);
    let (y_ref, dy_ref) = (reference.to_vec::<f32>()?, grad_reference.to_vec::<f32>()?);
    for line in lazuli::diagnostics::events::take_captured().iter().flat_map(|e| &e.kernels) {
        println!("kernel: {line}");
    }

    let (err, grad_err) = (max_abs_diff(&y, &y_ref), max_abs_diff(&dy, &dy_ref));
    println!(
        "row softmax of [{rows}, {cols}] on {}: max |kernel - composite| = {err:.2e}, gradient {grad_err:.2e}",
        lazuli::platform()?
    );
    let rows_sum_to_one = y.chunks(cols).all(|r| (r.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    assert!(err < 1e-5 && grad_err < 1e-5 && rows_sum_to_one, "the kernel disagrees with its composite");

    // A kernel whose IR does not define the function it names is refused at the call, with the call's line.
    let broken = TritonKernel::new("row_softmax", row_softmax_ir(cols, 1024).replace("@row_softmax", "@softmax"))
        .grid([rows as u32, 1, 1])
        .output(DType::F32, &[rows, cols])
        .composite(|x| vec![x[0].softmax(-1)]);
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the message is printed below, not as a crash
    let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| broken.call(&[&x])));
    std::panic::set_hook(quiet);
    let message = refused.err().and_then(|e| e.downcast::<String>().ok()).expect("a broken kernel is refused");
    println!("a broken kernel: {}", message.lines().collect::<Vec<_>>().join(" | "));

    // IR that passes lazuli's checks but not Triton's parser: XLA's compile fails (on a GPU), and the error names
    // the kernel and the line that called it. Elsewhere the composite runs and XLA never sees the IR.
    let typo = TritonKernel::new("row_softmax", row_softmax_ir(cols, 1024).replace("arith.subf", "arith.subtract"))
        .grid([rows as u32, 1, 1])
        .output(DType::F32, &[rows, cols])
        .composite(|x| vec![x[0].softmax(-1)]);
    match typo.call(&[&x]).remove(0).to_vec::<f32>() {
        Err(e) => {
            println!("a kernel XLA cannot compile: {}", e.to_string().lines().take(3).collect::<Vec<_>>().join(" | "))
        }
        Ok(_) => println!(
            "a kernel with a typo in its IR: the composite ran on {}, so XLA never saw it",
            lazuli::platform()?
        ),
    }
    Ok(())
}

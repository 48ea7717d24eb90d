//! Bad input that used to abort or run away, now refused with a clear error before XLA sees it: shapes whose size
//! overflows, programs that need more memory than the machine has, and graphs recorded without a step boundary.
//! (Malformed settings: `tests/engine/runtime_config.rs`.)

use lazuli::{DType, Tensor};

use crate::common::child;
use crate::common::panic_message;

#[test]
fn a_shape_whose_size_overflows_is_refused_at_the_callers_line() {
    let huge = [1usize << 32, 1 << 32];
    let line = line!() + 1;
    let msg = panic_message(|| drop(Tensor::zeros(&huge, DType::F32)));
    assert!(msg.contains("f32[4294967296,4294967296] has more bytes than a 64-bit address space holds"), "{msg}");
    assert!(msg.contains(&format!("tests/errors/bad_input.rs:{line}:")), "{msg}");
    // An empty slice "fills" a shape whose element count wraps to 0.
    let msg = panic_message(|| drop(Tensor::from_slice::<f32>(&[], &[1 << 32, 1 << 32])));
    assert!(msg.contains("(more than 2^64 elements)"), "{msg}");
    let x = Tensor::zeros(&[1 << 40], DType::U8);
    let msg = panic_message(|| drop(x.broadcast_to(&[1 << 30, 1 << 40])));
    assert!(msg.contains("has more bytes than a 64-bit address space holds"), "{msg}");
    // Empty, but XLA's CPU compiler counts the bytes of the nonzero dimensions, and past 2^63 it threw an uncaught
    // C++ exception, ending the process.
    let line = line!() + 1;
    let msg = panic_message(|| drop(Tensor::zeros(&[1 << 40, 1 << 21, 0], DType::F32)));
    assert!(msg.contains("has no elements, but its nonzero dimensions span more bytes than"), "{msg}");
    assert!(msg.contains(&format!("tests/errors/bad_input.rs:{line}:")), "{msg}");
    // An empty tensor reshaped to a shape whose element count wraps to 0 (the fuzz harness, seed 122067).
    let empty = Tensor::zeros(&[0, 3], DType::I32);
    let line = line!() + 1;
    let msg = panic_message(|| drop(empty.reshape(&[1 << 40, 2, 1 << 40])));
    assert!(msg.contains("its element count overflows"), "{msg}");
    assert!(msg.contains(&format!("tests/errors/bad_input.rs:{line}:")), "{msg}");
}

/// A layer too large for the host (a typo in its sizes) is refused at the line that made it, with its type and
/// what the host has: the host allocation of its initial values would have ended the process without a word. A
/// size past the address space, a dropout probability past 1 likewise.
#[test]
fn a_layer_the_host_cannot_hold_is_refused_at_the_callers_line() {
    use lazuli::nn::{Dropout, Embedding, HostRng, Linear, Mlp};
    let mut rng = HostRng::new(0);
    let line = line!() + 1;
    let msg = panic_message(|| drop(Linear::new(&mut rng, 1 << 20, 1 << 21, true, DType::F32)));
    assert!(msg.contains("f32[1048576,2097152] needs 8192.0 GiB on the host, which has"), "{msg}");
    assert!(msg.contains(&format!("tests/errors/bad_input.rs:{line}:")), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(Mlp::new(&mut rng, &[4, 1 << 40, 4], lazuli::nn::Activation::Relu, DType::F32)));
    assert!(msg.contains("needs 16384.0 GiB on the host") && msg.contains(&format!(":{line}:")), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(Embedding::new(&mut rng, 1 << 62, 1 << 4, 0.02, DType::F32)));
    assert!(msg.contains("has more bytes than a 64-bit address space holds"), "{msg}");
    assert!(msg.contains(&format!("tests/errors/bad_input.rs:{line}:")), "{msg}");
    let line = line!() + 2;
    let msg = panic_message(|| {
        let _ = Dropout::new(1.5);
    });
    assert!(msg.contains("p = 1.5 is not a probability") && msg.contains(&format!(":{line}:")), "{msg}");
    // An optimizer's zero state is host data too: a parameter still pending on the device (4 TiB, never computed)
    // is refused at the optimizer's line, for AdamW's moments and SGD's momentum buffers alike.
    let vast = || vec![("w".to_string(), lazuli::nn::Param::new(Tensor::zeros(&[1 << 40], DType::F32)))];
    let line = line!() + 1;
    let msg = panic_message(|| drop(lazuli::optim::AdamW::new(vast(), 1e-3)));
    assert!(msg.contains("f32[1099511627776] needs 4096.0 GiB") && msg.contains(&format!(":{line}:")), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(lazuli::optim::Sgd::new(vast(), 0.1).momentum(0.9)));
    assert!(msg.contains("needs 4096.0 GiB") && msg.contains(&format!(":{line}:")), "{msg}");
    // What fits is made as before.
    let small = Linear::new(&mut rng, 3, 2, true, DType::F32);
    assert_eq!(small.weight.get().dims(), &[3, 2]);
}

/// An empty tensor with a vast dimension (`[2^40, 0, 5]`, 0 elements) is computed at once, on the device and by the
/// reference interpreter, which used to walk its 5·2^40 empty lanes for a running sum, a sort or a reduction
/// (found by the fuzz harness, seeds 51547 and 53965).
#[test]
fn an_empty_tensor_with_a_vast_dimension_is_computed_at_once() {
    let x = Tensor::zeros(&[1 << 40, 0, 5], DType::F64);
    let indices = Tensor::from_slice(&[0i64, 2, 1], &[3]);
    let values = [
        x.cumsum(1).cumsum(-1),
        x.sort(-1, false),
        x.sum(&[2]),
        x.max(&[0, 2]),
        x.topk(2, 0).0,
        x.softmax(0),
        x.softmax(1),
        x.log_softmax(1),
        x.logsumexp(&[2]),
        x.layer_norm(&[-1], 1e-5),
        x.flip(&[0, 2]),
        x.index_select(0, &indices),
    ];
    for y in values {
        let started = std::time::Instant::now();
        assert_eq!(y.evaluate_reference().unwrap().len(), 0);
        assert_eq!(y.to_vec::<f64>().unwrap(), Vec::<f64>::new());
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    }
    for y in [x.argmax(0), x.argsort(-1, false)] {
        let started = std::time::Instant::now();
        assert_eq!(y.evaluate_reference().unwrap().len(), 0);
        assert_eq!(y.to_vec::<i64>().unwrap(), Vec::<i64>::new());
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    }
}

/// Bytes the host can still allocate (the CPU plugin's devices are the host's memory).
fn available_bytes() -> usize {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:")).expect("MemAvailable");
    line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap() * 1024
}

#[test]
fn a_program_larger_than_memory_is_an_error_before_it_runs() {
    // Four times what the machine has, and 4 TB: refused with both sizes and the line, nothing allocated.
    for elements in [available_bytes(), 1 << 40] {
        let line = line!() + 1;
        let x = Tensor::ones(&[elements], DType::F32);
        let err = x.to_vec::<f32>().unwrap_err().to_string();
        assert!(err.starts_with("out of memory: the program's outputs and uploads need "), "{err}");
        assert!(err.contains("GiB free") && err.contains(&format!("tests/errors/bad_input.rs:{line}:")), "{err}");
    }
    // The runtime is still usable.
    assert_eq!((Tensor::ones(&[3], DType::F32) * 2.0).to_vec::<f32>().unwrap(), vec![2.0; 3]);
}

#[test]
fn a_graph_recorded_without_a_step_boundary_is_compiled_in_pieces() {
    if child::alone(module_path!(), "a_graph_recorded_without_a_step_boundary_is_compiled_in_pieces") {
        return; // captured events are process-wide: alone in a process of its own
    }
    // 60k ops and 40k host scalars with no boundary: more than MAX_GRAPH_NODES, computed in pieces, each a break.
    let mut x = Tensor::from_slice(&[0.5f32, -0.25], &[2]);
    let mut want = [0.5f64, -0.25];
    for _ in 0..20_000 {
        x = (&x * 0.999 + 0.001).tanh();
        want = want.map(|v| (f64::from((v * 0.999) as f32) + 0.001).tanh());
    }
    lazuli::diagnostics::events::start_capture();
    let got = x.to_vec::<f32>().unwrap();
    let events = lazuli::diagnostics::events::take_captured();
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-4, "{got:?} vs {want:?}");
    }
    let pieces = events.iter().filter(|e| e.cause == "graph_size").count();
    assert!(pieces >= 2, "{pieces} pieces: {:?}", events.iter().map(|e| (&e.cause, e.nodes)).collect::<Vec<_>>());
    assert!(events.iter().all(|e| e.nodes <= lazuli_lazy::exec::MAX_GRAPH_NODES), "every piece is bounded");
    let report = lazuli::diagnostics::report::render(&lazuli::diagnostics::report::analyse(&events));
    assert!(report.contains("call lazuli::sync() inside the loop"), "{report}");
}

/// Gradients through ops over empty tensors are empty, on the device and in the reference, and compile: an empty
/// batch (the last of an epoch) through a model's ops, pools and convolutions included.
#[test]
fn gradients_over_empty_tensors_are_empty() {
    type Op = fn(&Tensor) -> Tensor;
    let any_rank: &[(&str, Op)] = &[
        ("sum", |x| x.sum(&[0])),
        ("mean", |x| x.mean(&[-1])),
        ("max", |x| x.max(&[0])),
        ("softmax", |x| x.softmax(0)),
        ("log_softmax", |x| x.log_softmax(-1)),
        ("logsumexp", |x| x.logsumexp(&[-1])),
        ("layer_norm", |x| x.layer_norm(&[-1], 1e-5)),
        ("cumsum", |x| x.cumsum(-1)),
        ("sort", |x| x.sort(-1, false)),
        ("topk", |x| x.topk(0, -1).0),
        ("flip", |x| x.flip(&[0, -1])),
        ("pad", |x| x.pad(&vec![(1, 1); x.rank()], 0.0)),
        ("gelu", |x| x.gelu()),
        ("tril", |x| x.tril(0)),
        ("matmul", |x| x.matmul(&Tensor::ones(&[x.dims()[x.rank() - 1], 3], DType::F32))),
        ("einsum", |x| {
            lazuli::einsum("...ij,jk->...ik", &[x, &Tensor::ones(&[x.dims()[x.rank() - 1], 2], DType::F32)])
        }),
        ("cross_entropy", |x| x.cross_entropy(&Tensor::zeros(&x.dims()[..x.rank() - 1], DType::I64))),
        ("broadcast", |x| x.unsqueeze(0).broadcast_to(&[&[2][..], x.dims()].concat())),
        ("concat", |x| Tensor::concat(&[x, x], 0)),
        // No indices into the last axis, empty or not: nothing read, nothing written.
        ("index_select", |x| x.index_select(-1, &Tensor::from_slice(&[0i64; 0], &[0]))),
        ("take_along_axis", |x| {
            x.take_along_axis(&Tensor::zeros(&[&x.dims()[..x.rank() - 1], &[0]].concat(), DType::I64), -1)
        }),
        ("scatter_add", |x| x.scatter_add(-1, &Tensor::from_slice(&[0i64; 0], &[0]), &x.slice(-1, 0, 0))),
        ("scatter", |x| x.scatter(-1, &Tensor::from_slice(&[0i64; 0], &[0]), &x.slice(-1, 0, 0))),
        ("scatter_max", |x| x.scatter_max(-1, &Tensor::from_slice(&[0i64; 0], &[0]), &x.slice(-1, 0, 0))),
    ];
    let images: &[(&str, Op)] = &[
        ("conv2d", |x| x.conv2d(&Tensor::ones(&[2, x.dims()[1], 2, 2], DType::F32), [2, 1], [1, 1])),
        ("max_pool2d", |x| x.max_pool2d([2, 2], [1, 2])),
        ("avg_pool2d", |x| x.avg_pool2d([2, 1], [2, 2])),
    ];
    let shapes: [&[usize]; 6] = [&[0, 3], &[2, 0], &[3, 0, 4], &[2, 1, 0, 4], &[0, 2, 3, 3], &[1, 0, 3, 3]];
    for dims in shapes {
        let ops = any_rank.iter().chain(if dims.len() == 4 && dims[2] > 0 { images } else { &[] });
        for (name, f) in ops {
            let x = Tensor::zeros(dims, DType::F32).requires_grad();
            let y = f(&x);
            let dx = lazuli::grad(&((&y * &y).sum_all() + y.sum_all()), &[&x]).remove(0);
            assert_eq!(dx.dims(), dims, "{name} {dims:?}");
            assert_eq!(dx.evaluate_reference().unwrap().len(), 0, "{name} {dims:?}");
            // The result need not be empty (a sum over an empty axis is 0, a mean NaN, a product 0).
            let want: Vec<f64> = y.evaluate_reference().unwrap().iter().copied().collect();
            assert_eq!(dx.to_vec::<f32>().unwrap(), Vec::<f32>::new(), "{name} {dims:?}");
            let got = y.to_f64_vec().unwrap();
            let same =
                got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| g == w || g.is_nan() && w.is_nan());
            assert!(same, "{name} {dims:?}: device {got:?}, reference {want:?}");
        }
    }
    // An empty image has no pixels to convolve or pool (PyTorch refuses both too): refused at the line.
    let image = Tensor::zeros(&[2, 1, 0, 4], DType::F32);
    let msg = panic_message(|| drop(image.conv2d(&Tensor::ones(&[2, 1, 1, 1], DType::F32), [1, 1], [1, 1])));
    assert!(msg.contains("spatial dimension 0 of f32[2,1,0,4] is empty") && msg.contains("bad_input.rs:"), "{msg}");
    let msg = panic_message(|| drop(image.max_pool2d([1, 1], [2, 2])));
    assert!(msg.contains("does not fit dimension 2 of size 0") && msg.contains("bad_input.rs:"), "{msg}");
    // Nor has an empty kernel anything to multiply: refused as such (it said a window of 0 did not fit).
    let image = Tensor::zeros(&[2, 1, 4, 4], DType::F32);
    let msg = panic_message(|| drop(image.conv2d(&Tensor::ones(&[2, 1, 0, 3], DType::F32), [1, 1], [0, 0])));
    assert!(msg.contains("spatial dimension 0 of the kernel f32[2,1,0,3] is empty"), "{msg}");
}

//! Long chains of pending ops are dropped without recursing once per node: a loop that records `x = &x * c` for a
//! long time and then drops `x` must not overflow the stack. A long elementwise chain that is computed compiles as
//! several fused loops instead of one (XLA's compile time grows faster than the loop: 35 s and 2.3 GB for 6,000
//! ops before lazuli cut it), and computes what the host computes.

use lazuli::Tensor;

/// Run `f` on a thread with a 1 MiB stack: a recursive drop of the chains below would need tens of megabytes.
fn on_small_stack<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::Builder::new().stack_size(1 << 20).spawn(f).unwrap().join().expect("the thread panicked or crashed")
}

#[test]
fn a_long_pending_chain_is_dropped_without_deep_recursion() {
    let live = on_small_stack(|| {
        let mut x = Tensor::from_slice(&[1.0f32, 2.0], &[2]);
        for _ in 0..200_000 {
            x = &x * 1.0;
        }
        drop(x);
        // The thread's graph is still usable, and nothing of the chain is left to compute.
        let y = Tensor::from_slice(&[3.0f32, 4.0], &[2]) * 0.5;
        lazuli::sync().unwrap();
        y.to_vec::<f32>().unwrap()
    });
    assert_eq!(live, vec![1.5, 2.0]);
}

#[test]
fn a_long_elementwise_chain_computes_what_the_host_does() {
    let start: Vec<f32> = (0..64).map(|i| i as f32 / 16.0 - 2.0).collect();
    let mut x = Tensor::from_slice(&start, &[64]);
    // 2,400 elementwise ops in one chain, with no step boundary: the emitter cuts it into loops of 128.
    for _ in 0..800 {
        x = (&x * 0.999).sin() + 0.001;
    }
    let got = x.to_vec::<f32>().unwrap();
    for (i, (&g, &s)) in got.iter().zip(&start).enumerate() {
        let mut want = s as f64;
        for _ in 0..800 {
            want = (want * 0.999).sin() + 0.001;
        }
        // The map is a contraction (|d/dx| <= 0.999): f32 rounding does not grow over the iterations.
        assert!((g as f64 - want).abs() < 1e-5, "element {i}: {g} against {want}");
    }
}

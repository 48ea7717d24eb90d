//! Long chains of pending ops are dropped without recursing once per node: a loop that records `x = &x * c` for a
//! long time and then drops `x` must not overflow the stack.

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

//! The executable cache: one compile per graph structure. The counters and the cache are process-wide and the
//! tests of one binary run in parallel threads, so each test here runs alone in a child process (and holds
//! `SERIAL`).

use std::sync::Mutex;

use lazuli::{DType, Tensor};

use crate::common::child;

static SERIAL: Mutex<()> = Mutex::new(());

fn step(x: &Tensor, w: &Tensor, lr: f64) -> Tensor {
    let y = x.matmul(w).tanh();
    (&y * lr).sum(&[1])
}

#[test]
fn one_compile_per_structure() {
    if child::alone(module_path!(), "one_compile_per_structure") {
        return; // the counters and the executable cache are process-wide: alone in a process of its own
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = Tensor::from_slice(&[0.5f32, -1.0, 0.25, 2.0, 1.0, -0.5], &[3, 2]);

    let m0 = lazuli::metrics();
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let a = step(&x, &w, 0.1).to_vec::<f32>().unwrap();
    let m1 = lazuli::metrics();
    assert_eq!((m1 - m0).compiles, 1, "first run compiles");
    assert_eq!((m1 - m0).executions, 1);
    // Independent check of the values: tanh(x @ w) * 0.1 summed per row.
    let xv = [[1.0f64, 2.0, 3.0], [4.0, 5.0, 6.0]];
    let wv = [[0.5f64, -1.0], [0.25, 2.0], [1.0, -0.5]];
    for i in 0..2 {
        let want: f64 = (0..2).map(|j| (0..3).map(|k| xv[i][k] * wv[k][j]).sum::<f64>().tanh() * 0.1).sum();
        assert!((a[i] as f64 - want).abs() < 1e-6, "row {i}: {} vs {want}", a[i]);
    }

    // New values, new learning rate (a host scalar, so a parameter): same structure, no compile.
    let x2 = Tensor::from_slice(&[0.0f32, 1.0, 0.0, 1.0, 0.0, 1.0], &[2, 3]);
    let b = step(&x2, &w, 0.01).to_vec::<f32>().unwrap();
    let m2 = lazuli::metrics();
    assert_eq!((m2 - m1).compiles, 0, "new values and a new scalar must not recompile");
    assert_eq!((m2 - m1).cache_hits, 1);
    assert!(b != a, "the new values were used");

    // A changed shape is a new structure: a second compile; repeating it hits the cache.
    let x3 = Tensor::from_slice(&[1.0f32; 9], &[3, 3]);
    assert_eq!(step(&x3, &w, 0.1).dims(), &[3]);
    step(&x3, &w, 0.1).materialize().unwrap();
    let m3 = lazuli::metrics();
    step(&x3, &w, 0.2).materialize().unwrap();
    let m4 = lazuli::metrics();
    assert_eq!((m3 - m2).compiles, 1, "a new shape compiles once");
    assert_eq!((m4 - m3).compiles, 0);

    // A changed dtype is a new structure too.
    let x4 = Tensor::from_slice(&[1.0f64; 6], &[2, 3]);
    let w4 = w.to_dtype(DType::F64);
    step(&x4, &w4, 0.1).materialize().unwrap();
    assert_eq!((lazuli::metrics() - m4).compiles, 1);

    // Bytes moved: reading two f32 values back is 8 bytes.
    let m5 = lazuli::metrics();
    let _ = step(&x, &w, 0.3).to_vec::<f32>().unwrap();
    let d = lazuli::metrics() - m5;
    assert_eq!(d.bytes_to_host, 8);
    assert_eq!(d.compiles, 0);
    // x and w are on the device already; only the scalar learning rate (4 bytes) travels.
    assert_eq!(d.bytes_to_device, 4);
}

#[test]
fn sync_materializes_every_live_pending_tensor_in_one_program() {
    if child::alone(module_path!(), "sync_materializes_every_live_pending_tensor_in_one_program") {
        return; // the counters and the executable cache are process-wide: alone in a process of its own
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = lazuli::metrics();
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
    let b = (&a * 2.0).exp();
    let c = b.sum(&[0]);
    let dropped = &a + 100.0;
    drop(dropped);
    assert!(b.is_pending() && c.is_pending());
    lazuli::sync().unwrap();
    assert!(!b.is_pending() && !c.is_pending());
    assert_eq!((lazuli::metrics() - before).executions, 1, "b and c in one program");
    let want: f64 = [2.0f64, 4.0, 6.0].iter().map(|x| x.exp()).sum();
    assert!((c.item::<f32>().unwrap() as f64 - want).abs() < 1e-3);
}

//! Random numbers on the device: reproducibility, the reference interpreter's bit-exact Threefry, distribution
//! statistics, dropout, the generator state as a parameter (no recompiles), and the bit ops underneath.
//! The generator and the compile counters are process-wide, so every test here holds `SERIAL`, and the one that
//! counts compiles runs alone in a child process.

use crate::common;

use std::sync::{Mutex, MutexGuard};

use crate::common::panic_message;
use common::{assert_close, tensor_of};
use lazuli::{DType, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (mean, v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n)
}

#[test]
fn same_seed_same_numbers_next_draw_differs_and_the_reference_matches_bit_for_bit() {
    let _s = serial();
    for dt in FLOATS {
        lazuli::manual_seed(1234);
        let a = Tensor::rand(&[4, 5], dt);
        let a_ref = a.evaluate_reference().unwrap();
        let b = Tensor::rand(&[4, 5], dt);
        lazuli::sync().unwrap();
        let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
        // The interpreter implements XLA's Threefry, so even raw bits agree exactly.
        assert_eq!(a, a_ref.iter().copied().collect::<Vec<_>>(), "{dt}: XLA vs reference interpreter");
        assert_ne!(a, b, "{dt}: the second draw continues the stream");
        assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)), "{dt}: {a:?}");

        lazuli::manual_seed(1234);
        let again = Tensor::rand(&[4, 5], dt).to_f64_vec().unwrap();
        assert_eq!(a, again, "{dt}: the same seed reproduces the draw");
        lazuli::manual_seed(1235);
        assert_ne!(a, Tensor::rand(&[4, 5], dt).to_f64_vec().unwrap(), "{dt}: another seed, other numbers");
    }
    // Odd and scalar shapes take XLA's other ways of splitting a draw into Threefry pairs.
    lazuli::manual_seed(7);
    for dims in [&[][..], &[1], &[3], &[3, 5], &[5, 3, 7], &[2, 3]] {
        let bits = Tensor::rand_bits(dims);
        let want = bits.evaluate_reference().unwrap();
        let got: Vec<f64> = bits.to_vec::<u32>().unwrap().into_iter().map(f64::from).collect();
        assert_eq!(got, want.iter().copied().collect::<Vec<_>>(), "bits {dims:?}");
    }
}

#[test]
fn rand_is_uniform_in_every_float_dtype() {
    let _s = serial();
    lazuli::manual_seed(2);
    for dt in FLOATS {
        let n = 200_000;
        let v = Tensor::rand(&[n], dt).to_f64_vec().unwrap();
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)), "{dt}: a value outside [0, 1)");
        let (mean, var) = mean_var(&v);
        // Standard errors: 0.29/sqrt(n) for the mean, 0.075/sqrt(n) for the variance; allow 5 of them (plus the
        // grid of bf16, whose 8 bits shift the mean by 2^-9).
        let grid = if dt == DType::BF16 { 2f64.powi(-9) } else { 0.0 };
        assert!((mean - 0.5 + grid).abs() < 0.0033, "{dt}: mean {mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.0009 + grid, "{dt}: variance {var}");
        // Ten bins, each within 5 standard errors of its share of the dtype's grid k / 2^bits.
        let bits = match dt {
            DType::F16 => 11,
            DType::BF16 => 8,
            _ => 24,
        };
        let mut share = [0usize; 10];
        for k in 0..1usize << bits {
            share[(k as f64 / (1u64 << bits) as f64 * 10.0) as usize] += 1;
        }
        let mut bins = [0usize; 10];
        for &x in &v {
            bins[(x * 10.0) as usize] += 1;
        }
        for (i, &c) in bins.iter().enumerate() {
            let p = share[i] as f64 / (1u64 << bits) as f64;
            let sd = (n as f64 * p * (1.0 - p)).sqrt();
            assert!((c as f64 - n as f64 * p).abs() < 5.0 * sd, "{dt}: bin {i} has {c} of {n}: {bins:?}");
        }
    }
}

#[test]
fn randn_is_standard_normal() {
    let _s = serial();
    lazuli::manual_seed(3);
    for dt in FLOATS {
        let n = 200_000;
        let z = Tensor::randn(&[n], dt);
        assert_eq!(z.dtype(), dt);
        let v = z.to_f64_vec().unwrap();
        assert!(v.iter().all(|x| x.is_finite()), "{dt}: a non-finite value");
        let (mean, var) = mean_var(&v);
        assert!(mean.abs() < 0.012, "{dt}: mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "{dt}: variance {var}");
        let within_one = v.iter().filter(|x| x.abs() < 1.0).count() as f64 / n as f64;
        assert!((within_one - 0.6827).abs() < 0.006, "{dt}: P(|z| < 1) = {within_one}");
    }
    // The reference interpreter follows the same stream (up to the rounding of log/cos/sqrt in f32).
    lazuli::manual_seed(4);
    let z = Tensor::randn(&[64], DType::F64);
    let want: Vec<f64> = z.evaluate_reference().unwrap().iter().copied().collect();
    assert_close("randn f64 vs reference", DType::F64, &z.to_vec::<f64>().unwrap(), &want);
}

#[test]
fn bernoulli_and_dropout_rates_and_scaling() {
    let _s = serial();
    lazuli::manual_seed(5);
    let n = 100_000;
    for p in [0.1, 0.5, 0.9] {
        let b = Tensor::bernoulli(&[n], p);
        assert_eq!(b.dtype(), DType::Bool);
        let rate = b.to_vec::<bool>().unwrap().iter().filter(|&&x| x).count() as f64 / n as f64;
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!((rate - p).abs() < 5.0 * sd, "bernoulli({p}): rate {rate}");
    }
    for dt in [DType::F32, DType::F64] {
        for p in [0.25, 0.6] {
            let x = Tensor::ones(&[n], dt);
            let y = x.dropout(p, true).to_f64_vec().unwrap();
            let scale = dt.round(1.0 / (1.0 - p));
            let kept = y.iter().filter(|&&v| v != 0.0).count();
            assert!(y.iter().all(|&v| v == 0.0 || v == scale), "{dt} p={p}: kept values are scaled by 1/(1-p)");
            let rate = kept as f64 / n as f64;
            let sd = (p * (1.0 - p) / n as f64).sqrt();
            assert!((rate - (1.0 - p)).abs() < 5.0 * sd, "{dt} p={p}: kept {rate}");
            let (mean, _) = mean_var(&y);
            assert!((mean - 1.0).abs() < 0.02, "{dt} p={p}: the expectation is kept, mean {mean}");
        }
    }
    // Evaluation mode and p = 0 are the identity (the very same tensor); p = 1 drops everything.
    let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0], &[3]);
    assert_eq!(x.dropout(0.5, false).to_vec::<f32>().unwrap(), vec![1.0, -2.0, 3.0]);
    assert_eq!(x.dropout(0.0, true).to_vec::<f32>().unwrap(), vec![1.0, -2.0, 3.0]);
    assert_eq!(x.dropout(1.0, true).to_vec::<f32>().unwrap(), vec![0.0, 0.0, 0.0]);
}

#[test]
fn dropout_gradient_is_the_mask_times_the_scale() {
    let _s = serial();
    lazuli::manual_seed(6);
    let x = Tensor::from_slice(&[0.5f64, -1.0, 2.0, 3.0, -4.0, 1.5, 0.25, 8.0], &[2, 4]).requires_grad();
    let y = x.dropout(0.5, true);
    let g = lazuli::grad(&y.sum_all(), &[&x]);
    lazuli::sync().unwrap();
    let (xs, ys, gs) = (x.to_vec::<f64>().unwrap(), y.to_vec::<f64>().unwrap(), g[0].to_vec::<f64>().unwrap());
    for i in 0..8 {
        let kept = ys[i] != 0.0;
        assert_eq!(gs[i], if kept { 2.0 } else { 0.0 }, "element {i}: x {} y {}", xs[i], ys[i]);
        if kept {
            assert_eq!(ys[i], 2.0 * xs[i]);
        }
    }
    assert!(gs.contains(&0.0) && gs.contains(&2.0), "with 8 draws at p = 0.5 both occur for this seed: {gs:?}");
}

#[test]
fn the_state_is_a_parameter_so_repeated_draws_compile_once() {
    if common::child::alone(module_path!(), "the_state_is_a_parameter_so_repeated_draws_compile_once") {
        return; // the counters are process-wide: alone in a process of its own
    }
    let _s = serial();
    lazuli::manual_seed(8);
    // Warm up both shapes of program (first draw from a host state, and the steady state).
    for _ in 0..2 {
        let _r = Tensor::rand(&[3, 4], DType::F32);
        lazuli::sync().unwrap();
    }
    let before = lazuli::metrics();
    let mut seen = Vec::new();
    for step in 0..5 {
        let r = Tensor::rand(&[3, 4], DType::F32);
        lazuli::sync().unwrap(); // the step boundary computes the bits and the next state together
        let v = r.to_vec::<f32>().unwrap();
        assert!(!seen.contains(&v), "step {step} repeated an earlier draw");
        seen.push(v);
    }
    let d = lazuli::metrics() - before;
    assert_eq!(d.compiles, 0, "five steps of draws reuse one program");
    assert_eq!(d.executions, 5);

    // Reading only the numbers (no sync) leaves the state behind; the next draw computes it alone instead of
    // chaining, so programs stop compiling after the first two.
    let _ = Tensor::rand(&[5], DType::F32).to_vec::<f32>().unwrap();
    let _ = Tensor::rand(&[5], DType::F32).to_vec::<f32>().unwrap();
    let before = lazuli::metrics();
    let mut last = Vec::new();
    for _ in 0..5 {
        let v = Tensor::rand(&[5], DType::F32).to_vec::<f32>().unwrap();
        assert_ne!(v, last);
        last = v;
    }
    assert_eq!((lazuli::metrics() - before).compiles, 0, "item-style reads reuse their programs too");
}

#[test]
fn rng_state_saves_and_restores_the_stream() {
    let _s = serial();
    lazuli::manual_seed(9);
    let _ = Tensor::rand(&[7], DType::F32).to_vec::<f32>().unwrap();
    let saved = lazuli::rng_state().to_vec::<u64>().unwrap();
    assert_eq!(saved[0], 9, "word 0 is the Threefry key (the seed)");
    assert_eq!(saved[1], 4, "word 1 counts Threefry pairs: 7 numbers took 4");
    let a = Tensor::rand(&[3, 3], DType::F64).to_vec::<f64>().unwrap();
    let b = Tensor::randn(&[4], DType::F32).to_vec::<f32>().unwrap();
    lazuli::set_rng_state(&Tensor::from_slice(&saved, &[2]));
    assert_eq!(Tensor::rand(&[3, 3], DType::F64).to_vec::<f64>().unwrap(), a);
    assert_eq!(Tensor::randn(&[4], DType::F32).to_vec::<f32>().unwrap(), b);
}

#[test]
fn shifts_every_integer_dtype() {
    let _s = serial();
    let vals = [0.0, 1.0, 5.0, 100.0, 127.0, 255.0];
    let by = [0.0, 1.0, 3.0, 7.0, 2.0, 4.0];
    for dt in [DType::U8, DType::I32, DType::I64, DType::U32, DType::U64] {
        let (x, s) = (tensor_of(dt, &vals, &[6]), tensor_of(dt, &by, &[6]));
        let bits = 8 * dt.byte_size() as u32;
        let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let left: Vec<f64> =
            vals.iter().zip(&by).map(|(&v, &b)| dt.round((((v as u64) << b as u32) & mask) as f64)).collect();
        let right: Vec<f64> = vals.iter().zip(&by).map(|(&v, &b)| ((v as u64) >> b as u32) as f64).collect();
        for (name, t, want) in [("shl", x.shift_left(&s), left), ("shr", x.shift_right_logical(&s), right)] {
            let r: Vec<f64> = t.evaluate_reference().unwrap().iter().copied().collect();
            let got = t.to_f64_vec().unwrap();
            assert_eq!(got, want, "{name} {dt} vs expectation");
            assert_eq!(got, r, "{name} {dt} vs reference");
        }
    }
    // Logical: zeros come in from the left even for negative signed values; shifting by the width gives 0.
    let x = Tensor::from_slice(&[-8i32, -1, i32::MIN, 64], &[4]);
    let by = Tensor::from_slice(&[1i32, 28, 31, 32], &[4]);
    let want = vec![(-8i32 as u32 >> 1) as i32, 15, 1, 0];
    assert_eq!(x.shift_right_logical(&by).to_vec::<i32>().unwrap(), want);
    let r: Vec<i32> = x.shift_right_logical(&by).evaluate_reference().unwrap().iter().map(|&v| v as i32).collect();
    assert_eq!(r, want);
    let u = Tensor::from_slice(&[u64::MAX, 1 << 40], &[2]);
    assert_eq!(u.shift_right_logical(63.0).to_vec::<u64>().unwrap(), vec![1, 0]);
    assert_eq!(u.shift_left(Tensor::from_slice(&[64u64, 20], &[2])).to_vec::<u64>().unwrap(), vec![0, 1 << 60]);
}

#[test]
fn bitcast_between_types_of_one_width() {
    let _s = serial();
    let f = [1.0f32, -2.5, 0.1, f32::INFINITY];
    let t = Tensor::from_slice(&f, &[4]);
    let want: Vec<u32> = f.iter().map(|x| x.to_bits()).collect();
    let u = t.bitcast(DType::U32);
    let r: Vec<u32> = u.evaluate_reference().unwrap().iter().map(|&v| v as u32).collect();
    assert_eq!(u.to_vec::<u32>().unwrap(), want);
    assert_eq!(r, want);
    assert_eq!(u.bitcast(DType::F32).to_vec::<f32>().unwrap(), f.to_vec());
    let i: Vec<i32> = f.iter().map(|x| x.to_bits() as i32).collect();
    assert_eq!(t.bitcast(DType::I32).to_vec::<i32>().unwrap(), i);
    let d = [1.5f64, -0.0, 1e300];
    let td = Tensor::from_slice(&d, &[3]);
    assert_eq!(td.bitcast(DType::U64).to_vec::<u64>().unwrap(), d.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    assert_eq!(
        td.bitcast(DType::I64).to_vec::<i64>().unwrap(),
        d.iter().map(|x| x.to_bits() as i64).collect::<Vec<_>>()
    );
    let h = [half::f16::from_f32(1.5), half::f16::from_f32(-3.0)];
    let hb = Tensor::from_slice(&h, &[2]).bitcast(DType::BF16);
    let want: Vec<half::bf16> = h.iter().map(|x| half::bf16::from_bits(x.to_bits())).collect();
    let r: Vec<f64> = hb.evaluate_reference().unwrap().iter().copied().collect();
    assert_eq!(hb.to_vec::<half::bf16>().unwrap(), want);
    assert_eq!(r, want.iter().map(|x| x.to_f64()).collect::<Vec<_>>());
}

#[test]
fn unsigned_dtypes_hold_their_whole_range() {
    let _s = serial();
    let big = [u64::MAX, (1 << 63) + 5, 3];
    let t = Tensor::from_slice(&big, &[3]);
    assert_eq!(
        (&t + &Tensor::from_slice(&[0u64, 7, 1], &[3])).to_vec::<u64>().unwrap(),
        vec![u64::MAX, (1 << 63) + 12, 4]
    );
    assert_eq!(t.max(&[0]).item::<u64>().unwrap(), u64::MAX);
    assert_eq!(t.min(&[0]).item::<u64>().unwrap(), 3);
    let w = Tensor::from_slice(&[u32::MAX, 0], &[2]);
    assert_eq!((&w + &Tensor::from_slice(&[1u32, 0], &[2])).to_vec::<u32>().unwrap(), vec![0, 0], "u32 wraps");
    assert_eq!((&w - &Tensor::from_slice(&[0u32, 1], &[2])).to_vec::<u32>().unwrap(), vec![u32::MAX, u32::MAX]);
    assert!(w.gt(Tensor::from_slice(&[0u32, 0], &[2])).to_vec::<bool>().unwrap()[0], "compared as unsigned");
    assert_eq!(Tensor::zeros(&[2], DType::U64).max(&[0]).item::<u64>().unwrap(), 0);
    assert_eq!(format!("{}", Tensor::from_slice(&[7u32], &[1])), "[7] : u32[1]");
}

#[test]
fn bad_input_names_the_callers_line() {
    let _s = serial();
    let here = |line: u32| format!("{}:{line}:", file!());
    let line = line!() + 1;
    let msg = panic_message(|| drop(Tensor::rand(&[2], DType::I32)));
    assert!(msg.contains("floating-point") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(Tensor::randn(&[2], DType::U8)));
    assert!(msg.contains("floating-point") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| lazuli::set_rng_state(&Tensor::from_slice(&[1u32, 2], &[2])));
    assert!(msg.contains("u64[2]") && msg.contains(&here(line)), "{msg}");
    let x = Tensor::from_slice(&[1.0f32, 2.0], &[2]);
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.dropout(1.5, true)));
    assert!(msg.contains("probability") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(Tensor::bernoulli(&[2], -0.1)));
    assert!(msg.contains("probability") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.shift_left(1.0)));
    assert!(msg.contains("shift_left") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.bitcast(DType::F64)));
    assert!(msg.contains("widths") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(Tensor::from_slice(&[1u32], &[1]).neg()));
    assert!(msg.contains("neg") && msg.contains(&here(line)), "{msg}");
}

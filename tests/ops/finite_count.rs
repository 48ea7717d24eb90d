//! `count_nonfinite`: NaN and infinite elements of many tensors counted at once, against the count of what was
//! planted. On the CPU the composite; with `LAZULI_DEVICE=gpu` (the ignored test) lazuli's Triton kernel, whose
//! programs each take a chunk of one tensor: values are planted at the first and last elements, at the edges of
//! the kernel's blocks (2,048) and chunks (32,768), in tensors that share a size (one walk, the tensor picked by
//! the program's number) and in f32, bf16 and f16.

use lazuli::{count_nonfinite, try_count_nonfinite, DType, Tensor};

/// Tensors of `shapes` and types with values in [-1, 1) and, with `plant`, NaN, +inf and -inf where the kernel's
/// programs and blocks meet; and how many were planted.
fn tensors(shapes: &[(&[usize], DType)], plant: bool) -> (Vec<Tensor>, i32) {
    let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    let mut planted = 0;
    let tensors = shapes
        .iter()
        .enumerate()
        .map(|(i, &(dims, dtype))| {
            let n: usize = dims.iter().product();
            let mut v: Vec<f32> = (0..n).map(|k| ((k * 7 + i * 13) % 200) as f32 / 100.0 - 1.0).collect();
            let mut at: Vec<usize> = [0, n.saturating_sub(1), 2047, 2048, 32_767, 32_768, 65_536 + 5]
                .into_iter()
                .filter(|&k| plant && k < n && (k + i) % 3 != 1)
                .collect();
            at.sort_unstable();
            at.dedup();
            for (j, &k) in at.iter().enumerate() {
                v[k] = specials[(i + j) % 3];
            }
            planted += at.len() as i32;
            Tensor::from_slice(&v, dims).to_dtype(dtype)
        })
        .collect();
    (tensors, planted)
}

fn check(shapes: &[(&[usize], DType)]) {
    let (planted, want) = tensors(shapes, true);
    assert!(want > 10, "the table plants values");
    let got = count_nonfinite(&planted.iter().collect::<Vec<_>>());
    assert_eq!(got.dims(), &[] as &[usize]);
    assert_eq!(got.dtype(), DType::I32);
    assert_eq!(got.to_vec::<i32>().unwrap(), vec![want], "planted {want} in {shapes:?}");
    let (clean, none) = tensors(shapes, false);
    assert_eq!(none, 0);
    assert_eq!(count_nonfinite(&clean.iter().collect::<Vec<_>>()).to_vec::<i32>().unwrap(), vec![0]);
}

#[test]
fn count_nonfinite_counts_every_planted_value() {
    use DType::{BF16, F16, F32};
    let same = [768usize];
    check(&[
        (&[], F32),
        (&[3, 0], F32),
        (&same, F32),
        (&same, F32),
        (&same, F32),
        (&[3, 5], BF16),
        (&same, F16),
        (&[32_768 + 1], F32),
        (&[70, 1001], BF16),
    ]);
    assert_eq!(count_nonfinite(&[]).to_vec::<i32>().unwrap(), vec![0]);
}

#[test]
fn count_nonfinite_refuses_integers_at_the_callers_line() {
    let ids = Tensor::from_slice(&[1i32, 2], &[2]);
    let x = Tensor::from_slice(&[1.0f32], &[1]);
    let line = line!() + 1;
    let err = try_count_nonfinite(&[&x, &ids]).unwrap_err().to_string();
    assert!(err.contains("float tensors") && err.contains(&format!("finite_count.rs:{line}")), "{err}");
}

#[test]
#[ignore = "needs an NVIDIA GPU: LAZULI_DEVICE=gpu cargo test --release --test ops gpu_kernels -- --ignored"]
fn gpu_kernels_count_nonfinite_counts_every_planted_value() {
    use DType::{BF16, F16, F32};
    assert_eq!(lazuli::platform().expect("a runtime"), "cuda", "run with LAZULI_DEVICE=gpu");
    let (weight, bias) = ([768usize, 2304], [768usize]);
    let mut shapes: Vec<(&[usize], DType)> = vec![(&[], F32), (&[0, 4], BF16)];
    for _ in 0..4 {
        shapes.extend([(&weight[..], F32), (&bias[..], F32), (&bias[..], F32)]);
    }
    shapes.extend([(&[3, 5][..], BF16), (&[1000, 333][..], F16), (&[50_304, 768][..], BF16), (&[65_537][..], F32)]);
    check(&shapes);
    // More tensors than one launch takes (`lazuli_kernels::finite_count::LAUNCH_TENSORS`): several launches.
    let (small, odd) = ([3000usize], [5usize]);
    let many: Vec<(&[usize], DType)> =
        (0..1100).map(|i| if i % 7 == 0 { (&odd[..], F16) } else { (&small[..], F32) }).collect();
    check(&many);
}

//! Gradients of the array ops and nn functionals against central finite differences in f64, at several shapes.

// `check_grad` takes owned inputs; `&[x.clone()]` reads better than `slice::from_ref(&x)`.
#![allow(clippy::cloned_ref_to_slice_refs)]

use crate::common;

use common::gradcheck::check_grad;
use common::{array, values, Rng};
use lazuli::{DType, Tensor};
use ndarray::ArrayD;

fn data(seed: u64, dims: &[usize], lo: f64, hi: f64) -> ArrayD<f64> {
    let n = dims.iter().product();
    array(values(&mut Rng::new(seed), DType::F64, n, lo, hi), dims)
}

#[test]
fn slice_concat_stack_pad_flip_gradients() {
    let x = data(1, &[3, 4, 5], -2.0, 2.0);
    check_grad("slice", &[x.clone()], |t| t[0].slice(1, 1, 3));
    check_grad("slice_step", &[x.clone()], |t| t[0].slice_step(2, 0, 5, 2));
    check_grad("slice_step 3 from 1", &[x.clone()], |t| t[0].slice_step(-1, 1, 4, 3));
    check_grad("narrow twice", &[x.clone()], |t| t[0].narrow(0, 1, 2).narrow(1, 0, 3));
    let (a, b, c) = (data(2, &[2, 3], -1.0, 1.0), data(3, &[2, 1], -1.0, 1.0), data(4, &[2, 4], -1.0, 1.0));
    check_grad("concat", &[a.clone(), b.clone(), c.clone()], |t| Tensor::concat(&[&t[0], &t[1], &t[2]], 1));
    check_grad("concat same input twice", &[a.clone()], |t| Tensor::concat(&[&t[0], &t[0]], 0));
    check_grad("stack", &[a.clone(), data(5, &[2, 3], -1.0, 1.0)], |t| Tensor::stack(&[&t[0], &t[1]], 1));
    check_grad("pad", &[x.clone()], |t| t[0].pad(&[(1, 0), (0, 2), (2, 1)], 0.5));
    // A padding value that is itself a gradient leaf receives the sum over the padded area.
    check_grad("pad value", &[a.clone(), array(vec![0.3], &[])], |t| t[0].pad(&[(1, 1), (0, 2)], &t[1]).exp());
    check_grad("flip", &[x.clone()], |t| t[0].flip(&[0, -1]));
}

#[test]
fn index_select_embedding_scatter_add_gradients() {
    let x = data(10, &[4, 3, 2], -1.0, 1.0);
    // Repeated and clamped (out-of-range) indices: their cotangents accumulate on the clamped element.
    let idx = Tensor::from_slice(&[1i32, 3, 1, -2, 7, 0], &[2, 3]);
    check_grad("index_select axis 0", &[x.clone()], |t| t[0].index_select(0, &idx));
    check_grad("index_select axis 1", &[x.clone()], |t| t[0].index_select(1, &idx));
    check_grad("index_select axis -1", &[x.clone()], |t| t[0].index_select(-1, &Tensor::from_slice(&[1i64, 1], &[2])));
    let ids = Tensor::from_slice(&[2u8, 0, 2, 4], &[4]);
    check_grad("embedding", &[data(11, &[5, 3], -1.0, 1.0)], |t| t[0].embedding(&ids).tanh());
    let upd = data(12, &[4, 2, 3, 2], -1.0, 1.0);
    check_grad("scatter_add", &[x.clone(), upd], |t| t[0].scatter_add(1, &idx, &t[1]).sin());
}

#[test]
fn cumsum_clamp_tri_gradients() {
    for dims in [&[5][..], &[3, 4], &[2, 3, 4]] {
        let x = data(20, dims, -2.0, 2.0);
        for axis in 0..dims.len() as isize {
            check_grad(&format!("cumsum {dims:?} axis {axis}"), &[x.clone()], |t| t[0].cumsum(axis).sin());
        }
    }
    // Values kept away from the bounds (the kinks): inside passes g, outside gets 0.
    let x = array(vec![-1.7, -0.4, 0.2, 0.9, 1.3, -1.1], &[2, 3]);
    check_grad("clamp", &[x.clone()], |t| t[0].clamp(-1.0, 1.0));
    check_grad("clamp by tensors", &[x.clone(), array(vec![-0.5, 0.0, 1.0], &[3])], |t| t[0].clamp(&t[1], 1.2));
    check_grad("tril", &[data(21, &[2, 3, 4], -1.0, 1.0)], |t| t[0].tril(0));
    check_grad("triu", &[data(22, &[3, 4], -1.0, 1.0)], |t| t[0].triu(1));
}

#[test]
fn activation_gradients() {
    // Kept away from 0, where relu has its kink.
    let x = array(vec![-1.5, -0.3, 0.4, 2.0, -0.7, 1.1], &[2, 3]);
    check_grad("relu", &[x.clone()], |t| t[0].relu());
    for dims in [&[7][..], &[3, 4], &[2, 3, 4]] {
        let x = data(30, dims, -3.0, 3.0);
        check_grad(&format!("erf {dims:?}"), &[x.clone()], |t| t[0].erf());
        check_grad(&format!("gelu {dims:?}"), &[x.clone()], |t| t[0].gelu());
        check_grad(&format!("gelu_erf {dims:?}"), &[x.clone()], |t| t[0].gelu_erf());
    }
}

#[test]
fn softmax_family_gradients() {
    for (dims, axes) in
        [(&[6][..], &[0isize][..]), (&[3, 5], &[1]), (&[3, 5], &[0]), (&[2, 3, 4], &[-1]), (&[2, 3, 4], &[0, 2])]
    {
        let x = data(40 + dims.len() as u64, dims, -3.0, 3.0);
        check_grad(&format!("logsumexp {dims:?} {axes:?}"), &[x.clone()], |t| t[0].logsumexp(axes));
        check_grad(&format!("logsumexp_keepdim {dims:?} {axes:?}"), &[x.clone()], |t| t[0].logsumexp_keepdim(axes));
        if axes.len() == 1 {
            check_grad(&format!("softmax {dims:?} {axes:?}"), &[x.clone()], |t| t[0].softmax(axes[0]));
            check_grad(&format!("log_softmax {dims:?} {axes:?}"), &[x.clone()], |t| t[0].log_softmax(axes[0]));
        }
        check_grad(&format!("layer_norm {dims:?} {axes:?}"), &[x.clone()], |t| t[0].layer_norm(axes, 1e-5));
    }
    for dims in [&[5][..], &[3, 4], &[2, 3, 4]] {
        let d = dims[dims.len() - 1];
        let (x, w, b) = (data(70, dims, -3.0, 3.0), data(71, &[d], 0.5, 1.5), data(72, &[d], -1.0, 1.0));
        check_grad(&format!("layer_norm_affine {dims:?}"), &[x, w, b], |t| {
            t[0].layer_norm_affine(&t[1], &t[2], 1e-5, t[0].dtype())
        });
    }
    for dims in [&[5][..], &[3, 4], &[2, 3, 4]] {
        let d = dims[dims.len() - 1];
        let (x, a) = (data(75, dims, -3.0, 3.0), data(76, dims, -1.0, 1.0));
        let (w, b, c) = (data(77, &[d], 0.5, 1.5), data(78, &[d], -1.0, 1.0), data(79, &[d], -1.0, 1.0));
        // Both results reach the loss, each with its own cotangent; with and without the added bias.
        check_grad(&format!("add_layer_norm_affine {dims:?}"), &[x.clone(), a.clone(), w.clone(), b.clone()], |t| {
            let (s, y) = t[0].add_layer_norm_affine(&t[1], None, &t[2], &t[3], 1e-5, t[0].dtype());
            y * s.sin()
        });
        check_grad(&format!("add_layer_norm_affine biased {dims:?}"), &[x, a, c, w, b], |t| {
            let (s, y) = t[0].add_layer_norm_affine(&t[1], Some(&t[2]), &t[3], &t[4], 1e-5, t[0].dtype());
            y * s.sin()
        });
    }
    for dims in [&[5][..], &[3, 4], &[2, 3, 4]] {
        let (x, b) = (data(73, dims, -3.0, 3.0), data(74, &[dims[dims.len() - 1]], -1.0, 1.0));
        check_grad(&format!("bias_gelu {dims:?}"), &[x, b], |t| t[0].bias_gelu(&t[1], DType::F64));
    }
    // Large logits: the max-shift keeps everything finite.
    let big = data(50, &[2, 4], 500.0, 510.0);
    check_grad("log_softmax large", &[big.clone()], |t| t[0].log_softmax(1));
    check_grad("logsumexp large", &[big], |t| t[0].logsumexp(&[1]));
}

#[test]
fn loss_gradients() {
    for (n, c, seed) in [(1usize, 2usize, 60u64), (4, 3, 61), (6, 5, 62)] {
        let logits = data(seed, &[n, c], -2.0, 2.0);
        let targets: Vec<i64> = (0..n).map(|i| ((i * 7 + 3) % c) as i64).collect();
        let t32: Vec<i32> = targets.iter().map(|&t| t as i32).collect();
        let (ti64, ti32) = (Tensor::from_slice(&targets, &[n]), Tensor::from_slice(&t32, &[n]));
        check_grad(&format!("cross_entropy [{n}, {c}] i64"), &[logits.clone()], |t| t[0].cross_entropy(&ti64));
        check_grad(&format!("cross_entropy [{n}, {c}] i32"), &[logits], |t| t[0].cross_entropy(&ti32));
    }
    let (p, q) = (data(63, &[3, 4], -1.0, 1.0), data(64, &[3, 4], -1.0, 1.0));
    check_grad("mse_loss", &[p, q], |t| t[0].mse_loss(&t[1]));
}

#[test]
fn cross_entropy_options_gradients() {
    use lazuli::CrossEntropyOptions;
    let x = data(65, &[2, 3, 4], -2.0, 2.0);
    let ids = Tensor::from_slice(&[3i64, -100, 1, 0, 2, 1], &[2, 3]);
    let none = CrossEntropyOptions::default();
    for (name, opts) in [
        ("ignore -100", none.ignore_index(-100)),
        ("ignore class 1", none.ignore_index(1)),
        ("smoothing 0.2", none.label_smoothing(0.2)),
        ("ignore -100, smoothing 0.1", none.ignore_index(-100).label_smoothing(0.1)),
        ("smoothing 1", none.label_smoothing(1.0)),
    ] {
        check_grad(&format!("cross_entropy_with {name}"), &[x.clone()], |t| t[0].cross_entropy_with(&ids, &opts));
    }
    let ok = Tensor::from_slice(&[3i32, 2, 1, 0, 2, 1], &[2, 3]);
    check_grad("cross_entropy [2, 3, 4]", &[x], |t| t[0].cross_entropy(&ok));
}

#[test]
fn take_along_axis_gradients() {
    let x = data(66, &[3, 4], -2.0, 2.0);
    // Repeated, negative and out-of-range indices: the cotangent accumulates where they land.
    let idx = Tensor::from_slice(&[0i64, 0, 3, -1, 2, 9, 1, 1, -7], &[3, 3]);
    check_grad("take_along_axis axis 1", &[x.clone()], |t| t[0].take_along_axis(&idx, 1));
    let rows = Tensor::from_slice(&[2i32, 0, 1, 2, 2, 0, 1, 1], &[2, 4]);
    check_grad("take_along_axis axis 0", &[x.clone()], |t| t[0].take_along_axis(&rows, 0));
    // x broadcast beside the axis: its gradient sums over the broadcast copies.
    let b = data(67, &[1, 4], -2.0, 2.0);
    let picks = Tensor::from_slice(&[3i64, 1, 0, 0, 2, 2], &[3, 2]);
    check_grad("take_along_axis broadcast", &[b], |t| t[0].take_along_axis(&picks, -1));
}

#[test]
fn sort_and_topk_gradients() {
    // Distinct values: the sorted order, and so the gradient, does not change under the finite differences.
    let x = data(71, &[3, 4], -2.0, 2.0);
    check_grad("sort ascending axis 1", &[x.clone()], |t| t[0].sort(1, false));
    check_grad("sort descending axis 0", &[x.clone()], |t| t[0].sort(0, true));
    check_grad("topk 2 axis -1", &[x.clone()], |t| t[0].topk(2, -1).0);
    let y = data(72, &[2, 3, 4], -2.0, 2.0);
    check_grad("sort rank 3 axis 1", &[y], |t| t[0].sort(1, true));
}

#[test]
fn slice_axes_scatter_and_einsum_gradients() {
    use lazuli::s;
    let x = data(73, &[3, 4, 5], -2.0, 2.0);
    check_grad("slice_axes steps", &[x.clone()], |t| t[0].slice_axes(&s![1.., ..;2, -4..;3]));
    check_grad("slice_axes negative steps", &[x.clone()], |t| t[0].slice_axes(&s![..;-1, 1..4;-2]));

    // Repeated indices: only the last update to a slot reaches it, so only that one gets a gradient.
    let base = data(74, &[4, 3], -2.0, 2.0);
    let upd = data(75, &[5, 3], -2.0, 2.0);
    let idx = Tensor::from_slice(&[1i64, 3, 1, 1, 9], &[5]);
    check_grad("scatter", &[base.clone(), upd.clone()], |t| t[0].scatter(0, &idx, &t[1]));
    // Distinct random values: one winner per element, so the extremes are differentiable there.
    check_grad("scatter_max", &[base.clone(), upd.clone()], |t| t[0].scatter_max(0, &idx, &t[1]));
    check_grad("scatter_min", &[base.clone(), upd.clone()], |t| t[0].scatter_min(0, &idx, &t[1]));

    let a = data(76, &[2, 3, 4], -2.0, 2.0);
    let b = data(77, &[2, 4, 3], -2.0, 2.0);
    let c = data(78, &[3, 2], -2.0, 2.0);
    check_grad("einsum batched", &[a.clone(), b.clone()], |t| lazuli::einsum("bij,bjk->bik", &[&t[0], &t[1]]));
    check_grad("einsum three operands", &[a.clone(), b, c], |t| {
        lazuli::einsum("bij,bjk,kl->lbi", &[&t[0], &t[1], &t[2]])
    });
    // A size-1 `...` dimension broadcast against another operand's: its gradient sums over the copies.
    let d = data(79, &[2, 1, 4], -2.0, 2.0);
    check_grad("einsum broadcast", &[a, d], |t| lazuli::einsum("...ij,...j->...i", &[&t[0], &t[1]]));
    let e = data(80, &[3, 2, 3], -2.0, 2.0);
    check_grad("einsum diagonal", &[e], |t| lazuli::einsum("iji->ji", &[&t[0]]));
}

#[test]
fn scatter_max_shares_a_tie_evenly_like_pytorch() {
    // Slot 1 holds 5 and receives 5 and 5 again: three winners, a third of the cotangent each; slot 0 keeps its
    // value alone; the update of 2 at slot 0 loses.
    let x = Tensor::from_slice(&[3.0f64, 5.0], &[2]).requires_grad();
    let upd = Tensor::from_slice(&[5.0f64, 2.0, 5.0], &[3]).requires_grad();
    let idx = Tensor::from_slice(&[1i32, 0, 1], &[3]);
    let out = x.scatter_max(0, &idx, &upd);
    let loss = (&out * &Tensor::from_slice(&[1.0f64, 3.0], &[2])).sum_all();
    let grads = lazuli::grad(&loss, &[&x, &upd]);
    assert_eq!(grads[0].to_vec::<f64>().unwrap(), [1.0, 1.0]);
    assert_eq!(grads[1].to_vec::<f64>().unwrap(), [1.0, 0.0, 1.0]);
}

//! Convolution and pooling: forward results against loops written here and against the reference interpreter,
//! every float dtype; gradients against finite differences in f64; and, at the IR level, the adjoint identity of
//! the gradient convolutions for layouts and options `conv2d` never produces (reversed windows, input dilation,
//! NHWC), on the reference interpreter and on XLA.

use crate::common;

use crate::common::panic_message;
use common::gradcheck::check_grad;
use common::{array, assert_close, tensor_of, values, Rng};
use lazuli::{DType, Precision, Tensor};
use lazuli_hlo::{Builder, Convolution, Graph, Loc, NodeId, Op, ReduceWindow, TensorType, WindowKind};
use ndarray::{ArrayD, Dimension, IxDyn};

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

struct Check {
    name: String,
    dtype: DType,
    got: Tensor,
    want: ArrayD<f64>,
}

/// Compare each result with its expectation and with the reference interpreter, all in one program.
fn run(checks: Vec<Check>) {
    let refs: Vec<ArrayD<f64>> = checks.iter().map(|c| c.got.evaluate_reference().unwrap()).collect();
    lazuli::sync().unwrap();
    for (c, r) in checks.iter().zip(refs) {
        assert_eq!(c.got.dims(), c.want.shape(), "{}: shape", c.name);
        let got = c.got.to_f64_vec().unwrap();
        let want: Vec<f64> = c.want.iter().map(|&x| c.dtype.round(x)).collect();
        assert_close(&format!("{} vs loops", c.name), c.dtype, &got, &want);
        assert_close(&format!("{} vs reference", c.name), c.dtype, &got, &r.iter().copied().collect::<Vec<_>>());
    }
}

/// Small integers, so that every dtype (bf16 included) holds inputs and sums exactly.
fn input(rng: &mut Rng, dtype: DType, dims: &[usize]) -> (Tensor, ArrayD<f64>) {
    let v = values(rng, DType::I32, dims.iter().product(), -2.0, 3.0);
    (tensor_of(dtype, &v, dims), array(v, dims))
}

fn f64_data(seed: u64, dims: &[usize]) -> ArrayD<f64> {
    array(values(&mut Rng::new(seed), DType::F64, dims.iter().product(), -1.0, 1.0), dims)
}

/// PyTorch's conv2d, by definition.
fn conv2d_loops(x: &ArrayD<f64>, w: &ArrayD<f64>, stride: [usize; 2], pad: [usize; 2], dil: [usize; 2]) -> ArrayD<f64> {
    let (n, c, h, wd) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (o, kh, kw) = (w.shape()[0], w.shape()[2], w.shape()[3]);
    let ho = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) / stride[0] + 1;
    let wo = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) / stride[1] + 1;
    ArrayD::from_shape_fn(IxDyn(&[n, o, ho, wo]), |ix| {
        let mut acc = 0.0;
        for ic in 0..c {
            for a in 0..kh {
                for b in 0..kw {
                    let y = (ix[2] * stride[0] + a * dil[0]) as isize - pad[0] as isize;
                    let z = (ix[3] * stride[1] + b * dil[1]) as isize - pad[1] as isize;
                    if y >= 0 && z >= 0 && (y as usize) < h && (z as usize) < wd {
                        acc += x[[ix[0], ic, y as usize, z as usize]] * w[[ix[1], ic, a, b]];
                    }
                }
            }
        }
        acc
    })
}

/// Max or average pooling over the last two dimensions; padding is skipped by max and counts as zero for mean.
fn pool_loops(x: &ArrayD<f64>, kernel: [usize; 2], stride: [usize; 2], pad: [usize; 2], max: bool) -> ArrayD<f64> {
    let r = x.ndim();
    let (h, w) = (x.shape()[r - 2], x.shape()[r - 1]);
    let mut dims = x.shape().to_vec();
    dims[r - 2] = (h + 2 * pad[0] - kernel[0]) / stride[0] + 1;
    dims[r - 1] = (w + 2 * pad[1] - kernel[1]) / stride[1] + 1;
    ArrayD::from_shape_fn(IxDyn(&dims), |ix| {
        let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
        for a in 0..kernel[0] {
            for b in 0..kernel[1] {
                let y = (ix[r - 2] * stride[0] + a) as isize - pad[0] as isize;
                let z = (ix[r - 1] * stride[1] + b) as isize - pad[1] as isize;
                if y >= 0 && z >= 0 && (y as usize) < h && (z as usize) < w {
                    let mut at = ix.slice().to_vec();
                    at[r - 2] = y as usize;
                    at[r - 1] = z as usize;
                    let v = x[IxDyn(&at)];
                    acc = if max { acc.max(v) } else { acc + v };
                }
            }
        }
        if max {
            acc
        } else {
            acc / (kernel[0] * kernel[1]) as f64
        }
    })
}

/// (input dims, weight dims, stride, padding, dilation)
type ConvCase = ([usize; 4], [usize; 4], [usize; 2], [usize; 2], [usize; 2]);

/// (input dims, kernel, stride, padding)
type PoolCase = ([usize; 4], [usize; 2], [usize; 2], [usize; 2]);

/// (input dims, window, strides, base dilation, padding)
type SumWindowCase = ([usize; 3], [usize; 3], [usize; 3], [usize; 3], [(i64, i64); 3]);

const CONV_CASES: [ConvCase; 6] = [
    ([2, 3, 5, 5], [4, 3, 3, 3], [1, 1], [0, 0], [1, 1]),
    ([2, 3, 7, 6], [2, 3, 3, 2], [2, 1], [1, 0], [1, 1]),
    ([1, 2, 8, 8], [3, 2, 3, 3], [2, 2], [1, 1], [1, 1]),
    ([1, 2, 9, 7], [2, 2, 3, 3], [1, 2], [2, 1], [2, 1]),
    ([3, 1, 4, 4], [1, 1, 4, 4], [1, 1], [0, 0], [1, 1]),
    ([1, 2, 7, 7], [2, 2, 2, 2], [3, 3], [0, 2], [1, 1]),
];

#[test]
fn conv2d_forward_every_float_dtype() {
    let mut rng = Rng::new(1);
    let mut checks = Vec::new();
    for dt in FLOATS {
        for (xd, wd, stride, pad, dil) in CONV_CASES {
            let (x, xa) = input(&mut rng, dt, &xd);
            let (w, wa) = input(&mut rng, dt, &wd);
            checks.push(Check {
                name: format!("conv2d {xd:?} * {wd:?} stride {stride:?} pad {pad:?} dilation {dil:?} {dt}"),
                dtype: dt,
                got: x.conv2d_dilated(&w, stride, pad, dil),
                want: conv2d_loops(&xa, &wa, stride, pad, dil),
            });
        }
        // The plain entry point, plus a bias added by the caller.
        let (x, xa) = input(&mut rng, dt, &[2, 2, 4, 4]);
        let (w, wa) = input(&mut rng, dt, &[3, 2, 2, 2]);
        let (bias, ba) = input(&mut rng, dt, &[3]);
        let mut want = conv2d_loops(&xa, &wa, [2, 2], [1, 1], [1, 1]);
        for ((_, o, _, _), v) in want.view_mut().into_dimensionality::<ndarray::Ix4>().unwrap().indexed_iter_mut() {
            *v += ba[[o]];
        }
        let got = x.conv2d(&w, [2, 2], [1, 1]) + bias.reshape(&[1, -1, 1, 1]);
        checks.push(Check { name: format!("conv2d + bias {dt}"), dtype: dt, got, want });
    }
    run(checks);
}

#[test]
fn pooling_forward_every_dtype() {
    let mut rng = Rng::new(2);
    let mut checks = Vec::new();
    let cases: [PoolCase; 4] = [
        ([2, 3, 4, 4], [2, 2], [2, 2], [0, 0]),
        ([1, 2, 5, 7], [3, 3], [1, 2], [0, 0]),
        ([2, 1, 6, 5], [3, 2], [2, 2], [1, 1]),
        ([1, 1, 5, 5], [2, 2], [3, 3], [1, 0]),
    ];
    for dt in DType::ALL {
        for (xd, kernel, stride, pad) in cases {
            if dt == DType::Bool {
                continue;
            }
            let (x, xa) = if dt.is_float() {
                input(&mut rng, dt, &xd)
            } else {
                let v = values(&mut rng, dt, xd.iter().product(), 0.0, 50.0);
                (tensor_of(dt, &v, &xd), array(v, &xd))
            };
            let name = format!("{xd:?} kernel {kernel:?} stride {stride:?} pad {pad:?} {dt}");
            let want = pool_loops(&xa, kernel, stride, pad, true);
            let got =
                if pad == [0, 0] { x.max_pool2d(kernel, stride) } else { x.max_pool2d_padded(kernel, stride, pad) };
            checks.push(Check { name: format!("max_pool2d {name}"), dtype: dt, got, want });
            if dt.is_float() {
                let want = pool_loops(&xa, kernel, stride, pad, false);
                let got =
                    if pad == [0, 0] { x.avg_pool2d(kernel, stride) } else { x.avg_pool2d_padded(kernel, stride, pad) };
                checks.push(Check { name: format!("avg_pool2d {name}"), dtype: dt, got, want });
            }
        }
    }
    // Rank 3 and rank 2 pool their last two dimensions too.
    let (x, xa) = input(&mut rng, DType::F32, &[3, 4, 6]);
    let want = pool_loops(&xa, [2, 3], [2, 3], [0, 0], true);
    checks.push(Check { name: "max_pool2d rank 3".into(), dtype: DType::F32, got: x.max_pool2d([2, 3], [2, 3]), want });
    let (x, xa) = input(&mut rng, DType::F64, &[4, 6]);
    let want = pool_loops(&xa, [2, 2], [1, 2], [0, 0], false);
    checks.push(Check { name: "avg_pool2d rank 2".into(), dtype: DType::F64, got: x.avg_pool2d([2, 2], [1, 2]), want });
    run(checks);
}

#[test]
fn conv2d_gradients() {
    for (i, (xd, wd, stride, pad, dil)) in CONV_CASES.iter().enumerate() {
        let (x, w) = (f64_data(10 + i as u64, xd), f64_data(20 + i as u64, wd));
        let name = format!("conv2d {xd:?} * {wd:?} stride {stride:?} pad {pad:?} dilation {dil:?}");
        check_grad(&name, &[x, w], |t| t[0].conv2d_dilated(&t[1], *stride, *pad, *dil));
    }
    // Through a nonlinearity and a second convolution, as in a small network.
    let (x, w1, w2) = (f64_data(30, &[2, 2, 6, 6]), f64_data(31, &[3, 2, 3, 3]), f64_data(32, &[2, 3, 2, 2]));
    check_grad("conv2d stack", &[x, w1, w2], |t| {
        t[0].conv2d(&t[1], [1, 1], [1, 1]).tanh().conv2d(&t[2], [2, 2], [0, 0])
    });
}

/// Distinct values at least 0.05 apart, so finite differences never cross a tie.
fn distinct(seed: u64, dims: &[usize]) -> ArrayD<f64> {
    let n: usize = dims.iter().product();
    let mut rng = Rng::new(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    array(order.into_iter().map(|k| k as f64 * 0.05 - 1.0).collect(), dims)
}

#[test]
fn pooling_gradients() {
    let x = distinct(40, &[2, 2, 6, 5]);
    let one = std::slice::from_ref(&x);
    check_grad("max_pool2d 2x2/2", one, |t| t[0].max_pool2d([2, 2], [2, 2]));
    check_grad("max_pool2d 3x3/1 overlapping", one, |t| t[0].max_pool2d([3, 3], [1, 1]));
    check_grad("max_pool2d 3x2/2 padded", one, |t| t[0].max_pool2d_padded([3, 2], [2, 2], [1, 1]));
    check_grad("avg_pool2d 2x2/2", one, |t| t[0].avg_pool2d([2, 2], [2, 2]));
    check_grad("avg_pool2d 3x3/2", one, |t| t[0].avg_pool2d([3, 3], [2, 1]));
    check_grad("avg_pool2d 3x3/3 padded", one, |t| t[0].avg_pool2d_padded([3, 3], [3, 3], [1, 2]));
    check_grad("avg_pool2d stride beyond kernel", one, |t| t[0].avg_pool2d([1, 2], [3, 3]));
    let (img, w) = (distinct(41, &[1, 2, 6, 6]), f64_data(42, &[2, 2, 3, 3]));
    check_grad("conv2d then max_pool2d", &[img, w], |t| t[0].conv2d(&t[1], [1, 1], [1, 1]).max_pool2d([2, 2], [2, 2]));
}

#[test]
fn max_pool_ties_send_the_gradient_to_the_first_maximum() {
    // Window (0,0) is all 1s, window (0,1) has 3 at two places; overlapping windows with stride 1 in rows.
    let x = Tensor::from_slice(&[1.0f64, 1.0, 3.0, 2.0, 1.0, 1.0, 0.0, 3.0, 0.5, 0.5, 0.5, 0.5], &[1, 1, 3, 4])
        .requires_grad();
    let y = x.max_pool2d([2, 2], [1, 2]);
    let g = lazuli::grad(&(&y * Tensor::from_slice(&[1.0f64, 10.0, 100.0, 1000.0], &[1, 1, 2, 2])).sum_all(), &[&x]);
    let r = g[0].evaluate_reference().unwrap();
    let got = g[0].to_vec::<f64>().unwrap();
    // Row windows {0,1} and {1,2}: (0,0) first max at x[0,0]; (0,1) at x[0,2]; (1,0) at x[1,0]; (1,1) at x[1,3].
    let want = vec![1.0, 0.0, 10.0, 0.0, 100.0, 0.0, 0.0, 1000.0, 0.0, 0.0, 0.0, 0.0];
    assert_eq!(got, want);
    assert_eq!(r.iter().copied().collect::<Vec<_>>(), want, "reference interpreter");
}

#[test]
fn bad_input_names_the_callers_line() {
    let x = Tensor::zeros(&[1, 3, 5, 5], DType::F32);
    let here = |line: u32| format!("{}:{line}:", file!());
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.conv2d(&Tensor::zeros(&[2, 4, 3, 3], DType::F32), [1, 1], [0, 0])));
    assert!(msg.contains("3 features") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.conv2d(&Tensor::zeros(&[2, 3, 7, 7], DType::F32), [1, 1], [0, 0])));
    assert!(msg.contains("does not fit") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.conv2d(&Tensor::zeros(&[2, 3, 3, 3], DType::F64), [1, 1], [0, 0])));
    assert!(msg.contains("floating-point type") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.reshape(&[3, 5, 5]).conv2d(&x, [1, 1], [0, 0])));
    assert!(msg.contains("[N, C, H, W]") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.conv2d(&Tensor::zeros(&[2, 3, 3, 3], DType::F32), [0, 1], [0, 0])));
    assert!(msg.contains("positive") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.max_pool2d([6, 2], [1, 1])));
    assert!(msg.contains("does not fit") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(x.max_pool2d_padded([2, 2], [1, 1], [2, 0])));
    assert!(msg.contains("smaller than the kernel") && msg.contains(&here(line)), "{msg}");
    let line = line!() + 1;
    let msg = panic_message(|| drop(Tensor::zeros(&[4, 4], DType::I32).avg_pool2d([2, 2], [2, 2])));
    assert!(msg.contains("floating-point") && msg.contains(&here(line)), "{msg}");
}

// The IR level: gradient convolutions in configurations conv2d never records.

/// Records ops into an `hlo::Graph`, so a rule's vjp can be run by the reference interpreter and by XLA.
struct GraphBuilder(Graph);

const HERE: Loc = Loc { file: "ops_window.rs", line: 0, col: 0 };

impl Builder for GraphBuilder {
    type V = NodeId;
    fn ty<'a>(&'a self, v: &'a NodeId) -> &'a TensorType {
        &self.0.nodes[*v].ty
    }
    fn op(&mut self, op: Op, operands: &[&NodeId]) -> NodeId {
        self.0.push(op, operands.iter().map(|&&o| o).collect(), HERE).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Run `graph` on the CPU plugin (f64 parameters and results).
fn run_on_xla(graph: &Graph, params: &[ArrayD<f64>]) -> Vec<Vec<f64>> {
    use lazuli_pjrt::{provision, Client, ClientOptions, CompileOptions, ElementType, Plugin};
    let plugin = Plugin::load(provision::cpu_plugin_path().unwrap()).unwrap();
    let client = Client::new(&plugin, &ClientOptions::new().cpu_device_count(1)).unwrap();
    let devices = client.devices();
    let device = &devices[0];
    let text = lazuli_hlo::emit(graph, &Default::default());
    let exe = client.compile(&text, &CompileOptions::default()).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let bufs: Vec<_> = params
        .iter()
        .map(|p| {
            let bytes: Vec<u8> = p.iter().flat_map(|x| x.to_le_bytes()).collect();
            let dims: Vec<i64> = p.shape().iter().map(|&d| d as i64).collect();
            client.buffer_from_host(&bytes, ElementType::F64, &dims, device).unwrap()
        })
        .collect();
    let refs: Vec<_> = bufs.iter().collect();
    let outs = exe.execute(&refs).unwrap();
    outs.iter()
        .map(|b| b.to_host().unwrap().chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect())
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// For a bilinear op y = f(a, b) with cotangent g: <g, y> = <vjp_a, a> = <vjp_b, b>. Checked on the reference
/// interpreter, whose values XLA must then match.
fn check_adjoint(name: &str, op: Op, a_dims: &[usize], b_dims: Option<&[usize]>) {
    let mut gb = GraphBuilder(Graph::new());
    let a = gb.0.parameter(TensorType::new(DType::F64, a_dims), HERE);
    let mut operands = vec![a];
    if let Some(d) = b_dims {
        operands.push(gb.0.parameter(TensorType::new(DType::F64, d), HERE));
    }
    let refs: Vec<&NodeId> = operands.iter().collect();
    let y = gb.op(op.clone(), &refs);
    let y_dims = gb.ty(&y).dims.clone();
    let g = gb.0.parameter(TensorType::new(DType::F64, y_dims.clone()), HERE);
    let grads = op.vjp(&mut gb, &operands, &y, &g);
    let mut graph = gb.0;
    graph.outputs = vec![y];
    graph.outputs.extend(grads.iter().map(|d| d.expect("a gradient")));
    let mut params = vec![f64_data(1, a_dims)];
    if let Some(d) = b_dims {
        params.push(f64_data(2, d));
    }
    params.push(f64_data(3, &y_dims));
    let want = graph.evaluate(&params).unwrap();
    let inner = dot(want[0].as_slice().unwrap(), params.last().unwrap().as_slice().unwrap());
    for (k, d) in want[1..].iter().enumerate() {
        assert_eq!(d.shape(), params[k].shape(), "{name}: gradient {k} shape");
        let other = dot(d.as_slice().unwrap(), params[k].as_slice().unwrap());
        assert!(
            (inner - other).abs() < 1e-9 * (1.0 + inner.abs()),
            "{name}: <g, y> = {inner} but <vjp {k}, x> = {other}"
        );
    }
    for (k, (got, w)) in run_on_xla(&graph, &params).iter().zip(&want).enumerate() {
        assert_close(&format!("{name}: output {k} XLA vs reference"), DType::F64, got, w.as_slice().unwrap());
    }
}

#[test]
fn gradient_convolutions_are_adjoint_in_every_configuration() {
    let nchw: Vec<usize> = vec![0, 1, 2, 3];
    let nhwc: Vec<usize> = vec![0, 3, 1, 2];
    let hwio: Vec<usize> = vec![3, 2, 0, 1];
    // (lhs spec, rhs spec, out spec, input dims, kernel dims, strides, padding, lhs dilation, rhs dilation, reverse)
    let cases = [
        (&nchw, &nchw, &nchw, [2, 3, 6, 5], [4, 3, 3, 2], [1, 1], [(0, 0), (0, 0)], [1, 1], [1, 1], false),
        (&nchw, &nchw, &nchw, [2, 3, 6, 5], [4, 3, 3, 2], [2, 1], [(1, 2), (0, 1)], [1, 1], [1, 1], true),
        (&nchw, &nchw, &nchw, [1, 2, 5, 6], [3, 2, 2, 3], [2, 3], [(1, 0), (2, 2)], [2, 1], [1, 2], false),
        (&nchw, &nchw, &nchw, [1, 2, 5, 6], [3, 2, 2, 3], [2, 3], [(1, 0), (2, 2)], [2, 1], [1, 2], true),
        (&nhwc, &hwio, &nhwc, [2, 5, 4, 3], [3, 2, 3, 2], [1, 2], [(1, 1), (0, 0)], [1, 1], [2, 1], false),
        (&nhwc, &hwio, &nchw, [2, 5, 4, 3], [3, 2, 3, 2], [3, 1], [(0, -1), (1, 0)], [1, 2], [1, 1], true),
    ];
    for (i, (ls, rs, os, xd, kd, st, pad, ld, rd, rev)) in cases.into_iter().enumerate() {
        let conv = Convolution {
            lhs_spec: ls.clone(),
            rhs_spec: rs.clone(),
            out_spec: os.clone(),
            strides: st.to_vec(),
            padding: pad.to_vec(),
            lhs_dilation: ld.to_vec(),
            rhs_dilation: rd.to_vec(),
            reverse: rev,
            // The attribute compiles, and the gradients' convolutions carry it too.
            precision: if i % 2 == 0 { Precision::Default } else { Precision::Highest },
        };
        check_adjoint(&format!("convolution case {i}"), Op::Convolution(Box::new(conv)), &xd, Some(&kd));
    }
    // 1-D and 3-D convolutions go through the same rules.
    let conv1 = Convolution::channels_first(vec![2], vec![(1, 1)], vec![2]);
    check_adjoint("conv1d", Op::Convolution(Box::new(conv1)), &[2, 3, 9], Some(&[2, 3, 3]));
    let conv3 = Convolution::channels_first(vec![1, 2, 1], vec![(0, 0), (1, 0), (0, 1)], vec![1, 1, 1]);
    check_adjoint("conv3d", Op::Convolution(Box::new(conv3)), &[1, 2, 3, 4, 3], Some(&[2, 2, 2, 2, 2]));
}

#[test]
fn sum_window_gradient_is_adjoint() {
    let cases: [SumWindowCase; 3] = [
        ([2, 6, 5], [1, 2, 2], [1, 2, 2], [1, 1, 1], [(0, 0), (0, 0), (0, 0)]),
        ([2, 6, 5], [2, 3, 2], [1, 2, 3], [1, 1, 1], [(1, 0), (1, 2), (0, 1)]),
        ([3, 4, 5], [1, 2, 3], [1, 1, 2], [1, 2, 2], [(0, 0), (1, 1), (2, 0)]),
    ];
    for (i, (xd, window, strides, base, padding)) in cases.into_iter().enumerate() {
        let op = ReduceWindow {
            kind: WindowKind::Sum,
            window: window.to_vec(),
            strides: strides.to_vec(),
            base_dilation: base.to_vec(),
            padding: padding.to_vec(),
        };
        check_adjoint(&format!("sum window case {i}"), Op::ReduceWindow(Box::new(op)), &xd, None);
    }
}

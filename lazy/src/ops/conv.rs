//! Convolution and pooling in PyTorch's layout (`[N, C, H, W]` inputs, `[O, C, kh, kw]` kernels). Gradients come
//! from the ops' own rules (`lazuli_hlo::Convolution`, `ReduceWindow`, `SelectAndScatter`).

use lazuli_hlo::{BinaryKind, Constant, Convolution, Loc, Op, ReduceWindow, TensorType, WindowKind};

use crate::graph::record::{apply, fail};
use crate::graph::tensor::Tensor;

impl Tensor {
    /// 2-D convolution (cross-correlation, as PyTorch's `conv2d`): `self` `[N, C, H, W]`, `weight` `[O, C, kh, kw]`,
    /// result `[N, O, H', W']` with `H' = (H + 2·pad - kh) / stride + 1`. Add a bias with
    /// `+ bias.reshape(&[1, -1, 1, 1])`.
    #[track_caller]
    pub fn conv2d(&self, weight: &Tensor, stride: [usize; 2], padding: [usize; 2]) -> Tensor {
        self.conv2d_at(weight, stride, padding, [1, 1], Loc::caller())
    }

    /// [`Tensor::conv2d`] with the kernel's taps `dilation` apart (atrous convolution).
    #[track_caller]
    pub fn conv2d_dilated(
        &self,
        weight: &Tensor,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    ) -> Tensor {
        self.conv2d_at(weight, stride, padding, dilation, Loc::caller())
    }

    #[track_caller]
    fn conv2d_at(
        &self,
        weight: &Tensor,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        loc: Loc,
    ) -> Tensor {
        if self.rank() != 4 || weight.rank() != 4 {
            fail(
                loc,
                format!(
                    "conv2d: needs an [N, C, H, W] input and an [O, C, kh, kw] weight, got {} and {}",
                    self.tensor_type(),
                    weight.tensor_type()
                ),
            );
        }
        if stride.contains(&0) || dilation.contains(&0) {
            fail(loc, format!("conv2d: stride {stride:?} and dilation {dilation:?} must be positive"));
        }
        let padding = padding.iter().map(|&p| (p as i64, p as i64)).collect();
        let conv = Convolution {
            precision: crate::graph::precision::precision_at(loc),
            ..Convolution::channels_first(stride.to_vec(), padding, dilation.to_vec())
        };
        apply(Op::Convolution(Box::new(conv)), &[self, weight], loc)
    }

    /// Max pooling over the last two dimensions with a `kernel` window moved by `stride`, no padding.
    #[track_caller]
    pub fn max_pool2d(&self, kernel: [usize; 2], stride: [usize; 2]) -> Tensor {
        self.pool2d(WindowKind::Max, kernel, stride, [0, 0], Loc::caller())
    }

    /// [`Tensor::max_pool2d`] with `padding` on both sides of each dimension (padding never wins the max).
    #[track_caller]
    pub fn max_pool2d_padded(&self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Tensor {
        self.pool2d(WindowKind::Max, kernel, stride, padding, Loc::caller())
    }

    /// Average pooling over the last two dimensions, no padding.
    #[track_caller]
    pub fn avg_pool2d(&self, kernel: [usize; 2], stride: [usize; 2]) -> Tensor {
        self.pool2d(WindowKind::Sum, kernel, stride, [0, 0], Loc::caller())
    }

    /// [`Tensor::avg_pool2d`] with zero padding; padded zeros count in the average (PyTorch's default,
    /// `count_include_pad=True`).
    #[track_caller]
    pub fn avg_pool2d_padded(&self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Tensor {
        self.pool2d(WindowKind::Sum, kernel, stride, padding, Loc::caller())
    }

    /// A max or mean pool over the last two dimensions (`WindowKind::Sum` means average here).
    #[track_caller]
    fn pool2d(
        &self,
        kind: WindowKind,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        loc: Loc,
    ) -> Tensor {
        let what = if kind == WindowKind::Max { "max_pool2d" } else { "avg_pool2d" };
        let r = self.rank();
        if r < 2 {
            fail(loc, format!("{what}: needs at least two dimensions to pool, got {}", self.tensor_type()));
        }
        if kind == WindowKind::Sum && !self.dtype().is_float() {
            fail(loc, format!("{what}: needs a floating-point tensor, got {}", self.tensor_type()));
        }
        if kernel.contains(&0) || stride.contains(&0) {
            fail(loc, format!("{what}: kernel {kernel:?} and stride {stride:?} must be positive"));
        }
        // Every window then holds at least one element of the input.
        if padding[0] >= kernel[0] || padding[1] >= kernel[1] {
            fail(loc, format!("{what}: padding {padding:?} must be smaller than the kernel {kernel:?}"));
        }
        let mut window = vec![1; r];
        let mut strides = vec![1; r];
        let mut pads = vec![(0i64, 0i64); r];
        for k in 0..2 {
            window[r - 2 + k] = kernel[k];
            strides[r - 2 + k] = stride[k];
            pads[r - 2 + k] = (padding[k] as i64, padding[k] as i64);
        }
        let pooled = apply(Op::ReduceWindow(Box::new(ReduceWindow::new(kind, window, strides, pads))), &[self], loc);
        if kind == WindowKind::Max {
            return pooled;
        }
        // The count is structure (it follows from the kernel), so it is a constant.
        let count = (kernel[0] * kernel[1]) as f64;
        let c = apply(Op::Constant(Constant::new(count, TensorType::new(self.dtype(), pooled.dims()))), &[], loc);
        apply(Op::Binary(lazuli_hlo::Binary { kind: BinaryKind::Div }), &[&pooled, &c], loc)
    }
}

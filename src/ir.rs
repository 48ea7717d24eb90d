//! The few pieces of lazuli's graph IR a user touches: fused elementwise expressions for [`Tensor::fused`]
//! (one graph node for a chain of unary and binary steps, as the optimizers' updates are) and the static type of a
//! tensor ([`Tensor::tensor_type`]).
//!
//! ```no_run
//! use lazuli::ir::{FusedBuilder, UnaryKind};
//! use lazuli::Tensor;
//!
//! // w - lr * g / (sqrt(v) + eps), as one node.
//! let mut e = FusedBuilder::new("update", 5);
//! let (w, lr, g, v, eps) = (e.arg(0), e.arg(1), e.arg(2), e.arg(3), e.arg(4));
//! let root = e.unary(UnaryKind::Sqrt, v);
//! let den = e.add(root, eps);
//! let step = e.mul(lr, g);
//! let step = e.div(step, den);
//! e.sub(w, step);
//! let update = e.finish();
//!
//! let t = |x: f32| Tensor::from_slice(&[x; 4], &[4]);
//! let new_w = Tensor::fused(&update, &[&t(1.0), &Tensor::scalar(0.1f32), &t(0.5), &t(4.0), &Tensor::scalar(1e-8f32)]);
//! println!("{new_w}");
//! ```
//!
//! [`Tensor::fused`]: crate::Tensor::fused
//! [`Tensor::tensor_type`]: crate::Tensor::tensor_type

pub use lazuli_hlo::ops::fused::{Ref, Step};
pub use lazuli_hlo::{BinaryKind, Fused, FusedBuilder, TensorType, UnaryKind};

//! `+ - * /` and unary `-` on tensors and host scalars, all broadcasting and all reporting the user's line.

use std::ops::{Add, Div, Mul, Neg, Sub};

use lazuli_hlo::{BinaryKind, Loc};

use crate::graph::tensor::Tensor;

macro_rules! binop {
    ($Trait:ident, $method:ident, $kind:expr) => {
        impl $Trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary_at(rhs, $kind, Loc::caller())
            }
        }
        impl $Trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary_at(rhs, $kind, Loc::caller())
            }
        }
        impl $Trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                self.binary_at(rhs, $kind, Loc::caller())
            }
        }
        impl $Trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                self.binary_at(rhs, $kind, Loc::caller())
            }
        }
        binop!(@scalar $Trait, $method, $kind, f64);
    };
    (@scalar $Trait:ident, $method:ident, $kind:expr, $($s:ty),*) => {$(
        impl $Trait<$s> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: $s) -> Tensor {
                self.binary_at(rhs, $kind, Loc::caller())
            }
        }
        impl $Trait<$s> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: $s) -> Tensor {
                self.binary_at(rhs, $kind, Loc::caller())
            }
        }
        /// Scalar on the left: the scalar takes the tensor's dtype.
        impl $Trait<&Tensor> for $s {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                let loc = Loc::caller();
                let lhs = crate::graph::record::Operand::into_tensor(self, rhs.dtype(), loc);
                lhs.binary_at(rhs, $kind, loc)
            }
        }
        impl $Trait<Tensor> for $s {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                let loc = Loc::caller();
                let lhs = crate::graph::record::Operand::into_tensor(self, rhs.dtype(), loc);
                lhs.binary_at(rhs, $kind, loc)
            }
        }
    )*};
}

binop!(Add, add, BinaryKind::Add);
binop!(Sub, sub, BinaryKind::Sub);
binop!(Mul, mul, BinaryKind::Mul);
binop!(Div, div, BinaryKind::Div);

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}

//! Reads: what makes a pending tensor compute (`materialize`, `item`, `to_vec`, `to_ndarray`, printing, a host
//! `if` on a value) and `sync()`, the step boundary. Each runs `exec::materialize` with its cause and the user's
//! line, then copies the value to the host.

use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use lazuli_hlo::{DType, Loc, Op, TensorType};
use ndarray::{ArrayD, IxDyn};

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::diagnostics::{cause_name, Cause, EventKind};
use crate::error::{Error, Result};
use crate::exec::materialize;
use crate::graph::element::{bytes_to_f64, from_bytes, Element};
use crate::graph::tensor::{live_pending, Data, Node, NodeMap, Recipe, Tensor};

impl Data {
    /// The whole value as dense host bytes (gathering shards).
    pub fn to_host(&self, ty: &TensorType) -> Result<Arc<Vec<u8>>> {
        match self {
            Data::Host(b) => Ok(b.clone()),
            Data::Device(value) => {
                crate::runtime::launcher::note_read(value);
                let bytes = value.buffer()?.to_host()?;
                Counters::add(&COUNTERS.bytes_to_host, bytes.len() as u64);
                Ok(Arc::new(bytes))
            }
            Data::Sharded { shards, sharding } => Ok(Arc::new(crate::exec::spmd::gather(shards, ty, sharding)?)),
        }
    }
}

impl Tensor {
    /// Compute this tensor (if pending) and keep the result on the device.
    #[track_caller]
    pub fn materialize(&self) -> Result<()> {
        materialize(std::slice::from_ref(&self.node), Cause::Explicit, Loc::caller())
    }

    /// The raw little-endian bytes, computing first if needed.
    fn bytes(&self, cause: Cause, at: Loc) -> Result<Arc<Vec<u8>>> {
        materialize(std::slice::from_ref(&self.node), cause, at)?;
        // A read waits for its step anyway: a bad checked index of that step is reported here, not later.
        crate::exec::index_check::read_computed()?;
        let data = self.node.lock().data.clone();
        match data {
            Some(Data::Host(b)) => Ok(b),
            Some(d) => {
                let t0 = std::time::Instant::now();
                let mut event = crate::diagnostics::events::enabled()
                    .then(|| crate::diagnostics::Event::new(EventKind::Read, cause_name(cause), at));
                let bytes = d.to_host(&self.node.ty)?;
                if let Some(e) = &mut event {
                    e.transfer_ms = t0.elapsed().as_secs_f64() * 1e3;
                    e.bytes_to_host = bytes.len() as u64;
                    crate::diagnostics::events::emit(e);
                }
                // So does the finite check of a step whose result this is (see `finite::after_read`).
                crate::exec::finite::after_read(&d)?;
                Ok(bytes)
            }
            None => Err(Error::Internal("materialize left a target pending".into())),
        }
    }

    fn check_dtype<T: Element>(&self, what: &'static str, at: Loc) -> Result<()> {
        if T::DTYPE == self.dtype() {
            Ok(())
        } else {
            Err(Error::DTypeMismatch { what, at, actual: self.dtype(), wanted: T::DTYPE, wanted_variant: T::DTYPE })
        }
    }

    /// The raw little-endian bytes of any dtype, computing first if needed.
    pub(crate) fn raw_bytes(&self, at: Loc) -> Result<Arc<Vec<u8>>> {
        self.bytes(Cause::ToVec, at)
    }

    /// All elements in row-major order. `T` must be the tensor's dtype.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let at = Loc::caller();
        self.check_dtype::<T>("to_vec", at)?;
        Ok(from_bytes(&self.bytes(Cause::ToVec, at)?))
    }

    /// The single element of a one-element tensor.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        let at = Loc::caller();
        self.check_dtype::<T>("item", at)?;
        if self.elements() != 1 {
            return Err(Error::NotScalar { at, elements: self.elements() });
        }
        Ok(from_bytes::<T>(&self.bytes(Cause::Item, at)?)[0])
    }

    /// The tensor as an ndarray array.
    #[track_caller]
    pub fn to_ndarray<T: Element>(&self) -> Result<ArrayD<T>> {
        let at = Loc::caller();
        self.check_dtype::<T>("to_ndarray", at)?;
        let v = from_bytes(&self.bytes(Cause::ToVec, at)?);
        Ok(ArrayD::from_shape_vec(IxDyn(self.dims()), v).expect("the buffer matches the tensor type"))
    }

    /// Any dtype's values as f64 (exact for every dtype but large i64).
    #[track_caller]
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let at = Loc::caller();
        Ok(bytes_to_f64(self.dtype(), &self.bytes(Cause::ToVec, at)?))
    }
}

/// The step boundary: compute every live pending tensor of this thread in one program, keeping results on the
/// device.
#[track_caller]
pub fn sync() -> Result<()> {
    let at = Loc::caller();
    // A span, not an event: the events (`diagnostics::events`) already report each program; the span gives a
    // subscriber the step boundary's extent, with what it compiled or saved nested inside.
    let _span = tracing::info_span!(target: "lazuli", "sync", step = crate::diagnostics::current_step()).entered();
    let t0 = std::time::Instant::now();
    let live = live_pending();
    Counters::add(&COUNTERS.boundary_ns, t0.elapsed().as_nanos() as u64);
    materialize(&live, Cause::Sync, at)?;
    if crate::diagnostics::events::enabled() {
        crate::diagnostics::events::emit(&crate::diagnostics::Event::new(EventKind::StepEnd, "sync", at));
    }
    crate::diagnostics::end_step();
    Ok(())
}

/// Before an optimizer records its update, where [`Config::splits_update`](crate::Config::splits_update) says
/// so: compute every live pending tensor of this thread (the step's loss and gradients) in a program of its own.
/// On a device that runs programs asynchronously the host then records the update, plans its program and the
/// plugin prepares its launch while the device runs the forward and backward. It is the first of the step
/// boundary's two programs, not a graph break. A tensor still held here but dropped before `sync()` is computed
/// here, where one program would not have written it. An error is returned by this thread's next
/// materialization (the step boundary, or a read), at its line.
pub(crate) fn launch_gradients(at: Loc) {
    // Without a runtime the step boundary reports why.
    let Ok(rt) = crate::runtime::runtime() else { return };
    if !rt.config.splits_update() {
        return;
    }
    let t0 = std::time::Instant::now();
    let outputs = gradient_outputs(live_pending());
    Counters::add(&COUNTERS.boundary_ns, t0.elapsed().as_nanos() as u64);
    if let Err(e) = materialize(&outputs, Cause::Gradients, at) {
        crate::exec::defer_error(e);
    }
}

/// What the gradients' program computes for the live pending tensors `live`: each one, except where two or more
/// of them only slice one pending value (through slices, reshapes and converts, the value at most four times each
/// one's size): that value is computed instead, and they stay pending, to be computed inside the next program's
/// fusions. A kernel's column sums sliced into several parameters' gradients are then one output of the first
/// program instead of a copy per row, and the update reads them as one program would. A lone view is computed as
/// itself: its value instead would save no output, and reading it before the step boundary (a loss logged after
/// `step()`) would take a program of its own.
fn gradient_outputs(live: Vec<Rc<Node>>) -> Vec<Rc<Node>> {
    let sliced: Vec<Option<Rc<Node>>> = live.iter().map(sliced_value).collect();
    // How many live tensors slice each value; a shared value, once taken, counts 0 so that it is taken once.
    let mut views: NodeMap<usize> = NodeMap::default();
    for v in sliced.iter().flatten() {
        *views.entry(Rc::as_ptr(v)).or_default() += 1;
    }
    let mut outputs = Vec::with_capacity(live.len());
    for (node, value) in live.into_iter().zip(sliced) {
        match value {
            // A value the user holds is live itself, and has its own turn.
            Some(v) if v.user_handles() == 0 && views[&Rc::as_ptr(&v)] != 1 => {
                if std::mem::take(views.get_mut(&Rc::as_ptr(&v)).expect("counted")) >= 2 {
                    outputs.push(v);
                }
            }
            _ => outputs.push(node),
        }
    }
    outputs
}

/// The pending value `node` slices, through slices, reshapes and converts with at least one slice among them
/// (see [`gradient_outputs`]).
fn sliced_value(node: &Rc<Node>) -> Option<Rc<Node>> {
    let most = node.ty.elements().saturating_mul(4);
    let (mut from, mut viewed, mut sliced) = (node.clone(), None, false);
    loop {
        let (next, slice) = match &from.lock().recipe {
            Some(Recipe { op: op @ (Op::Slice(_) | Op::Reshape(_) | Op::Convert(_)), operands })
                if operands.len() == 1 =>
            {
                (operands[0].clone(), matches!(op, Op::Slice(_)))
            }
            _ => break,
        };
        if !next.is_pending() || next.ty.elements() > most {
            break;
        }
        sliced |= slice;
        viewed = Some(next.clone());
        from = next;
    }
    viewed.filter(|_| sliced)
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.is_pending() { "pending" } else { "ready" };
        write!(f, "Tensor({}, {state}, recorded at {})", self.node.ty, self.node.loc)
    }
}

/// Printing materializes (cause `Display`) and shows the values with the tensor type.
impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The formatting machinery hides the user's line; name the line that recorded the tensor instead.
        let at = self.node.loc;
        let bytes = match self.bytes(Cause::Display, at) {
            Ok(b) => b,
            Err(e) => return write!(f, "<{}: error: {e}>", self.node.ty),
        };
        let shape = IxDyn(self.dims());
        // Long runs of zeros in positional notation read badly: such values print as `1e-45`, `3.4e38`.
        let exponents = self.dtype().is_float() && scientific(&bytes_to_f64(self.dtype(), &bytes));
        macro_rules! show {
            ($t:ty $(, $exp:ident)?) => {{
                let a = ArrayD::from_shape_vec(shape, from_bytes::<$t>(&bytes)).expect("buffer matches type");
                match a.is_empty() {
                    // ndarray shows `[[]]` for `[0, 3]`, as if there were one row.
                    true => write!(f, "[]"),
                    $(false if $exp => write!(f, "{a:e}"),)?
                    false => write!(f, "{a}"),
                }
            }};
        }
        match self.dtype() {
            DType::F32 => show!(f32, exponents),
            DType::F64 => show!(f64, exponents),
            DType::F16 => show!(half::f16, exponents),
            DType::BF16 => show!(half::bf16, exponents),
            DType::I32 => show!(i32),
            DType::I64 => show!(i64),
            DType::U8 => show!(u8),
            DType::U32 => show!(u32),
            DType::U64 => show!(u64),
            DType::Bool => show!(bool),
        }?;
        write!(f, " : {}", self.node.ty)
    }
}

/// Whether floating-point values print in scientific notation: when a finite nonzero magnitude reaches 1e8 or falls
/// under 1e-4, where positional notation runs to long strings of zeros (PyTorch switches at the same bounds).
fn scientific(values: &[f64]) -> bool {
    values.iter().map(|v| v.abs()).any(|m| m.is_finite() && m != 0.0 && !(1e-4..1e8).contains(&m))
}

/// `if loss > 1.0 { … }`: comparing a one-element tensor with a number reads its value, which materializes it
/// (cause `host_control_flow`). Diagnostics report it as a graph break when it happens mid-step.
impl PartialEq<f64> for Tensor {
    #[track_caller]
    fn eq(&self, other: &f64) -> bool {
        self.host_value(Loc::caller()) == *other
    }
}

impl PartialOrd<f64> for Tensor {
    #[track_caller]
    fn partial_cmp(&self, other: &f64) -> Option<std::cmp::Ordering> {
        self.host_value(Loc::caller()).partial_cmp(other)
    }
    #[track_caller]
    fn lt(&self, other: &f64) -> bool {
        self.host_value(Loc::caller()) < *other
    }
    #[track_caller]
    fn le(&self, other: &f64) -> bool {
        self.host_value(Loc::caller()) <= *other
    }
    #[track_caller]
    fn gt(&self, other: &f64) -> bool {
        self.host_value(Loc::caller()) > *other
    }
    #[track_caller]
    fn ge(&self, other: &f64) -> bool {
        self.host_value(Loc::caller()) >= *other
    }
}

impl Tensor {
    /// The value of a one-element tensor of a bool dtype, for host-side branches (`if t.gt(0.0).to_bool()? {…}`).
    #[track_caller]
    pub fn to_bool(&self) -> Result<bool> {
        let at = Loc::caller();
        if self.elements() != 1 {
            return Err(Error::NotScalar { at, elements: self.elements() });
        }
        Ok(bytes_to_f64(self.dtype(), &self.bytes(Cause::HostControlFlow, at)?)[0] != 0.0)
    }

    /// A comparison operator needs a plain bool: a failure to compute the value is reported at the user's line.
    fn host_value(&self, at: Loc) -> f64 {
        if self.elements() != 1 {
            crate::graph::record::fail(
                at,
                format!("comparing a tensor with a number needs one element, not {}", self.tensor_type()),
            );
        }
        match self.bytes(Cause::HostControlFlow, at) {
            Ok(b) => bytes_to_f64(self.dtype(), &b)[0],
            Err(e) => panic!("lazuli: reading the tensor compared at {at} failed: {e}"),
        }
    }
}

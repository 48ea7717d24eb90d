//! `Tensor`: a cheap-to-clone handle to a node of the lazy graph. Ops record nodes; reads materialize them.

use std::cell::{Cell, OnceCell, RefCell, RefMut};
use std::rc::{Rc, Weak};
use std::sync::Arc;

use lazuli_hlo::{DType, Loc, Op, TensorType};
use lazuli_pjrt::Buffer;
use lazuli_sharding::Sharding;

use crate::graph::element::{scalar_bytes, to_bytes, Element};
use crate::runtime::value::DeviceValue;

/// A node's value, once it has one.
#[derive(Clone)]
pub(crate) enum Data {
    /// Host data not yet copied to the device; the first materialization that uses it uploads it.
    Host(Arc<Vec<u8>>),
    /// A device buffer (computed, or uploaded), which the CPU launcher may still be making (`runtime/launcher.rs`).
    Device(Arc<DeviceValue>),
    /// One buffer per mesh position, laid out by `sharding`.
    Sharded { shards: Vec<Arc<Buffer>>, sharding: Arc<Sharding> },
}

/// How a node is computed from other nodes. The operands first (`repr(C)`): walks read them, not the op.
#[derive(Clone)]
#[repr(C)]
pub(crate) struct Recipe {
    pub operands: Operands,
    pub op: Op,
}

/// A node's operands: inline up to two (most ops), so recording allocates no list for them.
pub(crate) type Operands = smallvec::SmallVec<[Rc<Node>; 2]>;

/// A node is pending until it has data. Its recipe is dropped when it is computed (freeing the graph above it),
/// except on the gradient path, where `backward()` still needs it.
#[repr(C)]
pub(crate) struct State {
    pub data: Option<Data>,
    pub recipe: Option<Recipe>,
}

/// Fields in declaration order (`repr(C)`): what the step boundary's walk and the backward pass read of every
/// node comes first, so that a walk touches one or two cache lines per node instead of a handful.
#[repr(C)]
pub(crate) struct Node {
    /// The last graph walk that numbered this node, and its number there (see `walk.rs`).
    pub visit: Cell<u64>,
    /// Hash of the recipe's op (0 without one) and of the type, taken once when the node is made: the step
    /// boundary's walk combines these instead of re-reading ops and shapes scattered in memory.
    pub op_hash: u64,
    pub ty_hash: u64,
    /// The same as `visit` for the last backward pass that reached it (see `autodiff.rs`).
    pub grad_visit: Cell<u64>,
    /// Number of `Tensor` handles the user holds; nodes only referenced by other nodes are not "live" for `sync()`.
    handles: Cell<usize>,
    /// `state.data` is set: read without borrowing the state (the step boundary asks this of every candidate).
    has_data: Cell<bool>,
    /// A gradient leaf: `backward()` accumulates into `grad` and does not look further up.
    pub requires_grad: Cell<bool>,
    /// Some operand leads to a gradient leaf, and the node was recorded with gradients enabled.
    pub grad_path: bool,
    /// `backward()` has run from this node: once computed, its recipe is no longer needed.
    pub backward_done: Cell<bool>,
    pub state: RefCell<State>,
    pub ty: TensorType,
    pub loc: Loc,
    /// The accumulated gradient of a gradient leaf.
    pub grad: RefCell<Option<Tensor>>,
    /// Where a leaf's data should live on a mesh (set by `Tensor::shard`), or how a sharding constraint lays out
    /// the value it computes (its mesh is then the mesh of the program that computes it).
    pub placement: OnceCell<Arc<Sharding>>,
    /// The value that replaces this one (a parameter's or an optimizer state's next value): donation gives this
    /// node's buffer to that output, so XLA can update it in place instead of copying around a mismatched pair.
    pub successor: OnceCell<Weak<Node>>,
}

thread_local! {
    /// How many node drops are nested on this thread's stack (see `Drop for Node`).
    static DROP_DEPTH: Cell<u32> = const { Cell::new(0) };
    /// Recipes whose drop was put off to keep the stack shallow, dropped by the outermost node drop.
    static DEFERRED_DROPS: RefCell<Vec<Recipe>> = const { RefCell::new(Vec::new()) };
}

/// Dropping a node drops its recipe, whose operands may be last references to their nodes, and so on: a chain of
/// 100,000 unmaterialized ops (`x = &x * 1.0` in a loop) would recurse that deep and overflow the stack. Below a
/// fixed nesting depth drops recurse as usual; deeper recipes are queued and dropped by the outermost drop.
impl Drop for Node {
    fn drop(&mut self) {
        const MAX_DEPTH: u32 = 512;
        let Some(recipe) = self.state.get_mut().recipe.take() else { return };
        let depth = DROP_DEPTH.get();
        if depth >= MAX_DEPTH {
            // During thread teardown the queue may be gone; the recipe is then dropped here.
            let _ = DEFERRED_DROPS.try_with(|q| q.borrow_mut().push(recipe));
            return;
        }
        DROP_DEPTH.set(depth + 1);
        drop(recipe);
        if depth == 0 {
            while let Some(next) = DEFERRED_DROPS.try_with(|q| q.borrow_mut().pop()).ok().flatten() {
                drop(next);
            }
        }
        DROP_DEPTH.set(depth);
    }
}

impl Node {
    /// A new node with `handles` user handles.
    fn make(ty: TensorType, loc: Loc, state: State, grad_path: bool, handles: usize) -> Rc<Node> {
        // Every node passes here: a shape whose size overflows stops at the user's line, before XLA sees it.
        if let Some(why) = ty.addressable() {
            crate::graph::record::fail(loc, why);
        }
        let op_hash = state.recipe.as_ref().map_or(0, |r| structure_hash(&r.op));
        let ty_hash = structure_hash(&ty);
        let node = Node::made(ty, loc, state, grad_path, handles, op_hash, ty_hash);
        crate::graph::trace::made(&node);
        node
    }

    /// A node whose type was checked and whose hashes were taken when a node like it was first made.
    fn made(
        ty: TensorType,
        loc: Loc,
        state: State,
        grad_path: bool,
        handles: usize,
        op_hash: u64,
        ty_hash: u64,
    ) -> Rc<Node> {
        Rc::new(Node {
            op_hash,
            ty_hash,
            ty,
            loc,
            has_data: Cell::new(state.data.is_some()),
            state: RefCell::new(state),
            handles: Cell::new(handles),
            requires_grad: Cell::new(false),
            grad_path,
            grad: RefCell::new(None),
            backward_done: Cell::new(false),
            placement: OnceCell::new(),
            visit: Cell::new(0),
            grad_visit: Cell::new(0),
            successor: OnceCell::new(),
        })
    }

    /// The node's state, borrowed for reading or writing. No caller borrows a node's state twice (each borrow
    /// ends before anything that could reach the same node runs).
    pub fn lock(&self) -> RefMut<'_, State> {
        self.state.borrow_mut()
    }

    pub fn is_pending(&self) -> bool {
        !self.has_data.get()
    }

    pub fn requires_grad(&self) -> bool {
        self.requires_grad.get()
    }

    /// The operand of the pending one-operand op that is to make this node, where `is` accepts that op: what a
    /// fused op may read in this node's place (through a reshape, a widening, a slice). `None` for a gradient
    /// leaf, whose gradient must stay its own, and for a node already computed.
    pub fn looked_through(&self, is: impl Fn(&Op) -> bool) -> Option<Rc<Node>> {
        if self.requires_grad() || !self.is_pending() {
            return None;
        }
        let state = self.lock();
        let recipe = state.recipe.as_ref()?;
        (recipe.operands.len() == 1 && is(&recipe.op)).then(|| recipe.operands[0].clone())
    }

    /// How this node's data is (or is to be) split over a mesh, if at all.
    pub fn sharding(&self) -> Option<Arc<Sharding>> {
        if let Some(p) = self.placement.get() {
            return Some(p.clone());
        }
        match &self.lock().data {
            Some(Data::Sharded { sharding, .. }) => Some(sharding.clone()),
            _ => None,
        }
    }

    /// Note that `next` replaces this value (see `successor`).
    pub fn hand_over(&self, next: &Rc<Node>) {
        let _ = self.successor.set(Rc::downgrade(next));
    }

    /// Tensor handles the user holds on this node.
    pub fn user_handles(&self) -> usize {
        self.handles.get()
    }

    /// Whether the recipe must outlive the computation: a later `backward()` may still walk through it.
    pub fn keeps_recipe(&self) -> bool {
        self.grad_path && !self.requires_grad() && !self.backward_done.get()
    }

    /// Store computed data; keep the recipe only where gradients will need it.
    pub fn set_data(&self, data: Data) {
        let keep = self.keeps_recipe();
        let mut s = self.lock();
        s.data = Some(data);
        if !keep {
            s.recipe = None;
        }
        self.has_data.set(true);
    }

    /// Drop the data (a donated input: its buffer now belongs to an output).
    pub fn take_data(&self) {
        self.lock().data = None;
        self.has_data.set(false);
    }
}

/// The hash the executable cache's key is built from (foldhash's quality variant with a fixed seed: fast on the
/// small values ops and types are made of, and the same in every run).
pub(crate) fn structure_hash<T: std::hash::Hash + ?Sized>(x: &T) -> u64 {
    use std::hash::BuildHasher;
    structure_hasher_state().hash_one(x)
}

/// A running hasher of the same family, for combining node hashes.
pub(crate) fn structure_hasher() -> impl std::hash::Hasher {
    use std::hash::BuildHasher;
    structure_hasher_state().build_hasher()
}

fn structure_hasher_state() -> foldhash::quality::FixedState {
    foldhash::quality::FixedState::with_seed(0x6c61_7a75_6c69)
}

/// Hashing for maps keyed by node address: the address is already unique, so one multiply spreads it (SipHash,
/// the default, cost a large share of walking a graph).
#[derive(Default, Clone, Copy)]
pub(crate) struct NodeAddrHasher(u64);

impl std::hash::Hasher for NodeAddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64 >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by node address.
pub(crate) type NodeMap<V> = std::collections::HashMap<*const Node, V, std::hash::BuildHasherDefault<NodeAddrHasher>>;

thread_local! {
    /// Pending nodes of this thread that may be live, for `sync()`. Weak, so the registry never keeps a graph
    /// alive.
    static PENDING: RefCell<Vec<Weak<Node>>> = const { RefCell::new(Vec::new()) };
}

/// Note a pending node as a candidate output of this thread's next `sync()`.
fn register(node: &Rc<Node>) {
    PENDING.with_borrow_mut(|reg| {
        if reg.len() >= 1024 && reg.len().is_power_of_two() {
            reg.retain(|w| w.strong_count() > 0);
        }
        reg.push(Rc::downgrade(node));
    })
}

/// A lazy tensor. Cloning is cheap (a reference count); ops record into the graph and return new tensors;
/// nothing runs until a value is read (`item`, `to_vec`, `to_ndarray`, `Display`) or `sync()` is called.
///
/// A tensor belongs to the thread that recorded it (it is neither `Send` nor `Sync`): each thread records into a
/// graph of its own, whose nodes are counted and updated with plain loads and stores instead of atomic
/// operations, which made up most of the cost of recording and walking a small step. Values cross threads as
/// host data (`to_vec`, `to_ndarray`, then `from_slice`, `from_ndarray` on the other thread).
pub struct Tensor {
    pub(crate) node: Rc<Node>,
}

impl Clone for Tensor {
    fn clone(&self) -> Self {
        self.node.handles.set(self.node.handles.get() + 1);
        Tensor { node: self.node.clone() }
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        self.node.handles.set(self.node.handles.get() - 1);
    }
}

impl Tensor {
    fn from_state(ty: TensorType, loc: Loc, state: State, grad_path: bool) -> Tensor {
        let pending = state.data.is_none();
        let node = Node::make(ty, loc, state, grad_path, 1);
        if pending {
            register(&node);
        }
        Tensor { node }
    }

    /// Record `op` on `operands`; the op's shape rule has already produced `ty`.
    pub(crate) fn record(op: Op, operands: Operands, ty: TensorType, loc: Loc) -> Tensor {
        let grad_path = ty.dtype.is_float()
            && crate::graph::autodiff::grad_enabled()
            && operands.iter().any(|o| o.grad_path || o.requires_grad());
        Tensor::from_state(ty, loc, State { data: None, recipe: Some(Recipe { op, operands }) }, grad_path)
    }

    /// Record an intermediate node no `Tensor` holds (autodiff's): no user handle, so it is not registered as a
    /// candidate output of `sync()` unless a handle is made for it later (`from_node`).
    pub(crate) fn record_node(op: Op, operands: Operands, ty: TensorType, loc: Loc) -> Rc<Node> {
        let grad_path = ty.dtype.is_float()
            && crate::graph::autodiff::grad_enabled()
            && operands.iter().any(|o| o.grad_path || o.requires_grad());
        Node::make(ty, loc, State { data: None, recipe: Some(Recipe { op, operands }) }, grad_path, 0)
    }

    /// [`Tensor::record_node`] again for a node made before from the same op and operand types
    /// (`backward_replay`), with the type and hashes it had, recorded with gradients off.
    pub(crate) fn remake_node(
        op: Op,
        operands: Operands,
        ty: TensorType,
        loc: Loc,
        op_hash: u64,
        ty_hash: u64,
    ) -> Rc<Node> {
        debug_assert!(!crate::graph::autodiff::grad_enabled(), "gradient ops are recorded with gradients off");
        let state = State { data: None, recipe: Some(Recipe { op, operands }) };
        Node::made(ty, loc, state, false, 0, op_hash, ty_hash)
    }

    pub(crate) fn host(ty: TensorType, bytes: Vec<u8>, loc: Loc) -> Tensor {
        Tensor::from_state(ty, loc, State { data: Some(Data::Host(Arc::new(bytes))), recipe: None }, false)
    }

    /// A new leaf with `data`, to be laid out on a mesh as `placement`.
    pub(crate) fn placed(ty: TensorType, data: Data, placement: Arc<Sharding>, loc: Loc) -> Tensor {
        let t = Tensor::from_state(ty, loc, State { data: Some(data), recipe: None }, false);
        // Only this handle exists yet; the node is not shared.
        let mut node = t.node.clone();
        drop(t);
        let n = Rc::get_mut(&mut node).expect("a fresh node");
        let _ = n.placement.set(placement);
        n.handles.set(1);
        Tensor { node }
    }

    /// A handle to an existing node (counts as a user handle while it lives).
    pub(crate) fn from_node(node: Rc<Node>) -> Tensor {
        // A node that had no handle may never have been registered (see `record_node`).
        let before = node.handles.replace(node.handles.get() + 1);
        if before == 0 && node.is_pending() {
            register(&node);
        }
        Tensor { node }
    }

    /// A handle to a shared structural constant (`graph::constants::constant_like`): counted like any handle, but never
    /// registered as a candidate output of `sync()`, since the node is shared by every graph that uses it.
    pub(crate) fn structural(node: Rc<Node>) -> Tensor {
        node.handles.set(node.handles.get() + 1);
        Tensor { node }
    }

    /// A tensor from a slice in row-major order. Panics (at the caller's line) if `data.len()` is not the product
    /// of `dims`.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], dims: &[usize]) -> Tensor {
        Tensor::from_slice_at(data, dims, Loc::caller()).unwrap_or_else(|e| crate::graph::record::raise(e))
    }

    /// [`Tensor::from_slice`], with [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) when the data does not
    /// fill `dims` (a file's records of another length, say).
    #[track_caller]
    pub fn try_from_slice<T: Element>(data: &[T], dims: &[usize]) -> crate::Result<Tensor> {
        Tensor::from_slice_at(data, dims, Loc::caller())
    }

    fn from_slice_at<T: Element>(data: &[T], dims: &[usize], loc: Loc) -> crate::Result<Tensor> {
        let n = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if n != Some(data.len()) {
            let n = n.map_or("more than 2^64".to_string(), |n| n.to_string());
            let why = format!("from_slice: {} values do not fill dims {dims:?} ({n} elements)", data.len());
            let shapes = vec![vec![data.len()], dims.to_vec()];
            return Err(crate::Error::ShapeMismatch { op: "from_slice", shapes, why, at: loc });
        }
        let ty = TensorType::new(T::DTYPE, dims);
        if let Some(why) = ty.addressable() {
            return Err(crate::Error::InvalidArgument { op: "from_slice", why, at: loc });
        }
        Ok(Tensor::host(ty, to_bytes(data), loc))
    }

    /// A tensor from an ndarray array (any layout; copied in logical row-major order).
    #[track_caller]
    pub fn from_ndarray<T: Element, S: ndarray::Data<Elem = T>, D: ndarray::Dimension>(
        a: &ndarray::ArrayBase<S, D>,
    ) -> Tensor {
        let data: Vec<T> = a.iter().copied().collect();
        Tensor::host(TensorType::new(T::DTYPE, a.shape()), to_bytes(&data), Loc::caller())
    }

    /// A rank-0 tensor. As an operand of an op it is a program parameter, so new values do not recompile.
    #[track_caller]
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Tensor::host(TensorType::scalar(T::DTYPE), to_bytes(&[value]), Loc::caller())
    }

    /// A rank-0 tensor of any dtype from an f64 (rounded to the dtype).
    #[track_caller]
    pub fn scalar_of(dtype: DType, value: f64) -> Tensor {
        Tensor::host(TensorType::scalar(dtype), scalar_bytes(dtype, value), Loc::caller())
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.node.ty.dtype
    }

    /// The dimensions (empty for a scalar).
    pub fn dims(&self) -> &[usize] {
        &self.node.ty.dims
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.node.ty.rank()
    }

    /// The number of elements (1 for a scalar).
    pub fn elements(&self) -> usize {
        self.node.ty.elements()
    }

    /// The static type: dtype and dimensions, displayed as `f32[2,3]`.
    pub fn tensor_type(&self) -> &TensorType {
        &self.node.ty
    }

    /// The line that created this tensor.
    pub fn location(&self) -> Loc {
        self.node.loc
    }

    /// True until the tensor has been computed.
    pub fn is_pending(&self) -> bool {
        self.node.is_pending()
    }
}

/// This thread's live pending tensors: those the user still holds a handle to.
pub(crate) fn live_pending() -> Vec<Rc<Node>> {
    PENDING.with_borrow_mut(|reg| {
        let mut live = Vec::new();
        reg.retain(|w| match w.upgrade() {
            // No handle: not an output now; kept until it dies (a handle may be made for it later).
            Some(n) if n.handles.get() == 0 => true,
            Some(n) if n.is_pending() => {
                live.push(n);
                true
            }
            _ => false,
        });
        live
    })
}

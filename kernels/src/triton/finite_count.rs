//! How many elements of a list of float tensors are NaN or infinite, as one Triton kernel generated per signature:
//! a guarded step's check counts the loss and every gradient, and XLA counted them in a reduction kernel each.
//!
//! Every tensor is cut into chunks of `block · rounds` elements, one program a chunk, so the grid is the chunks of
//! all the tensors in a row; each program walks its chunk in `rounds` blocks, counts the elements whose `|x| < inf`
//! is false (NaN and ±inf) and writes its count to its own slot of an `i32` vector, which the caller sums.
//!
//! A program finds its tensor by comparisons against constants. Tensors of one element type and size share a
//! *leaf*: one copy of the walk, with the size a constant (so that the tail's mask keeps wide loads), and the
//! tensor's pointer picked among the leaf's by the program's number. The leaves are found by a binary tree of
//! branches on the program number, so a program takes a few branches and one walk.

use super::ttir::{Cmp, Kernel, Reduction, Scalar, Type, Value};
use super::TritonCall;

/// One count's signature: the element type and number of elements of each tensor, in operand order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CountSpec {
    pub tensors: Vec<(Scalar, usize)>,
}

/// How the kernel walks: elements a block, blocks a program (at most), warps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CountTiling {
    pub block: usize,
    pub rounds: usize,
    pub warps: u32,
}

impl CountTiling {
    /// 2,048 elements a block (16 a thread of 4 warps: four 16-byte loads of f32), 16 blocks a program: GPT-2
    /// small's gradients are about 3,800 programs.
    pub const DEFAULT: CountTiling = CountTiling { block: 2048, rounds: 16, warps: 4 };
}

/// Tensors of one element type and size, counted by one copy of the walk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    pub dtype: Scalar,
    pub elements: usize,
    /// Operand indices of its tensors, in order.
    pub members: Vec<usize>,
    /// Its first program.
    pub first: usize,
    /// Programs (chunks) per tensor.
    pub chunks: usize,
    /// Elements a block and blocks a program, for this size.
    pub block: usize,
    pub rounds: usize,
}

impl Leaf {
    fn programs(&self) -> usize {
        self.members.len() * self.chunks
    }
}

/// The largest tensor the kernel counts: its element offsets are `i32`.
const MOST_ELEMENTS: usize = i32::MAX as usize;

impl CountSpec {
    /// Why the kernel does not take this signature (`None`: it does).
    pub fn unsupported(&self) -> Option<String> {
        if let Some((s, _)) = self.tensors.iter().find(|(s, _)| !s.is_float()) {
            return Some(format!("the finite count's kernel takes float tensors, not {}", s.mlir()));
        }
        if let Some((_, n)) = self.tensors.iter().find(|(_, n)| *n > MOST_ELEMENTS) {
            return Some(format!("a tensor of {n} elements is more than the kernel's i32 offsets reach"));
        }
        let programs = self.leaves(CountTiling::DEFAULT).iter().map(Leaf::programs).sum::<usize>();
        if programs == 0 {
            return Some("there is no element to count".into());
        }
        (programs > MOST_ELEMENTS).then(|| format!("{programs} programs are more than a grid takes"))
    }

    /// The leaves, in order of their first tensor; tensors without elements have none.
    pub fn leaves(&self, tiling: CountTiling) -> Vec<Leaf> {
        let mut leaves: Vec<Leaf> = Vec::new();
        for (i, &(dtype, elements)) in self.tensors.iter().enumerate() {
            if elements == 0 {
                continue;
            }
            match leaves.iter_mut().find(|l| l.dtype == dtype && l.elements == elements) {
                Some(leaf) => leaf.members.push(i),
                None => {
                    let block = tiling.block.min(elements.next_power_of_two().max(128));
                    let rounds = tiling.rounds.min(elements.div_ceil(block));
                    let chunks = elements.div_ceil(block * rounds);
                    leaves.push(Leaf { dtype, elements, members: vec![i], first: 0, chunks, block, rounds });
                }
            }
        }
        let mut first = 0;
        for leaf in &mut leaves {
            leaf.first = first;
            first += leaf.programs();
        }
        leaves
    }

    fn name(&self, tiling: CountTiling) -> String {
        use std::hash::BuildHasher;
        // The signature is too long for a name: a hash of it with a fixed seed, the same in every process.
        let h = foldhash::fast::FixedState::with_seed(0).hash_one(&self.tensors);
        let CountTiling { block, rounds, warps } = tiling;
        format!("lazuli_count_nonfinite_{}_{h:016x}_{block}x{rounds}_w{warps}", self.tensors.len())
    }
}

/// The kernel: operands the tensors (as pointers), result `i32[programs]`, each program's count.
pub fn count(spec: &CountSpec, tiling: CountTiling) -> TritonCall {
    let name = spec.name(tiling);
    let mut k = Kernel::new(&name);
    let args: Vec<Value> = spec.tensors.iter().enumerate().map(|(i, &(s, _))| k.ptr_arg(&format!("x{i}"), s)).collect();
    let out = k.ptr_arg("counts", Scalar::I32);
    let leaves = spec.leaves(tiling);
    let programs: usize = leaves.iter().map(Leaf::programs).sum();
    let pid = k.named("pid").program_id(0);
    let count = leaf_of(&mut k, &leaves, &args, &pid);
    let slot = k.addptr(&out, &pid);
    k.store(&slot, &count, None);
    TritonCall { name, ir: k.finish(), grid: [programs as u32, 1, 1], num_warps: tiling.warps, num_stages: 1 }
}

/// The count of program `pid`, which belongs to one of `leaves`: a branch on the first program of the middle
/// leaf, down to one.
fn leaf_of(k: &mut Kernel, leaves: &[Leaf], args: &[Value], pid: &Value) -> Value {
    if let [leaf] = leaves {
        return count_in_leaf(k, leaf, args, pid);
    }
    let (left, right) = leaves.split_at(leaves.len() / 2);
    let bound = k.const_i32(right[0].first as i32);
    let is_left = k.named("left").cmp(Cmp::Lt, pid, &bound);
    let i32_ty = Type::scalar(Scalar::I32);
    let counts = k.if_else(
        &is_left,
        std::slice::from_ref(&i32_ty),
        |k| vec![leaf_of(k, left, args, pid)],
        |k| vec![leaf_of(k, right, args, pid)],
    );
    counts.into_iter().next().expect("one result")
}

/// Program `pid`'s count in `leaf`: its tensor and chunk, then a walk over the chunk's blocks.
fn count_in_leaf(k: &mut Kernel, leaf: &Leaf, args: &[Value], pid: &Value) -> Value {
    let first = k.const_i32(leaf.first as i32);
    let local = k.named("local").sub(pid, &first);
    let (tensor, chunk) = if leaf.members.len() > 1 {
        let chunks = k.const_i32(leaf.chunks as i32);
        let tensor = k.named("tensor").div(&local, &chunks);
        let start = k.mul(&tensor, &chunks);
        (Some(tensor), k.named("chunk").sub(&local, &start))
    } else {
        (None, local)
    };
    let ptr = member_pointer(k, leaf, args, tensor.as_ref());
    let chunk_elements = k.const_i32((leaf.block * leaf.rounds) as i32);
    let start = k.named("start").mul(&chunk, &chunk_elements);
    let acc = k.named("acc").full_int(Scalar::I32, &[leaf.block], 0);
    let (lo, hi, one) = (k.const_i32(0), k.const_i32(leaf.rounds as i32), k.const_i32(1));
    let block = k.const_i32(leaf.block as i32);
    let walked = k.for_loop((&lo, &hi, &one), &[acc], |k, r, carried| {
        let skip = k.mul(r, &block);
        let base = k.add(&start, &skip);
        let base = k.splat(&base, &[leaf.block]);
        let lanes = k.make_range(0, leaf.block as u32);
        let offsets = k.named("offs").add(&base, &lanes);
        let flags = nonfinite_flags(k, leaf, &ptr, &offsets);
        vec![k.add(&carried[0], &flags)]
    });
    k.named("count").reduce(&walked[0], 0, Reduction::Sum)
}

/// The pointer of the leaf's `tensor`-th member: a select per member after the first.
fn member_pointer(k: &mut Kernel, leaf: &Leaf, args: &[Value], tensor: Option<&Value>) -> Value {
    let mut ptr = args[leaf.members[0]].clone();
    if let Some(tensor) = tensor {
        for (m, &operand) in leaf.members.iter().enumerate().skip(1) {
            let m = k.const_i32(m as i32);
            let at_or_past = k.cmp(Cmp::Ge, tensor, &m);
            ptr = k.select(&at_or_past, &args[operand], &ptr);
        }
    }
    ptr
}

/// `i32[block]`: 1 where the element at `offsets` is NaN or infinite, 0 where it is finite or past the tensor.
fn nonfinite_flags(k: &mut Kernel, leaf: &Leaf, ptr: &Value, offsets: &Value) -> Value {
    let shape = [leaf.block];
    let n = k.full_int(Scalar::I32, &shape, leaf.elements as i64);
    let inside = k.named("inside").cmp(Cmp::Lt, offsets, &n);
    let ptrs = k.splat(ptr, &shape);
    let ptrs = k.addptr(&ptrs, offsets);
    let zero = k.full_float(leaf.dtype, &shape, 0.0);
    let x = k.named("x").load(&ptrs, Some(&inside), Some(&zero));
    let x = k.convert(&x, Scalar::F32);
    let magnitude = k.math("absf", &x);
    let inf = k.full_float(Scalar::F32, &shape, f64::INFINITY);
    let finite = k.named("finite").cmp(Cmp::Lt, &magnitude, &inf);
    let (no, yes) = (k.full_int(Scalar::I32, &shape, 0), k.full_int(Scalar::I32, &shape, 1));
    k.named("flag").select(&finite, &no, &yes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt_like() -> CountSpec {
        // A loss, then per "layer" a weight and two biases of one size, and a large embedding of odd size.
        let mut tensors = vec![(Scalar::F32, 1)];
        for _ in 0..3 {
            tensors.extend([(Scalar::F32, 768 * 2304), (Scalar::F32, 768), (Scalar::F32, 768)]);
        }
        tensors.extend([(Scalar::BF16, 50_257 * 768), (Scalar::F32, 0), (Scalar::F16, 768)]);
        CountSpec { tensors }
    }

    #[test]
    fn every_element_belongs_to_exactly_one_program() {
        let spec = gpt_like();
        let leaves = spec.leaves(CountTiling::DEFAULT);
        // Leaves of one type and size: the loss, the weights, the f32 biases, the embedding, the f16 bias.
        let sizes: Vec<(Scalar, usize, usize)> =
            leaves.iter().map(|l| (l.dtype, l.elements, l.members.len())).collect();
        assert_eq!(
            sizes,
            vec![
                (Scalar::F32, 1, 1),
                (Scalar::F32, 768 * 2304, 3),
                (Scalar::F32, 768, 6),
                (Scalar::BF16, 50_257 * 768, 1),
                (Scalar::F16, 768, 1)
            ]
        );
        let mut next = 0;
        for leaf in &leaves {
            assert_eq!(leaf.first, next, "leaves' programs follow each other");
            next += leaf.programs();
            // A tensor's chunks cover it, and the last chunk starts inside it.
            let chunk = leaf.block * leaf.rounds;
            assert!(leaf.chunks * chunk >= leaf.elements && (leaf.chunks - 1) * chunk < leaf.elements, "{leaf:?}");
            assert!(leaf.block.is_power_of_two() && leaf.rounds >= 1);
        }
        let call = count(&spec, CountTiling::DEFAULT);
        assert_eq!(call.grid, [next as u32, 1, 1]);
        call.validate(spec.tensors.len(), 1).unwrap();
    }

    #[test]
    fn the_kernel_branches_to_each_leaf_and_selects_among_its_tensors() {
        let spec = gpt_like();
        let call = count(&spec, CountTiling::DEFAULT);
        let leaves = spec.leaves(CountTiling::DEFAULT);
        // One walk per leaf, and a branch between leaves.
        assert_eq!(call.ir.matches("scf.for").count(), leaves.len(), "{}", call.ir);
        assert_eq!(call.ir.matches("scf.if").count(), leaves.len() - 1);
        // A select per tensor of a leaf after its first: 2 for the weights, 5 for the f32 biases.
        assert_eq!(call.ir.matches("arith.select %").count() - leaves.len(), 2 + 5, "flags' selects aside");
        // Each leaf's size is a constant of its mask; the branches compare with each leaf's first program.
        for leaf in &leaves {
            assert!(call.ir.contains(&format!("dense<{}> : tensor<{}xi32>", leaf.elements, leaf.block)), "{leaf:?}");
        }
        for leaf in &leaves[1..] {
            assert!(call.ir.contains(&format!("arith.constant {} : i32", leaf.first)), "{leaf:?}");
        }
        assert!(call.ir.contains("math.absf") && call.ir.contains("arith.extf"), "16-bit values widened, then tested");
    }

    #[test]
    fn unsupported_signatures_say_why() {
        let ints = CountSpec { tensors: vec![(Scalar::F32, 4), (Scalar::I32, 4)] };
        assert!(ints.unsupported().unwrap().contains("i32"));
        let empty = CountSpec { tensors: vec![(Scalar::F32, 0)] };
        assert!(empty.unsupported().unwrap().contains("no element"));
        assert_eq!(gpt_like().unsupported(), None);
    }
}

//! `einsum` with NumPy's string spec (`...` broadcasting and diagonals included), recorded as the ops it stands
//! for: diagonals by a mask and a sum, sums over indices used once, `dot_general` for each pair of operands (shared indices that the output or a later operand
//! keeps are batch dimensions, the others are contracted), and one transpose into the output's order. Its
//! gradient is those ops' gradients; nothing new reaches the op layer.

use std::collections::HashMap;

use lazuli_hlo::{
    Compare, CompareDir, DType, DotGeneral, Iota, Loc, Op, Reduce, ReduceKind, Reshape, Select, TensorType, Transpose,
};

use crate::error::{Error, Result};
use crate::graph::constants::constant_like;
use crate::graph::record::{raise, try_apply};
use crate::graph::tensor::Tensor;

/// A spec read into index letters: one list per operand, and the output's. The dimensions under a `...` get
/// letters of their own (see [`broadcast_letter`]).
struct Spec {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

fn invalid(why: String, loc: Loc) -> Error {
    Error::InvalidArgument { op: "einsum", why: format!("einsum: {why}"), at: loc }
}

/// The letter of the `k`-th dimension under a `...`, counted from the right (NumPy aligns them so): outside
/// ASCII, so no spec can name it.
fn broadcast_letter(k: usize) -> char {
    char::from_u32(0x100 + k as u32).expect("a valid char")
}

/// The letters of `count` dimensions under a `...`, left to right.
fn broadcast_letters(count: usize) -> impl Iterator<Item = char> {
    (0..count).rev().map(broadcast_letter)
}

/// Parse `spec` ("ij,jk->ik", or without `->` for NumPy's implicit output: the dimensions under `...`, then the
/// indices used once in alphabetical order) against the operands' ranks.
fn parse(spec: &str, ranks: &[usize], loc: Loc) -> Result<Spec> {
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match spec.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (spec.as_str(), None),
    };
    let letters = |part: &str| -> Result<Vec<char>> {
        match part.chars().find(|c| !c.is_ascii_alphabetic()) {
            Some(c) => Err(invalid(format!("{spec:?}: {c:?} is not an index letter (a-z, A-Z) or '...'"), loc)),
            None => Ok(part.chars().collect()),
        }
    };
    // A term's letters before and after its `...`, if it has one.
    let split = |term: &str| -> Result<(Vec<char>, Option<Vec<char>>)> {
        match term.split_once("...") {
            None => Ok((letters(term)?, None)),
            Some((before, after)) => Ok((letters(before)?, Some(letters(after)?))),
        }
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(invalid(format!("{spec:?} names {} operands, got {}", terms.len(), ranks.len()), loc));
    }
    let mut inputs = Vec::with_capacity(terms.len());
    let mut broadcast = 0;
    for (k, (term, &rank)) in terms.iter().zip(ranks).enumerate() {
        let (mut ix, after) = split(term)?;
        if let Some(after) = after {
            let Some(under) = rank.checked_sub(ix.len() + after.len()) else {
                return Err(invalid(format!("{spec:?}: operand {k} names more axes than its rank {rank}"), loc));
            };
            broadcast = broadcast.max(under);
            ix.extend(broadcast_letters(under));
            ix.extend(after);
        }
        inputs.push(ix);
    }
    let count = |c: char| inputs.iter().flatten().filter(|&&d| d == c).count();
    let output = match rhs.map(split).transpose()? {
        Some((mut before, Some(after))) => {
            before.extend(broadcast_letters(broadcast));
            before.extend(after);
            before
        }
        Some((_, None)) if broadcast > 0 => {
            let why = format!("{spec:?}: the output must place the operands' '...' dimensions");
            return Err(invalid(why, loc));
        }
        Some((named, None)) => named,
        None => {
            let mut once: Vec<char> =
                inputs.iter().flatten().copied().filter(|&c| c.is_ascii() && count(c) == 1).collect();
            once.sort_unstable();
            broadcast_letters(broadcast).chain(once).collect()
        }
    };
    for (i, c) in output.iter().enumerate() {
        if count(*c) == 0 {
            return Err(invalid(format!("{spec:?}: output index {c:?} is in no operand"), loc));
        }
        if output[..i].contains(c) {
            return Err(invalid(format!("{spec:?}: output index {c:?} repeats"), loc));
        }
    }
    Ok(Spec { inputs, output })
}

/// One operand on the way: its tensor and the index letter of each of its axes.
struct Term {
    t: Tensor,
    ix: Vec<char>,
}

impl Term {
    /// Sum away the axes whose letter `keep` rejects.
    fn sum_unless(self, keep: impl Fn(char) -> bool, loc: Loc) -> Result<Term> {
        let axes: Vec<usize> = (0..self.ix.len()).filter(|&a| !keep(self.ix[a])).collect();
        if axes.is_empty() {
            return Ok(self);
        }
        let t =
            try_apply(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: axes.clone(), keep: false }), &[&self.t], loc)?;
        let ix = self.ix.iter().enumerate().filter(|(a, _)| !axes.contains(a)).map(|(_, &c)| c).collect();
        Ok(Term { t, ix })
    }

    fn axis(&self, c: char) -> usize {
        self.ix.iter().position(|&d| d == c).expect("a letter of this term")
    }
}

/// `a` times `b` by `dot_general`: letters in both that `kept` wants stay as batch axes, other shared letters
/// are contracted. The result's letters: batch, then `a`'s free ones, then `b`'s.
fn product(a: Term, b: Term, kept: impl Fn(char) -> bool, loc: Loc) -> Result<Term> {
    let shared: Vec<char> = a.ix.iter().copied().filter(|c| b.ix.contains(c)).collect();
    let (batch, contract): (Vec<char>, Vec<char>) = shared.iter().partition(|&&c| kept(c));
    let axes = |t: &Term, cs: &[char]| cs.iter().map(|&c| t.axis(c)).collect::<Vec<usize>>();
    let precision = crate::graph::precision::precision_at(loc);
    let dot = DotGeneral::new(&axes(&a, &batch), &axes(&b, &batch), &axes(&a, &contract), &axes(&b, &contract))
        .with_precision(precision);
    let t = try_apply(Op::DotGeneral(dot), &[&a.t, &b.t], loc)?;
    let mut ix = batch.clone();
    ix.extend(a.ix.iter().filter(|c| !shared.contains(c)));
    ix.extend(b.ix.iter().filter(|c| !shared.contains(c)));
    Ok(Term { t, ix })
}

fn einsum_at(spec: &str, operands: &[&Tensor], loc: Loc) -> Result<Tensor> {
    let ranks: Vec<usize> = operands.iter().map(|t| t.rank()).collect();
    let mut s = parse(spec, &ranks, loc)?;
    let size = sizes(spec, &s, operands, loc)?;
    let mut terms = Vec::with_capacity(operands.len());
    for (ix, t) in s.inputs.iter_mut().zip(operands) {
        let t = diagonals(t, ix, loc)?;
        terms.push(drop_broadcast_ones(&t, ix, &size, loc)?);
    }
    // Letters still needed after term k: the output's, and those of every term after k.
    let needed_after = |k: usize, c: char| s.output.contains(&c) || s.inputs[k + 1..].iter().any(|t| t.contains(&c));
    let first = terms.remove(0);
    // An index used by one operand only (and not the output) is summed before any product.
    let once = |c: char| s.inputs.iter().flatten().filter(|&&d| d == c).count() == 1 && !s.output.contains(&c);
    let mut acc = first.sum_unless(|c| !once(c), loc)?;
    for (k, next) in terms.into_iter().enumerate() {
        let next = next.sum_unless(|c| !once(c), loc)?;
        acc = product(acc, next, |c| needed_after(k + 1, c), loc)?;
    }
    let acc = acc.sum_unless(|c| s.output.contains(&c), loc)?;
    let perm: Vec<usize> = s.output.iter().map(|&c| acc.axis(c)).collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(acc.t);
    }
    try_apply(Op::Transpose(Transpose { perm }), &[&acc.t], loc)
}

/// Each letter's size, checked across the operands: named indices must agree, dimensions under `...` broadcast
/// (1 against any size).
fn sizes(spec: &str, s: &Spec, operands: &[&Tensor], loc: Loc) -> Result<HashMap<char, usize>> {
    let mut size = HashMap::new();
    for (k, (term, t)) in s.inputs.iter().zip(operands).enumerate() {
        if term.len() != t.rank() {
            let why = format!("{spec:?}: operand {k} has {} indices, but it is {}", term.len(), t.tensor_type());
            return Err(Error::ShapeMismatch { op: "einsum", shapes: dims(operands), why, at: loc });
        }
        for (&c, &d) in term.iter().zip(t.dims()) {
            let known = *size.entry(c).or_insert(d);
            if known == d || (!c.is_ascii() && (known == 1 || d == 1)) {
                size.insert(c, known.max(d));
                continue;
            }
            let why = if c.is_ascii() {
                format!("{spec:?}: index {c:?} has size {known} in one operand and {d} in operand {k}")
            } else {
                format!("{spec:?}: the '...' dimensions of operand {k}, {}, do not broadcast", t.tensor_type())
            };
            return Err(Error::ShapeMismatch { op: "einsum", shapes: dims(operands), why, at: loc });
        }
    }
    Ok(size)
}

/// `t` with each index repeated in `ix` reduced to its diagonal (`"ii"`: the elements where both are equal), the
/// later axis removed from `t` and `ix`: the equal positions selected by a mask of two iotas, then summed over
/// the later axis, so the gradient is the select's and the sum's.
fn diagonals(t: &Tensor, ix: &mut Vec<char>, loc: Loc) -> Result<Tensor> {
    let mut t = t.clone();
    while let Some((a, b)) = repeated(ix) {
        let position = |dim| try_apply(Op::Iota(Iota { dim, ty: TensorType::new(DType::I64, t.dims()) }), &[], loc);
        let on_diagonal =
            try_apply(Op::Compare(Compare { dir: CompareDir::Eq }), &[&position(a)?, &position(b)?], loc)?;
        let zeros = constant_like(0.0, t.dtype(), t.dims(), loc);
        let masked = try_apply(Op::Select(Select), &[&on_diagonal, &t, &zeros], loc)?;
        t = try_apply(Op::Reduce(Reduce { kind: ReduceKind::Sum, axes: vec![b], keep: false }), &[&masked], loc)?;
        ix.remove(b);
    }
    Ok(t)
}

/// The first two axes of `ix` with the same letter.
fn repeated(ix: &[char]) -> Option<(usize, usize)> {
    (0..ix.len()).find_map(|b| ix[..b].iter().position(|&c| c == ix[b]).map(|a| (a, b)))
}

/// Operand `t` with letters `ix` as a term, without its size-1 `...` dimensions that other operands broadcast
/// (a letter an operand lacks is one it is constant along, which is what broadcasting means).
fn drop_broadcast_ones(t: &Tensor, ix: &mut Vec<char>, size: &HashMap<char, usize>, loc: Loc) -> Result<Term> {
    let keep: Vec<bool> = ix.iter().zip(t.dims()).map(|(c, &d)| c.is_ascii() || d == size[c]).collect();
    if keep.iter().all(|&k| k) {
        return Ok(Term { t: t.clone(), ix: ix.clone() });
    }
    let kept_dims: Vec<usize> = t.dims().iter().zip(&keep).filter(|(_, &k)| k).map(|(&d, _)| d).collect();
    let mut flags = keep.iter();
    ix.retain(|_| *flags.next().expect("one flag per letter"));
    let t = try_apply(Op::Reshape(Reshape { dims: kept_dims }), &[t], loc)?;
    Ok(Term { t, ix: ix.clone() })
}

fn dims(operands: &[&Tensor]) -> Vec<Vec<usize>> {
    operands.iter().map(|t| t.dims().to_vec()).collect()
}

/// NumPy's `einsum`: `einsum("bij,bjk->bik", &[&a, &b])` is a batched matmul. Without `->` the output is the
/// dimensions under `...`, then the indices used once, in alphabetical order. `...` stands for the dimensions an
/// operand does not name, aligned from the right and broadcast as NumPy does (size 1 against any size); an
/// explicit output with operands' `...` dimensions must place them. Each named index has one size everywhere. An
/// index repeated within one operand takes its diagonal (`"ii->i"`, the trace `"ii"`). Operands are multiplied
/// left to right; the gradient is that of the recorded selects, sums, products and transpose.
#[track_caller]
pub fn einsum(spec: &str, operands: &[&Tensor]) -> Tensor {
    einsum_at(spec, operands, Loc::caller()).unwrap_or_else(|e| raise(e))
}

/// [`einsum`], with [`Error::InvalidArgument`] for a spec it cannot read (or does not support) and
/// [`Error::ShapeMismatch`] for operands that do not fit it (sizes that differ, `...` dimensions that do not
/// broadcast).
#[track_caller]
pub fn try_einsum(spec: &str, operands: &[&Tensor]) -> Result<Tensor> {
    einsum_at(spec, operands, Loc::caller())
}

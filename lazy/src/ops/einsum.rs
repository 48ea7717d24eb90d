//! `einsum` with NumPy's string spec, recorded as the ops it stands for: sums over indices used once,
//! `dot_general` for each pair of operands (shared indices that the output or a later operand keeps are batch
//! dimensions, the others are contracted), and one transpose into the output's order. Its gradient is those
//! ops' gradients; nothing new reaches the op layer.

use lazuli_hlo::{DotGeneral, Loc, Op, Reduce, ReduceKind, Transpose};

use crate::error::{Error, Result};
use crate::graph::record::{raise, try_apply};
use crate::graph::tensor::Tensor;

/// A spec read into index letters: one list per operand, and the output's.
struct Spec {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

fn invalid(why: String, loc: Loc) -> Error {
    Error::InvalidArgument { op: "einsum", why: format!("einsum: {why}"), at: loc }
}

/// Parse `spec` ("ij,jk->ik", or without `->` for NumPy's implicit output: the indices used once, in
/// alphabetical order) against `n` operands.
fn parse(spec: &str, n: usize, loc: Loc) -> Result<Spec> {
    let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
    if spec.contains("...") {
        return Err(invalid(format!("{spec:?}: broadcasting with '...' is not supported; name every axis"), loc));
    }
    let (lhs, rhs) = match spec.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (spec.as_str(), None),
    };
    let letters = |part: &str| -> Result<Vec<char>> {
        match part.chars().find(|c| !c.is_ascii_alphabetic()) {
            Some(c) => Err(invalid(format!("{spec:?}: {c:?} is not an index letter (a-z, A-Z)"), loc)),
            None => Ok(part.chars().collect()),
        }
    };
    let inputs = lhs.split(',').map(letters).collect::<Result<Vec<_>>>()?;
    if inputs.len() != n {
        return Err(invalid(format!("{spec:?} names {} operands, got {n}", inputs.len()), loc));
    }
    for (k, term) in inputs.iter().enumerate() {
        if let Some(c) = term.iter().find(|c| term.iter().filter(|d| d == c).count() > 1) {
            let why = format!("{spec:?}: index {c:?} repeats in operand {k} (a diagonal), which is not supported");
            return Err(invalid(why, loc));
        }
    }
    let count = |c: char| inputs.iter().flatten().filter(|&&d| d == c).count();
    let output = match rhs {
        Some(r) => letters(r)?,
        None => {
            let mut once: Vec<char> = inputs.iter().flatten().copied().filter(|&c| count(c) == 1).collect();
            once.sort_unstable();
            once
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
    let s = parse(spec, operands.len(), loc)?;
    let mut size = std::collections::HashMap::new();
    for (k, (term, t)) in s.inputs.iter().zip(operands).enumerate() {
        if term.len() != t.rank() {
            let why = format!("{spec:?}: operand {k} has {} indices, but it is {}", term.len(), t.tensor_type());
            return Err(Error::ShapeMismatch { op: "einsum", shapes: dims(operands), why, at: loc });
        }
        for (&c, &d) in term.iter().zip(t.dims()) {
            if *size.entry(c).or_insert(d) != d {
                let why = format!("{spec:?}: index {c:?} has size {} in one operand and {d} in operand {k}", size[&c]);
                return Err(Error::ShapeMismatch { op: "einsum", shapes: dims(operands), why, at: loc });
            }
        }
    }
    let mut terms: Vec<Term> =
        s.inputs.iter().zip(operands).map(|(ix, t)| Term { t: (*t).clone(), ix: ix.clone() }).collect();
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

fn dims(operands: &[&Tensor]) -> Vec<Vec<usize>> {
    operands.iter().map(|t| t.dims().to_vec()).collect()
}

/// NumPy's `einsum`: `einsum("bij,bjk->bik", &[&a, &b])` is a batched matmul, `einsum("ii", …)` is not
/// supported (a repeated index within one operand, a diagonal, is an error, as is `...`). Without `->` the output
/// is the indices used once, in alphabetical order. Each index must have one size everywhere (no broadcasting
/// of size 1). Operands are multiplied left to right; the gradient is that of the recorded sums, products and
/// transpose.
#[track_caller]
pub fn einsum(spec: &str, operands: &[&Tensor]) -> Tensor {
    einsum_at(spec, operands, Loc::caller()).unwrap_or_else(|e| raise(e))
}

/// [`einsum`], with [`Error::InvalidArgument`] for a spec it cannot read (or does not support) and
/// [`Error::ShapeMismatch`] for operands that do not fit it.
#[track_caller]
pub fn try_einsum(spec: &str, operands: &[&Tensor]) -> Result<Tensor> {
    einsum_at(spec, operands, Loc::caller())
}

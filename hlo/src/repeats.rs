//! Repeated structure in a program: K copies of one subgraph in sequence (same ops, types, source lines and
//! wiring; their own parameters), as a loop over layers records them. Such a program could run one copy as a
//! scanned body; this finds the copies so the diagnostics can say which lines repeat and what scanning them
//! would save.
//!
//! Each node gets a key: its op, type and source line, and for each operand what kind of value it is (a leaf by
//! its type, or a computed value). Copies are consecutive runs of equal key sequences, compared by rolling hash,
//! whose wiring then matches node by node: an operand inside the copy lies at the same place in every copy, and
//! one from outside moves by the same stride from each copy to the next (0: one value shared by every layer, such
//! as a mask; the copy's length: the previous layer's output; minus a forward layer's length: the backward pass
//! reading the forward's activations, last layer first). The search is greedy from the front and skips past each repeat it reports, so it is linear
//! in the program's size for the shapes real programs have.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::graph::{Graph, Loc, NodeId};
use crate::op::Op;

/// Copies shorter than this are not worth reporting (a few elementwise ops in a row are not a layer).
pub const MIN_COPY_NODES: usize = 8;

/// How many later occurrences of a node's key are tried as the start of its next copy.
const PERIOD_CANDIDATES: usize = 4;

/// How many of the program's most common gaps between equal keys are tried as well at every node: where a key
/// occurs many times in one copy (each weight's optimizer update), its next occurrences are not the next copy.
const COMMON_PERIODS: usize = 16;

/// `copies` consecutive copies of `len` nodes, the first starting at node `first`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repeat {
    pub first: NodeId,
    pub len: usize,
    pub copies: usize,
    /// The source lines one copy was recorded at, in node order, without duplicates.
    pub lines: Vec<Loc>,
}

impl Repeat {
    /// Nodes a scanned body would leave out: every copy but one.
    pub fn nodes_saved(&self) -> usize {
        self.len * (self.copies - 1)
    }

    /// `12 copies of 310 nodes recorded at src/model.rs:40–58 (9 lines)`.
    pub fn describe(&self) -> String {
        let mut by_file: Vec<(&str, u32, u32)> = Vec::new();
        for l in &self.lines {
            match by_file.iter_mut().find(|(f, _, _)| *f == l.file) {
                Some(e) => {
                    e.1 = e.1.min(l.line);
                    e.2 = e.2.max(l.line);
                }
                None => by_file.push((l.file, l.line, l.line)),
            }
        }
        let mut distinct: Vec<(&str, u32)> = self.lines.iter().map(|l| (l.file, l.line)).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let spans: Vec<String> =
            by_file.iter().map(|(f, a, b)| if a == b { format!("{f}:{a}") } else { format!("{f}:{a}–{b}") }).collect();
        format!(
            "{} copies of {} nodes recorded at {} ({} line{})",
            self.copies,
            self.len,
            spans.join(", "),
            distinct.len(),
            if distinct.len() == 1 { "" } else { "s" }
        )
    }
}

/// The repeats of `g` with at least two copies of [`MIN_COPY_NODES`] nodes, the most nodes saved first.
pub fn find_repeats(g: &Graph) -> Vec<Repeat> {
    let keys = node_keys(g);
    let hashes = PrefixHash::new(&keys);
    let next = next_occurrences(&keys);
    let periods = common_periods(&keys);
    let mut found = Vec::new();
    let mut i = 0;
    while i < keys.len() {
        match best_repeat_at(g, i, &keys, &hashes, &next[i], &periods) {
            Some((len, _)) => {
                // The first start that repeats need not be where a copy begins: of the starts one copy long
                // from here, take the one with the most copies.
                let (first, copies) = (i..i + len)
                    .map(|s| (s, copies_at(g, s, len, &keys, &hashes)))
                    .fold((i, 0), |best, c| if c.1 > best.1 { c } else { best });
                found.push(Repeat { first, len, copies, lines: copy_lines(g, first, len) });
                i = first + len * copies;
            }
            None => i += 1,
        }
    }
    found.sort_by(|a, b| b.nodes_saved().cmp(&a.nodes_saved()).then(a.first.cmp(&b.first)));
    found
}

/// The longest-saving `(len, copies)` starting at `i`, trying the next few occurrences of `i`'s key and the
/// program's common periods as the start of the second copy.
fn best_repeat_at(
    g: &Graph,
    i: usize,
    keys: &[u64],
    h: &PrefixHash,
    next: &[usize],
    periods: &[usize],
) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    let nearest = next.iter().map(|&j| j - i);
    let common = periods.iter().copied().filter(|&p| keys.get(i + p) == Some(&keys[i]) && !next.contains(&(i + p)));
    for len in nearest.chain(common) {
        if len < MIN_COPY_NODES {
            continue;
        }
        let copies = copies_at(g, i, len, keys, h);
        if copies >= 2 && best.is_none_or(|(l, c)| len * (copies - 1) > l * (c - 1)) {
            best = Some((len, copies));
        }
    }
    best
}

/// How many copies of `len` nodes follow one another from `i` (1: none repeats).
fn copies_at(g: &Graph, i: usize, len: usize, keys: &[u64], h: &PrefixHash) -> usize {
    let same_keys =
        |c: usize| i + (c + 1) * len <= keys.len() && h.range(i, i + len) == h.range(i + c * len, i + (c + 1) * len);
    if !same_keys(1) {
        return 1;
    }
    let Some(strides) = wiring(g, i, i + len, len) else { return 1 };
    let mut copies = 2;
    while same_keys(copies) && wiring(g, i + (copies - 1) * len, i + copies * len, len).as_ref() == Some(&strides) {
        copies += 1;
    }
    copies
}

/// How the copy at `b` (the next one) uses its operands compared with the copy at `a`: `None` if an operand
/// inside one copy is elsewhere or outside in the other; else, for each operand from outside (leaves aside), how
/// far it moved from one copy to the next.
fn wiring(g: &Graph, a: usize, b: usize, len: usize) -> Option<Vec<isize>> {
    let mut strides = Vec::new();
    for r in 0..len {
        for (&oa, &ob) in g.nodes[a + r].operands.iter().zip(&g.nodes[b + r].operands) {
            match (oa >= a, ob >= b) {
                (true, true) if oa - a == ob - b => {}
                (false, false) if is_leaf(g, oa) && is_leaf(g, ob) => {}
                (false, false) => strides.push(ob as isize - oa as isize),
                _ => return None,
            }
        }
    }
    Some(strides)
}

/// Each node's structural key (see the module comment).
fn node_keys(g: &Graph) -> Vec<u64> {
    g.nodes
        .iter()
        .map(|n| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            leaf_key(&n.op).hash(&mut h);
            n.ty.hash(&mut h);
            (n.loc.file, n.loc.line, n.loc.col).hash(&mut h);
            for &o in &n.operands {
                // A leaf operand is keyed by what it is: shared by the copies (a scalar) or each copy's own (its
                // weights). Where a computed operand lies is checked by `wired_alike`.
                if is_leaf(g, o) {
                    leaf_key(&g.nodes[o].op).hash(&mut h);
                }
                g.nodes[o].ty.hash(&mut h);
            }
            h.finish()
        })
        .collect()
}

fn is_leaf(g: &Graph, id: NodeId) -> bool {
    matches!(g.nodes[id].op, Op::Parameter(_) | Op::Constant(_) | Op::Iota(_))
}

/// An op as a key: a parameter's index differs between copies (each has its own weights), so only "a parameter"
/// counts.
fn leaf_key(op: &Op) -> Option<&Op> {
    match op {
        Op::Parameter(_) => None,
        op => Some(op),
    }
}

/// The gaps between consecutive occurrences of equal keys that occur most often (at least twice), longest first
/// among equals: the likely lengths of a copy.
fn common_periods(keys: &[u64]) -> Vec<usize> {
    let mut last: HashMap<u64, usize> = HashMap::new();
    let mut gaps: HashMap<usize, usize> = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        if let Some(prev) = last.insert(*k, i) {
            if i - prev >= MIN_COPY_NODES {
                *gaps.entry(i - prev).or_default() += 1;
            }
        }
    }
    let mut ranked: Vec<(usize, usize)> = gaps.into_iter().filter(|&(_, n)| n >= 2).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
    ranked.into_iter().take(COMMON_PERIODS).map(|(gap, _)| gap).collect()
}

/// For each node, the positions of the later nodes with the same key (at most a few, nearest first).
fn next_occurrences(keys: &[u64]) -> Vec<Vec<usize>> {
    let mut later: HashMap<u64, Vec<usize>> = HashMap::new();
    let mut next = vec![Vec::new(); keys.len()];
    for (i, k) in keys.iter().enumerate().rev() {
        let seen = later.entry(*k).or_default();
        next[i] = seen.iter().rev().take(PERIOD_CANDIDATES).copied().collect();
        seen.push(i);
    }
    next
}

fn copy_lines(g: &Graph, first: usize, len: usize) -> Vec<Loc> {
    let mut lines: Vec<Loc> = Vec::new();
    for n in &g.nodes[first..first + len] {
        if !matches!(n.op, Op::Parameter(_)) && !lines.iter().any(|l| l.file == n.loc.file && l.line == n.loc.line) {
            lines.push(n.loc);
        }
    }
    lines
}

/// Polynomial prefix hashes mod 2^61 − 1: any range's hash in O(1).
struct PrefixHash {
    prefix: Vec<u64>,
    powers: Vec<u64>,
}

const MODULUS: u64 = (1 << 61) - 1;
const BASE: u64 = 0x5bd1_e995_1234_5677 % MODULUS;

fn mul_mod(a: u64, b: u64) -> u64 {
    ((u128::from(a) * u128::from(b)) % u128::from(MODULUS)) as u64
}

impl PrefixHash {
    fn new(keys: &[u64]) -> PrefixHash {
        let mut prefix = Vec::with_capacity(keys.len() + 1);
        let mut powers = Vec::with_capacity(keys.len() + 1);
        prefix.push(0);
        powers.push(1);
        for (i, k) in keys.iter().enumerate() {
            prefix.push((mul_mod(prefix[i], BASE) + k % MODULUS) % MODULUS);
            powers.push(mul_mod(powers[i], BASE));
        }
        PrefixHash { prefix, powers }
    }

    /// Hash of keys `a..b`.
    fn range(&self, a: usize, b: usize) -> u64 {
        (self.prefix[b] + MODULUS - mul_mod(self.prefix[a], self.powers[b - a])) % MODULUS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, TensorType};
    use crate::ops::elementwise::{Binary, BinaryKind, Unary, UnaryKind};

    fn at(line: u32) -> Loc {
        Loc { file: "model.rs", line, col: 9 }
    }
    fn unary(g: &mut Graph, kind: UnaryKind, x: NodeId, line: u32) -> NodeId {
        g.push(Op::Unary(Unary { kind }), vec![x], at(line)).unwrap()
    }
    fn binary(g: &mut Graph, kind: BinaryKind, a: NodeId, b: NodeId, line: u32) -> NodeId {
        g.push(Op::Binary(Binary { kind }), vec![a, b], at(line)).unwrap()
    }

    /// One "layer" of 10 nodes: its own weight (a parameter, at line 10 or 30), nine ops at lines 11–19 (31–39 with
    /// `second_kind`), a residual.
    fn layer(g: &mut Graph, x: NodeId, dim: usize, second_kind: bool) -> NodeId {
        let base = if second_kind { 30 } else { 10 };
        let w = g.parameter(TensorType::new(DType::F32, [dim]), at(base));
        let mut h = binary(g, BinaryKind::Mul, x, w, base + 1);
        for i in 0..6 {
            let kind = if second_kind && i % 2 == 1 { UnaryKind::Exp } else { UnaryKind::Tanh };
            h = unary(g, kind, h, base + 2 + i);
        }
        h = binary(g, BinaryKind::Add, h, w, base + 8);
        binary(g, BinaryKind::Add, x, h, base + 9)
    }

    fn model(kinds: &[(usize, bool)]) -> Graph {
        let mut g = Graph::new();
        let mut x = g.parameter(TensorType::new(DType::F32, [kinds[0].0]), at(1));
        x = unary(&mut g, UnaryKind::Neg, x, 2);
        for &(dim, second) in kinds {
            if g.nodes[x].ty.dims[0] != dim {
                let p = g.parameter(TensorType::new(DType::F32, [dim]), at(3));
                x = p;
            }
            x = layer(&mut g, x, dim, second);
        }
        g.outputs = vec![x];
        g
    }

    #[test]
    fn finds_twelve_layers_in_sequence() {
        let g = model(&[(64, false); 12]);
        let r = find_repeats(&g);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!((r[0].first, r[0].len, r[0].copies), (2, 10, 12), "{r:?}");
        assert_eq!(r[0].nodes_saved(), 10 * 11);
        assert_eq!(r[0].describe(), "12 copies of 10 nodes recorded at model.rs:11–19 (9 lines)");
    }

    #[test]
    fn two_kinds_of_block_are_two_repeats() {
        let mut kinds = vec![(64, false); 4];
        kinds.extend([(64, true); 6]);
        let r = find_repeats(&g_of(&kinds));
        let found: Vec<(usize, u32)> = r.iter().map(|r| (r.copies, r.lines[0].line)).collect();
        assert_eq!(found, vec![(6, 31), (4, 11)], "{r:?}");
    }

    fn g_of(kinds: &[(usize, bool)]) -> Graph {
        model(kinds)
    }

    #[test]
    fn blocks_that_differ_in_shape_do_not_repeat() {
        let kinds: Vec<(usize, bool)> = (0..8).map(|i| (16 + i, false)).collect();
        assert_eq!(find_repeats(&model(&kinds)), vec![]);
        // Nor does a single block, nor a chain of the same op too short to be a layer.
        assert_eq!(find_repeats(&model(&[(64, false)])), vec![]);
    }

    /// A body shorter than a layer is not reported. (Every node of this chain has the same key: a quadratic search
    /// would take minutes here.)
    #[test]
    fn a_long_chain_of_one_op_is_no_layer() {
        let mut g = Graph::new();
        let mut x = g.parameter(TensorType::new(DType::F32, [4]), at(1));
        for _ in 0..100_000 {
            x = unary(&mut g, UnaryKind::Tanh, x, 5);
        }
        g.outputs = vec![x];
        assert_eq!(find_repeats(&g), vec![]);
    }
}

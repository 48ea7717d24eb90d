//! How two graphs differ, in the user's terms. Nodes are grouped into classes: one op kind recorded at one source
//! location. Classes survive what changes between steps (shapes, constant values, how many times a loop ran),
//! so each class of one graph is matched with the same class of the other, occurrence by occurrence, instead of
//! node by node: one extra loop iteration shifts every later node, but not the classes.
//!
//! Each difference is attributed to the line that recorded it: an input's shape or dtype (the line that made
//! the input), a loop that ran another number of times (the loop's first op), a constant's value (its line),
//! or an op recorded in one graph only (its line).

use std::collections::{BTreeMap, HashMap, HashSet};

use lazuli_hlo::{Graph, Loc, Node, NodeId, Op, TensorType};

use super::explain::{DiffKind, Difference};

/// One op kind recorded at one source location.
pub(crate) type Class = (&'static str, Loc);

/// How many nodes of each class a graph has, and of each op kind wherever recorded: enough to rank earlier
/// graphs by likeness without comparing them.
#[derive(Debug, Default)]
pub(crate) struct Census {
    classes: HashMap<Class, u32>,
    kinds: HashMap<&'static str, u32>,
}

impl Census {
    /// Inputs count without their lines: a weight made by the optimizer's line after the first step is the
    /// same input as the one the model made.
    pub fn of(g: &Graph) -> Census {
        let anywhere = Loc { file: "", line: 0, col: 0 };
        let mut c = Census::default();
        for n in &g.nodes {
            let loc = if matches!(n.op, Op::Parameter(_)) { anywhere } else { n.loc };
            *c.classes.entry((n.op.name(), loc)).or_insert(0) += 1;
            *c.kinds.entry(n.op.name()).or_insert(0) += 1;
        }
        c
    }

    /// Nodes of either graph without a counterpart in the other: of their class, plus of their kind (so that
    /// among graphs recorded on other lines, the one with the same ops is nearer than a smaller one).
    pub fn distance(&self, other: &Census) -> u64 {
        unmatched(&self.classes, &other.classes) + unmatched(&self.kinds, &other.kinds)
    }
}

fn unmatched<K: std::hash::Hash + Eq>(a: &HashMap<K, u32>, b: &HashMap<K, u32>) -> u64 {
    let mut d: u64 = 0;
    for (k, &n) in a {
        d += u64::from(n.abs_diff(b.get(k).copied().unwrap_or(0)));
    }
    for (k, &n) in b {
        if !a.contains_key(k) {
            d += u64::from(n);
        }
    }
    d
}

/// `file:line`, the site a difference is reported at.
pub(crate) fn site(loc: &Loc) -> String {
    format!("{}:{}", loc.file, loc.line)
}

/// Listed differences of one kind stop here (the rest are counted).
const MAX_LISTED: usize = 4;

/// Two graphs with their nodes grouped by class.
struct Pair<'g> {
    now: &'g Graph,
    before: &'g Graph,
    classes: Vec<Class>,
    /// Per class, its nodes in each graph, in graph order.
    in_now: Vec<Vec<NodeId>>,
    in_before: Vec<Vec<NodeId>>,
    /// Per node of `now`, its class.
    class_of: Vec<usize>,
}

impl<'g> Pair<'g> {
    fn new(now: &'g Graph, before: &'g Graph) -> Pair<'g> {
        let mut ids: HashMap<Class, usize> = HashMap::new();
        let mut p = Pair {
            now,
            before,
            classes: Vec::new(),
            in_now: Vec::new(),
            in_before: Vec::new(),
            class_of: Vec::with_capacity(now.nodes.len()),
        };
        for (which, g) in [(0, now), (1, before)] {
            for (id, n) in g.nodes.iter().enumerate() {
                let key = (n.op.name(), n.loc);
                let c = *ids.entry(key).or_insert_with(|| {
                    p.classes.push(key);
                    p.in_now.push(Vec::new());
                    p.in_before.push(Vec::new());
                    p.classes.len() - 1
                });
                if which == 0 {
                    p.in_now[c].push(id);
                    p.class_of.push(c);
                } else {
                    p.in_before[c].push(id);
                }
            }
        }
        p
    }

    fn count(&self, c: usize) -> (usize, usize) {
        (self.in_now[c].len(), self.in_before[c].len())
    }

    /// Nodes of class `c` matched occurrence by occurrence: (now, before).
    fn pairs(&self, c: usize) -> impl Iterator<Item = (&'g Node, &'g Node)> + '_ {
        self.in_now[c].iter().zip(&self.in_before[c]).map(|(&a, &b)| (&self.now.nodes[a], &self.before.nodes[b]))
    }
}

/// An input whose type changed.
struct InputChange {
    index: usize,
    loc: Loc,
    now: TensorType,
    before: TensorType,
}

impl InputChange {
    /// What changed, for grouping inputs that changed the same way (a short batch changes `x` and `y` alike).
    fn signature(&self) -> (String, String) {
        if self.now.dtype != self.before.dtype {
            return (format!("{:?}", self.before.dtype), format!("{:?}", self.now.dtype));
        }
        let (a, b) = (&self.now.dims, &self.before.dims);
        match a.iter().zip(b.iter()).find(|(x, y)| x != y) {
            Some((x, y)) => (y.to_string(), x.to_string()),
            None => (format!("rank {}", b.len()), format!("rank {}", a.len())),
        }
    }
}

/// Sizes that changed with the inputs (each dimension and each element count, now and before): a constant whose
/// value moved with one of them (a mean's divisor) follows from the shape and is not news.
struct ShapeSizes(Vec<(f64, f64)>);

impl ShapeSizes {
    fn of(inputs: &[InputChange]) -> ShapeSizes {
        let mut sizes = Vec::new();
        for c in inputs {
            for (a, b) in c.now.dims.iter().zip(c.before.dims.iter()).filter(|(a, b)| a != b) {
                sizes.push((*a as f64, *b as f64));
            }
            sizes.push((c.now.elements() as f64, c.before.elements() as f64));
        }
        ShapeSizes(sizes)
    }

    fn explains(&self, now: f64, before: f64) -> bool {
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-6 * x.abs().max(y.abs());
        self.0.iter().any(|&(n, b)| {
            (close(now, n) && close(before, b))
                || (before != 0.0 && (close(now / before, n / b) || close(now / before, b / n)))
        })
    }
}

/// Inputs matched by the line that made them (occurrence by occurrence); inputs whose line the other graph has
/// no input from (a weight made by the model, then by the optimizer) are matched in input order.
fn changed_inputs(p: &Pair) -> Vec<InputChange> {
    let index = |n: &Node| match n.op {
        Op::Parameter(ref q) => q.index,
        _ => 0,
    };
    let inputs: Vec<usize> = (0..p.classes.len()).filter(|&c| p.classes[c].0 == "parameter").collect();
    let mut matched: Vec<(&Node, &Node)> = inputs.iter().flat_map(|&c| p.pairs(c)).collect();
    let unmatched = |nodes: &[Vec<NodeId>], other: &[Vec<NodeId>], g: &'_ Graph| {
        let mut ids: Vec<NodeId> =
            inputs.iter().filter(|&&c| other[c].is_empty()).flat_map(|&c| nodes[c].iter().copied()).collect();
        ids.sort_by_key(|&id| index(&g.nodes[id]));
        ids
    };
    let (a, b) = (unmatched(&p.in_now, &p.in_before, p.now), unmatched(&p.in_before, &p.in_now, p.before));
    matched.extend(a.iter().zip(&b).map(|(&a, &b)| (&p.now.nodes[a], &p.before.nodes[b])));
    let mut out: Vec<InputChange> = matched
        .into_iter()
        .filter(|(a, b)| a.ty != b.ty)
        .map(|(a, b)| InputChange { index: index(a), loc: a.loc, now: a.ty.clone(), before: b.ty.clone() })
        .collect();
    out.sort_by_key(|c| c.index);
    out
}

/// One difference per way the inputs changed, at the line that made the first such input.
fn input_differences(inputs: &[InputChange]) -> Vec<Difference> {
    let mut groups: Vec<((String, String), Vec<&InputChange>)> = Vec::new();
    for c in inputs {
        let sig = c.signature();
        match groups.iter_mut().find(|(s, _)| *s == sig) {
            Some((_, g)) => g.push(c),
            None => groups.push((sig, vec![c])),
        }
    }
    groups
        .into_iter()
        .map(|(_, g)| Difference {
            kind: DiffKind::InputType,
            site: site(&g[0].loc),
            text: g
                .iter()
                .map(|c| format!("input {} (recorded at {}): now {}, before {}", c.index, c.loc, c.now, c.before))
                .collect(),
        })
        .collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// How many times a loop ran now and before, from the node counts of its classes. A class records `k` nodes per
/// iteration (the forward op once, its gradient some more times), so each count changes by `k × (now − before)`:
/// the gcd of the changes is the change in iterations when some class records one node per iteration (the
/// loop's own ops do), and a class's count over its `k` is the iterations. Most classes agree; a few record one
/// node less (a gradient that accumulates from the second iteration on) or more (the same line used outside the
/// loop too), so the most common answer wins, the larger on a tie. `None` when the counts do not fit one loop.
fn iterations(counts: &[(usize, usize)]) -> Option<(usize, usize)> {
    let grew = counts.first().is_some_and(|(n, b)| n > b);
    if counts.iter().any(|(n, b)| (n > b) != grew || n == b) {
        return None;
    }
    let step = counts.iter().fold(0, |g, (n, b)| gcd(g, n.abs_diff(*b)));
    let mut votes: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for &(n, b) in counts {
        let k = n.abs_diff(b) / step;
        if n % k == 0 && b % k == 0 {
            *votes.entry((n / k, b / k)).or_insert(0) += 1;
        }
    }
    votes.into_iter().max_by_key(|&(answer, votes)| (votes, answer)).map(|(answer, _)| answer)
}

/// Classes recorded in both graphs but a different number of times, grouped into loops: classes whose nodes
/// feed each other belong to one loop. Returns each loop's classes, in the order its first node appears now.
fn loops(p: &Pair) -> Vec<Vec<usize>> {
    let changed: Vec<bool> = (0..p.classes.len())
        .map(|c| {
            let (n, b) = p.count(c);
            n > 0 && b > 0 && n != b
        })
        .collect();
    let mut parent: Vec<usize> = (0..p.classes.len()).collect();
    fn root(parent: &mut [usize], mut c: usize) -> usize {
        while parent[c] != c {
            parent[c] = parent[parent[c]];
            c = parent[c];
        }
        c
    }
    for (id, node) in p.now.nodes.iter().enumerate() {
        let c = p.class_of[id];
        if !changed[c] {
            continue;
        }
        for &o in &node.operands {
            let d = p.class_of[o];
            if changed[d] {
                let (a, b) = (root(&mut parent, c), root(&mut parent, d));
                parent[a] = b;
            }
        }
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    let mut placed = vec![false; p.classes.len()];
    for id in 0..p.now.nodes.len() {
        let c = p.class_of[id];
        if !changed[c] || std::mem::replace(&mut placed[c], true) {
            continue;
        }
        let r = root(&mut parent, c);
        let g = *group_of.entry(r).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(c);
    }
    // Inputs alone are no loop (some weights made by another line than before); they are compared as inputs.
    groups.retain(|g| g.iter().any(|&c| p.classes[c].0 != "parameter"));
    groups
}

/// The lines of `classes`, per file, as `file:12, 13`.
fn lines_of(p: &Pair, classes: impl Iterator<Item = usize>) -> String {
    let mut by_file: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for c in classes {
        let loc = p.classes[c].1;
        let lines = by_file.entry(loc.file).or_default();
        if !lines.contains(&loc.line) {
            lines.push(loc.line);
        }
    }
    by_file
        .into_iter()
        .map(|(f, mut l)| {
            l.sort_unstable();
            let l: Vec<String> = l.iter().map(u32::to_string).collect();
            format!("{f}:{}", l.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// One difference per loop that ran another number of times, at its first op in the user's file (`user_file`:
/// the file of the line that materialized), and the lines it covers (ops recorded in one graph only on those
/// lines belong to the loop too: a gradient accumulates only once a value is used twice).
fn loop_differences(p: &Pair, user_file: &str) -> (Vec<Difference>, Lines) {
    let mut out = Vec::new();
    let mut covered = Lines::new();
    for classes in loops(p) {
        let ops = || classes.iter().copied().filter(|&c| p.classes[c].0 != "parameter");
        let Some(first) = ops().find(|&c| p.classes[c].1.file == user_file).or_else(|| ops().next()) else {
            continue;
        };
        let at = p.classes[first].1;
        let counts: Vec<(usize, usize)> = classes.iter().map(|&c| p.count(c)).collect();
        let lines = lines_of(p, classes.iter().copied());
        // The loop's lines, when it has more than its first.
        let spans = if lines == site(&at) { String::new() } else { format!(" (ops recorded at {lines})") };
        let text = match iterations(&counts) {
            Some((n, b)) => format!("the loop at {} recorded its ops {n} times, before {b}{spans}", site(&at)),
            None => {
                let (n, b) = counts.iter().copied().min_by_key(|&(n, b)| n.min(b)).unwrap_or_default();
                format!("the ops recorded at {lines} were recorded another number of times ({n} now, {b} before)")
            }
        };
        covered.extend(classes.iter().map(|&c| (p.classes[c].1.file, p.classes[c].1.line)));
        out.push(Difference { kind: DiffKind::LoopCount, site: site(&at), text: vec![text] });
    }
    (out, covered)
}

/// Source lines: (file, line).
type Lines = HashSet<(&'static str, u32)>;

/// Nodes matched across the graphs: (now, before).
type Matched<'g> = Vec<(&'g Node, &'g Node)>;

/// Ops recorded in one graph only (outside the loops; inputs left out, their lines move without changing the
/// program: the optimizer's line makes the weights after the first step). Those of a kind the other graph has
/// only elsewhere are the same code recorded from another line (the program is the same): they are returned
/// matched, in order, for comparing constants. The rest is one difference, at the first extra op's line (or
/// the first missing op's, when nothing is extra); also returned is how many ops that is.
fn op_differences<'g>(p: &Pair<'g>, covered: &Lines) -> (Vec<Difference>, Matched<'g>, usize) {
    let outside = |c: usize| {
        let loc = p.classes[c].1;
        p.classes[c].0 != "parameter" && !covered.contains(&(loc.file, loc.line))
    };
    let mut by_kind: BTreeMap<&str, (Vec<NodeId>, Vec<NodeId>)> = BTreeMap::new();
    for c in (0..p.classes.len()).filter(|&c| outside(c)) {
        let entry = by_kind.entry(p.classes[c].0).or_default();
        match (p.in_now[c].is_empty(), p.in_before[c].is_empty()) {
            (false, true) => entry.0.extend(&p.in_now[c]),
            (true, false) => entry.1.extend(&p.in_before[c]),
            _ => {}
        }
    }
    let (mut moved, mut extra, mut missing) = (Vec::new(), Vec::new(), Vec::new());
    for (_, (mut now, mut before)) in by_kind {
        now.sort_unstable();
        before.sort_unstable();
        let m = now.len().min(before.len());
        moved.extend(now.iter().zip(&before).map(|(&a, &b)| (&p.now.nodes[a], &p.before.nodes[b])));
        extra.extend_from_slice(&now[m..]);
        missing.extend_from_slice(&before[m..]);
    }
    let (first_extra, first_missing) =
        (extra.iter().min().map(|&i| &p.now.nodes[i]), missing.iter().min().map(|&i| &p.before.nodes[i]));
    let (extra, missing) = (extra.len(), missing.len());
    let (at, text) = match (first_extra, first_missing) {
        (Some(a), Some(b)) => (
            a.loc,
            format!(
                "first different op: {} {} (now) vs {} {} (before); {extra} op(s) recorded only now, {missing} only before",
                a.loc,
                a.op.name(),
                b.loc,
                b.op.name()
            ),
        ),
        (Some(a), None) => (
            a.loc,
            format!("the graph has {extra} more op(s); the first extra one is {} recorded at {}", a.op.name(), a.loc),
        ),
        (None, Some(b)) => (
            b.loc,
            format!("the graph has {missing} fewer op(s); the first missing one is {} recorded at {}", b.op.name(), b.loc),
        ),
        (None, None) => return (Vec::new(), moved, 0),
    };
    (vec![Difference { kind: DiffKind::Op, site: site(&at), text: vec![text] }], moved, extra + missing)
}

/// Constants whose value (or, with unchanged inputs, type) differs, one difference per line. Values that moved
/// with a changed input size are left out: they follow from the shape.
fn constant_differences(p: &Pair, moved: &Matched, inputs: &[InputChange]) -> Vec<Difference> {
    let sizes = ShapeSizes::of(inputs);
    let mut by_line: Vec<(String, Vec<String>)> = Vec::new();
    let constants = (0..p.classes.len()).filter(|&c| p.classes[c].0 == "constant");
    for (a, b) in constants.flat_map(|c| p.pairs(c)).chain(moved.iter().copied()) {
        let (Op::Constant(x), Op::Constant(y)) = (&a.op, &b.op) else { continue };
        let line = if x.ty == y.ty && x.bits != y.bits && !sizes.explains(x.value(), y.value()) {
            format!("a constant recorded at {} is {} now, {} before", a.loc, x.value(), y.value())
        } else if x.ty != y.ty && inputs.is_empty() {
            format!("a constant recorded at {} is {} now, {} before", a.loc, x.ty, y.ty)
        } else {
            continue;
        };
        let at = site(&a.loc);
        match by_line.iter_mut().find(|(s, _)| *s == at) {
            Some((_, text)) => text.push(line),
            None => by_line.push((at, vec![line])),
        }
    }
    by_line
        .into_iter()
        .take(MAX_LISTED)
        .map(|(at, mut text)| {
            if text.len() > 1 {
                let more = text.len() - 1;
                text.truncate(1);
                text.push(format!("({more} more constant(s) on this line changed too)"));
            }
            Difference { kind: DiffKind::Constant, site: at, text }
        })
        .collect()
}

/// With unchanged inputs: ops of the same kind at the same line with other attributes (an axis, a shape or an
/// option that depends on a host value), one difference per line.
fn attribute_differences(p: &Pair) -> Vec<Difference> {
    let mut out: Vec<Difference> = Vec::new();
    for c in 0..p.classes.len() {
        let (n, b) = p.count(c);
        if n != b || matches!(p.classes[c].0, "constant" | "parameter") {
            continue;
        }
        let Some((a, b)) = p.pairs(c).find(|(a, b)| a.op != b.op) else { continue };
        let at = site(&a.loc);
        if out.iter().any(|d| d.site == at) {
            continue;
        }
        // Kernel ops carry their whole IR: keep the line readable.
        let short = |s: String| {
            if s.chars().count() > 160 {
                format!("{}…", s.chars().take(160).collect::<String>())
            } else {
                s
            }
        };
        out.push(Difference {
            kind: DiffKind::Op,
            site: at,
            text: vec![format!(
                "{} recorded at {} has other attributes: now {}, before {}",
                a.op.name(),
                a.loc,
                short(format!("{:?}", a.op)),
                short(format!("{:?}", b.op))
            )],
        });
    }
    out.truncate(MAX_LISTED);
    out
}

/// With the same ops: other outputs (a tensor kept alive or read in one step only), at its line; or other
/// donated inputs, at the line that materialized (`at`).
fn output_differences(p: &Pair, at: Loc) -> Vec<Difference> {
    let classes = |g: &Graph| {
        let mut m: HashMap<Class, usize> = HashMap::new();
        for &o in &g.outputs {
            *m.entry((g.nodes[o].op.name(), g.nodes[o].loc)).or_insert(0) += 1;
        }
        m
    };
    let (now, before) = (classes(p.now), classes(p.before));
    fn extra<'a>(g: &'a Graph, mine: &HashMap<Class, usize>, other: &HashMap<Class, usize>) -> Option<&'a Node> {
        g.outputs.iter().map(|&o| &g.nodes[o]).find(|n| {
            let c = (n.op.name(), n.loc);
            mine.get(&c) > other.get(&c)
        })
    }
    let counts = format!("{} outputs now, {} before", p.now.outputs.len(), p.before.outputs.len());
    let text = |n: &Node, when: &str| {
        format!(
            "the same ops produce other outputs ({counts}): the {} recorded at {} is an output {when} only (a tensor read or kept alive in one step but not the other)",
            n.op.name(),
            n.loc
        )
    };
    if let Some(n) = extra(p.now, &now, &before) {
        return vec![Difference { kind: DiffKind::Outputs, site: site(&n.loc), text: vec![text(n, "now")] }];
    }
    if let Some(n) = extra(p.before, &before, &now) {
        return vec![Difference { kind: DiffKind::Outputs, site: site(&n.loc), text: vec![text(n, "before")] }];
    }
    if p.now.aliases != p.before.aliases {
        let text = "the same program donates other inputs (a tensor kept alive in one step but not the other)";
        return vec![Difference { kind: DiffKind::Outputs, site: site(&at), text: vec![text.into()] }];
    }
    Vec::new()
}

/// How `now` differs from `before`, each difference at the line that recorded it; `at` is the line that
/// materialized `now` (the user's file, and the site of differences no op line explains). Empty when they
/// have the same structure. Also returned is the size of the change, for picking the graph to explain against:
/// one per difference, except that ops recorded in one graph only count one each (a different program is a
/// larger change than a loop that ran once more, or a new constant).
pub(crate) fn differences(now: &Graph, before: &Graph, at: Loc) -> (Vec<Difference>, usize) {
    let p = Pair::new(now, before);
    let inputs = changed_inputs(&p);
    let mut out = input_differences(&inputs);
    let (loops, covered) = loop_differences(&p, at.file);
    out.extend(loops);
    let (ops, moved, unmatched_ops) = op_differences(&p, &covered);
    let size = unmatched_ops.saturating_sub(ops.len());
    out.extend(ops);
    out.extend(constant_differences(&p, &moved, &inputs));
    // Changed input types change attributes that follow from shapes (reshapes, broadcasts): only news without.
    if inputs.is_empty() {
        out.extend(attribute_differences(&p));
    }
    if out.is_empty() {
        out.extend(output_differences(&p, at));
    }
    let size = size + out.len();
    (out, size)
}

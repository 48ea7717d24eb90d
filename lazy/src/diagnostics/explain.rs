//! Why did a graph miss the executable cache? Compare it with the closest graph compiled before and say what
//! differs, in the user's terms: an input's shape or dtype, the first op that differs with the line that recorded
//! each side, or a constant whose value is baked into the program.

use lazuli_hlo::{Graph, Node, Op};

/// Same op (with attributes) and type; source lines are ignored, like the cache does.
fn same_node(a: &Node, b: &Node) -> bool {
    a.op == b.op && a.ty == b.ty && a.operands == b.operands
}

/// Same op kind (name), whatever the attributes and types.
fn same_kind(a: &Node, b: &Node) -> bool {
    std::mem::discriminant(&a.op) == std::mem::discriminant(&b.op) && a.op.name() == b.op.name()
}

fn common_prefix(a: &Graph, b: &Graph) -> usize {
    a.nodes.iter().zip(&b.nodes).take_while(|(x, y)| same_node(x, y)).count()
}

/// How well two graphs line up node by node: each aligned node of the same kind scores 1, plus 1 for equal
/// dimensions and 1 for an equal dtype (so a dtype change and a shape change each still look alike).
fn alignment(a: &Graph, b: &Graph) -> usize {
    a.nodes
        .iter()
        .zip(&b.nodes)
        .filter(|(x, y)| same_kind(x, y))
        .map(|(x, y)| 1 + usize::from(x.ty.dims == y.ty.dims) + usize::from(x.ty.dtype == y.ty.dtype))
        .sum()
}

/// Index of the graph in `before` most like `now`: the longest identical prefix, then the best alignment, then
/// the closest size; the most recent wins ties.
pub fn closest<'a>(now: &Graph, before: impl IntoIterator<Item = &'a Graph>) -> Option<(usize, &'a Graph)> {
    before.into_iter().enumerate().max_by_key(|(i, g)| {
        (common_prefix(now, g), alignment(now, g), std::cmp::Reverse(now.nodes.len().abs_diff(g.nodes.len())), *i)
    })
}

fn input_name(g: &Graph, i: usize) -> String {
    format!("input {i} (recorded at {})", g.nodes[g.params[i]].loc)
}

/// Lines saying how `now` differs from `before`; empty when they have the same structure.
pub fn explain(now: &Graph, before: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    // Inputs whose type changed: the usual cause (a short last batch, a dtype change).
    let n_in = now.params.len().min(before.params.len());
    for i in 0..n_in {
        let (a, b) = (&now.nodes[now.params[i]].ty, &before.nodes[before.params[i]].ty);
        if a != b {
            out.push(format!("{}: now {a}, before {b}", input_name(now, i)));
        }
    }
    if now.params.len() != before.params.len() {
        out.push(format!("the graph has {} inputs now, {} before", now.params.len(), before.params.len()));
    }
    let inputs_changed = !out.is_empty();
    // The first node that differs in op, attributes or wiring (types that merely follow from an input are
    // already explained above).
    let k = now.nodes.iter().zip(&before.nodes).position(|(a, b)| !(a.op == b.op && a.operands == b.operands));
    match k {
        // With changed inputs, constants and attributes that follow from the shapes differ too; only a
        // different kind of op is news then.
        Some(k) if inputs_changed && same_kind(&now.nodes[k], &before.nodes[k]) => {
            out.push("(other differences in the graph follow from these input types)".into());
        }
        Some(k) => {
            let (a, b) = (&now.nodes[k], &before.nodes[k]);
            match (&a.op, &b.op) {
                (Op::Constant(x), Op::Constant(y)) if x.ty == y.ty => out.push(format!(
                    "a constant recorded at {} is {} now, {} before: constants are compiled into the program; pass the value as a host scalar operand or a tensor so it becomes a parameter",
                    a.loc,
                    x.value(),
                    y.value()
                )),
                _ if same_kind(a, b) && a.operands == b.operands => out.push(format!(
                    "{} {} has other attributes: now {:?}, before {:?} (recorded at {})",
                    a.op.name(),
                    a.ty,
                    a.op,
                    b.op,
                    b.loc
                )),
                _ => out.push(format!(
                    "first different op: {} {} (now) vs {} {} (before)",
                    a.loc,
                    a.op.name(),
                    b.loc,
                    b.op.name()
                )),
            }
        }
        None if now.nodes.len() > before.nodes.len() => {
            let a = &now.nodes[before.nodes.len()];
            out.push(format!(
                "the graph has {} more op(s); the first extra one is {} recorded at {}",
                now.nodes.len() - before.nodes.len(),
                a.op.name(),
                a.loc
            ));
        }
        None if now.nodes.len() < before.nodes.len() => {
            let b = &before.nodes[now.nodes.len()];
            out.push(format!(
                "the graph has {} fewer op(s); the first missing one is {} recorded at {}",
                before.nodes.len() - now.nodes.len(),
                b.op.name(),
                b.loc
            ));
        }
        None => {
            if now.outputs != before.outputs {
                out.push(format!(
                    "the same ops produce other outputs: {} now, {} before (a tensor read or kept alive in one step but not the other)",
                    now.outputs.len(),
                    before.outputs.len()
                ));
            } else if now.aliases != before.aliases {
                out.push(
                    "the same program donates other inputs (a tensor kept alive in one step but not the other)".into(),
                );
            }
        }
    }
    out
}

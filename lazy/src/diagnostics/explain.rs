//! Why did a graph miss the executable cache? Compare it with the most similar graph compiled before and say
//! what differs, each difference attributed to the line that recorded it (`compare.rs`): an input's shape or
//! dtype, a loop that ran another number of times, a constant whose value is compiled in, an op recorded in one
//! graph only.

use lazuli_hlo::{Graph, Loc};
use serde::{Deserialize, Serialize};

use super::compare::{differences, site, Census};

/// What kind of change made a graph new.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiffKind {
    /// An input's shape or dtype (a short last batch, a dtype change).
    InputType,
    /// A loop recorded its ops another number of times.
    LoopCount,
    /// A constant (compiled into the program) has another value.
    Constant,
    /// Ops recorded in one graph only, or with other attributes: a host-side branch recorded something else.
    Op,
    /// The same ops with other outputs or donations: a tensor kept alive in one step but not the other.
    Outputs,
    /// Nothing compiled before resembles it.
    NewGraph,
    /// The same graph was compiled before and evicted by the program cache (`LAZULI_PROGRAM_CACHE_LIMIT`).
    Evicted,
}

impl DiffKind {
    /// A short name for reports.
    pub fn label(self) -> &'static str {
        match self {
            DiffKind::InputType => "input shape/dtype",
            DiffKind::LoopCount => "loop count",
            DiffKind::Constant => "constant",
            DiffKind::Op => "different ops",
            DiffKind::Outputs => "other outputs",
            DiffKind::NewGraph => "new graph",
            DiffKind::Evicted => "evicted",
        }
    }

    /// What to do about it.
    pub fn advice(self) -> &'static str {
        match self {
            DiffKind::InputType => {
                "an input changed shape or dtype: pad or bucket batches to a fixed shape (or drop the short last batch), and keep dtypes stable"
            }
            DiffKind::LoopCount => {
                "a loop ran another number of times, so the step recorded another number of ops: keep loop counts fixed per step, or pad/bucket them (run a fixed count and mask the extra iterations)"
            }
            DiffKind::Constant => {
                "a value is compiled in as a constant: pass it as a host scalar operand (x * value) or a tensor so it becomes a parameter"
            }
            DiffKind::Op => {
                "the step records different ops from one step to the next: look for host-side branches that change what is recorded"
            }
            DiffKind::Outputs => {
                "a tensor is read or kept alive in some steps but not others: keep the same tensors alive every step"
            }
            DiffKind::NewGraph => "a new graph structure appeared after warm-up",
            DiffKind::Evicted => {
                "the program was compiled before and evicted: the process keeps its LAZULI_PROGRAM_CACHE_LIMIT most recently used programs; raise the limit, or run fewer distinct graphs"
            }
        }
    }
}

/// One reason a graph is new, at the line that recorded it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// What kind of difference it is.
    pub kind: DiffKind,
    /// `file:line` of the code that recorded the difference (the input, the loop's first op, the constant).
    pub site: String,
    /// The difference in words, one line each.
    pub text: Vec<String>,
}

/// A compiled graph, kept to explain later misses, with its census of classes.
pub(crate) struct Compiled {
    pub graph: Graph,
    census: Census,
}

impl Compiled {
    pub fn new(graph: Graph) -> Compiled {
        let census = Census::of(&graph);
        Compiled { graph, census }
    }
}

/// Graphs explained in full when picking the one to explain against.
const CANDIDATES: usize = 4;

fn common_prefix(a: &Graph, b: &Graph) -> usize {
    a.nodes.iter().zip(&b.nodes).take_while(|(x, y)| x.op == y.op && x.ty == y.ty && x.operands == y.operands).count()
}

/// How `now` (materialized at `at`) differs from the graph in `before` that explains it best. The graphs with the
/// fewest nodes unmatched class by class (then the longest identical prefix, then the most recent) are explained
/// in full; the one with the smallest change wins (the fewest differences, an op recorded in one graph only
/// counting as one each: the fewest changes that would have made a graph compiled before), then the fewest
/// unmatched nodes. A step that changes its loop count and its batch at once is then
/// explained against a graph that differs in one of them, not in everything. One `NewGraph` difference when
/// nothing before shares an op with it; empty when `before` is empty.
pub(crate) fn explain_miss(now: &Compiled, at: Loc, before: &[Compiled]) -> Vec<Difference> {
    use std::cmp::Reverse;
    let mut ranked: Vec<(u64, Reverse<usize>, Reverse<usize>)> = before
        .iter()
        .enumerate()
        .map(|(i, b)| (now.census.distance(&b.census), Reverse(common_prefix(&now.graph, &b.graph)), Reverse(i)))
        .collect();
    ranked.sort_unstable();
    let Some(&(distance, _, Reverse(i))) = ranked.first() else { return Vec::new() };
    // Not one op in common, by line or by kind.
    if distance >= 2 * (now.graph.nodes.len() + before[i].graph.nodes.len()) as u64 {
        return vec![Difference {
            kind: DiffKind::NewGraph,
            site: site(&at),
            text: vec!["no graph compiled before resembles it".into()],
        }];
    }
    ranked
        .iter()
        .take(CANDIDATES)
        .enumerate()
        .map(|(rank, &(distance, _, Reverse(i)))| (distance, rank, differences(&now.graph, &before[i].graph, at)))
        .min_by_key(|(distance, rank, (_, size))| (*size, *distance, *rank))
        .map(|(_, _, (d, _))| d)
        .unwrap_or_default()
}

/// How `now` (materialized at `at`) differs from `before`; empty when they have the same structure.
pub fn explain(now: &Graph, before: &Graph, at: Loc) -> Vec<Difference> {
    differences(now, before, at).0
}

/// The differences as lines of text, each headed by its kind and site.
pub fn describe(differences: &[Difference]) -> Vec<String> {
    let mut out = Vec::new();
    for d in differences {
        out.push(format!("{} at {}:", d.kind.label(), d.site));
        out.extend(d.text.iter().map(|t| format!("  {t}")));
    }
    out
}

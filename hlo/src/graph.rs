//! The graph IR: nodes in topological order, each with its op, operands, type and the user's source location.

use std::fmt;
use std::panic::Location;

use ndarray::ArrayD;

use crate::dtype::TensorType;
use crate::op::Op;
use crate::ops::leaf::Parameter;

/// Where in the user's code a node was recorded. Lowered as an MLIR `loc("file.rs":line:col)` on every op, so
/// XLA's errors and dumps name the user's Rust line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// The source file, as the compiler names it.
    pub file: &'static str,
    /// The line, from 1.
    pub line: u32,
    /// The column, from 1.
    pub col: u32,
}

impl Loc {
    /// The location of the caller of the `#[track_caller]` function that calls this.
    #[track_caller]
    pub fn caller() -> Loc {
        Location::caller().into()
    }

    /// MLIR's spelling: `loc("src/train.rs":57:13)`.
    pub fn mlir(&self) -> String {
        let mut file = String::with_capacity(self.file.len());
        for c in self.file.chars() {
            match c {
                '"' | '\\' => {
                    file.push('\\');
                    file.push(c);
                }
                c if c.is_ascii_graphic() || c == ' ' => file.push(c),
                _ => file.push('_'),
            }
        }
        format!("loc(\"{file}\":{}:{})", self.line, self.col)
    }
}

impl From<&'static Location<'static>> for Loc {
    fn from(l: &'static Location<'static>) -> Self {
        Loc { file: l.file(), line: l.line(), col: l.column() }
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// Index of a node in [`Graph::nodes`].
pub type NodeId = usize;

#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    pub operands: Vec<NodeId>,
    pub ty: TensorType,
    pub loc: Loc,
}

/// A whole program: nodes in topological order (operands before users), parameters in order, and outputs.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub nodes: Vec<Node>,
    /// Node id of parameter `i`.
    pub params: Vec<NodeId>,
    pub outputs: Vec<NodeId>,
    /// `(parameter, output)` pairs whose buffers alias: the parameter's buffer is donated and the output is
    /// written into it (in-place updates of weights and optimizer state). Same type on both sides.
    pub aliases: Vec<(usize, usize)>,
    /// SPMD partitions (mesh size) the program is compiled for; 1 for an ordinary single-device program.
    pub partitions: u32,
    /// Per parameter, its sharding attribute (SPMD programs only).
    pub param_shardings: Vec<Option<String>>,
    /// Per output, its sharding attribute (SPMD programs only).
    pub output_shardings: Vec<Option<String>>,
}

impl Graph {
    pub fn new() -> Self {
        Graph::default()
    }

    /// Add the next parameter of the program.
    pub fn parameter(&mut self, ty: TensorType, loc: Loc) -> NodeId {
        let index = self.params.len();
        let id = self.push_typed(Op::Parameter(Parameter { index }), Vec::new(), ty, loc);
        self.params.push(id);
        id
    }

    /// Add a node, inferring its type by the op's rule; the error says why the operands do not fit.
    pub fn push(&mut self, op: Op, operands: Vec<NodeId>, loc: Loc) -> Result<NodeId, String> {
        let tys: Vec<&TensorType> = operands.iter().map(|&i| &self.nodes[i].ty).collect();
        let ty = op.infer(&tys)?;
        Ok(self.push_typed(op, operands, ty, loc))
    }

    /// Add a node whose type the caller already inferred (the lazy recorder does it once, at record time).
    pub fn push_typed(&mut self, op: Op, operands: Vec<NodeId>, ty: TensorType, loc: Loc) -> NodeId {
        debug_assert!(operands.iter().all(|&o| o < self.nodes.len()), "operands must come first");
        self.nodes.push(Node { op, operands, ty, loc });
        self.nodes.len() - 1
    }

    /// Per node, whether it is one of `to` or an operand of one of them at any depth: what computing `to` needs.
    /// Operands come before their users, so one backward sweep marks them all.
    pub fn ancestors(&self, to: &[NodeId]) -> Vec<bool> {
        let mut marked = vec![false; self.nodes.len()];
        for &x in to {
            marked[x] = true;
        }
        for x in (0..self.nodes.len()).rev() {
            if marked[x] {
                for &o in &self.nodes[x].operands {
                    marked[o] = true;
                }
            }
        }
        marked
    }

    /// Run the graph on the host with each op's reference rule, in f64, rounding every result to its dtype.
    /// This is the independent reference the tests compare XLA's results with.
    pub fn evaluate(&self, params: &[ArrayD<f64>]) -> Result<Vec<ArrayD<f64>>, String> {
        if params.len() != self.params.len() {
            return Err(format!("graph has {} parameters, got {}", self.params.len(), params.len()));
        }
        let mut values: Vec<Option<ArrayD<f64>>> = vec![None; self.nodes.len()];
        for (i, &id) in self.params.iter().enumerate() {
            let want = &self.nodes[id].ty.dims;
            if params[i].shape() != want.as_slice() {
                return Err(format!("parameter {i}: shape {:?}, expected {:?}", params[i].shape(), want));
            }
            let dt = self.nodes[id].ty.dtype;
            values[id] = Some(params[i].mapv(|x| dt.round(x)));
        }
        for (id, node) in self.nodes.iter().enumerate() {
            if values[id].is_some() {
                continue;
            }
            let args: Vec<&ArrayD<f64>> = node
                .operands
                .iter()
                .map(|&o| values[o].as_ref().ok_or_else(|| format!("node {o} used before definition")))
                .collect::<Result<_, _>>()?;
            let dt = node.ty.dtype;
            let v = node.op.reference(&node.ty, &args).mapv(|x| dt.round(x));
            values[id] = Some(v);
        }
        self.outputs.iter().map(|&o| values[o].clone().ok_or_else(|| format!("output {o} has no value"))).collect()
    }
}

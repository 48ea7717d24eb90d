//! Graph → StableHLO text. Every op is written in MLIR's generic form (`"stablehlo.add"(%a, %b) : (…) -> …`), which
//! every StableHLO parser accepts regardless of pretty-printing changes, followed by the node's `loc(…)`.

use std::collections::HashMap;
use std::fmt::{self, Write};

use crate::dtype::TensorType;
use crate::graph::{Graph, Loc};
use crate::op::Op;

/// Module-level settings of the emitted program.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EmitOptions {
    pub num_partitions: u32,
    pub num_replicas: u32,
}

impl Default for EmitOptions {
    fn default() -> Self {
        EmitOptions { num_partitions: 1, num_replicas: 1 }
    }
}

/// What an op's `lower` rule sees: its operands' SSA names and types, its result type and location, and a way to
/// append lines.
pub struct LowerCx<'a> {
    text: &'a mut String,
    counter: &'a mut usize,
    args: Vec<(String, &'a TensorType)>,
    out: &'a TensorType,
    loc: Loc,
    /// Results of lowerings several nodes share (a kernel's results, one node each), by key and operand names.
    shared: &'a mut HashMap<String, Vec<String>>,
}

impl<'a> LowerCx<'a> {
    pub fn arg(&self, i: usize) -> &str {
        &self.args[i].0
    }

    pub fn arg_ty(&self, i: usize) -> &TensorType {
        self.args[i].1
    }

    pub fn out_ty(&self) -> &TensorType {
        self.out
    }

    pub fn num_args(&self) -> usize {
        self.args.len()
    }

    /// Lower `op` on explicit operands (SSA names and types) as part of this node: a compound op reuses the
    /// lowerings of the ops it is made of.
    pub fn lower_op<'b>(&'b mut self, op: &Op, args: Vec<(String, &'b TensorType)>, out: &'b TensorType) -> String {
        let mut cx = LowerCx {
            text: &mut *self.text,
            counter: &mut *self.counter,
            args,
            out,
            loc: self.loc,
            shared: &mut *self.shared,
        };
        op.lower(&mut cx)
    }

    /// The results of `lower` on this node's operands, lowered once per `key` and operand list: the first node
    /// to ask writes the lines, later ones (other results of the same call) reuse its SSA names. Nodes come in
    /// topological order in one block, so the first definition dominates every later use.
    pub fn shared(&mut self, key: &str, lower: impl FnOnce(&mut Self) -> Vec<String>) -> Vec<String> {
        let mut full = String::from(key);
        for (name, _) in &self.args {
            full.push(' ');
            full.push_str(name);
        }
        if let Some(names) = self.shared.get(&full) {
            return names.clone();
        }
        let names = lower(self);
        self.shared.insert(full, names.clone());
        names
    }

    /// A region of one block, as the text an op's `region` takes: arguments of `arg_tys` (fresh names, passed to
    /// `body`), the lines `body` writes, and a `stablehlo.return` of the values it returns. Shared lowerings do
    /// not cross the region's edge: a value defined inside is not visible after it.
    pub fn region(
        &mut self,
        arg_tys: &[&TensorType],
        body: impl FnOnce(&mut LowerCx<'_>, Vec<String>) -> Vec<(String, TensorType)>,
    ) -> String {
        let names: Vec<String> = arg_tys.iter().map(|_| self.fresh()).collect();
        let mut text = String::new();
        let mut shared = HashMap::new();
        let outs = {
            let mut cx = LowerCx {
                text: &mut text,
                counter: &mut *self.counter,
                args: Vec::new(),
                out: self.out,
                loc: self.loc,
                shared: &mut shared,
            };
            body(&mut cx, names.clone())
        };
        let mut r = String::from("{\n");
        if !names.is_empty() {
            let params: Vec<String> = names.iter().zip(arg_tys).map(|(n, t)| format!("{n}: {}", t.mlir())).collect();
            let _ = writeln!(r, "    ^bb0({}):", params.join(", "));
        }
        r.push_str(&text);
        let vals: Vec<&str> = outs.iter().map(|o| o.0.as_str()).collect();
        let tys: Vec<String> = outs.iter().map(|o| o.1.mlir()).collect();
        let _ = writeln!(
            r,
            "    \"stablehlo.return\"({}) : ({}) -> () {}",
            vals.join(", "),
            tys.join(", "),
            self.loc.mlir()
        );
        r.push_str("    }");
        r
    }

    /// A fresh SSA name.
    pub fn fresh(&mut self) -> String {
        *self.counter += 1;
        format!("%t{}", *self.counter)
    }

    /// Emit `op` applied to all of this node's operands, giving the node's result type. `attrs` is the inside of
    /// the generic attribute dictionary (may be empty).
    pub fn op_on_args(&mut self, op: &str, attrs: &str) -> String {
        let names: Vec<String> = self.args.iter().map(|a| a.0.clone()).collect();
        let tys: Vec<&TensorType> = self.args.iter().map(|a| a.1).collect();
        let out = self.out;
        self.op(op, &names, &tys, attrs, None, out)
    }

    /// Emit one generic op line with explicit operands, an optional region and the result type.
    pub fn op(
        &mut self,
        op: &str,
        operands: &[String],
        operand_tys: &[&TensorType],
        attrs: &str,
        region: Option<&str>,
        result: &TensorType,
    ) -> String {
        let name = self.fresh();
        self.write(&name, op, operands, operand_tys, attrs, region, &result.mlir());
        name
    }

    /// Emit one generic op with several results (a variadic reduce, say); returns their SSA names `%tN#i`.
    pub fn op_multi(
        &mut self,
        op: &str,
        operands: &[String],
        operand_tys: &[&TensorType],
        attrs: &str,
        region: Option<&str>,
        results: &[&TensorType],
    ) -> Vec<String> {
        let name = self.fresh();
        let outs: Vec<String> = results.iter().map(|ty| ty.mlir()).collect();
        let decl = format!("{name}:{}", results.len());
        self.write(&decl, op, operands, operand_tys, attrs, region, &format!("({})", outs.join(", ")));
        (0..results.len()).map(|i| format!("{name}#{i}")).collect()
    }

    /// `    <decl> = "<op>"(<operands>) (<region>) {<attrs>} : (<operand types>) -> <results> <loc>`
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        decl: &str,
        op: &str,
        operands: &[String],
        operand_tys: &[&TensorType],
        attrs: &str,
        region: Option<&str>,
        results: &str,
    ) {
        let t = &mut *self.text;
        let _ = write!(t, "    {decl} = \"{op}\"({})", operands.join(", "));
        if let Some(r) = region {
            let _ = write!(t, " ({r})");
        }
        if !attrs.is_empty() {
            let _ = write!(t, " {{{attrs}}}");
        }
        let ins: Vec<String> = operand_tys.iter().map(|ty| ty.mlir()).collect();
        let _ = writeln!(t, " : ({}) -> {results} {}", ins.join(", "), self.loc.mlir());
    }
}

/// A string as an MLIR string literal: printable ASCII verbatim except `"` and `\`, every other byte as `\XX`.
pub struct MlirString<'a>(pub &'a str);

impl fmt::Display for MlirString<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_char('"')?;
        for &b in self.0.as_bytes() {
            match b {
                b'"' | b'\\' => write!(f, "\\{b:02X}")?,
                0x20..=0x7e => f.write_char(b as char)?,
                _ => write!(f, "\\{b:02X}")?,
            }
        }
        f.write_char('"')
    }
}

/// `array<i64: 1, 0>`
pub fn i64_array(v: &[usize]) -> String {
    if v.is_empty() {
        return "array<i64>".to_string();
    }
    let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("array<i64: {}>", items.join(", "))
}

/// The longest elementwise chain left for XLA to fuse into one loop; a longer one is cut with an optimization
/// barrier. XLA's compile time grows faster than the chain: on the CPU plugin a chain of 6,000 elementwise ops
/// (a value updated in a loop without a step boundary) took 35 s and 2.3 GB to compile, and cut every 100–500 ops
/// 1.2–2.2 s. Ordinary steps have no chain this long, so their programs are unchanged.
pub const FUSION_CUT: usize = 128;

/// Lower a whole graph to a StableHLO module with a `@main` taking the parameters and returning the outputs.
pub fn emit(graph: &Graph, opts: &EmitOptions) -> String {
    let mut text = String::with_capacity(128 + graph.nodes.len() * 96);
    let _ = writeln!(
        text,
        "module @lazuli attributes {{mhlo.num_partitions = {} : i32, mhlo.num_replicas = {} : i32}} {{",
        opts.num_partitions.max(graph.partitions),
        opts.num_replicas
    );
    text.push_str("  func.func @main(");
    let mut names: Vec<String> = vec![String::new(); graph.nodes.len()];
    for (i, &id) in graph.params.iter().enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        let node = &graph.nodes[id];
        names[id] = format!("%arg{i}");
        let _ = write!(text, "%arg{i}: {}", node.ty.mlir());
        let mut attrs = Vec::new();
        if let Some(&(_, out)) = graph.aliases.iter().find(|(p, _)| *p == i) {
            attrs.push(format!("tf.aliasing_output = {out} : i32"));
        }
        if let Some(Some(sh)) = graph.param_shardings.get(i) {
            attrs.push(format!("mhlo.sharding = \"{sh}\""));
        }
        if !attrs.is_empty() {
            let _ = write!(text, " {{{}}}", attrs.join(", "));
        }
        let _ = write!(text, " {}", node.loc.mlir());
    }
    text.push_str(") -> (");
    let out_tys: Vec<String> = graph.outputs.iter().map(|&o| graph.nodes[o].ty.mlir()).collect();
    let results: Vec<String> = out_tys
        .iter()
        .enumerate()
        .map(|(i, t)| match graph.output_shardings.get(i) {
            Some(Some(sh)) => format!("{t} {{mhlo.sharding = \"{sh}\"}}"),
            _ => t.clone(),
        })
        .collect();
    text.push_str(&results.join(", "));
    text.push_str(") {\n");
    let mut counter = 0usize;
    let mut shared = HashMap::new();
    // Per node, the weight of the longest elementwise chain XLA would fuse into the loop that computes it.
    let mut chain = vec![0usize; graph.nodes.len()];
    for (id, node) in graph.nodes.iter().enumerate() {
        if !names[id].is_empty() {
            continue; // parameters are block arguments
        }
        let args = node.operands.iter().map(|&o| (names[o].clone(), &graph.nodes[o].ty)).collect();
        let mut cx =
            LowerCx { text: &mut text, counter: &mut counter, args, out: &node.ty, loc: node.loc, shared: &mut shared };
        names[id] = node.op.lower(&mut cx);
        chain[id] = node.op.loop_weight().map_or(0, |w| w + node.operands.iter().map(|&o| chain[o]).max().unwrap_or(0));
        if chain[id] >= FUSION_CUT {
            let ty = [&node.ty];
            names[id] = cx.op("stablehlo.optimization_barrier", &[names[id].clone()], &ty, "", None, &node.ty);
            chain[id] = 0;
        }
    }
    let outs: Vec<&str> = graph.outputs.iter().map(|&o| names[o].as_str()).collect();
    let _ = writeln!(text, "    \"func.return\"({}) : ({}) -> ()", outs.join(", "), out_tys.join(", "));
    text.push_str("  }\n}\n");
    text
}

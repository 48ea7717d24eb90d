//! Triton kernels handed to XLA as Triton IR text (`stablehlo.custom_call @__gpu$xla.gpu.triton`): the call's
//! parameters, their validation, and lazuli's own kernels' generators.
//!
//! XLA's CUDA plugin compiles the IR with the Triton built into it. Its `backend_config` must hold seven keys
//! (`debug`, `grid_x`, `grid_y`, `grid_z`, `ir`, `name`, `num_stages`, `num_warps`); a missing one crashes the
//! process inside compile, so every call is built from a [`TritonCall`], whose fields are exactly those keys, and
//! checked by [`TritonCall::validate`] before it reaches a program.

pub mod bias_gelu;
pub mod cross_entropy;
pub mod finite_count;
pub mod flash;
pub mod layer_norm;
mod tile;
pub mod ttir;

use lazuli_hlo::emit::MlirString;
use lazuli_hlo::{BackendConfig, CustomCall, TensorType};

/// XLA's custom-call target for Triton IR.
pub const TARGET: &str = "__gpu$xla.gpu.triton";

/// One Triton kernel launch as XLA's custom call takes it. Kernel arguments are pointers only: the call's
/// operands in order, then its results; shapes, strides and block sizes are constants of the IR, so a kernel's
/// text is generated per shape signature.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TritonCall {
    /// The `tt.func` to launch.
    pub name: String,
    /// Triton IR as MLIR text (a `module { tt.func … }` or a bare `tt.func`).
    pub ir: String,
    pub grid: [u32; 3],
    pub num_warps: u32,
    pub num_stages: u32,
}

impl TritonCall {
    /// Check what XLA's Triton call reads, for a call with `operands` operands and `results` results: the name
    /// is an identifier of a `tt.func` in the IR that takes one pointer per operand and result, the IR's
    /// brackets balance, the grid is positive and within CUDA's limits, warps are a power of two up to 32, and
    /// stages are 1 to 8. The error says what is wrong in the user's terms.
    pub fn validate(&self, operands: usize, results: usize) -> Result<(), String> {
        let name = &self.name;
        let identifier = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !identifier {
            return Err(format!("kernel name {name:?} is not an identifier (letters, digits, `_`)"));
        }
        check_brackets(&self.ir)?;
        let args = function_arguments(&self.ir, name)?;
        if args.len() != operands + results {
            return Err(format!(
                "tt.func @{name} takes {} argument(s), but the call passes {operands} operand(s) and {results} \
                 result(s): one pointer each",
                args.len()
            ));
        }
        if let Some((i, a)) = args.iter().enumerate().find(|(_, a)| !a.contains("!tt.ptr<")) {
            return Err(format!(
                "argument {i} of tt.func @{name} ({a}) is not a pointer: kernel arguments are pointers"
            ));
        }
        let [x, y, z] = self.grid;
        if x == 0 || y == 0 || z == 0 || x > i32::MAX as u32 || y > 65535 || z > 65535 {
            return Err(format!("grid {:?}: every size must be ≥ 1 (x < 2^31, y and z ≤ 65535)", self.grid));
        }
        if !self.num_warps.is_power_of_two() || self.num_warps > 32 {
            return Err(format!("num_warps = {}: must be 1, 2, 4, 8, 16 or 32", self.num_warps));
        }
        if !(1..=8).contains(&self.num_stages) {
            return Err(format!("num_stages = {}: must be 1 to 8", self.num_stages));
        }
        Ok(())
    }

    /// The `backend_config` dictionary: exactly the seven keys XLA reads, alphabetically, as MLIR prints it.
    pub fn backend_config(&self) -> String {
        let [x, y, z] = self.grid;
        format!(
            "{{debug = false, grid_x = {x} : i32, grid_y = {y} : i32, grid_z = {z} : i32, ir = {}, name = {}, \
             num_stages = {} : i32, num_warps = {} : i32}}",
            MlirString(&self.ir),
            MlirString(&self.name),
            self.num_stages,
            self.num_warps
        )
    }

    /// The custom call launching this kernel, with results of types `results` (row-major, like its operands).
    pub fn custom_call(&self, results: Vec<TensorType>) -> CustomCall {
        CustomCall {
            target: TARGET.to_string(),
            api_version: 4,
            backend_config: BackendConfig::Dictionary(self.backend_config()),
            results,
            operand_layouts: Vec::new(),
            result_layouts: Vec::new(),
        }
    }
}

/// A block of pointers: the pointer argument `arg` advanced by each of `offsets` (elements).
pub(crate) fn pointers(k: &mut ttir::Kernel, arg: &ttir::Value, offsets: &ttir::Value) -> ttir::Value {
    let base = k.splat(arg, offsets.shape());
    k.addptr(&base, offsets)
}

/// `()`, `[]`, `{}` and `<>` balance outside string literals (a cheap check that catches truncated IR here,
/// with a message, rather than in the plugin's parser).
fn check_brackets(ir: &str) -> Result<(), String> {
    let mut stack = Vec::new();
    let mut in_string = false;
    let mut line = 1;
    let mut prev = ' ';
    for c in ir.chars() {
        match c {
            '\n' => line += 1,
            '"' if prev != '\\' => in_string = !in_string,
            _ if in_string => {}
            '(' | '[' | '{' => stack.push((c, line)),
            ')' | ']' | '}' => {
                let open = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                match stack.pop() {
                    Some((o, _)) if o == open => {}
                    Some((o, l)) => {
                        return Err(format!("Triton IR line {line}: `{c}` closes `{o}` opened on line {l}"))
                    }
                    None => return Err(format!("Triton IR line {line}: `{c}` closes nothing")),
                }
            }
            _ => {}
        }
        prev = c;
    }
    match stack.pop() {
        Some((o, l)) => Err(format!("Triton IR: `{o}` opened on line {l} is never closed")),
        None if in_string => Err("Triton IR: a string literal is never closed".into()),
        None => Ok(()),
    }
}

/// The argument list of `tt.func … @name(…)`, split at top-level commas.
fn function_arguments(ir: &str, name: &str) -> Result<Vec<String>, String> {
    let pattern = format!("@{name}(");
    let start = ir
        .match_indices(&pattern)
        .map(|(i, _)| i)
        .find(|&i| ir[..i].rsplit('\n').next().is_some_and(|l| l.contains("tt.func")))
        .ok_or_else(|| format!("the Triton IR has no `tt.func @{name}(…)`"))?;
    let mut depth = 0usize;
    let mut args = Vec::new();
    let mut current = String::new();
    for c in ir[start + pattern.len()..].chars() {
        match c {
            ')' if depth == 0 => {
                if !current.trim().is_empty() {
                    args.push(current.trim().to_string());
                }
                return Ok(args);
            }
            ',' if depth == 0 => args.push(std::mem::take(&mut current).trim().to_string()),
            '(' | '[' | '{' | '<' => {
                depth += 1;
                current.push(c);
            }
            ')' | ']' | '}' | '>' => {
                depth = depth.saturating_sub(1);
                current.push(c);
            }
            _ => current.push(c),
        }
    }
    Err(format!("the argument list of tt.func @{name} is never closed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add_kernel() -> TritonCall {
        let ir = "module {\n  tt.func public @add(%x: !tt.ptr<f32> {tt.divisibility = 16 : i32}, \
                  %y: !tt.ptr<f32>, %o: !tt.ptr<f32>) {\n    tt.return\n  }\n}\n";
        TritonCall { name: "add".into(), ir: ir.into(), grid: [4, 1, 1], num_warps: 4, num_stages: 2 }
    }

    #[test]
    fn a_well_formed_call_passes_and_names_all_seven_keys() {
        let k = add_kernel();
        k.validate(2, 1).expect("valid");
        let config = k.backend_config();
        for key in ["debug", "grid_x", "grid_y", "grid_z", "ir", "name", "num_stages", "num_warps"] {
            assert!(config.contains(&format!("{key} = ")), "{key} missing from {config}");
        }
        assert!(config.contains("ir = \"module {\\0A  tt.func public @add("), "{config}");
        assert!(config.starts_with("{debug = false, grid_x = 4 : i32, grid_y = 1 : i32, grid_z = 1 : i32, ir = "));
        assert!(config.ends_with("name = \"add\", num_stages = 2 : i32, num_warps = 4 : i32}"), "{config}");
    }

    #[test]
    fn bad_parameters_are_refused_with_the_reason() {
        type Break = Box<dyn Fn(&mut TritonCall)>;
        let cases: Vec<(Break, &str)> = vec![
            (Box::new(|k| k.name = "a b".into()), "not an identifier"),
            (Box::new(|k| k.name = "mul".into()), "no `tt.func @mul"),
            (Box::new(|k| k.ir.truncate(k.ir.len() - 3)), "never closed"),
            (Box::new(|k| k.grid = [0, 1, 1]), "grid"),
            (Box::new(|k| k.grid = [1, 70000, 1]), "grid"),
            (Box::new(|k| k.num_warps = 3), "num_warps"),
            (Box::new(|k| k.num_stages = 0), "num_stages"),
            (Box::new(|k| k.ir = k.ir.replace("%o: !tt.ptr<f32>", "%o: i32")), "not a pointer"),
        ];
        for (break_it, expect) in cases {
            let mut k = add_kernel();
            break_it(&mut k);
            let e = k.validate(2, 1).expect_err(expect);
            assert!(e.contains(expect), "{e:?} should say {expect:?}");
        }
        let e = add_kernel().validate(1, 1).expect_err("arity");
        assert!(e.contains("takes 3 argument(s), but the call passes 1 operand(s) and 1 result(s)"), "{e}");
    }
}

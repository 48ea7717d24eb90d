//! [`load_named`]: set a module's parameters from named tensors (a safetensors file's, say), as PyTorch's
//! `load_state_dict` does, with a report of the names that did not fit.

use std::collections::{HashMap, HashSet};
use std::fmt;

use lazuli_hlo::{Loc, TensorType};

use super::{Module, Param};
use crate::error::{Error, Result};
use crate::graph::tensor::Tensor;
use crate::train::checkpoint::layer_name;

/// Whether [`load_named`] accepts tensors that do not cover the module exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strict {
    /// Any missing, unexpected or mismatched name is an error, and nothing is loaded.
    Yes,
    /// Load every parameter that matches; the report lists the rest.
    No,
}

/// A name whose tensor does not fit its parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The tensor's name (for a stacked parameter, the layer's: `blocks.1.ln1.weight`).
    pub name: String,
    /// The tensor's dtype and shape.
    pub given: TensorType,
    /// The parameter's (for a stacked parameter, one layer's).
    pub wanted: TensorType,
}

/// What [`load_named`] did: the parameters it set, and the names that did not fit.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadReport {
    /// Parameters set, by the module's names, in its order.
    pub loaded: Vec<String>,
    /// Parameters no tensor was given for (for a stacked parameter, the missing layers' names).
    pub missing: Vec<String>,
    /// Tensors the module has no parameter for, in the order given.
    pub unexpected: Vec<String>,
    /// Tensors of another dtype or shape than their parameter.
    pub mismatched: Vec<Mismatch>,
}

impl LoadReport {
    /// Every parameter was set and every tensor used.
    pub fn is_exact(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.mismatched.is_empty()
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} parameters loaded", self.loaded.len())?;
        if !self.missing.is_empty() {
            write!(f, "; missing: {:?}", self.missing)?;
        }
        if !self.unexpected.is_empty() {
            write!(f, "; unexpected: {:?}", self.unexpected)?;
        }
        if !self.mismatched.is_empty() {
            let m: Vec<String> =
                self.mismatched.iter().map(|m| format!("{:?} is {}, wants {}", m.name, m.given, m.wanted)).collect();
            write!(f, "; mismatched: {}", m.join(", "))?;
        }
        Ok(())
    }
}

/// Set each of `module`'s parameters from the tensor of the same name in `tensors` (a
/// [`NamedTensors`](crate::train::safetensors::NamedTensors) or any list of pairs). A stacked parameter
/// ([`ScannedBlocks`](super::ScannedBlocks)' `blocks.*.…`) takes its layers from the unrolled names
/// (`blocks.0.…`, `blocks.1.…`) or its stack under its own name. Names are compared exactly; dtypes and shapes
/// must match (convert or transpose beforehand).
///
/// With [`Strict::Yes`], any missing, unexpected or mismatched name is an [`Error::Weights`] listing all of them,
/// and nothing is changed. With [`Strict::No`], what matches is loaded and the report lists the rest.
#[track_caller]
pub fn load_named(module: &dyn Module, tensors: &[(String, Tensor)], strict: Strict) -> Result<LoadReport> {
    let at = Loc::caller();
    let given: HashMap<&str, &Tensor> = tensors.iter().rev().map(|(n, t)| (n.as_str(), t)).collect();
    let mut used: HashSet<&str> = HashSet::new();
    let mut report = LoadReport::default();
    let mut plan: Vec<(Param, Tensor)> = Vec::new();
    for (name, param) in module.named_params() {
        let wanted = param.get().tensor_type().clone();
        let value = match given.get_key_value(name.as_str()) {
            Some((&k, t)) => {
                used.insert(k);
                fit(&name, t, &wanted, &mut report)
            }
            None if layer_name(&name, 0).is_some() && wanted.rank() > 0 => {
                stack_layers(&name, &wanted, &given, &mut used, &mut report)
            }
            None => {
                report.missing.push(name.clone());
                None
            }
        };
        if let Some(v) = value {
            report.loaded.push(name);
            plan.push((param, v));
        }
    }
    report.unexpected = tensors.iter().map(|(n, _)| n).filter(|n| !used.contains(n.as_str())).cloned().collect();
    if strict == Strict::Yes && !report.is_exact() {
        return Err(Error::Weights(format!("load_named (at {at}): the tensors do not fit the module: {report}")));
    }
    for (param, value) in plan {
        param.set(value);
    }
    Ok(report)
}

/// `t` if it is of `wanted`'s dtype and shape; else a mismatch in `report`.
fn fit(name: &str, t: &Tensor, wanted: &TensorType, report: &mut LoadReport) -> Option<Tensor> {
    if t.tensor_type() == wanted {
        return Some(t.clone());
    }
    report.mismatched.push(Mismatch { name: name.into(), given: t.tensor_type().clone(), wanted: wanted.clone() });
    None
}

/// The stack of a stacked parameter's layers, each given under its unrolled name, if all are there and fit.
fn stack_layers<'a>(
    name: &str,
    wanted: &TensorType,
    given: &HashMap<&'a str, &Tensor>,
    used: &mut HashSet<&'a str>,
    report: &mut LoadReport,
) -> Option<Tensor> {
    let layer_ty = TensorType::new(wanted.dtype, &wanted.dims[1..]);
    let mut layers = Vec::with_capacity(wanted.dims[0]);
    for i in 0..wanted.dims[0] {
        let key = layer_name(name, i)?;
        match given.get_key_value(key.as_str()) {
            Some((&k, t)) => {
                used.insert(k);
                layers.extend(fit(&key, t, &layer_ty, report));
            }
            None => report.missing.push(key),
        }
    }
    if layers.len() != wanted.dims[0] {
        return None;
    }
    let refs: Vec<&Tensor> = layers.iter().collect();
    Some(crate::graph::autodiff::no_grad(|| Tensor::stack(&refs, 0)))
}

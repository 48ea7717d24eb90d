//! One result of an op held as shared data (a custom kernel's `KernelDef`, a loop's `ControlDef`): such an op is
//! recorded as one node per result, each pointing at the same definition, compared by content and hashed by the
//! hash the definition took once.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// What the result nodes need of a shared definition.
pub trait SharedDef: PartialEq {
    /// The op's name in diagnostics.
    fn def_name(&self) -> &'static str;
    fn result_count(&self) -> usize;
    /// The hash of the definition's content, taken when it was made.
    fn content_hash(&self) -> u64;
}

/// Result `result` of `def`: the op of one node.
#[derive(Debug)]
pub struct ResultOf<D> {
    pub def: Arc<D>,
    pub result: usize,
}

impl<D: SharedDef> ResultOf<D> {
    /// Panics if `def` has no such result.
    pub fn new(def: Arc<D>, result: usize) -> ResultOf<D> {
        assert!(result < def.result_count(), "{} has {} results", def.def_name(), def.result_count());
        ResultOf { def, result }
    }
}

impl<D> Clone for ResultOf<D> {
    fn clone(&self) -> Self {
        ResultOf { def: Arc::clone(&self.def), result: self.result }
    }
}

impl<D: SharedDef> PartialEq for ResultOf<D> {
    fn eq(&self, other: &Self) -> bool {
        self.result == other.result && (Arc::ptr_eq(&self.def, &other.def) || self.def == other.def)
    }
}

impl<D: SharedDef> Eq for ResultOf<D> {}

impl<D: SharedDef> Hash for ResultOf<D> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.def.content_hash().hash(state);
        self.result.hash(state);
    }
}

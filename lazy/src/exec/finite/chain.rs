//! A split step's update keeps no copy of what its gradients' program made. Kept for the update's locator, the
//! gradients (as large as the weights) stayed alive beside the next step's until the update's check was read, two
//! launches later (`docs/perf-log/2026-12-05-update-keeps-no-gradients.md`). The update keeps instead
//! what makes them again: the gradients' program and its inputs (the weights, which the update donates and the flag
//! keeps on a trip, the batch and scalars, all kept by the gradients' own check anyway). A trip of the update, or the
//! one warm run of its locator ahead, runs the gradients' program again on them and feeds its outputs to the
//! update's locator: the values the update read, bit for bit (the same program on the same inputs).
//!
//! Only a program on one device that donated nothing has a [`Source`]: under `stop` a split step's gradients'
//! program donates nothing (`exec/plan/`), so that its inputs stay its own. On a mesh the update keeps its inputs.
//! The update's plan names the source and the inputs it made (`super::remade`): those may be donated to any output,
//! and its check feeds exactly those.
//!
//! The gradients' program also reads the weights' low-precision copies, which no later program reads: the update
//! writes the new copies from the new weights. Kept until the gradients' check was read, often a step later, the
//! old copies outlived the point where the optimizer drops them without the check (perf log
//! `2026-12-05-stop-peak-measured.md`). But the update's guard writes each copy from the kept weight on a trip
//! (`lazuli_hlo::finite::guard`), so the new copy then holds the old one's value bit for bit, as a guarded output
//! holds its input's: the kept inputs follow the old copies to the new ones ([`note_copy`], [`copies_replaced`]),
//! as they follow donated inputs.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak as NodeWeak};
use std::sync::{Arc, Mutex, Weak};

use lazuli_hlo::Graph;
use lazuli_pjrt::LoadedExecutable;

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::error::{Error, Result};
use crate::graph::tensor::{Data, Node, NodeMap};
use crate::runtime::value::DeviceValue;
use crate::runtime::Runtime;

/// What makes a gradients' program's outputs again: the program, its IR (for its inputs' types) and its inputs.
pub(crate) struct Source {
    exe: Arc<LoadedExecutable>,
    graph: Arc<Graph>,
    /// Followed from output to output as later programs take them (`super::keep`).
    pub inputs: Mutex<Vec<Data>>,
    /// Its outputs' addresses and output indices: an update's input that is one of them is fed from here.
    made: HashMap<usize, usize>,
    /// Its outputs, weakly: an address in `made` is not taken by another value while the source lives.
    _pinned: Vec<Weak<DeviceValue>>,
}

/// An update's inputs that a gradients' program made: `(update input, gradients' output)`.
pub(crate) struct Fed {
    pub source: Arc<Source>,
    from: Vec<(usize, usize)>,
}

impl Source {
    /// The source of a program's `outputs` (without its check's counts), run on `inputs`.
    pub fn new(exe: Arc<LoadedExecutable>, graph: Arc<Graph>, inputs: Vec<Data>, outputs: &[Data]) -> Arc<Source> {
        let device: Vec<(usize, &Arc<DeviceValue>)> = outputs
            .iter()
            .enumerate()
            .filter_map(|(j, d)| match d {
                Data::Device(v) => Some((j, v)),
                Data::Host(_) | Data::Sharded { .. } => None,
            })
            .collect();
        let made = device.iter().map(|&(j, v)| (Arc::as_ptr(v) as usize, j)).collect();
        let _pinned = device.iter().map(|(_, v)| Arc::downgrade(v)).collect();
        Arc::new(Source { exe, graph, inputs: Mutex::new(inputs), made, _pinned })
    }

    /// Which of its outputs `d` is, if any.
    pub fn made(&self, d: &Data) -> Option<usize> {
        let Data::Device(v) = d else { return None };
        self.made.get(&(Arc::as_ptr(v) as usize)).copied()
    }

    /// Runs the program again on its kept inputs: its outputs, counts and flag included.
    fn run(&self, rt: &Runtime) -> Result<Vec<Data>> {
        let inputs = self.inputs.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let outs = {
            let _one = crate::exec::one_at_a_time();
            super::locate::run(rt, &self.graph, &self.exe, &inputs)?
        };
        Counters::add(&COUNTERS.gradients_remade, 1);
        Ok(outs.into_iter().map(|b| Data::Device(DeviceValue::ready(b, 0))).collect())
    }
}

/// Of an update's `inputs`, those that `source` made (`made[i]`, its output index, as the plan found them): each
/// is let go here (a placeholder takes its place) and named in the returned [`Fed`]; `None` when there is none.
pub(crate) fn feed(source: &Arc<Source>, made: &[Option<usize>], inputs: &mut [Data]) -> Option<Fed> {
    let mut from = Vec::new();
    for (i, (input, &j)) in inputs.iter_mut().zip(made).enumerate() {
        if let Some(j) = j {
            from.push((i, j));
            *input = placeholder();
        }
    }
    (!from.is_empty()).then(|| Fed { source: source.clone(), from })
}

/// What stands for a fed input: no buffer, never read.
fn placeholder() -> Data {
    Data::Host(Arc::new(Vec::new()))
}

/// The inputs to run an update's locator on: `inputs`, with the fed ones made again.
pub(crate) fn inputs<'a>(rt: &Runtime, inputs: &'a [Data], fed: Option<&Fed>) -> Result<Cow<'a, [Data]>> {
    let Some(fed) = fed else { return Ok(Cow::Borrowed(inputs)) };
    let made = fed.source.run(rt)?;
    let mut all = inputs.to_vec();
    for &(i, j) in &fed.from {
        all[i] =
            made.get(j).cloned().ok_or_else(|| Error::Internal("a fed input past its program's outputs".into()))?;
    }
    Ok(Cow::Owned(all))
}

/// A weight's copy replaced by a pending one ([`note_copy`]): the old copy's value, and the nodes of the new copy and
/// of the new weight it converts.
struct ReplacedCopy {
    old: Weak<DeviceValue>,
    copy: NodeWeak<Node>,
    weight: NodeWeak<Node>,
}

thread_local! {
    /// Copies replaced on this thread whose new value no program has computed yet.
    static REPLACED: RefCell<Vec<ReplacedCopy>> = const { RefCell::new(Vec::new()) };
}

/// Note that `copy`, pending, converts the pending new value `weight` and replaces `old`, a weight's computed copy:
/// under `stop` with the split step (where the old copy is an input of the gradients' program only), so that the
/// program that computes `copy` lets kept inputs follow `old` to it ([`copies_replaced`]).
pub(crate) fn note_copy(old: &Node, copy: &Rc<Node>, weight: &Rc<Node>) {
    let Some(Data::Device(v)) = old.lock().data.clone() else { return };
    let entry = ReplacedCopy { old: Arc::downgrade(&v), copy: Rc::downgrade(copy), weight: Rc::downgrade(weight) };
    REPLACED.with(|r| r.borrow_mut().push(entry));
}

/// Of a guarded program's `targets`, the new copies noted by [`note_copy`] whose weight is a guarded output
/// (`guards`, `(input, output)` pairs): `(old copy, output index)`. On a trip the guard writes such a copy from the
/// kept weight, the old copy's value. Copies computed elsewhere, or no longer pending, are forgotten.
pub(crate) fn copies_replaced(targets: &[Rc<Node>], guards: &[(usize, usize)]) -> Vec<(Data, usize)> {
    REPLACED.with(|r| {
        let mut noted = r.borrow_mut();
        if noted.is_empty() {
            return Vec::new();
        }
        // The noted nodes' output indices, found in one pass over the targets (a step's update has hundreds; the
        // notes are a few per weight).
        let mut at: NodeMap<Option<usize>> =
            noted.iter().flat_map(|c| [(c.copy.as_ptr(), None), (c.weight.as_ptr(), None)]).collect();
        for (j, t) in targets.iter().enumerate() {
            if let Some(slot) = at.get_mut(&Rc::as_ptr(t)) {
                *slot = Some(j);
            }
        }
        let index = |node: *const Node| at.get(&node).copied().flatten();
        let mut guarded = vec![false; targets.len()];
        for &(_, o) in guards {
            guarded[o] = at.contains_key(&Rc::as_ptr(&targets[o]));
        }
        let mut pairs = Vec::new();
        noted.retain(|c| {
            let Some(copy) = c.copy.upgrade() else { return false };
            let (Some(j), Some(w)) = (index(c.copy.as_ptr()), index(c.weight.as_ptr())) else {
                return copy.is_pending();
            };
            if let (true, Some(old)) = (guarded[w], c.old.upgrade()) {
                Counters::add(&COUNTERS.copies_followed, 1);
                pairs.push((Data::Device(old), j));
            }
            false
        });
        pairs
    })
}

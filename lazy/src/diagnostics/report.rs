//! The analysis behind `lazuli-report`: read an event file, find graph breaks and recompiles, rank them by the
//! time they cost, attach advice, and render text, JSON or a Chrome/Perfetto trace.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::events::{Event, EventKind};
use super::explain::{DiffKind, Difference};

/// A call site that forced extra programs inside steps.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BreakSite {
    /// What materialized: `item`, `to_vec`, `display`, `host_control_flow`, …
    pub cause: String,
    /// `file:line` of the call that materialized.
    pub site: String,
    /// Extra programs it forced (one per step unless it runs several times a step).
    pub count: usize,
    /// Compile, execute and transfer time of the extra programs, in milliseconds.
    pub ms_lost: f64,
    /// The first step in which it broke the graph.
    pub first_step: u64,
    /// The steps in which it broke the graph, in order.
    pub steps: Vec<u64>,
    /// How to avoid the break.
    pub advice: String,
}

/// One cause of compiles after warm-up: a kind of change at the line that recorded it (the input, the loop's
/// first op, the constant), over every program it made new.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecompileSite {
    /// `input_type`, `loop_count`, `constant`, `op`, `outputs` or `new_graph`.
    pub kind: DiffKind,
    /// `file:line` of the cause.
    pub site: String,
    /// The materializations whose programs compiled, as `cause at file:line`.
    pub materialized_at: Vec<String>,
    /// Compiles it caused (alone or with other causes).
    pub count: usize,
    /// Their compile time; a compile with several causes is shared evenly among them.
    pub compile_ms: f64,
    /// The steps they happened in, in order.
    pub steps: Vec<u64>,
    /// The first compile's explanation, then how many compiles differed in other values.
    pub explanation: Vec<String>,
    /// Other causes of the same compiles, as `kind at file:line`.
    pub together_with: Vec<String>,
    /// How to avoid these compiles.
    pub advice: String,
}

/// What an event file says: totals, the graph breaks ranked by time lost, the recompiles grouped by cause, and the
/// custom kernels (`analyse`; `render` prints it, `lazuli-report` too).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Steps seen: the number of the step after the last step boundary (or the last event's step, if later).
    pub steps: u64,
    /// Programs run, checked or not.
    pub programs: usize,
    /// The most checked programs any one step ran.
    pub max_programs_per_step: usize,
    /// Steps that ran more than one checked program.
    pub steps_with_breaks: usize,
    /// Programs that were not cache hits (compiled or loaded from the persistent compile cache).
    pub compiles: usize,
    /// Compiles after the warm-up steps (checked programs only).
    pub recompiles: usize,
    /// Total compile (or load) time, in milliseconds.
    pub compile_ms: f64,
    /// Total launch time, in milliseconds.
    pub execute_ms: f64,
    /// Total transfer time of programs and reads, in milliseconds.
    pub transfer_ms: f64,
    /// Programs inside `unchecked` scopes, left out of the step accounting.
    pub unchecked_programs: usize,
    /// The graph breaks per cause and call site, the most time lost first.
    pub breaks: Vec<BreakSite>,
    /// The recompiles after warm-up, one entry per cause (kind and line).
    pub recompile_sites: Vec<RecompileSite>,
    /// Every custom kernel compiled, with the implementation it runs and why, once each.
    pub kernels: Vec<String>,
    /// Repeated structure in compiled programs (scan candidates), once each: where, and what scanning would save.
    pub repeats: Vec<String>,
    /// Steps whose outputs held non-finite values (`LAZULI_CHECK_FINITE`): the step and the first line of where
    /// it started, one entry per trip.
    pub non_finite: Vec<String>,
}

/// Parse JSON lines; a malformed line is an error naming its number.
pub fn parse(text: &str) -> Result<Vec<Event>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

fn break_advice(cause: &str) -> String {
    match cause {
        "item" | "to_vec" | "display" => "read the value after the step boundary (lazuli::sync()): the step's program then computes it and reading runs nothing".into(),
        "host_control_flow" => "an `if` on a tensor value waits for the device mid-step: decide on the device (cond.select(a, b)) or branch on a value read after the step boundary".into(),
        "checkpoint" => "save checkpoints right after lazuli::sync()".into(),
        "explicit" => "let the step boundary compute the tensor instead of materialize()".into(),
        "gradients" => "the gradients, launched before the optimizer's update (LAZULI_SPLIT_UPDATE)".into(),
        "graph_size" => "the graph grew too large without a step boundary and was compiled in pieces: call lazuli::sync() inside the loop that records it".into(),
        _ => "the step ran more than one program".into(),
    }
}

/// A recompile's causes; an event without them (written by an older lazuli) is one cause at its own line, of
/// the kind its explanation's words say.
fn causes_of(e: &Event) -> Vec<Difference> {
    if !e.differences.is_empty() {
        return e.differences.clone();
    }
    let text = e.explanation.join(" ");
    let kind = if e.explanation.is_empty() {
        DiffKind::NewGraph
    } else if text.contains("input") && text.contains(", before ") {
        DiffKind::InputType
    } else if text.contains("constant") {
        DiffKind::Constant
    } else {
        DiffKind::Op
    };
    let text = if e.explanation.is_empty() {
        vec!["no graph compiled before resembles it".to_string()]
    } else {
        e.explanation.clone()
    };
    vec![Difference { kind, site: e.site(), text }]
}

/// Group the recompiles by cause (kind and line), each with the materializations it hit and its other causes.
fn recompile_sites(recompiles: &[&Event]) -> Vec<RecompileSite> {
    let mut sites: BTreeMap<(DiffKind, String), (RecompileSite, Vec<String>)> = BTreeMap::new();
    for e in recompiles {
        let causes = causes_of(e);
        let names: Vec<String> = causes.iter().map(|d| format!("{} at {}", d.kind.label(), d.site)).collect();
        for (i, d) in causes.iter().enumerate() {
            let (r, texts) = sites.entry((d.kind, d.site.clone())).or_insert_with(|| {
                let r = RecompileSite {
                    kind: d.kind,
                    site: d.site.clone(),
                    materialized_at: Vec::new(),
                    count: 0,
                    compile_ms: 0.0,
                    steps: Vec::new(),
                    explanation: d.text.clone(),
                    together_with: Vec::new(),
                    advice: d.kind.advice().to_string(),
                };
                (r, Vec::new())
            });
            r.count += 1;
            r.compile_ms += e.compile_ms / causes.len() as f64;
            push_new(&mut r.steps, e.step);
            push_new(&mut r.materialized_at, format!("{} at {}", e.cause, e.site()));
            for (j, other) in names.iter().enumerate() {
                if j != i {
                    push_new(&mut r.together_with, other.clone());
                }
            }
            push_new(texts, d.text.join("\n"));
        }
    }
    let mut out: Vec<RecompileSite> = sites
        .into_values()
        .map(|(mut r, texts)| {
            // The others name other inputs or values; the cause and its line are the same.
            if texts.len() > 1 {
                r.explanation.push(format!("(shown for the first of {} compiles)", r.count));
            }
            r
        })
        .collect();
    out.sort_by(|a, b| b.compile_ms.total_cmp(&a.compile_ms));
    out
}

fn push_new<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

/// Steps as ranges: `0-9`, `4, 9`.
fn step_ranges(steps: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < steps.len() {
        let mut j = i;
        while j + 1 < steps.len() && steps[j + 1] == steps[j] + 1 {
            j += 1;
        }
        out.push(if j > i { format!("{}-{}", steps[i], steps[j]) } else { steps[i].to_string() });
        i = j + 1;
    }
    out.join(", ")
}

/// Analyse events.
pub fn analyse(events: &[Event]) -> Report {
    let programs: Vec<&Event> = events.iter().filter(|e| e.kind == EventKind::Program).collect();
    let checked: Vec<&Event> = programs.iter().copied().filter(|e| !e.unchecked).collect();
    let mut by_step: BTreeMap<u64, Vec<&Event>> = BTreeMap::new();
    for e in &checked {
        by_step.entry(e.step).or_default().push(e);
    }
    let mut breaks: BTreeMap<(String, String), BreakSite> = BTreeMap::new();
    let mut steps_with_breaks = 0;
    for (&step, progs) in &by_step {
        // The step boundary's programs: `sync`'s, and the gradients an optimizer launched before its update.
        let (boundary, others): (Vec<&Event>, Vec<&Event>) =
            progs.iter().partition(|e| e.cause == "sync" || e.cause == "gradients");
        let extra: &[&Event] = if boundary.is_empty() { &others[..others.len().saturating_sub(1)] } else { &others };
        if extra.is_empty() {
            continue;
        }
        steps_with_breaks += 1;
        for e in extra {
            let b = breaks.entry((e.cause.clone(), e.site())).or_insert_with(|| BreakSite {
                cause: e.cause.clone(),
                site: e.site(),
                count: 0,
                ms_lost: 0.0,
                first_step: step,
                steps: Vec::new(),
                advice: break_advice(&e.cause),
            });
            b.count += 1;
            push_new(&mut b.steps, step);
            b.ms_lost += e.total_ms();
        }
    }
    let mut breaks: Vec<BreakSite> = breaks.into_values().collect();
    breaks.sort_by(|a, b| b.ms_lost.total_cmp(&a.ms_lost));
    let recompiled: Vec<&Event> = checked.iter().copied().filter(|e| e.recompile).collect();
    let recompile_sites = recompile_sites(&recompiled);
    let mut kernels: Vec<String> = Vec::new();
    for k in programs.iter().flat_map(|e| &e.kernels) {
        if !kernels.contains(k) {
            kernels.push(k.clone());
        }
    }
    let mut repeats: Vec<String> = Vec::new();
    for r in programs.iter().flat_map(|e| &e.repeats) {
        push_new(&mut repeats, r.clone());
    }
    let last_step = events.iter().map(|e| e.step + u64::from(e.kind == EventKind::StepEnd)).max().unwrap_or(0);
    Report {
        steps: last_step,
        programs: programs.len(),
        max_programs_per_step: by_step.values().map(Vec::len).max().unwrap_or(0),
        steps_with_breaks,
        compiles: programs.iter().filter(|e| !e.cache_hit).count(),
        recompiles: checked.iter().filter(|e| e.recompile).count(),
        // From +0: a float sum of nothing is -0, which printed as "-0.0 ms".
        compile_ms: programs.iter().fold(0.0, |ms, e| ms + e.compile_ms),
        execute_ms: programs.iter().fold(0.0, |ms, e| ms + e.execute_ms),
        transfer_ms: events.iter().fold(0.0, |ms, e| ms + e.transfer_ms),
        unchecked_programs: programs.len() - checked.len(),
        breaks,
        recompile_sites,
        kernels,
        repeats,
        non_finite: non_finite(events),
    }
}

/// One line per trip of the finite check: its step and the report's line naming the first non-finite value, or
/// saying that the step was skipped.
fn non_finite(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == EventKind::NonFinite)
        .map(|e| {
            let line = |start: &str| e.explanation.iter().map(|l| l.trim()).find(|l| l.starts_with(start));
            let what = line("first non-finite value").or_else(|| line("skipped"));
            format!("step {} at {}: {}", e.step, e.site(), what.unwrap_or("not located"))
        })
        .collect()
}

/// The report as text for a terminal.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "steps: {}   programs: {} (at most {} in one step; {} step(s) with graph breaks)   compiles: {} ({} after warm-up)",
        r.steps, r.programs, r.max_programs_per_step, r.steps_with_breaks, r.compiles, r.recompiles
    );
    let _ = writeln!(
        s,
        "time: compile {:.1} ms | execute {:.1} ms | transfer {:.1} ms{}",
        r.compile_ms,
        r.execute_ms,
        r.transfer_ms,
        if r.unchecked_programs > 0 {
            format!("   ({} unchecked program(s) not counted)", r.unchecked_programs)
        } else {
            String::new()
        }
    );
    if !r.kernels.is_empty() {
        let _ = writeln!(s, "\ncustom kernels:");
        for k in &r.kernels {
            let _ = writeln!(s, "  {k}");
        }
    }
    if !r.repeats.is_empty() {
        let _ = writeln!(s, "\nrepeated structure (each copy compiled again; `lazuli::scan`, or `GptConfig::scan_blocks` for a GPT, compiles one body):");
        for line in &r.repeats {
            let _ = writeln!(s, "  {line}");
        }
    }
    if !r.non_finite.is_empty() {
        let _ = writeln!(s, "\nnon-finite values (LAZULI_CHECK_FINITE):");
        for line in &r.non_finite {
            let _ = writeln!(s, "  {line}");
        }
    }
    if r.breaks.is_empty() && r.recompile_sites.is_empty() {
        let _ = writeln!(s, "\nno graph breaks, no recompiles after warm-up");
        return s;
    }
    if !r.breaks.is_empty() {
        let _ = writeln!(s, "\ngraph breaks, by time lost:");
        for (i, b) in r.breaks.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {}. {} at {}: {} in {} step(s) (steps {}), {:.2} ms",
                i + 1,
                b.cause,
                b.site,
                if b.count == b.steps.len() {
                    "an extra program".to_string()
                } else {
                    format!("{} extra programs", b.count)
                },
                b.steps.len(),
                step_ranges(&b.steps),
                b.ms_lost
            );
            let _ = writeln!(s, "     fix: {}", b.advice);
        }
    }
    if !r.recompile_sites.is_empty() {
        let _ = writeln!(s, "\nrecompiles after warm-up, by cause and compile time:");
        for (i, c) in r.recompile_sites.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {}. {} at {}: {} compile(s) in step(s) {}, {:.1} ms",
                i + 1,
                c.kind.label(),
                c.site,
                c.count,
                step_ranges(&c.steps),
                c.compile_ms
            );
            for line in &c.explanation {
                let _ = writeln!(s, "     {line}");
            }
            let _ = writeln!(s, "     materialized at: {}", c.materialized_at.join(", "));
            if !c.together_with.is_empty() {
                let _ = writeln!(s, "     together with: {}", c.together_with.join(", "));
            }
            let _ = writeln!(s, "     fix: {}", c.advice);
        }
    }
    s
}

/// A Chrome/Perfetto trace (`{"traceEvents": [...]}`): uploads, compiles and executions of each program, reads,
/// and step boundaries on one timeline.
pub fn chrome_trace(events: &[Event]) -> serde_json::Value {
    use serde_json::json;
    let mut out = Vec::new();
    for e in events {
        let args = json!({"cause": e.cause, "site": e.site(), "step": e.step, "graph": e.graph_hash, "nodes": e.nodes, "cache_hit": e.cache_hit});
        let mut t = e.start_us;
        let mut span = |name: String, tid: u32, ms: f64| {
            if ms > 0.0 {
                out.push(
                    json!({"name": name, "ph": "X", "ts": t, "dur": ms * 1e3, "pid": 1, "tid": tid, "args": args}),
                );
                t += ms * 1e3;
            }
        };
        match e.kind {
            EventKind::Program => {
                span(format!("upload ({})", e.cause), 3, e.transfer_ms);
                span(format!("compile ({} at {})", e.cause, e.site()), 1, e.compile_ms);
                span(format!("execute ({} at {})", e.cause, e.site()), 2, e.execute_ms);
            }
            EventKind::Read => span(format!("read ({} at {})", e.cause, e.site()), 3, e.transfer_ms),
            EventKind::NonFinite => out.push(
                json!({"name": format!("non-finite values in step {}", e.step), "ph": "i", "s": "g", "ts": t, "pid": 1, "tid": 2}),
            ),
            EventKind::StepEnd => out.push(
                json!({"name": format!("end of step {}", e.step), "ph": "i", "s": "g", "ts": t, "pid": 1, "tid": 2}),
            ),
        }
    }
    for (tid, name) in [(1, "compile"), (2, "execute"), (3, "transfer")] {
        out.push(json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}));
    }
    json!({ "traceEvents": out, "displayTimeUnit": "ms" })
}

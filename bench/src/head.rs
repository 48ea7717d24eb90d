//! `lazuli-bench head`: where a waiting step's head goes, from the end of one step's last kernel to the start of the
//! next step's first. Two records on the host's wall clock are put side by side:
//! - the plugin's whole profile (`LAZULI_PROFILE_TRACE=file` with `gpu --profile`): its host spans (the launch
//!   call, XLA's thunks) and the device's kernels;
//! - the bench's own marks (`LAZULI_BENCH_MARKS=file`): when each step began, when its forward and backward were
//!   recorded, when `wait()` returned.
//!
//! The profiler slows some of the plugin's host work (its pageable copies to the device, by 0.3 ms each on an
//! H200's host), so a piece here can be longer than the same piece without it.

use std::io::Write;
use std::path::Path;

use lazuli_pjrt::{Event, Line, Trace};
use serde_json::{json, Value};

use crate::BenchResult;

/// One step's marks, in nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Marks {
    pub start: i128,
    pub forward: i128,
    pub backward: i128,
    /// When the step's `wait()` returned (pipelined steps have none).
    pub waited: Option<i128>,
}

/// Now, in nanoseconds since the Unix epoch.
pub fn wall_ns() -> i128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

/// Append `m` to the marks file `path` as one JSON line.
pub fn append(path: &Path, m: &Marks) -> BenchResult<()> {
    let ns = |t: i128| i64::try_from(t).unwrap_or(i64::MAX);
    let line = json!({"start": ns(m.start), "forward": ns(m.forward), "backward": ns(m.backward),
        "waited": m.waited.map(ns)});
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{line}")?;
    Ok(())
}

fn read_marks(text: &str) -> BenchResult<Vec<Marks>> {
    let ns = |v: &Value, k: &str| v[k].as_i64().map(i128::from).ok_or_else(|| format!("a mark without {k}: {v}"));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l)?;
            Ok(Marks {
                start: ns(&v, "start")?,
                forward: ns(&v, "forward")?,
                backward: ns(&v, "backward")?,
                waited: v["waited"].as_i64().map(i128::from),
            })
        })
        .collect()
}

/// One waiting step's head, in microseconds; `None` where the trace has no such span.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Head {
    /// The last kernel's end to `wait()` returning: the plugin's notice that the program finished.
    pub notice: Option<f64>,
    /// `wait()` returning to the next step's start (the loop's own work).
    pub between: Option<f64>,
    pub forward: f64,
    pub backward: f64,
    /// The backward recorded to the plugin's launch call: the optimizer's step up to its launch (the plan,
    /// uploads).
    pub to_launch: Option<f64>,
    /// The launch call to XLA's first thunk (its preparation: inputs, outputs, buffer allocations).
    pub preparing: Option<f64>,
    /// XLA's first thunk to the first kernel on the device.
    pub first_kernel: Option<f64>,
    /// The device idle, from the last kernel's end to the next step's first kernel.
    pub gap: Option<f64>,
}

/// Where spans and kernels start and end, in nanoseconds since the epoch.
struct Timeline {
    /// Kernels on the device's compute streams (not its copy streams), as (start, end), by start.
    kernels: Vec<(i128, i128)>,
    /// Starts of the plugin's launch calls.
    launches: Vec<i128>,
    /// Starts of XLA's thunk sequences.
    thunks: Vec<i128>,
}

/// Where an event of a trace line starts and ends, in nanoseconds since the epoch.
fn span_ns(line: &Line, e: &Event) -> (i128, i128) {
    let start_ps = i128::from(line.timestamp_ns) * 1000 + i128::from(e.offset_ps);
    (start_ps / 1000, (start_ps + i128::from(e.duration_ps)) / 1000)
}

impl Timeline {
    fn of(trace: &Trace) -> Timeline {
        let mut kernels: Vec<(i128, i128)> = trace
            .events_on("/device:")
            .filter(|(_, line, e)| {
                line.name.starts_with("Stream") && !line.name.contains("Memcpy") && e.duration_ps > 0
            })
            .map(|(_, line, e)| span_ns(line, e))
            .collect();
        kernels.sort_unstable();
        let starts = |what: &str| {
            let mut v: Vec<i128> = trace
                .events_on("/host:")
                .filter(|(_, _, e)| e.name.contains(what))
                .map(|(_, line, e)| span_ns(line, e).0)
                .collect();
            v.sort_unstable();
            v
        };
        Timeline { kernels, launches: starts("PJRT_LoadedExecutable_Execute"), thunks: starts("ExecuteThunks") }
    }

    fn first_after(v: &[i128], t: i128) -> Option<i128> {
        v.get(v.partition_point(|&x| x < t)).copied()
    }

    /// The latest end of the kernels that started before `t`.
    fn last_end_before(&self, t: i128) -> Option<i128> {
        let n = self.kernels.partition_point(|k| k.0 < t);
        self.kernels[..n].iter().map(|k| k.1).max()
    }

    fn first_kernel_after(&self, t: i128) -> Option<i128> {
        self.kernels.get(self.kernels.partition_point(|k| k.0 < t)).map(|k| k.0)
    }
}

/// The heads of the steps in `marks` that follow a waited step and lie inside the trace.
pub fn heads(trace: &Trace, marks: &[Marks]) -> Vec<Head> {
    let tl = Timeline::of(trace);
    let us = |a: i128, b: i128| (b - a) as f64 / 1e3;
    let mut out = Vec::new();
    for pair in marks.windows(2) {
        let (before, m) = (&pair[0], &pair[1]);
        let (Some(waited), Some(&(first_start, _))) = (before.waited, tl.kernels.first()) else { continue };
        // Steps the profiler did not see.
        if m.start < first_start || tl.kernels.last().is_some_and(|k| k.0 < m.backward) {
            continue;
        }
        let done = tl.last_end_before(m.start);
        let launch = Timeline::first_after(&tl.launches, m.backward);
        let thunks = launch.and_then(|l| Timeline::first_after(&tl.thunks, l));
        let first = tl.first_kernel_after(m.backward);
        out.push(Head {
            notice: done.map(|d| us(d, waited)),
            between: Some(us(waited, m.start)),
            forward: us(m.start, m.forward),
            backward: us(m.forward, m.backward),
            to_launch: launch.map(|l| us(m.backward, l)),
            preparing: launch.zip(thunks).map(|(l, t)| us(l, t)),
            first_kernel: thunks.zip(first).map(|(t, f)| us(t, f)),
            gap: done.zip(first).map(|(d, f)| us(d, f)),
        });
    }
    out
}

/// Every event of the trace (host spans, kernels, copies) that overlaps the window from `before_us` before a waited
/// step's last kernel ends to its `wait()` returning, for the `step`-th waited step: where the plugin's notice
/// goes. One line each, by start, in microseconds from the last kernel's end.
pub fn window(trace: &Trace, marks: &[Marks], step: usize, before_us: i128) -> Vec<String> {
    let tl = Timeline::of(trace);
    let waited: Vec<(i128, i128)> = marks
        .windows(2)
        .filter_map(|p| Some((tl.last_end_before(p[1].start)?, p[0].waited?)))
        .filter(|&(done, waited)| waited > done)
        .collect();
    let Some(&(done, waited)) = waited.get(step) else { return Vec::new() };
    let mut events: Vec<(i128, i128, String)> = trace
        .planes
        .iter()
        .flat_map(|plane| plane.lines.iter().map(move |line| (plane, line)))
        .flat_map(|(plane, line)| {
            line.events.iter().map(move |e| {
                let (start, end) = span_ns(line, e);
                (start, end, format!("{} | {} | {}", plane.name, line.name, e.name))
            })
        })
        .filter(|&(start, end, _)| end >= done - before_us * 1000 && start <= waited)
        .collect();
    events.sort();
    let us = |t: i128| (t - done) as f64 / 1e3;
    let mut out =
        vec![format!("waited step {step}: `wait()` returned {:.0} µs after the last kernel ended", us(waited))];
    out.extend(
        events.iter().map(|(s, e, name)| format!("{:>9.1} µs +{:>8.1} µs  {name}", us(*s), (e - s) as f64 / 1e3)),
    );
    out
}

/// One piece of a head, read from it.
type Piece = fn(&Head) -> Option<f64>;

/// `lazuli-bench head --trace FILE --marks FILE`: each piece's median and range over the waited steps.
pub fn report(trace: &Path, marks: &Path, window_of: Option<usize>) -> BenchResult<()> {
    let trace = Trace::decode(&std::fs::read(trace)?)?;
    let marks = read_marks(&std::fs::read_to_string(marks)?)?;
    if let Some(step) = window_of {
        window(&trace, &marks, step, 50).iter().for_each(|l| println!("{l}"));
        return Ok(());
    }
    let heads = heads(&trace, &marks);
    if heads.is_empty() {
        return Err(
            "no waited step inside the trace (profile a waiting run: `gpu --profile` without --pipelined)".into()
        );
    }
    println!("{} waited steps; µs, median (min–max)\n", heads.len());
    println!("| piece | µs |\n|---|---|");
    let pieces: [(&str, Piece); 9] = [
        ("the device done → `wait()` returns (the plugin's notice)", |h| h.notice),
        ("`wait()` returns → the next step starts", |h| h.between),
        ("recording the forward", |h| Some(h.forward)),
        ("recording the backward", |h| Some(h.backward)),
        ("the backward recorded → the plugin's launch call", |h| h.to_launch),
        ("the launch call → XLA's first thunk", |h| h.preparing),
        ("that thunk → the first kernel on the device", |h| h.first_kernel),
        ("the device idle between the steps", |h| h.gap),
        ("of it, not lazuli's own (the notice and the two after the launch call)", |h| {
            Some(h.notice? + h.preparing? + h.first_kernel?)
        }),
    ];
    for (name, piece) in pieces {
        let v: Vec<f64> = heads.iter().filter_map(piece).collect();
        let cell = if v.is_empty() {
            "–".to_string()
        } else {
            let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            format!("{:.0} ({lo:.0}–{hi:.0})", crate::stats::median(&v))
        };
        println!("| {name} | {cell} |");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazuli_pjrt::Plane;

    /// A span or kernel starting `start_us` after the line's time, lasting `us`.
    fn event(name: &str, start_us: i64, us: i64) -> Event {
        Event { name: name.into(), offset_ps: start_us * 1_000_000, duration_ps: us * 1_000_000, stats: Vec::new() }
    }

    #[test]
    fn a_waited_steps_head_is_split_at_the_spans_and_kernels() {
        const T0: i64 = 1_764_600_000_000_000_000; // ns since the epoch
        let host = Plane {
            name: "/host:CPU".into(),
            lines: vec![Line {
                name: "main".into(),
                timestamp_ns: T0,
                events: vec![
                    event("PJRT_LoadedExecutable_Execute", 1_700, 3_000),
                    event("[0] GpuExecutable::ExecuteThunks", 1_850, 2_800),
                ],
            }],
        };
        let device = Plane {
            name: "/device:GPU:0".into(),
            lines: vec![
                Line {
                    name: "Stream #14(Compute,Memset)".into(),
                    timestamp_ns: T0,
                    events: vec![event("update", 0, 1_000), event("matmul", 1_900, 50)],
                },
                // A copy stream's event is not a kernel of the step.
                Line {
                    name: "Stream #15(MemcpyH2D)".into(),
                    timestamp_ns: T0,
                    events: vec![event("MemcpyH2D", 1_600, 4)],
                },
            ],
        };
        let trace = Trace { planes: vec![host, device] };
        let us = |x: i64| i128::from(T0) + i128::from(x) * 1000;
        let marks = [
            Marks { start: us(-16_000), forward: us(-15_700), backward: us(-15_400), waited: Some(us(1_100)) },
            Marks { start: us(1_110), forward: us(1_310), backward: us(1_510), waited: Some(us(17_000)) },
        ];
        let heads = heads(&trace, &marks);
        let want = Head {
            notice: Some(100.0),
            between: Some(10.0),
            forward: 200.0,
            backward: 200.0,
            to_launch: Some(190.0),
            preparing: Some(150.0),
            first_kernel: Some(50.0),
            gap: Some(900.0),
        };
        assert_eq!(heads, [want]);
        // The notice's window: the kernel ending at its start, nothing after `wait()` returned.
        let lines = window(&trace, &marks, 0, 50);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("100 µs after the last kernel"), "{lines:?}");
        assert!(lines[1].contains("-1000.0 µs") && lines[1].ends_with("| update"), "{lines:?}");
        assert!(window(&trace, &marks, 1, 50).is_empty(), "one waited step only");
        // The first step follows no waited step inside the trace; a pipelined one (no `waited`) has no head.
        let pipelined = [Marks { waited: None, ..marks[0] }, marks[1]];
        assert!(super::heads(&trace, &pipelined).is_empty());
    }

    #[test]
    fn marks_survive_their_file() {
        let dir = std::env::temp_dir().join(format!("lazuli-head-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("marks.jsonl");
        let m = Marks {
            start: 1_764_600_000_123_456_789,
            forward: 1_764_600_000_123_556_789,
            backward: 1_764_600_000_123_656_789,
            waited: None,
        };
        append(&path, &m).unwrap();
        append(&path, &Marks { waited: Some(m.backward + 5_000), ..m }).unwrap();
        let back = read_marks(&std::fs::read_to_string(&path).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back, [m, Marks { waited: Some(m.backward + 5_000), ..m }]);
    }
}

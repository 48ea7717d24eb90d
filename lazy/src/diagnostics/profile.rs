//! Where a step's device time goes: the kernels XLA ran, read from the plugin's profiler (`exec::profile`) or
//! from any profiler `XSpace` (JAX's `*.xplane.pb` files too, so both sides of a benchmark are read alike).
//!
//! Kernels are grouped by family (XLA's fusion name without its numeric suffix: `loop_add_fusion_12` and
//! `loop_add_fusion_31` are one row) and by kind, a coarse class read from the name (matmul, attention,
//! normalization, elementwise, reduction, copy, other), which is what decides where a fused kernel would pay.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use lazuli_pjrt::Trace;

/// A coarse class of kernel, read from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelKind {
    /// cuBLAS/cuBLASLt GEMMs and XLA's Triton GEMM fusions.
    Matmul,
    /// cuDNN or Triton flash attention.
    Attention,
    /// Row-wise fusions XLA gives to Triton (softmax, layer norm and their neighbours).
    Normalization,
    /// XLA's loop fusions: elementwise work, conversions, broadcasts, optimizer updates.
    Elementwise,
    /// XLA's reduction fusions.
    Reduction,
    /// Copies, transposes, memsets.
    Copy,
    Other,
}

impl KernelKind {
    /// Reads the kind from a kernel's name as XLA's GPU backend and its libraries spell them.
    pub fn of(name: &str) -> KernelKind {
        let n = name.to_ascii_lowercase();
        let has = |words: &[&str]| words.iter().any(|w| n.contains(w));
        if has(&["sdpa", "fmha", "flash", "cudnn", "attention"]) {
            KernelKind::Attention
        } else if has(&["gemm", "xmma", "nvjet", "cutlass", "gemv", "matmul"]) || n.starts_with("dot") {
            KernelKind::Matmul
        } else if has(&["softmax", "norm"]) {
            KernelKind::Normalization
        } else if has(&["memcpy", "memset", "copy", "transpose"]) {
            KernelKind::Copy
        } else if has(&["reduce", "reduction"]) {
            KernelKind::Reduction
        } else if n.starts_with("loop_") || has(&["fusion", "elementwise"]) {
            KernelKind::Elementwise
        } else {
            KernelKind::Other
        }
    }

    fn label(self) -> &'static str {
        match self {
            KernelKind::Matmul => "matmul",
            KernelKind::Attention => "attention",
            KernelKind::Normalization => "normalization",
            KernelKind::Elementwise => "elementwise",
            KernelKind::Reduction => "reduction",
            KernelKind::Copy => "copy",
            KernelKind::Other => "other",
        }
    }
}

impl fmt::Display for KernelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One family of kernels: its launches and their summed device time.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The family: the kernel's name without a trailing numeric suffix.
    pub family: String,
    pub kind: KernelKind,
    pub launches: usize,
    pub time: Duration,
    /// The device's idle time right before this family's launches (from the previous kernel's end, gaps under
    /// a millisecond): where the device waited for the host to launch it rather than for a kernel to finish.
    pub idle_before: Duration,
    /// The XLA instructions that launched them (the trace's `hlo_op`), most launches first: a library kernel or a
    /// memset is named by the instruction it serves.
    pub ops: Vec<(String, usize)>,
}

/// The device time of what ran while a profile was recorded, by kernel family and by kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceProfile {
    /// Families, longest total time first.
    pub kernels: Vec<KernelTime>,
    /// Sum of every kernel's duration.
    pub busy: Duration,
    /// From the first kernel's start to the last one's end (busy time plus gaps), over all devices.
    pub span: Duration,
    /// Steps the profile covers; figures are shown per step.
    pub steps: usize,
    /// The last step's share of launches (the last `launches / steps`), in order: what ran between what.
    pub last_step: Vec<Launch>,
}

/// One kernel launch of [`DeviceProfile::last_step`].
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub name: String,
    /// The XLA instruction that launched it, where the trace says.
    pub op: String,
    /// From the first of these launches' start.
    pub start: Duration,
    pub duration: Duration,
    /// The device's idle time right before it.
    pub idle_before: Duration,
}

impl DeviceProfile {
    /// The kernels on the trace's device planes (`/device:GPU:0`, `/device:TPU:0`, …); host planes are skipped.
    pub fn from_trace(trace: &Trace, steps: usize) -> DeviceProfile {
        let steps = steps.max(1);
        let mut launches = launches(trace);
        let first = launches.first().map_or(0, |l| l.0);
        let last =
            launches.iter().map(|(start, l)| start + l.duration.as_nanos() as i128 * 1000).max().unwrap_or(first);
        let span = picos(i64::try_from(last - first).unwrap_or(i64::MAX));
        let kernels = families(&launches);
        let busy = launches.iter().map(|(_, l)| l.duration).sum();
        let mut last_step: Vec<Launch> =
            launches.split_off(launches.len() - launches.len() / steps).into_iter().map(|(_, l)| l).collect();
        let from = last_step.first().map_or(Duration::ZERO, |l| l.start);
        last_step.iter_mut().for_each(|l| l.start -= from);
        DeviceProfile { kernels, busy, span, steps, last_step }
    }

    /// The kernels of a serialized `XSpace` (what `jax.profiler` writes as `*.xplane.pb`).
    pub fn from_xspace(bytes: &[u8], steps: usize) -> Result<DeviceProfile, lazuli_pjrt::TraceError> {
        Ok(DeviceProfile::from_trace(&Trace::decode(bytes)?, steps))
    }

    /// Total time and launches per kind, longest first.
    pub fn by_kind(&self) -> Vec<(KernelKind, Duration, usize)> {
        let mut kinds: HashMap<KernelKind, (Duration, usize)> = HashMap::new();
        for k in &self.kernels {
            let e = kinds.entry(k.kind).or_default();
            e.0 += k.time;
            e.1 += k.launches;
        }
        let mut out: Vec<_> = kinds.into_iter().map(|(k, (t, n))| (k, t, n)).collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// Kernel launches in the profile.
    pub fn launches(&self) -> usize {
        self.kernels.iter().map(|k| k.launches).sum()
    }

    fn per_step_ms(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e3 / self.steps as f64
    }
}

/// Every kernel launch on the trace's device stream lines in start order, with its absolute start in picoseconds
/// (beyond an i64: times since the epoch), `start` from the first launch, and the device's idle time before it.
fn launches(trace: &Trace) -> Vec<(i128, Launch)> {
    let mut out: Vec<(i128, Launch)> = trace
        .events_on("/device:")
        .filter(|(_, line, event)| event.duration_ps > 0 && is_kernel_line(&line.name))
        .map(|(_, line, event)| {
            let start = i128::from(line.timestamp_ns) * 1000 + i128::from(event.offset_ps);
            let op = event.stat("hlo_op").or_else(|| event.stat("tf_op")).unwrap_or("").to_string();
            let duration = picos(event.duration_ps);
            (
                start,
                Launch { name: event.name.clone(), op, start: Duration::ZERO, duration, idle_before: Duration::ZERO },
            )
        })
        .collect();
    out.sort_by_key(|l| l.0);
    let first = out.first().map_or(0, |l| l.0);
    let mut end: Option<i128> = None;
    for (start, l) in &mut out {
        l.start = picos(i64::try_from(*start - first).unwrap_or(i64::MAX));
        // A gap of a millisecond or more is the host between steps, not a launch that came late.
        let gap = end.map_or(0, |end| *start - end);
        if gap > 0 && gap < 1_000_000_000 {
            l.idle_before = picos(gap as i64);
        }
        let finish = *start + i128::from(l.duration.as_nanos() as i64) * 1000;
        end = Some(end.map_or(finish, |end| end.max(finish)));
    }
    out
}

/// The launches grouped by family, longest total time first, each family's instructions most launches first.
fn families(launches: &[(i128, Launch)]) -> Vec<KernelTime> {
    let mut families: HashMap<String, (KernelTime, HashMap<&str, usize>)> = HashMap::new();
    for (_, l) in launches {
        let family = family(&l.name);
        let (k, ops) = families.entry(family.clone()).or_insert_with(|| {
            let k = KernelTime {
                kind: KernelKind::of(&l.name),
                family,
                launches: 0,
                time: Duration::ZERO,
                idle_before: Duration::ZERO,
                ops: Vec::new(),
            };
            (k, HashMap::new())
        });
        k.launches += 1;
        k.time += l.duration;
        k.idle_before += l.idle_before;
        if !l.op.is_empty() {
            *ops.entry(&l.op).or_default() += 1;
        }
    }
    let mut kernels: Vec<KernelTime> = families
        .into_values()
        .map(|(mut k, ops)| {
            k.ops = ops.into_iter().map(|(op, n)| (op.to_string(), n)).collect();
            k.ops.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            k
        })
        .collect();
    kernels.sort_by(|a, b| b.time.cmp(&a.time).then_with(|| a.family.cmp(&b.family)));
    kernels
}

/// Stream lines hold a GPU's kernels; a device plane's other lines are derived views (XLA ops, modules, steps)
/// that repeat the same time.
fn is_kernel_line(name: &str) -> bool {
    name.starts_with("Stream")
}

fn picos(ps: i64) -> Duration {
    Duration::from_nanos((ps.max(0) / 1000) as u64)
}

/// `loop_add_fusion_12` → `loop_add_fusion`; `gemm_fusion_dot.3` → `gemm_fusion_dot`; library kernels keep
/// their (long) names.
fn family(name: &str) -> String {
    let trimmed = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if trimmed.len() < name.len() && (trimmed.ends_with('_') || trimmed.ends_with('.')) {
        trimmed[..trimmed.len() - 1].to_string()
    } else {
        name.to_string()
    }
}

impl fmt::Display for DeviceProfile {
    /// Per step: the kinds, then the families (see below).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let busy = self.per_step_ms(self.busy);
        writeln!(
            f,
            "device time per step: {busy:.2} ms busy in {:.0} kernel launches, {:.2} ms from first start to last end",
            self.launches() as f64 / self.steps as f64,
            self.per_step_ms(self.span)
        )?;
        writeln!(f, "{:<14} {:>9} {:>6} {:>9}", "kind", "ms/step", "share", "launches")?;
        for (kind, time, launches) in self.by_kind() {
            let ms = self.per_step_ms(time);
            let share = if busy > 0.0 { 100.0 * ms / busy } else { 0.0 };
            writeln!(f, "{:<14} {ms:>9.3} {share:>5.1}% {:>9.0}", kind.label(), launches as f64 / self.steps as f64)?;
        }
        let idle: Duration = self.kernels.iter().map(|k| k.idle_before).sum();
        writeln!(f, "idle between kernels (gaps under 1 ms): {:.3} ms/step", self.per_step_ms(idle))?;
        // `{:#}` lists every family; `{}` the twenty longest, then the twenty the device waited longest before.
        let mut waited: Vec<&KernelTime> = self.kernels.iter().filter(|k| !k.idle_before.is_zero()).collect();
        waited.sort_by_key(|k| std::cmp::Reverse(k.idle_before));
        let lists: Vec<(&str, Vec<&KernelTime>)> = if f.alternate() {
            vec![("kernel family", self.kernels.iter().collect())]
        } else {
            vec![
                ("kernel family", self.kernels.iter().take(20).collect()),
                ("kernel family (longest idle before)", waited.into_iter().take(20).collect()),
            ]
        };
        for (title, list) in lists {
            writeln!(f, "{title:<60} {:<14} {:>9} {:>9} {:>11}", "kind", "ms/step", "launches", "idle before")?;
            for k in list {
                let name: String = k.family.chars().take(60).collect();
                writeln!(
                    f,
                    "{name:<60} {:<14} {:>9.3} {:>9.0} {:>11.3}",
                    k.kind.label(),
                    self.per_step_ms(k.time),
                    k.launches as f64 / self.steps as f64,
                    self.per_step_ms(k.idle_before)
                )?;
                if f.alternate() && !k.ops.is_empty() {
                    let named: Vec<String> = k.ops.iter().take(12).map(|(op, n)| format!("{op} x{n}")).collect();
                    writeln!(f, "    from: {}{}", named.join(", "), if k.ops.len() > 12 { ", ..." } else { "" })?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazuli_pjrt::{Event, Line, Plane};

    fn kernel(name: &str, offset_ps: i64, duration_ps: i64) -> Event {
        Event { name: name.into(), offset_ps, duration_ps, stats: vec![] }
    }

    #[test]
    fn kinds_follow_xla_and_library_names() {
        assert_eq!(KernelKind::of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), KernelKind::Matmul);
        assert_eq!(KernelKind::of("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT"), KernelKind::Matmul);
        assert_eq!(KernelKind::of("gemm_fusion_dot_12"), KernelKind::Matmul);
        assert_eq!(KernelKind::of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop"), KernelKind::Attention);
        assert_eq!(KernelKind::of("triton_softmax_3"), KernelKind::Normalization);
        assert_eq!(KernelKind::of("loop_add_fusion_7"), KernelKind::Elementwise);
        assert_eq!(KernelKind::of("input_reduce_fusion_2"), KernelKind::Reduction);
        assert_eq!(KernelKind::of("loop_transpose_fusion"), KernelKind::Copy);
        assert_eq!(KernelKind::of("MemcpyD2D"), KernelKind::Copy);
    }

    #[test]
    fn families_sum_their_launches_and_only_stream_lines_count() {
        let stream = Line {
            name: "Stream #14(compute)".into(),
            timestamp_ns: 1_764_600_000_000_000_000, // an absolute time, as the CUDA plugin writes it
            events: vec![
                kernel("loop_add_fusion_1", 0, 2_000_000),
                kernel("loop_add_fusion_2", 3_000_000, 1_000_000),
                Event {
                    stats: vec![("hlo_op".into(), "dot.7".into())],
                    ..kernel("gemm_fusion_dot.4", 5_000_000, 6_000_000)
                },
            ],
        };
        let derived =
            Line { name: "XLA Modules".into(), timestamp_ns: 0, events: vec![kernel("jit_step", 0, 11_000_000)] };
        let host = Plane { name: "/host:CPU".into(), lines: vec![stream.clone()] };
        let gpu = Plane { name: "/device:GPU:0".into(), lines: vec![stream, derived] };
        let p = DeviceProfile::from_trace(&Trace { planes: vec![host, gpu] }, 2);
        assert_eq!(p.busy, Duration::from_micros(9));
        assert_eq!(p.span, Duration::from_micros(11));
        assert_eq!(p.launches(), 3);
        assert_eq!(p.kernels[0].family, "gemm_fusion_dot");
        assert_eq!((p.kernels[1].family.as_str(), p.kernels[1].launches), ("loop_add_fusion", 2));
        assert_eq!(p.by_kind()[0], (KernelKind::Matmul, Duration::from_micros(6), 1));
        // The device idled 1 µs before the second add and 1 µs before the GEMM; nothing before the first kernel.
        assert_eq!(p.kernels[0].idle_before, Duration::from_micros(1));
        assert_eq!(p.kernels[1].idle_before, Duration::from_micros(1));
        let text = p.to_string();
        assert!(text.starts_with("device time per step: 0.00 ms busy in 2 kernel launches"), "{text}");
        assert!(text.contains("elementwise"), "{text}");
        assert!(text.contains("idle between kernels (gaps under 1 ms): 0.001 ms/step"), "{text}");
        // The instruction behind each family, listed with every family.
        assert_eq!(p.kernels[0].ops, vec![("dot.7".to_string(), 1)]);
        assert!(p.kernels[1].ops.is_empty());
        // Three launches over two steps: the last step's share is the last launch, timed from its own start.
        let order: Vec<(&str, &str, u64, u64)> = p
            .last_step
            .iter()
            .map(|l| (l.name.as_str(), l.op.as_str(), l.start.as_nanos() as u64, l.idle_before.as_nanos() as u64))
            .collect();
        assert_eq!(order, vec![("gemm_fusion_dot.4", "dot.7", 0, 1000)]);
        assert!(format!("{p:#}").contains("    from: dot.7 x1\n"), "{p:#}");
    }
}

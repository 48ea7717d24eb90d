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
}

impl DeviceProfile {
    /// The kernels on the trace's device planes (`/device:GPU:0`, `/device:TPU:0`, …); host planes are skipped.
    pub fn from_trace(trace: &Trace, steps: usize) -> DeviceProfile {
        let mut families: HashMap<String, KernelTime> = HashMap::new();
        let mut busy_ps = 0i64;
        // Absolute picoseconds since the epoch overflow an i64.
        let (mut first, mut last) = (i128::MAX, i128::MIN);
        for (_, line, event) in trace.events_on("/device:") {
            if event.duration_ps <= 0 || !is_kernel_line(&line.name) {
                continue;
            }
            busy_ps += event.duration_ps;
            let start = i128::from(line.timestamp_ns) * 1000 + i128::from(event.offset_ps);
            first = first.min(start);
            last = last.max(start + i128::from(event.duration_ps));
            let family = family(&event.name);
            let entry = families.entry(family.clone()).or_insert_with(|| KernelTime {
                kind: KernelKind::of(&event.name),
                family,
                launches: 0,
                time: Duration::ZERO,
            });
            entry.launches += 1;
            entry.time += picos(event.duration_ps);
        }
        let mut kernels: Vec<KernelTime> = families.into_values().collect();
        kernels.sort_by(|a, b| b.time.cmp(&a.time).then_with(|| a.family.cmp(&b.family)));
        let span = if last > first { picos(i64::try_from(last - first).unwrap_or(i64::MAX)) } else { Duration::ZERO };
        DeviceProfile { kernels, busy: picos(busy_ps), span, steps: steps.max(1) }
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
    /// Per step: the kinds, then the twenty longest families.
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
        writeln!(f, "{:<60} {:<14} {:>9} {:>9}", "kernel family", "kind", "ms/step", "launches")?;
        for k in self.kernels.iter().take(20) {
            let name: String = k.family.chars().take(60).collect();
            writeln!(
                f,
                "{name:<60} {:<14} {:>9.3} {:>9.0}",
                k.kind.label(),
                self.per_step_ms(k.time),
                k.launches as f64 / self.steps as f64
            )?;
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
                kernel("gemm_fusion_dot.4", 5_000_000, 6_000_000),
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
        let text = p.to_string();
        assert!(text.starts_with("device time per step: 0.00 ms busy in 2 kernel launches"), "{text}");
        assert!(text.contains("elementwise"), "{text}");
    }
}

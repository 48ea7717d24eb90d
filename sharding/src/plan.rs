//! The sharding planner: for a training step's parameters, a device count and a per-device memory limit, cost the
//! standard plans — data parallel, parameter-sharded data parallel (FSDP / ZeRO-3), Megatron tensor parallel, and
//! their 2-D mix — and pick the fastest that fits. Every number it uses is printed, so the choice can be read and
//! overridden.

use std::fmt::{self, Write};

use crate::PartitionSpec;

/// What a parameter does in a Megatron split: a column-parallel layer splits its output features, the row-parallel
/// layer after it splits its input features (so the pair needs one all-reduce).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `[in, out]` weight (or `[out]` bias) of a layer whose outputs are split: q/k/v, MLP up-projection.
    Column,
    /// `[in, out]` weight of a layer whose inputs are split: attention output, MLP down-projection.
    Row,
    /// `[vocab, d]` embedding table.
    Embedding,
    /// Everything else (norms, row-layer biases): small, replicated under tensor parallelism.
    Other,
}

/// One parameter as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamInfo {
    /// Its dotted name (`blocks.0.attn.qkv.weight`).
    pub name: String,
    /// Its dimensions.
    pub shape: Vec<usize>,
    /// Bytes per element of its dtype.
    pub bytes_per_element: usize,
    /// What kind of weight it is, which decides how each plan splits it.
    pub role: Role,
}

impl ParamInfo {
    /// Its size in bytes.
    pub fn bytes(&self) -> f64 {
        (self.shape.iter().product::<usize>() * self.bytes_per_element) as f64
    }
}

/// Speeds of one device and its links, for the cost model. A step's estimate is compute (matmul FLOPs, plus the
/// bytes of elementwise work and of the optimizer update, per device) + communication (bytes over the link) +
/// latency (a fixed cost per collective).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceModel {
    /// Matmul FLOP/s of one device, or of one core when the devices share a host's cores.
    pub flops_per_s: f64,
    /// Bytes/s of elementwise work (counted as the bytes of the recorded ops' results) of one device or core.
    pub bytes_per_s: f64,
    /// Bytes per second one device sends or receives in a collective (measured with every device taking part).
    pub link_bytes_per_s: f64,
    /// Fixed cost of one collective (launch, synchronisation).
    pub collective_latency_s: f64,
    /// `Some(cores)`: the devices are threads sharing this many cores (virtual CPU devices), so the work of all
    /// devices together runs `cores` at a time: work a plan replicates costs wall time. `None`: independent devices.
    pub shared_cores: Option<usize>,
}

impl DeviceModel {
    /// Virtual CPU devices sharing the 2 cores of the machine the numbers were measured on (2026-11-29, medians of
    /// four runs of `cargo run --release --example planner_calibration -- --devices 8`; in
    /// docs/perf-log/2026-11-29-planner-virtual-cpu.md):
    /// - flops_per_s: chained `[256,128]x[128,512]` and `[256,512]x[512,128]` matmuls on each of 8 devices at once,
    ///   total FLOPs / wall time / 2 cores (1.06e11..1.09e11).
    /// - bytes_per_s: layer norm, GELU, softmax and residual adds on `[256,512]` rows per device, forward and
    ///   backward; 3x the forward's recorded result bytes (the planner's count) / wall time / 2 cores
    ///   (1.06e10..1.33e10). Counted before fusion, so it is not a memory bandwidth.
    /// - link_bytes_per_s, collective_latency_s: chains of all-reduces over 8 devices at 4 KiB and 1 MiB, minus the
    ///   same chains without them; ring bytes per device over time (9.4e8..9.8e8), intercept (1.8e-4..1.9e-4 s).
    pub const CPU: DeviceModel = DeviceModel {
        flops_per_s: 1.08e11,
        bytes_per_s: 1.25e10,
        link_bytes_per_s: 9.5e8,
        collective_latency_s: 1.8e-4,
        shared_cores: Some(2),
    };
    /// H200s with NVLink, independent devices, measured on two (2026-11-29, `LAZULI_DEVICE=gpu planner_calibration
    /// --devices 2 --rows 8192 --dim 768 --param-mib 64`, medians of 7; the run is in
    /// docs/perf-log/2026-11-29-sharded-two-h200s.md):
    /// - flops_per_s: f32 matmuls of a GPT-2-small MLP on 8,192 tokens per device (XLA's default f32 precision;
    ///   the data sheet's dense bf16 peak is 9.9e14).
    /// - bytes_per_s: the CPU model's elementwise block at that size, counted before fusion as the planner counts
    ///   (so above the HBM bandwidth of 4.8e12: XLA fuses what the planner counts separately).
    /// - link_bytes_per_s, collective_latency_s: all-reduces of 4 KiB and 64 MiB per device, as on the CPU.
    pub const H200: DeviceModel = DeviceModel {
        flops_per_s: 3.52e14,
        bytes_per_s: 1.11e13,
        link_bytes_per_s: 3.15e11,
        collective_latency_s: 1.8e-5,
        shared_cores: None,
    };

    /// Wall time of `per_device` seconds of work on each of `devices` devices.
    fn wall(&self, per_device: f64, devices: usize) -> f64 {
        match self.shared_cores {
            Some(cores) => per_device * devices as f64 / devices.min(cores).max(1) as f64,
            None => per_device,
        }
    }
}

/// The work of one device in one step under a candidate's placements.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Work {
    /// Matmul FLOPs (forward and backward).
    pub matmul_flops: f64,
    /// Bytes of the results of all other ops (forward and backward), as recorded, before XLA fuses them.
    pub elementwise_bytes: f64,
    /// Bytes of the forward results the backward pass reads (kept between the two).
    pub saved_bytes: f64,
}

/// The training step as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct StepInfo {
    /// Every parameter of the model.
    pub params: Vec<ParamInfo>,
    /// Matmul FLOPs of one whole step (forward and backward) on one device.
    pub flops: f64,
    /// Bytes of the results of every other op of one whole step on one device, as recorded (before fusion).
    pub elementwise_bytes: f64,
    /// Bytes of activations kept for the backward pass (forward results its gradient rules read), whole batch.
    pub activation_bytes: f64,
    /// Bytes of one activation tensor crossing a Megatron all-reduce ([batch·seq, d]), whole batch.
    pub boundary_bytes: f64,
    /// How many column/row pairs (all-reduces per forward pass under tensor parallelism).
    pub tp_pairs: usize,
    /// Batch size (the data axis must divide it).
    pub batch: usize,
    /// Optimizer state per parameter byte (AdamW: 2, SGD with momentum: 1).
    pub optimizer_state_factor: f64,
    /// Cost of the optimizer update per parameter byte a device holds, in bytes of elementwise work
    /// (`DeviceModel::bytes_per_s`); every device updates its own copy or shard.
    pub update_traffic: f64,
}

impl StepInfo {
    /// AdamW's update costs as much as this many bytes of elementwise work per parameter byte: measured by
    /// `planner_calibration` on a replicated 4 MiB parameter on 8 virtual devices (the step with the update minus
    /// the step without, in units of `DeviceModel::CPU.bytes_per_s`; 1.9..2.4, median 2.0). XLA fuses the whole
    /// update into about one pass over parameter, gradient and moments.
    pub const ADAMW_UPDATE_TRAFFIC: f64 = 2.0;
}

/// A candidate plan: its mesh, its placements and its estimated costs per device and step.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The plan's name: `dp`, `fsdp`, `tp` or `2d`.
    pub name: &'static str,
    /// Its mesh's axes and sizes.
    pub mesh: Vec<(String, usize)>,
    /// One device's work, and the wall time of all devices' work (over the shared cores, if shared).
    pub work: Work,
    /// Bytes of elementwise work of the optimizer update on one device.
    pub update_bytes: f64,
    /// Estimated matmul time per step, in seconds.
    pub matmul_s: f64,
    /// Estimated time of the other ops per step, in seconds.
    pub elementwise_s: f64,
    /// Estimated optimizer update time per step, in seconds.
    pub update_s: f64,
    /// Bytes one device sends over its links per step.
    pub comm_bytes: f64,
    /// Transfer time of the collectives' bytes.
    pub comm_s: f64,
    /// Collectives per step.
    pub collectives: f64,
    /// Their fixed latency per step, in seconds.
    pub latency_s: f64,
    /// Memory per device: weights, gradients, optimizer state and the activations kept for the backward pass.
    pub memory_bytes: f64,
    /// Whether `memory_bytes` is within the memory limit.
    pub fits: bool,
    /// Why it is not possible (a dimension does not divide), if so.
    pub invalid: Option<String>,
    /// Each parameter's partition spec, by name.
    pub placements: Vec<(String, PartitionSpec)>,
}

impl Candidate {
    /// Estimated compute time per step (matmuls, other ops, the update), in seconds.
    pub fn compute_s(&self) -> f64 {
        self.matmul_s + self.elementwise_s + self.update_s
    }

    /// Estimated step time: compute, communication and collective latency, in seconds.
    pub fn time_s(&self) -> f64 {
        self.compute_s() + self.comm_s + self.latency_s
    }

    /// The terms of the estimate by name, for explanations.
    pub fn terms(&self) -> [(&'static str, f64); 5] {
        [
            ("matmul", self.matmul_s),
            ("elementwise", self.elementwise_s),
            ("optimizer update", self.update_s),
            ("communication", self.comm_s),
            ("collective latency", self.latency_s),
        ]
    }
}

/// The planner's answer: every candidate with its estimates, the one chosen and why (`Display` prints the table).
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Devices planned for.
    pub devices: usize,
    /// Memory per device, in bytes (infinite: no limit).
    pub memory_limit: f64,
    /// Every candidate considered.
    pub candidates: Vec<Candidate>,
    /// Index of the chosen candidate.
    pub chosen: usize,
    /// Why that candidate, in words.
    pub reason: String,
}

impl Plan {
    /// The chosen candidate.
    pub fn chosen(&self) -> &Candidate {
        &self.candidates[self.chosen]
    }

    /// Use another candidate by name (`dp`, `fsdp`, `tp`, `2d`).
    pub fn choose(&mut self, name: &str) -> Result<(), String> {
        let i = self
            .candidates
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| format!("no candidate named {name:?}"))?;
        if let Some(why) = &self.candidates[i].invalid {
            return Err(format!("{name} is not possible here: {why}"));
        }
        self.chosen = i;
        self.reason = format!("chosen by the user: {name}");
        Ok(())
    }

    /// Replace one parameter's placement in the chosen candidate.
    pub fn override_param(&mut self, name: &str, spec: PartitionSpec) -> Result<(), String> {
        let c = &mut self.candidates[self.chosen];
        let slot = c.placements.iter_mut().find(|(n, _)| n == name).ok_or_else(|| format!("no parameter {name:?}"))?;
        slot.1 = spec;
        Ok(())
    }

    /// Candidates from fastest to slowest estimated step (possible ones first).
    pub fn ranking(&self) -> Vec<&Candidate> {
        let mut v: Vec<&Candidate> = self.candidates.iter().filter(|c| c.invalid.is_none()).collect();
        v.sort_by(|a, b| a.time_s().total_cmp(&b.time_s()));
        v
    }
}

fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / (1024.0 * 1024.0))
}

fn ms(s: f64) -> String {
    format!("{:.2}ms", s * 1e3)
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = if self.memory_limit.is_finite() { mib(self.memory_limit) } else { "none".into() };
        writeln!(f, "sharding plan for {} device(s), memory limit {limit} per device", self.devices)?;
        writeln!(
            f,
            "  {:<6} {:<16} {:>9} {:>11} {:>9} {:>11} {:>9} {:>9} {:>11} {:>10}",
            "plan", "mesh", "matmul", "elementwise", "update", "comm bytes", "comm", "latency", "memory", "est. step"
        )?;
        for (i, c) in self.candidates.iter().enumerate() {
            let mesh: Vec<String> = c.mesh.iter().map(|(n, s)| format!("{n}={s}")).collect();
            let mark = if i == self.chosen { "*" } else { " " };
            match &c.invalid {
                Some(why) => writeln!(f, "{mark} {:<6} {:<16} not possible: {why}", c.name, mesh.join(","))?,
                None => writeln!(
                    f,
                    "{mark} {:<6} {:<16} {:>9} {:>11} {:>9} {:>11} {:>9} {:>9} {:>11} {:>10}{}",
                    c.name,
                    mesh.join(","),
                    ms(c.matmul_s),
                    ms(c.elementwise_s),
                    ms(c.update_s),
                    mib(c.comm_bytes),
                    ms(c.comm_s),
                    ms(c.latency_s),
                    mib(c.memory_bytes),
                    ms(c.time_s()),
                    if c.fits { "" } else { "  (over the memory limit)" }
                )?,
            }
        }
        writeln!(f, "chosen: {} — {}", self.chosen().name, self.reason)?;
        writeln!(f, "placements:")?;
        let mut s = String::new();
        for (name, spec, count) in grouped(&self.chosen().placements) {
            let times = if count > 1 { format!("  (×{count})") } else { String::new() };
            let _ = writeln!(s, "  {name:<32} {spec}{times}");
        }
        f.write_str(&s)
    }
}

/// Placements with the layer index written `*` where every layer places that parameter alike (a 48-layer
/// model then prints a dozen lines, not six hundred), in order of first appearance; names whose layers differ
/// (an override) stay one per line.
fn grouped(placements: &[(String, PartitionSpec)]) -> Vec<(String, String, usize)> {
    let pattern = |name: &str| -> String {
        let segments: Vec<&str> = name
            .split('.')
            .map(|g| if !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) { "*" } else { g })
            .collect();
        segments.join(".")
    };
    let mut order: Vec<String> = Vec::new();
    let mut members: std::collections::HashMap<String, Vec<usize>> = std::collections::HashMap::new();
    for (i, (name, _)) in placements.iter().enumerate() {
        let key = pattern(name);
        if !members.contains_key(&key) {
            order.push(key.clone());
        }
        members.entry(key).or_default().push(i);
    }
    let mut out = Vec::new();
    for key in order {
        let idx = &members[&key];
        let first = &placements[idx[0]].1;
        if idx.len() > 1 && idx.iter().all(|&i| placements[i].1 == *first) {
            out.push((key, first.to_string(), idx.len()));
        } else {
            out.extend(idx.iter().map(|&i| (placements[i].0.clone(), placements[i].1.to_string(), 1)));
        }
    }
    out
}

/// Megatron placement of one parameter over `model` (plus FSDP-style over `data` for 2-D); a dimension that an
/// axis does not divide stays whole.
fn tp_spec(p: &ParamInfo, model: usize, data: Option<(&str, usize)>) -> PartitionSpec {
    let rank = p.shape.len();
    let split = |dim: usize| {
        if p.shape[dim].is_multiple_of(model) {
            PartitionSpec::split(rank, dim, "model")
        } else {
            PartitionSpec::replicated(rank)
        }
    };
    let mut s = match (p.role, rank) {
        (Role::Column, 2) | (Role::Embedding, 2) => split(1),
        (Role::Column, 1) | (Role::Row, 2) => split(0),
        _ => PartitionSpec::replicated(rank),
    };
    if let Some((axis, size)) = data {
        // 2-D: the other dimension of a matrix is split over data too, where it divides.
        if rank == 2 {
            let free = if s.0[0].is_empty() { 0 } else { 1 };
            if s.0[free].is_empty() && p.shape[free].is_multiple_of(size) {
                s.0[free].push(axis.to_string());
            }
        }
    }
    s
}

/// Whether every placement divides its parameter's dimensions on this mesh.
fn check(params: &[ParamInfo], placements: &[(String, PartitionSpec)], mesh: &[(String, usize)]) -> Option<String> {
    for (p, (_, spec)) in params.iter().zip(placements) {
        for (d, axes) in spec.0.iter().enumerate() {
            let parts: usize = axes.iter().map(|a| mesh.iter().find(|(n, _)| n == a).map_or(1, |m| m.1)).product();
            if p.shape[d] % parts != 0 {
                return Some(format!("{} dimension {d} ({}) is not divisible by {parts}", p.name, p.shape[d]));
            }
        }
    }
    None
}

/// Bytes of `p`'s shard on one device when placed as `spec` on `mesh` (a dimension an axis does not divide is padded).
fn shard_bytes(p: &ParamInfo, spec: &PartitionSpec, mesh: &[(String, usize)]) -> f64 {
    let elems: usize = p
        .shape
        .iter()
        .enumerate()
        .map(|(d, &size)| {
            let axes = spec.0.get(d).map_or(&[][..], |a| &a[..]);
            let parts: usize = axes.iter().map(|a| mesh.iter().find(|(n, _)| n == a).map_or(1, |m| m.1)).product();
            size.div_ceil(parts.max(1))
        })
        .product();
    (elems * p.bytes_per_element) as f64
}

/// One device's work for a candidate: from the recorded graph (`work`), or, without one, matmuls split over all
/// devices and elementwise work over the data axis only.
pub type WorkFn<'a> = &'a dyn Fn(&[(String, usize)], &[(String, PartitionSpec)]) -> Option<Work>;

/// Cost the candidates for `devices` devices and choose, with per-device work estimated from `step` alone.
pub fn plan(step: &StepInfo, devices: usize, memory_limit: f64, dev: DeviceModel) -> Plan {
    plan_with(step, devices, memory_limit, dev, &|_, _| None)
}

/// Cost the candidates and choose; `work` gives one device's work under a candidate's mesh and placements.
pub fn plan_with(step: &StepInfo, devices: usize, memory_limit: f64, dev: DeviceModel, work: WorkFn<'_>) -> Plan {
    let n = devices.max(1) as f64;
    let param_bytes: f64 = step.params.iter().map(ParamInfo::bytes).sum();
    // Parameters, gradients and optimizer state.
    let state_bytes = param_bytes * (2.0 + step.optimizer_state_factor);
    let ring = |k: f64| if k > 1.0 { (k - 1.0) / k } else { 0.0 };
    let n_params = step.params.len() as f64;
    let mut out = Vec::new();
    let mut add = |name: &'static str,
                   mesh: Vec<(String, usize)>,
                   placements: Vec<(String, PartitionSpec)>,
                   comm_bytes: f64,
                   collectives: f64,
                   state: f64| {
        let data = mesh.iter().find(|(n, _)| n == "data").map_or(1, |m| m.1);
        let invalid = if !step.batch.is_multiple_of(data) {
            Some(format!("batch {} is not divisible by data={data}", step.batch))
        } else {
            check(&step.params, &placements, &mesh)
        };
        let w = work(&mesh, &placements).unwrap_or(Work {
            matmul_flops: step.flops / n,
            elementwise_bytes: step.elementwise_bytes / data as f64,
            saved_bytes: step.activation_bytes / data as f64,
        });
        // Weights, gradients and optimizer state (`state`), and the activations kept for the backward pass.
        let memory = state + w.saved_bytes;
        let held: f64 = step.params.iter().zip(&placements).map(|(p, (_, s))| shard_bytes(p, s, &mesh)).sum();
        let update_bytes = held * step.update_traffic;
        let collectives = if comm_bytes > 0.0 { collectives } else { 0.0 };
        out.push(Candidate {
            name,
            mesh,
            work: w,
            update_bytes,
            matmul_s: dev.wall(w.matmul_flops / dev.flops_per_s, devices),
            elementwise_s: dev.wall(w.elementwise_bytes / dev.bytes_per_s, devices),
            update_s: dev.wall(update_bytes / dev.bytes_per_s, devices),
            comm_bytes,
            comm_s: comm_bytes / dev.link_bytes_per_s,
            collectives,
            latency_s: collectives * dev.collective_latency_s,
            memory_bytes: memory,
            fits: memory <= memory_limit,
            invalid,
            placements,
        });
    };
    let names = |f: &dyn Fn(&ParamInfo) -> PartitionSpec| -> Vec<(String, PartitionSpec)> {
        step.params.iter().map(|p| (p.name.clone(), f(p))).collect()
    };
    let data_mesh = vec![("data".to_string(), devices)];
    // Collective counts follow XLA's compiled programs: independent all-reduces (the gradients) are combined into
    // one; a sharded parameter's all-gather is one collective. Data parallel: everything replicated, gradients
    // all-reduced (2·(n-1)/n of their bytes).
    add(
        "dp",
        data_mesh.clone(),
        names(&|p| PartitionSpec::replicated(p.shape.len())),
        2.0 * ring(n) * param_bytes,
        1.0,
        state_bytes,
    );
    // FSDP: parameters gathered for forward and backward, gradients reduce-scattered (3·(n-1)/n).
    add(
        "fsdp",
        data_mesh,
        names(&|p| {
            let d = p.shape.iter().position(|&s| s % devices == 0 && s >= devices);
            match d {
                Some(d) => PartitionSpec::split(p.shape.len(), d, "data"),
                None => PartitionSpec::replicated(p.shape.len()),
            }
        }),
        3.0 * ring(n) * param_bytes,
        n_params + 1.0,
        // The gathered weights the backward reads stay gathered from the forward: measured on two H200s, FSDP's
        // peak is its shard of the state plus about the whole weights (GPT with 85M and 1.48B parameters).
        state_bytes / n + param_bytes,
    );
    // Tensor parallel: weights split, activations all-reduced twice per column/row pair (forward and backward).
    let tp_param: f64 = step.params.iter().map(|p| if p.role == Role::Other { p.bytes() } else { p.bytes() / n }).sum();
    add(
        "tp",
        vec![("model".to_string(), devices)],
        names(&|p| tp_spec(p, devices, None)),
        2.0 * step.tp_pairs as f64 * 2.0 * ring(n) * step.boundary_bytes,
        4.0 * step.tp_pairs as f64,
        tp_param * (2.0 + step.optimizer_state_factor),
    );
    // 2-D: model=2 within pairs, data over the rest; weights split both ways.
    if devices >= 4 && devices.is_multiple_of(2) {
        let d = n / 2.0;
        let other: f64 = step.params.iter().filter(|p| p.role == Role::Other).map(ParamInfo::bytes).sum();
        let split = (param_bytes - other) / n + other;
        add(
            "2d",
            vec![("data".to_string(), devices / 2), ("model".to_string(), 2)],
            names(&|p| tp_spec(p, 2, Some(("data", devices / 2)))),
            2.0 * step.tp_pairs as f64 * 2.0 * ring(2.0) * step.boundary_bytes / d + 3.0 * ring(d) * param_bytes / 2.0,
            4.0 * step.tp_pairs as f64 + n_params + 1.0,
            // As under FSDP, the weights gathered over `data` (each its model=2 half) stay for the backward.
            split * (2.0 + step.optimizer_state_factor) + (param_bytes - other) / 2.0,
        );
    }
    let fastest = |fits: bool| {
        let mut v: Vec<usize> =
            (0..out.len()).filter(|&i| out[i].invalid.is_none() && (!fits || out[i].fits)).collect();
        v.sort_by(|&a, &b| out[a].time_s().total_cmp(&out[b].time_s()));
        v
    };
    let (chosen, reason) = match fastest(true).first() {
        Some(&i) => (i, explain(&out, i, &fastest(false), devices, dev, memory_limit)),
        None => {
            let i = out
                .iter()
                .enumerate()
                .filter(|(_, c)| c.invalid.is_none())
                .min_by(|a, b| a.1.memory_bytes.total_cmp(&b.1.memory_bytes))
                .map_or(0, |(i, _)| i);
            (i, "nothing fits the memory limit: the plan with the least memory per device".to_string())
        }
    };
    Plan { devices, memory_limit, candidates: out, chosen, reason }
}

/// Why candidate `i` won: its terms, how shared cores count, and what the runner-up loses most on.
fn explain(out: &[Candidate], i: usize, ranked: &[usize], devices: usize, dev: DeviceModel, limit: f64) -> String {
    let c = &out[i];
    let terms: Vec<String> = c.terms().iter().map(|(n, t)| format!("{} {n}", ms(*t))).collect();
    let mut why = format!(
        "the fastest estimated step that fits: {} = {}; {} per device",
        ms(c.time_s()),
        terms.join(" + "),
        mib(c.memory_bytes)
    );
    if let Some(cores) = dev.shared_cores.filter(|&k| k < devices) {
        let _ = write!(
            why,
            "; the {devices} devices share {cores} cores, so every device's work costs {:.1}x its time \
             (work a plan replicates is paid on every device)",
            devices as f64 / cores as f64
        );
    }
    if let Some(&r) = ranked.iter().find(|&&r| r != i && out[r].fits) {
        let o = &out[r];
        let (term, d) = c
            .terms()
            .iter()
            .zip(o.terms())
            .map(|((n, a), (_, b))| (*n, b - a))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or(("", 0.0));
        let _ = write!(
            why,
            "; next: {} at {} (+{}, most of it {term}: +{})",
            o.name,
            ms(o.time_s()),
            ms(o.time_s() - c.time_s()),
            ms(d)
        );
    }
    let over: Vec<&str> =
        out.iter().filter(|o| o.invalid.is_none() && o.memory_bytes > limit).map(|o| o.name).collect();
    if !over.is_empty() {
        let _ = write!(why, "; over the memory limit: {}", over.join(", "));
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mlp(width: usize, batch: usize) -> StepInfo {
        let p =
            |name: &str, shape: Vec<usize>, role| ParamInfo { name: name.into(), shape, bytes_per_element: 4, role };
        let params = vec![
            p("fc.weight", vec![width, 4 * width], Role::Column),
            p("fc.bias", vec![4 * width], Role::Column),
            p("proj.weight", vec![4 * width, width], Role::Row),
            p("proj.bias", vec![width], Role::Other),
        ];
        let flops = 3.0 * 2.0 * (batch * width * 4 * width * 2) as f64;
        StepInfo {
            params,
            flops,
            activation_bytes: (batch * 5 * width * 4) as f64,
            boundary_bytes: (batch * width * 4) as f64,
            tp_pairs: 1,
            batch,
            optimizer_state_factor: 2.0,
            elementwise_bytes: 3.0 * (batch * 10 * width * 4) as f64,
            update_traffic: StepInfo::ADAMW_UPDATE_TRAFFIC,
        }
    }

    #[test]
    fn small_model_large_batch_is_data_parallel() {
        let p = plan(&mlp(64, 4096), 8, 1e12, DeviceModel::CPU);
        assert_eq!(p.chosen().name, "dp", "{p}");
    }

    #[test]
    fn memory_below_the_replicated_model_picks_a_sharded_plan() {
        let step = mlp(1024, 64);
        let replicated = plan(&step, 8, 1e12, DeviceModel::CPU);
        let dp_memory = replicated.candidates.iter().find(|c| c.name == "dp").unwrap().memory_bytes;
        let p = plan(&step, 8, dp_memory * 0.5, DeviceModel::CPU);
        assert_ne!(p.chosen().name, "dp", "{p}");
        assert!(p.chosen().fits, "{p}");
        assert!(["fsdp", "tp", "2d"].contains(&p.chosen().name));
    }

    #[test]
    fn indivisible_candidates_are_marked_and_overrides_apply() {
        let mut p = plan(&mlp(64, 6), 4, 1e12, DeviceModel::CPU);
        let dp = p.candidates.iter().find(|c| c.name == "dp").unwrap();
        assert!(dp.invalid.as_deref().unwrap().contains("batch 6"), "{p}");
        p.choose("tp").unwrap();
        p.override_param("proj.bias", PartitionSpec::split(1, 0, "model")).unwrap();
        assert!(p.to_string().contains("proj.bias"));
        assert!(p.choose("dp").is_err());
    }

    #[test]
    fn layers_placed_alike_print_as_one_line() {
        let spec =
            |dim: Option<usize>| dim.map_or(PartitionSpec::replicated(2), |d| PartitionSpec::split(2, d, "model"));
        let mut placements = Vec::new();
        for l in 0..3 {
            placements.push((format!("blocks.{l}.fc.weight"), spec(Some(1))));
            // Layer 1's projection was overridden.
            placements.push((format!("blocks.{l}.proj.weight"), spec((l != 1).then_some(0))));
        }
        placements.push(("head.weight".to_string(), spec(None)));
        let lines: Vec<(String, String, usize)> = grouped(&placements);
        let names: Vec<(&str, usize)> = lines.iter().map(|(n, _, c)| (n.as_str(), *c)).collect();
        assert_eq!(
            names,
            [
                ("blocks.*.fc.weight", 3),
                ("blocks.0.proj.weight", 1),
                ("blocks.1.proj.weight", 1),
                ("blocks.2.proj.weight", 1),
                ("head.weight", 1)
            ]
        );
        assert_eq!(lines[0].1, spec(Some(1)).to_string());
        assert_eq!(lines[2].1, spec(None).to_string());
    }
}

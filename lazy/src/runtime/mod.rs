//! The process-wide runtime: one PJRT plugin and client, the device tensors live on, and the executable cache.
//! Created on first materialization from the environment, or explicitly with [`init`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use lazuli_kernels::{Implementation, Target};
use lazuli_pjrt::{provision, AttrValue, Client, ClientOptions, CompileOptions, Device, Plugin, XlaOption};

use crate::error::{Error, Result};
use crate::settings::{self, MAX_CPU_DEVICES};
pub use crate::settings::{Backend, BlockScan, CheckFinite, CompileCache, CpuLauncher, LocateAhead, SplitUpdate};
use lazuli_pjrt::provision::Sources;

pub(crate) mod compile_cache;
pub mod distributed;
pub(crate) mod launcher;
pub(crate) mod program_cache;
pub(crate) mod value;

/// How the runtime is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Which kind of plugin to load.
    pub backend: Backend,
    /// A plugin file to load instead of the backend's default.
    pub plugin_path: Option<PathBuf>,
    /// Number of virtual devices of the CPU plugin.
    pub cpu_device_count: i64,
    /// Run CPU programs on the plugin's worker threads, returning from `sync()` before they finish. Off by
    /// default: on the CPU the "device" is the host's own cores, and handing a program to a worker thread and
    /// waking the waiter cost about 80 µs per step on the 2-core machine of
    /// `docs/perf-log/2026-11-30-cpu-launcher.md`, more than a small program runs. Turn it on when steps are long
    /// and cores are spare (the host records the next step while the program runs). Other backends always run
    /// asynchronously.
    pub cpu_async: bool,
    /// Where single-device CPU programs run: see [`CpuLauncher`]. Ignored with `cpu_async`.
    pub cpu_launcher: CpuLauncher,
    /// XLA debug options for every compile, by name, applied after the backend's defaults (see
    /// [`Config::backend_xla_options`]); later entries win. They are part of the persistent cache's key.
    pub xla_options: Vec<(String, XlaOption)>,
    /// Which attention implementation `scaled_dot_product_attention` records (`LAZULI_ATTENTION`): the fastest
    /// that applies (default), or one forced; forcing one that cannot apply is an error at the recording line.
    pub attention: Implementation,
    /// Which layer-norm implementation `Tensor::layer_norm_affine` (and `nn::LayerNorm`) records
    /// (`LAZULI_LAYER_NORM`): lazuli's Triton kernels where they apply (default), or the composite.
    pub layer_norm: Implementation,
    /// Which bias + GELU implementation `Tensor::bias_gelu` records (`LAZULI_BIAS_GELU`), likewise.
    pub bias_gelu: Implementation,
    /// Which cross-entropy implementation `Tensor::cross_entropy` records (`LAZULI_CROSS_ENTROPY`), likewise.
    pub cross_entropy: Implementation,
    /// How a guarded finite check counts its non-finite values (`LAZULI_FINITE_COUNT`): on an NVIDIA GPU, lazuli's
    /// Triton kernel over every counted tensor in one launch (`auto`, the default, where it applies; `triton`
    /// forces it), or XLA's reductions (`composite`, the only way elsewhere).
    pub finite_count: Implementation,
    /// Where that kernel writes the loss's gradient (`LAZULI_CROSS_ENTROPY_GRAD`): in a forward that walks each row
    /// twice with this tiling, when the logits will be differentiated (default), or `None`: in a backward kernel
    /// of its own. The forward's gradient is at a unit cotangent: for a loss scaled before `backward()` the
    /// autodiff records the forward and backward kernels instead (`KernelDef::scaled_alternative`).
    pub cross_entropy_grad: Option<lazuli_kernels::cross_entropy::GradTiling>,
    /// Where plugins come from (`LAZULI_PJRT_PLUGIN`, `LAZULI_CPU_PLUGIN`, `LAZULI_GPU_PLUGIN`,
    /// `LAZULI_TPU_PLUGIN`, `LAZULI_CACHE_DIR`, `LAZULI_PYTHON`); `plugin_path`, when set, wins.
    pub plugins: Sources,
    /// Donate the buffers of inputs that die with a step to its outputs, so weights update in place
    /// (`LAZULI_DONATE`, default on).
    pub donate: bool,
    /// Write every compiled program there as `<hash>.mlir` (`LAZULI_DUMP_DIR`).
    pub dump_dir: Option<PathBuf>,
    /// The persistent compile cache (`LAZULI_COMPILE_CACHE`) and its size limit in bytes
    /// (`LAZULI_COMPILE_CACHE_LIMIT`, default 2 GiB).
    pub compile_cache: CompileCache,
    pub compile_cache_limit: u64,
    /// How many compiled programs the process keeps (`LAZULI_PROGRAM_CACHE_LIMIT`, default 64): beyond it the
    /// least recently used one is evicted, to be loaded or compiled again if needed (see `program_cache`).
    pub program_cache_limit: usize,
    /// Count each step's non-finite output values in the step's own program, and skip the step, stop or log on a
    /// trip (`LAZULI_CHECK_FINITE`, default off; see `CheckFinite`).
    pub check_finite: CheckFinite,
    /// Whether the check (`stop`, `log`) compiles each training step structure's locating program ahead of any
    /// trip (`LAZULI_LOCATE_AHEAD`, see [`LocateAhead`] and [`Config::locates_ahead`]).
    pub locate_ahead: LocateAhead,
    /// Whether an optimizer's `step()` launches the gradients before recording its update (`LAZULI_SPLIT_UPDATE`,
    /// see [`SplitUpdate`] and [`Config::splits_update`]).
    pub split_update: SplitUpdate,
    /// How scanned blocks run where the model does not say (`LAZULI_SCANNED_BLOCKS`, see [`BlockScan`] and
    /// [`Config::unrolls_blocks`]).
    pub block_scan: BlockScan,
    /// How long a wait for the device polls before it sleeps (`LAZULI_WAIT_SPIN`, microseconds); `None`: the
    /// backend's default, see [`Config::wait_spin`].
    pub wait_spin: Option<std::time::Duration>,
    /// Join a multi-process group before the client is made (`LAZULI_COORDINATOR`, `LAZULI_PROCESS_ID`,
    /// `LAZULI_NUM_PROCESSES`, `LAZULI_HEARTBEAT_TIMEOUT`, `LAZULI_COORDINATOR_EXTERNAL`); `None`: one process.
    pub distributed: Option<distributed::Distributed>,
}

impl Default for Config {
    /// The CPU plugin, one device, synchronous.
    fn default() -> Config {
        Config {
            backend: Backend::Cpu,
            plugin_path: None,
            cpu_device_count: 1,
            cpu_async: false,
            cpu_launcher: CpuLauncher::default(),
            xla_options: Vec::new(),
            attention: Implementation::Auto,
            layer_norm: Implementation::Auto,
            bias_gelu: Implementation::Auto,
            cross_entropy: Implementation::Auto,
            finite_count: Implementation::Auto,
            cross_entropy_grad: Some(lazuli_kernels::cross_entropy::GradTiling::DEFAULT),
            plugins: Sources::default(),
            donate: true,
            dump_dir: None,
            compile_cache: CompileCache::Default,
            compile_cache_limit: 2 << 30,
            program_cache_limit: program_cache::DEFAULT_LIMIT,
            check_finite: CheckFinite::Off,
            locate_ahead: LocateAhead::Auto,
            split_update: SplitUpdate::Auto,
            block_scan: BlockScan::Auto,
            wait_spin: None,
            distributed: None,
        }
    }
}

impl Config {
    /// The configuration the `LAZULI_*` variables describe (`crate::settings` reads and checks every one; its
    /// `VARIABLES` lists them with their values and defaults). A malformed value is an error naming it.
    pub fn from_env() -> Result<Config> {
        // Read by `backward()` itself; checked here so that a bad value is an error.
        settings::backward_replay_setting()?;
        Ok(Config {
            backend: settings::device()?,
            plugin_path: None,
            cpu_device_count: settings::cpu_devices()?,
            cpu_async: settings::cpu_async()?,
            cpu_launcher: settings::cpu_launcher()?,
            xla_options: settings::xla_options()?,
            attention: settings::attention()?,
            layer_norm: settings::triton_kernel("LAZULI_LAYER_NORM")?,
            bias_gelu: settings::triton_kernel("LAZULI_BIAS_GELU")?,
            cross_entropy: settings::triton_kernel("LAZULI_CROSS_ENTROPY")?,
            finite_count: settings::triton_kernel("LAZULI_FINITE_COUNT")?,
            cross_entropy_grad: settings::cross_entropy_grad()?,
            plugins: settings::plugin_sources()?,
            donate: settings::donate()?,
            dump_dir: settings::dump_dir()?,
            compile_cache: settings::compile_cache(),
            compile_cache_limit: settings::compile_cache_limit()?,
            program_cache_limit: settings::program_cache_limit()?,
            check_finite: settings::check_finite()?,
            locate_ahead: settings::locate_ahead()?,
            split_update: settings::split_update()?,
            block_scan: settings::block_scan()?,
            wait_spin: settings::wait_spin()?,
            distributed: settings::distributed()?,
        })
    }

    /// How long a wait for the device polls its event before sleeping on it. CPU plugins compute on the host's
    /// cores, so a wait polls briefly (a longer poll would take a core from the program). On GPUs the host is idle
    /// while it waits, and a thread that slept through a step wakes late on a core that may have emptied its
    /// caches, so the next step's recording starts cold: waits poll for up to 50 ms, as CUDA's own
    /// synchronization spins by default. Measured in `docs/perf-log/2026-12-02-waits-sums-locator.md`.
    pub fn wait_spin(&self) -> std::time::Duration {
        self.wait_spin.unwrap_or(match self.backend {
            Backend::Gpu | Backend::Rocm => std::time::Duration::from_millis(50),
            Backend::Cpu | Backend::Tpu | Backend::Xpu => lazuli_pjrt::DEFAULT_SPIN,
        })
    }

    /// Whether an optimizer's `step()` launches the gradients before recording its update: as
    /// [`Config::split_update`] says. `Auto`: on NVIDIA GPUs, unchecked or under `stop`, whose sticky flag
    /// carries the gradients' program's trip into the update's guard. On GPT-2 small on an H200 `stop` then costs
    /// what it costs in one program where the host waits for nothing, and less where it reads the loss every step
    /// (+0.6% against +8.6%), since the read returns once the gradients are done. `skip` guards a step by its own
    /// count and `log` reads each check before the next launch: never split. Measured in
    /// `docs/perf-log/2026-12-03-split-update.md` and `docs/perf-log/2026-12-04-check-by-rows.md`.
    pub fn splits_update(&self) -> bool {
        match self.split_update {
            SplitUpdate::Auto => {
                self.backend == Backend::Gpu && matches!(self.check_finite, CheckFinite::Off | CheckFinite::Stop)
            }
            SplitUpdate::On => matches!(self.check_finite, CheckFinite::Off | CheckFinite::Stop),
            SplitUpdate::Off => false,
        }
    }

    /// Whether a training step structure's locating program is compiled ahead of any trip: as
    /// [`Config::locate_ahead`] says; `Auto` on NVIDIA GPUs, where a trip's compile is many steps' time and the
    /// host has cores to spare.
    pub fn locates_ahead(&self) -> bool {
        self.locate_ahead_after().is_some()
    }

    /// How long a training step structure trains, from its first checked run, before its locating program is
    /// compiled ahead (on its next run after that), or `None` where it is not: `Auto`
    /// [`LOCATE_AHEAD_AFTER`](crate::LOCATE_AHEAD_AFTER) on NVIDIA GPUs, `On` from its second run.
    pub fn locate_ahead_after(&self) -> Option<std::time::Duration> {
        match self.locate_ahead {
            LocateAhead::Auto => (self.backend == Backend::Gpu).then_some(crate::settings::LOCATE_AHEAD_AFTER),
            LocateAhead::On => Some(std::time::Duration::ZERO),
            LocateAhead::Off => None,
        }
    }

    /// Settings forced on that the check's mode leaves without effect, each in words for a notice at start: the run
    /// is correct either way, but a user who asked for them should not believe they are working.
    pub fn settings_without_effect(&self) -> Vec<&'static str> {
        let mut idle = Vec::new();
        if self.locate_ahead == LocateAhead::On && !crate::exec::finite::replays(self.check_finite) {
            idle.push(
                "LAZULI_LOCATE_AHEAD=1 has no effect: the locator runs only under LAZULI_CHECK_FINITE=stop or log",
            );
        }
        if self.split_update == SplitUpdate::On && !self.splits_update() {
            idle.push(
                "LAZULI_SPLIT_UPDATE=on has no effect under LAZULI_CHECK_FINITE=skip or log, which guard or read each \
                 step as a whole",
            );
        }
        idle
    }

    /// Whether scanned blocks whose model does not say are written out in the program: as
    /// [`Config::block_scan`] says; `Auto` on GPUs, where the compile grows little with depth and a loop's
    /// state costs a large part of the step.
    pub fn unrolls_blocks(&self) -> bool {
        match self.block_scan {
            BlockScan::Auto => self.backend == Backend::Gpu,
            BlockScan::Unrolled => true,
            BlockScan::Loop => false,
        }
    }

    /// The XLA debug options a backend compiles with unless [`Config::xla_options`] says otherwise.
    ///
    /// GPU: no command buffers (CUDA graphs). A lazily traced step hands XLA fresh output buffers every time, so
    /// each launch first updates the captured graph (about 4.7 ms for a GPT-2-small step on an H200) before the
    /// device starts; launching kernels one by one starts the device at once. Measured in
    /// `docs/perf-log/2026-11-29-composite-ops.md`.
    ///
    /// GPU: products on cuBLAS, not XLA's Triton GEMMs (`xla_gpu_enable_triton_gemm=false`). XLA wraps a product in
    /// a Triton fusion before it would fold a vector bias added to the product into cuBLAS's epilogue; when its
    /// autotuner then picks cuBLAS for the product anyway, the bias stays a pass of its own over the result. GPT-2
    /// small on an H200 (q, k and v's bias added in bf16): 0.2–0.3 ms a step faster with the products unchanged
    /// in time. Measured in `docs/perf-log/2026-12-02-bias-in-the-gemm.md`.
    ///
    /// GPU: scanned loops' stacked results start uninitialized instead of zero-filled when every iteration writes
    /// its slice (XLA's `dus_accumulator_zero_init_elimination`, off by default in the plugin): the scanned GPT-2
    /// step filled its saved activations and stacked gradients with zeros on every step. Measured in
    /// `docs/perf-log/2026-12-01-xla-options.md`.
    ///
    /// CPU: YNNPACK runs single products only (upstream XLA's default). The default plugin's XLA (jaxlib 0.11.2)
    /// also hands the elementwise ops and reductions around a product to YNNPACK, and it then computes a batched
    /// product with a broadcast operand, multiplied and reduced, wrong by up to 1e242, with no error
    /// (`tests/ops/cpu_library_fusions.rs`). The cost, and why single products stay, is in
    /// `docs/perf-log/2026-11-30-ynnpack-fusions.md`.
    ///
    /// CPU and GPU: `max`/`min` (reductions, `maximum`, `minimum`, clamp, pooling) propagate NaN, as in JAX, which
    /// sets both options below to false (`docs/numerics.md`). XLA's "fast" min/max, the CPU's default, returns the
    /// number when one operand is NaN (both CPU plugins); on GPUs off is XLA's default, pinned here. On the CPU it
    /// slows max/min reductions: a row max over `f32[512,1024]` 135 → 315 µs, a softmax over `f32[2048,64]` (a
    /// gpt-tiny attention) 165 → 215 µs; elementwise `maximum` is unchanged. `lazuli-bench cpu`, 13 alternating
    /// runs: gpt-tiny 6.88 → 6.97 ms (+1.3%, within the 2-core machine's noise), mlp-tiny 17.3 → 17.0 µs.
    ///
    /// A plugin that does not know an option here compiles without it.
    pub fn backend_xla_options(&self) -> Vec<(String, XlaOption)> {
        let single_products = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT";
        match self.backend {
            Backend::Gpu => vec![
                ("xla_gpu_enable_command_buffer".into(), XlaOption::Str(String::new())),
                ("xla_gpu_enable_triton_gemm".into(), XlaOption::Bool(false)),
                ("xla_gpu_enable_fast_min_max".into(), XlaOption::Bool(false)),
                ("xla_gpu_enable_dus_accumulator_zero_init_elimination".into(), XlaOption::Bool(true)),
            ],
            Backend::Cpu => vec![
                ("xla_cpu_experimental_ynn_fusion_type".into(), XlaOption::Str(single_products.into())),
                ("xla_cpu_enable_fast_min_max".into(), XlaOption::Bool(false)),
            ],
            Backend::Tpu | Backend::Rocm | Backend::Xpu => Vec::new(),
        }
    }
}

pub(crate) struct Runtime {
    pub client: Client,
    pub device: Device,
    pub config: Config,
    /// What custom kernels may run on (the platform and, on NVIDIA GPUs, the compute capability).
    pub target: Target,
    /// Compiled programs by graph structure hash, the most recently used ones.
    pub cache: Mutex<program_cache::ProgramCache>,
    /// Backend defaults ([`Config::backend_xla_options`]) the plugin refused as unknown; compiles leave them out.
    unknown_options: Mutex<Vec<String>>,
    /// Options the provisioned plugin needs (the CUDA tools' directory), before the configured ones.
    plugin_options: Vec<(String, XlaOption)>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

impl Runtime {
    fn new(config: Config) -> Result<Runtime> {
        check_settings(&config)?;
        for notice in config.settings_without_effect() {
            eprintln!("lazuli: {notice}");
        }
        lazuli_pjrt::set_spin_before_sleeping(config.wait_spin());
        let mut opts = ClientOptions::new();
        if config.backend == Backend::Cpu {
            opts = opts.cpu_device_count(config.cpu_device_count);
            opts = opts.bool_option("asynchronous", config.cpu_async);
        }
        if let Some(group) = &config.distributed {
            opts = distributed::join(group, config.backend, opts)?;
        }
        let mut plugin_options = Vec::new();
        let client = match &config.plugin_path {
            Some(path) => Client::new(&Plugin::load(path)?, &opts)?,
            // The target table's checks: C API range, libraries, platform, devices, bounded creation.
            None => {
                let (plugin, found) = provision::load_device_plugin(config.backend.device(), &config.plugins)?;
                if let Some(dir) = &found.cuda_data_dir {
                    let dir = XlaOption::Str(dir.to_string_lossy().into_owned());
                    plugin_options.push(("xla_gpu_cuda_data_dir".to_string(), dir));
                }
                provision::create_device_client(&plugin, &found, &opts, provision::CLIENT_CREATE_TIMEOUT)?
            }
        };
        let device = client.devices().into_iter().next().ok_or_else(|| {
            Error::Config(format!("the plugin {} reports no devices", client.plugin().path().display()))
        })?;
        let target = kernel_target(&client, &device)?;
        let program_cache_limit = config.program_cache_limit;
        Ok(Runtime {
            client,
            device,
            target,
            config,
            cache: Mutex::new(program_cache::ProgramCache::new(program_cache_limit)),
            unknown_options: Mutex::new(Vec::new()),
            plugin_options,
        })
    }

    /// Bytes the device can still allocate: the allocator's limit minus what is in use where the plugin reports
    /// both (GPUs), the host's available memory for the CPU plugin (`MemAvailable`), else unknown.
    pub(crate) fn free_memory(&self) -> Option<usize> {
        if let Ok(stats) = self.device.memory_stats() {
            if let Some(limit) = stats.bytes_limit {
                return Some((limit - stats.bytes_in_use).max(0) as usize);
            }
        }
        if self.config.backend != Backend::Cpu {
            return None;
        }
        host_available_memory()
    }

    /// A single-device program goes to the launcher thread (`Config::cpu_launcher`); `demanded`: the thread read
    /// a result of its latest program, or waited, since launching it.
    pub(crate) fn uses_launcher(&self, demanded: bool) -> bool {
        let on = match self.config.cpu_launcher {
            CpuLauncher::Off => false,
            CpuLauncher::Adaptive => !demanded,
            CpuLauncher::Always => true,
        };
        on && self.config.backend == Backend::Cpu && !self.config.cpu_async
    }

    /// Compile options of a single-device program: on this process's device. A multi-process client (the CUDA
    /// plugin in a group) also has the other processes' devices, and left to itself would place the program on
    /// the group's device 0, so there it is pinned.
    pub(crate) fn single_device_options(&self) -> CompileOptions {
        let base = CompileOptions { xla_options: self.xla_options(), ..CompileOptions::default() };
        if self.client.global_device_ids().len() > self.client.devices().len() {
            CompileOptions { device_assignment: Some(vec![vec![i64::from(self.device.id())]]), ..base }
        } else {
            base
        }
    }

    /// The XLA options of a compile: the backend's defaults the plugin knows, then the configured ones.
    pub(crate) fn xla_options(&self) -> Vec<(String, XlaOption)> {
        let unknown = self.unknown_options.lock().unwrap_or_else(|e| e.into_inner());
        let defaults = self.config.backend_xla_options().into_iter().chain(self.plugin_options.iter().cloned());
        let mut all: Vec<_> = defaults.filter(|(name, _)| !unknown.contains(name)).collect();
        all.extend(self.config.xla_options.iter().cloned());
        all
    }

    /// Whether `error` is the plugin refusing one of the backend's own defaults or the provisioned plugin's (an
    /// older XLA, which lacks the option or the value); if so, later compiles leave it out. Options the user
    /// configured are never dropped: their error is reported.
    pub(crate) fn drop_unknown_default(&self, error: &lazuli_pjrt::Error) -> bool {
        let lazuli_pjrt::Error::Pjrt { message, .. } = error else { return false };
        let plugin_defaults = self.plugin_options.iter().map(|(name, _)| name.clone());
        let Some(name) = unknown_default(&self.config, plugin_defaults, message) else { return false };
        let mut unknown = self.unknown_options.lock().unwrap_or_else(|e| e.into_inner());
        let new = !unknown.contains(&name);
        if new {
            unknown.push(name);
        }
        new
    }
}

/// What the host lacks to hold `bytes` more (`"3.0 GiB on the host, which has 1.2 GiB available"`), or `None` where
/// they fit or the available memory cannot be read: what the callers that would otherwise abort on a failed
/// allocation refuse with, naming their own line.
pub(crate) fn host_shortfall(bytes: usize) -> Option<String> {
    let free = host_available_memory().filter(|&free| bytes > free)?;
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    Some(format!("{:.1} GiB on the host, which has {:.1} GiB available", gib(bytes), gib(free)))
}

/// The host's available memory (Linux's `MemAvailable`), or `None` where it cannot be read.
pub(crate) fn host_available_memory() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// What `Config::from_env` cannot check for a configuration made in code: the CPU device count's range.
fn check_settings(config: &Config) -> Result<()> {
    if config.backend == Backend::Cpu && !(1..=MAX_CPU_DEVICES).contains(&config.cpu_device_count) {
        return Err(Error::Config(format!(
            "{} CPU devices (LAZULI_CPU_DEVICES or Config::cpu_device_count): expected 1 to {MAX_CPU_DEVICES}",
            config.cpu_device_count
        )));
    }
    Ok(())
}

/// The kernels' view of the device: the plugin's platform, and a CUDA device's `compute_capability` attribute
/// (`"9.0"`).
fn kernel_target(client: &Client, device: &Device) -> Result<Target> {
    Ok(match client.platform_name()?.as_str() {
        "cpu" => Target::Cpu,
        "cuda" => {
            let attrs = device.attributes().unwrap_or_default();
            let cc = attrs.iter().find(|(name, _)| name == "compute_capability").and_then(|(_, v)| match v {
                AttrValue::String(s) => {
                    let (major, minor) = s.split_once('.')?;
                    Some((major.parse().ok()?, minor.parse().ok()?))
                }
                _ => None,
            });
            Target::Cuda { compute_capability: cc }
        }
        other => Target::Other(other.to_string()),
    })
}

/// The backend default that a compile error says the plugin cannot apply, unless the user configured it too.
/// XLA words it `No such compile option: 'NAME'`, or `While setting option NAME, …` for a value it does not know
/// (both seen on the real plugin; `tests/engine/runtime_config.rs` checks the first).
fn unknown_default(config: &Config, plugin_defaults: impl Iterator<Item = String>, message: &str) -> Option<String> {
    let configured = |name: &str| config.xla_options.iter().any(|(n, _)| n == name);
    let refused = |name: &str| {
        message.contains(&format!("No such compile option: '{name}'"))
            || message.contains(&format!("While setting option {name},"))
    };
    let mut defaults = config.backend_xla_options().into_iter().map(|(name, _)| name).chain(plugin_defaults);
    defaults.find(|name| refused(name) && !configured(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_setting_the_check_leaves_idle_is_noticed() {
        let with = |check_finite, locate_ahead, split_update| {
            Config { check_finite, locate_ahead, split_update, ..Config::default() }.settings_without_effect()
        };
        let ahead = "LAZULI_LOCATE_AHEAD=1 has no effect";
        let split = "LAZULI_SPLIT_UPDATE=on has no effect";
        let noticed = |notices: Vec<&str>, what: &str| notices.iter().any(|n| n.starts_with(what));
        for mode in [CheckFinite::Off, CheckFinite::Skip] {
            assert!(noticed(with(mode, LocateAhead::On, SplitUpdate::Auto), ahead), "{mode:?}");
        }
        for mode in [CheckFinite::Stop, CheckFinite::Log] {
            assert!(with(mode, LocateAhead::On, SplitUpdate::Auto).is_empty(), "{mode:?}");
        }
        for mode in [CheckFinite::Skip, CheckFinite::Log] {
            assert!(noticed(with(mode, LocateAhead::Auto, SplitUpdate::On), split), "{mode:?}");
        }
        for mode in [CheckFinite::Off, CheckFinite::Stop] {
            assert!(with(mode, LocateAhead::Auto, SplitUpdate::On).is_empty(), "{mode:?}");
        }
        // Left to its default (auto) or turned off, a setting is never noticed.
        for mode in [CheckFinite::Off, CheckFinite::Skip, CheckFinite::Log] {
            assert!(with(mode, LocateAhead::Off, SplitUpdate::Off).is_empty(), "{mode:?}");
            assert!(with(mode, LocateAhead::Auto, SplitUpdate::Auto).is_empty(), "{mode:?}");
        }
    }

    #[test]
    fn only_an_unknown_backend_default_is_dropped() {
        let cpu = Config::default();
        let refused = "No such compile option: 'xla_cpu_experimental_ynn_fusion_type'";
        assert_eq!(
            unknown_default(&cpu, std::iter::empty(), refused).as_deref(),
            Some("xla_cpu_experimental_ynn_fusion_type")
        );
        assert_eq!(unknown_default(&cpu, std::iter::empty(), "No such compile option: 'xla_other'"), None);
        let bad_value = "While setting option xla_cpu_experimental_ynn_fusion_type, 'X' is not a valid enum value.";
        assert_eq!(
            unknown_default(&cpu, std::iter::empty(), bad_value).as_deref(),
            Some("xla_cpu_experimental_ynn_fusion_type")
        );
        assert_eq!(
            unknown_default(&cpu, std::iter::empty(), "While setting option xla_other, 'X' is not a valid enum value."),
            None
        );
        // Set by the user as well: their compile error stands.
        let user = Config {
            xla_options: vec![("xla_cpu_experimental_ynn_fusion_type".into(), XlaOption::Str(String::new()))],
            ..Config::default()
        };
        assert_eq!(unknown_default(&user, std::iter::empty(), refused), None);
        // Another backend's defaults are not this one's.
        assert_eq!(
            unknown_default(&Config { backend: Backend::Gpu, ..Config::default() }, std::iter::empty(), refused),
            None
        );
        // The provisioned plugin's own defaults (the CUDA tools' directory) are dropped the same way.
        let cuda_dir = "No such compile option: 'xla_gpu_cuda_data_dir'";
        let gpu = Config { backend: Backend::Gpu, ..Config::default() };
        let plugin = || std::iter::once("xla_gpu_cuda_data_dir".to_string());
        assert_eq!(unknown_default(&gpu, plugin(), cuda_dir).as_deref(), Some("xla_gpu_cuda_data_dir"));
        assert_eq!(unknown_default(&gpu, std::iter::empty(), cuda_dir), None);
    }
}

/// The runtime, created from the environment on first use.
pub(crate) fn runtime() -> Result<&'static Runtime> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let config = Config::from_env()?;
    init_with(config)
}

fn init_with(config: Config) -> Result<&'static Runtime> {
    let _guard = INIT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(rt) = RUNTIME.get() {
        return if rt.config == config {
            Ok(rt)
        } else {
            Err(Error::Config(format!(
                "already initialized with {:?}; init() must come before the first tensor is read",
                rt.config
            )))
        };
    }
    let rt = Runtime::new(config)?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// Set up the runtime explicitly (before any tensor is read). Calling it again with the same config is a no-op.
pub fn init(config: Config) -> Result<()> {
    init_with(config).map(|_| ())
}

/// The platform the runtime runs on (`"cpu"`, `"cuda"`, …), initializing it if needed.
pub fn platform() -> Result<String> {
    Ok(runtime()?.client.platform_name()?)
}

/// What the runtime loaded: useful in logs and bug reports.
#[derive(Clone, Debug)]
pub struct RuntimeInfo {
    /// The plugin's platform name (`cpu`, `cuda`, `tpu`).
    pub platform: String,
    /// The plugin file loaded.
    pub plugin_path: PathBuf,
    /// The plugin's PJRT C API version (major, minor).
    pub api_version: (i32, i32),
    /// Devices the plugin offers.
    pub device_count: usize,
    /// The device programs run on.
    pub device: String,
}

/// Describe the runtime, initializing it if needed.
pub fn runtime_info() -> Result<RuntimeInfo> {
    let rt = runtime()?;
    let plugin = rt.client.plugin();
    Ok(RuntimeInfo {
        platform: rt.client.platform_name()?,
        plugin_path: plugin.path().to_path_buf(),
        api_version: plugin.api_version(),
        device_count: rt.client.devices().len(),
        device: format!("{} {}", rt.device.kind(), rt.device.id()),
    })
}

/// Every device's allocator statistics (bytes in use, peak, limit), in device order, initializing the runtime
/// if needed. The CPU plugins keep none: there this is the plugin's `Unimplemented` error.
pub fn memory_stats() -> Result<Vec<lazuli_pjrt::MemoryStats>> {
    let rt = runtime()?;
    Ok(rt.client.devices().iter().map(|d| d.memory_stats()).collect::<std::result::Result<_, _>>()?)
}

thread_local! {
    /// The latest program this thread launched, for [`program_memory`].
    static LAST_PROGRAM: std::cell::RefCell<Option<Arc<lazuli_pjrt::LoadedExecutable>>> =
        const { std::cell::RefCell::new(None) };
}

/// Note the program this thread launches now (`exec::materialize`).
pub(crate) fn note_launched(exe: &Arc<lazuli_pjrt::LoadedExecutable>) {
    LAST_PROGRAM.with_borrow_mut(|last| *last = Some(exe.clone()));
}

/// XLA's memory plan of the latest program this thread launched (a training step's, right after its `sync()`):
/// its inputs, outputs and the intermediate values live at its high-water mark, from the compiled program's
/// buffer assignment. [`lazuli_pjrt::CompiledMemoryStats::peak_bytes`] is the most the step holds at once. Unlike
/// [`memory_stats`] this is per program, and the CPU plugin reports it too. `None` before any program ran.
pub fn program_memory() -> Result<Option<lazuli_pjrt::CompiledMemoryStats>> {
    let exe = LAST_PROGRAM.with_borrow(|last| last.clone());
    Ok(exe.map(|e| e.compiled_memory_stats()).transpose()?)
}

impl std::fmt::Display for RuntimeInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let file = self.plugin_path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
        write!(
            f,
            "{} ({} device(s), running on {}), plugin {file} with PJRT C API {}.{}",
            self.platform, self.device_count, self.device, self.api_version.0, self.api_version.1
        )
    }
}

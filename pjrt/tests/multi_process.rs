//! What the CPU plugins do with a multi-process client: two real processes, each creating a client with its
//! `process_id` and the key-value callbacks (a store of files in a shared directory), then compiling and
//! running a 2-partition all-reduce over "both processes' devices". Each process reports what happened in a
//! line; the test checks those lines, so a plugin that starts to behave otherwise shows up here
//! (docs/perf-log/2026-12-01-multi-process-cpu.md records the findings).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{plugin, Which};
use lazuli_pjrt::{provision, Client, ClientOptions, CompileOptions, ErrorCode, KeyValueError, KeyValueStore, Plugin};

const ROLE: &str = "LAZULI_TEST_PJRT_PROCESS";
const DIR: &str = "LAZULI_TEST_PJRT_KV_DIR";
const PLUGIN: &str = "LAZULI_TEST_PJRT_PLUGIN";

/// Files in a directory shared by the processes, one per key; counts the plugin's calls.
struct FileStore {
    dir: PathBuf,
    calls: AtomicUsize,
}

impl FileStore {
    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key.replace(['/', ':'], "_"))
    }
}

impl KeyValueStore for FileStore {
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KeyValueError> {
        self.calls.fetch_add(1, Relaxed);
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(v) = std::fs::read(self.path(key)) {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(KeyValueError::new(ErrorCode::DeadlineExceeded, format!("{key} not set in time")));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, KeyValueError> {
        self.calls.fetch_add(1, Relaxed);
        Ok(std::fs::read(self.path(key)).ok())
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), KeyValueError> {
        self.calls.fetch_add(1, Relaxed);
        let tmp = self.path(&format!("{key}.tmp"));
        std::fs::write(&tmp, value)
            .and_then(|()| std::fs::rename(&tmp, self.path(key)))
            .map_err(|e| KeyValueError::new(ErrorCode::Internal, e.to_string()))
    }
}

/// A sum over rows split across 2 partitions: needs an all-reduce between them.
const ALL_REDUCE: &str = r#"
module @spmd attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @main(%x: tensor<4x2xf32> {mhlo.sharding = "{devices=[2,1]0,1}"})
      -> (tensor<2xf32> {mhlo.sharding = "{replicated}"}) {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0] : (tensor<4x2xf32>, tensor<f32>) -> tensor<2xf32>
    return %s : tensor<2xf32>
  }
}"#;

/// One process: what its client sees and what compiling the all-reduce does, as `key=value` lines.
/// `which`: a CPU plugin, or `None` for the CUDA plugin (one GPU per process, by `CUDA_VISIBLE_DEVICES`).
fn probe(which: Option<Which>, process_id: i64, dir: &Path) -> BTreeMap<String, String> {
    let mut seen = BTreeMap::new();
    let store = Arc::new(FileStore { dir: dir.to_path_buf(), calls: AtomicUsize::new(0) });
    let (plugin, options) = match which {
        Some(which) => (plugin(which), ClientOptions::new().cpu_device_count(1).int_option("process_id", process_id)),
        None => {
            let path = provision::gpu_plugin_path().unwrap_or_else(|e| panic!("{e}"));
            let options = ClientOptions::new()
                .int_option("node_id", process_id)
                .int_option("num_nodes", 2)
                .bool_option("preallocate", false);
            (Plugin::load(&path).unwrap_or_else(|e| panic!("{e}")), options)
        }
    };
    let client = match Client::new(&plugin, &options.key_value_store(store.clone())) {
        Ok(c) => c,
        Err(e) => {
            seen.insert("create".into(), format!("error: {e}"));
            return seen;
        }
    };
    seen.insert("create".into(), "ok".into());
    seen.insert("process_index".into(), format!("{:?}", client.process_index().ok()));
    let ids: Vec<i32> = client.devices().iter().map(|d| d.id()).collect();
    seen.insert("addressable_device_ids".into(), format!("{ids:?}"));
    seen.insert("global_device_ids".into(), format!("{:?}", client.global_device_ids()));
    seen.insert("kv_calls_at_create".into(), store.calls.load(Relaxed).to_string());
    let compiled = client.compile(ALL_REDUCE, &CompileOptions::spmd(2));
    seen.insert(
        "compile_2_partitions".into(),
        match &compiled {
            Ok(_) => "ok".into(),
            Err(e) => format!("error: {}", e.to_string().lines().next().unwrap_or_default()),
        },
    );
    if let Ok(exe) = compiled {
        // Rows 2p and 2p+1 of [[1, 2], [3, 4], [5, 6], [7, 8]] here; the sum over all rows is [16, 20].
        let p = process_id as f32;
        let rows = [4.0 * p + 1.0, 4.0 * p + 2.0, 4.0 * p + 3.0, 4.0 * p + 4.0];
        let device = &client.devices()[0];
        let x = common::f32_buffer(&client, &rows, &[2, 2], device);
        let sum = exe.execute(&[&x]).map(|out| common::read_f32(&out[0]));
        seen.insert("all_reduce".into(), format!("{sum:?}"));
    }
    seen
}

#[test]
fn probe_process() {
    let Ok(id) = std::env::var(ROLE) else { return };
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let which = match std::env::var(PLUGIN).unwrap().as_str() {
        "xla-cpu-pjrt" => Some(Which::XlaCpu),
        "cuda" => None,
        _ => Some(Which::Default),
    };
    for (k, v) in probe(which, id.parse().unwrap(), &dir) {
        println!("PROBE {k}={v}");
    }
}

/// Runs the probe in two processes sharing a store; their `PROBE` lines, per process.
fn run_two_processes(plugin: &str) -> Vec<BTreeMap<String, String>> {
    let dir = std::env::temp_dir().join(format!("lazuli-pjrt-kv-{plugin}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let children: Vec<_> = (0..2)
        .map(|p| {
            Command::new(std::env::current_exe().unwrap())
                .args(["probe_process", "--exact", "--nocapture", "--test-threads=1"])
                .env(ROLE, p.to_string())
                .env(PLUGIN, plugin)
                // "default" is the default plugin even when the suite runs against the second one.
                .env_remove("LAZULI_CPU_PLUGIN")
                .env("CUDA_VISIBLE_DEVICES", p.to_string())
                .env(DIR, &dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Both run at once: a multi-process client waits in its creation for the other's topology.
    let outputs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let _ = std::fs::remove_dir_all(&dir);
    outputs
        .into_iter()
        .map(|out| {
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_once("PROBE ").map(|(_, kv)| kv.to_string()))
                .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
                .collect()
        })
        .collect()
}

/// The default CPU plugin (XLA of jaxlib 0.11.2) takes `process_id` (the client's process index, and its
/// device's id: 2048 × the process id) and the callbacks, but never calls the store and sees only its own
/// device: no global topology, and a program over two processes' devices is refused by XLA ("Multiprocess
/// computations aren't implemented on the CPU backend"). Cross-process collectives therefore need another
/// plugin (the CUDA plugin, through NCCL); see the perf-log note.
#[test]
fn the_default_cpu_plugin_builds_no_multi_process_client() {
    let seen = run_two_processes("default");
    for (p, s) in seen.iter().enumerate() {
        assert_eq!(s["create"], "ok", "process {p}: {s:?}");
        assert_eq!(s["process_index"], format!("Some({p})"), "process {p}: {s:?}");
        assert_eq!(s["addressable_device_ids"], format!("[{}]", 2048 * p), "process {p}: {s:?}");
        assert_eq!(s["global_device_ids"], s["addressable_device_ids"], "process {p}: {s:?}");
        assert_eq!(s["kv_calls_at_create"], "0", "process {p}: {s:?}");
        assert!(s["compile_2_partitions"].starts_with("error"), "process {p}: {s:?}");
    }
}

/// xla-cpu-pjrt 0.0.1 ignores `process_id`: both processes are process 0 with device 0.
#[test]
fn xla_cpu_pjrt_ignores_the_process_id() {
    let seen = run_two_processes("xla-cpu-pjrt");
    for (p, s) in seen.iter().enumerate() {
        assert_eq!(s["create"], "ok", "process {p}: {s:?}");
        assert_eq!(s["process_index"], "Some(0)", "process {p}: {s:?}");
        assert_eq!(s["global_device_ids"], "[0]", "process {p}: {s:?}");
        assert_eq!(s["kv_calls_at_create"], "0", "process {p}: {s:?}");
        assert!(s["compile_2_partitions"].starts_with("error"), "process {p}: {s:?}");
    }
}

/// The CUDA plugin across two processes, one GPU each: the clients exchange their topology through the store,
/// each sees both GPUs, and the 2-partition sum all-reduces across the processes (NCCL). On a 2-GPU machine:
/// `cargo test -p lazuli-pjrt --test multi_process cuda -- --ignored --nocapture`.
#[test]
#[ignore = "needs two NVIDIA GPUs and the jax-cuda13-pjrt (or -cuda12-) plugin"]
fn cuda_two_processes_all_reduce() {
    let seen = run_two_processes("cuda");
    for (p, s) in seen.iter().enumerate() {
        eprintln!("process {p}: {s:?}");
        assert_eq!(s["create"], "ok", "process {p}: {s:?}");
        assert_ne!(s["kv_calls_at_create"], "0", "process {p}: {s:?}");
        assert_eq!(s["global_device_ids"].matches(',').count(), 1, "two devices in all: {s:?}");
        assert_eq!(s["compile_2_partitions"], "ok", "process {p}: {s:?}");
        assert_eq!(s["all_reduce"], "Ok([16.0, 20.0])", "process {p}: {s:?}");
    }
}

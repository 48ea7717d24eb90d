//! Every Linux target of the table: its pinned wheel fetched (into the default cache, once per machine),
//! checked, unpacked and loaded, its C API version read and compared with the table; the plugins whose libraries
//! are absent here name them; clients without their hardware fail with lazuli's error within a bounded time.
//!
//! Each case runs in a child process (this binary again, running only `child`), so that a plugin's crash or
//! hang shows up as a signal or a timeout instead of killing the harness, and so that no two large plugins share
//! a process.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lazuli_pjrt::provision::{self, targets, Device, Host, Sources, Target, TARGETS};
use lazuli_pjrt::{ClientOptions, Error, Plugin};

const CHILD: &str = "LAZULI_TEST_TARGETS_CHILD";
/// The bound on client creation in these tests; a child that outlives it by far is killed.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(20);

/// The child side: `load` or `client` (from the environment) of the device in `LAZULI_DEVICE`, with the
/// provisioning sources of the environment. Exit 0 with `api M.N` on stdout when it worked, exit 3 with the
/// error on stderr when not.
#[test]
#[ignore = "run in a child process by the other tests of this file"]
fn child() {
    let Ok(what) = std::env::var(CHILD) else { return };
    let device = Device::from_setting(&std::env::var("LAZULI_DEVICE").unwrap()).unwrap();
    let sources = Sources::from_env().unwrap_or_else(|e| fail(e));
    provision::device_plugin_in(device, &sources).unwrap_or_else(|e| fail(e)); // fetched, if needed, untimed
    let start = Instant::now();
    let loaded = provision::load_device_plugin(device, &sources);
    eprintln!("load: {:.2} s", start.elapsed().as_secs_f64());
    let (plugin, found) = loaded.unwrap_or_else(|e| fail(e));
    let (major, minor) = plugin.api_version();
    println!("api {major}.{minor} from {}", found.origin);
    for library in &found.preload {
        println!("preloaded {}", library.display());
    }
    if let Some(dir) = &found.cuda_data_dir {
        println!("cuda data dir {}", dir.display());
    }
    if what == "client" {
        let options = ClientOptions::new();
        let start = Instant::now();
        let client = provision::create_device_client(&plugin, &found, &options, CLIENT_TIMEOUT);
        eprintln!("client: {:.2} s", start.elapsed().as_secs_f64());
        let client = client.unwrap_or_else(|e| fail(e));
        println!("client on {} with {} devices", client.platform_name().unwrap(), client.devices().len());
    }
    std::process::exit(0)
}

fn fail(e: Error) -> ! {
    eprintln!("child error: {e}");
    std::process::exit(3)
}

/// Runs the child for `device` with `env`, killing it after `limit`; returns its output and how long it ran.
fn run_child(what: &str, device: Device, env: &[(&str, &Path)], limit: Duration) -> (Output, Duration) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, what)
        .env("LAZULI_DEVICE", device.setting())
        .env("TF_CPP_MIN_LOG_LEVEL", "2")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in [
        "LAZULI_TARGET",
        "LAZULI_WHEELS",
        "LAZULI_GPU_PLUGIN",
        "LAZULI_TPU_PLUGIN",
        "TPU_LIBRARY_PATH",
        "LAZULI_PYTHON",
    ] {
        command.env_remove(var);
    }
    for (var, value) in env {
        command.env(var, value);
    }
    let start = Instant::now();
    let mut child = command.spawn().unwrap();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out, start.elapsed())
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn linux_targets() -> impl Iterator<Item = &'static Target> {
    TARGETS.iter().filter(|t| t.host == Host::LinuxX86_64)
}

/// Every Linux target's pinned plugin, fetched into the default cache if needed: loaded with the table's C API
/// version, or, where its libraries are absent, refused with an error naming the first one and its wheel.
#[test]
fn every_pinned_plugin_is_fetched_checked_and_loaded() {
    for target in linux_targets() {
        let name = PathBuf::from(target.name);
        let (out, took) = run_child("load", target.device, &[("LAZULI_TARGET", &name)], Duration::from_secs(600));
        let (stdout, stderr) = text(&out);
        eprintln!("{}: {:.1} s", target.name, took.as_secs_f64());
        match target.api_version {
            Some((major, minor)) => {
                assert_eq!(out.status.code(), Some(0), "{}: {stdout}\n{stderr}", target.name);
                assert!(
                    stdout.contains(&format!("api {major}.{minor} from the pinned wheel")),
                    "{}: {stdout}",
                    target.name
                );
            }
            None => {
                assert_eq!(out.status.code(), Some(3), "{}: {stdout}\n{stderr}", target.name);
                let first = target.libraries.iter().find(|l| l.needed).unwrap();
                let named = format!("{} (pip wheel {}", first.soname, first.wheel.unwrap());
                assert!(stderr.contains("libraries that are not found") && stderr.contains(&named), "{stderr}");
                assert!(stderr.contains("python3 -m pip install"), "{stderr}");
            }
        }
    }
}

/// Without the hardware, the CUDA and TPU clients fail with lazuli's sentence, well within the bound.
#[test]
fn clients_without_hardware_fail_clearly_and_in_time() {
    for name in ["cuda13", "libtpu"] {
        let target = targets::target(name).unwrap();
        let name_path = PathBuf::from(name);
        let limit = CLIENT_TIMEOUT + Duration::from_secs(60); // the load itself, on a cold disk cache
        let (out, took) = run_child("client", target.device, &[("LAZULI_TARGET", &name_path)], limit);
        let (stdout, stderr) = text(&out);
        eprintln!("{name}: client creation failed after {:.1} s:\n{stderr}", took.as_secs_f64());
        assert_eq!(out.status.code(), Some(3), "{name}: {stdout}\n{stderr}");
        let plugin = format!("the PJRT {} plugin", target.device.name());
        assert!(stderr.contains(&plugin) && stderr.contains("(from the pinned wheel)"), "{stderr}");
        assert!(stderr.contains("cannot create a client") || stderr.contains("did not create a client within"));
        // Loading and client creation end well within the bound: libtpu does not wait on metadata servers.
        for step in ["load", "client"] {
            let seconds = stderr.lines().find_map(|l| l.strip_prefix(&format!("{step}: "))?.strip_suffix(" s"));
            let seconds: f64 = seconds.unwrap_or_else(|| panic!("no {step} time in {stderr}")).parse().unwrap();
            assert!(seconds < CLIENT_TIMEOUT.as_secs_f64() / 2.0, "{name}: {step} took {seconds} s");
        }
        if name == "cuda13" {
            // No NVIDIA driver here, nor the nvidia-* wheels: both named, with where they come from.
            assert!(stderr.contains("libcuda.so.1 (the NVIDIA driver"), "{stderr}");
            assert!(stderr.contains("libcublas.so.13 (pip wheel nvidia-cublas>=13.0.0.19"), "{stderr}");
        }
    }
}

/// A file named by a variable that is another device's plugin loads, and its client is refused: the CPU plugin
/// is no CUDA plugin.
#[test]
fn a_plugin_of_the_wrong_platform_is_refused() {
    let cpu = provision::cpu_plugin_path().unwrap();
    let (out, _) = run_child("client", Device::Cuda, &[("LAZULI_GPU_PLUGIN", &cpu)], Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(stdout.contains("from LAZULI_GPU_PLUGIN"), "{stdout}");
    assert!(stderr.contains("runs on platform \"cpu\", not \"cuda\" as LAZULI_DEVICE=gpu expects"), "{stderr}");
}

/// A plugin outside the accepted C API range is refused before it is initialized, naming both versions.
#[test]
fn a_plugin_outside_the_accepted_api_range_is_refused() {
    let path = provision::cpu_plugin_path_for(provision::CpuPluginKind::LammpsJax0112).unwrap();
    let err = Plugin::load_accepting(&path, (0, 57), (0, 100)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::ApiVersion { found: (0, 115), need: (0, 57), newest: (0, 100), .. }), "{err:?}");
    assert!(text.contains("implements C API 0.115, but lazuli accepts 0.57 to 0.100"), "{text}");
    assert!(text.contains("use an older plugin, or a newer lazuli"), "{text}");
    let text = Plugin::load_accepting(&path, (0, 116), (0, 200)).unwrap_err().to_string();
    assert!(text.contains("accepts 0.116 to 0.200 for it; use a newer plugin"), "{text}");
}

/// A corrupted wheel given in `LAZULI_WHEELS` is refused by its sha256, kept (it is the user's), and nothing is
/// unpacked; no download is tried while the wheel is there.
#[test]
fn a_corrupted_wheel_is_refused() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("targets-corrupt-{}", std::process::id()));
    let wheels = root.join("wheels");
    fs::create_dir_all(&wheels).unwrap();
    let target = targets::target("cuda13").unwrap();
    let wheel = wheels.join(target.plugin.wheel_file);
    fs::write(&wheel, b"PK\x03\x04 not the wheel").unwrap();
    let cache = root.join("cache");
    let name = PathBuf::from(target.name);
    let env = [("LAZULI_TARGET", name.as_path()), ("LAZULI_WHEELS", &wheels), ("LAZULI_CACHE_DIR", &cache)];
    let (out, _) = run_child("load", Device::Cuda, &env, Duration::from_secs(60));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let refused = format!("{} has sha256 ", target.plugin.wheel_file);
    assert!(stderr.contains(&refused) && stderr.contains(&format!("expected {}", target.plugin.sha256)), "{stderr}");
    assert!(stderr.contains("-m pip download --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64"));
    assert!(!stderr.contains("fetching PJRT"), "a download was tried: {stderr}");
    assert!(wheel.is_file(), "the user's wheel was deleted");
    let plugin_dir = cache.join("plugins").join(format!("{}-{}", target.plugin.pip_name, target.plugin.version));
    assert!(!plugin_dir.join("xla_cuda_plugin.so").exists());

    // A download that pip reports done but that is damaged (a proxy's error page, a cut transfer): a Python whose
    // `pip download` writes garbage under the wheel's name.
    let python = root.join("python");
    let script = format!(
        "#!/bin/sh\nwhile [ \"$1\" != -d ]; do shift; done\nmkdir -p \"$2\"\nprintf 'damaged' > \"$2/{}\"\n",
        target.plugin.wheel_file
    );
    write_executable(&python, &script);
    let env = [("LAZULI_TARGET", name.as_path()), ("LAZULI_PYTHON", &python), ("LAZULI_CACHE_DIR", &cache)];
    let (out, _) = run_child("load", Device::Cuda, &env, Duration::from_secs(60));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(stderr.contains("fetching PJRT CUDA plugin jax-cuda13-pjrt==0.12.0.1"), "{stderr}");
    use sha2::Digest;
    let damaged: String = sha2::Sha256::digest(b"damaged").iter().map(|b| format!("{b:02x}")).collect();
    let refused = format!("{} has sha256 {damaged}, expected {}", target.plugin.wheel_file, target.plugin.sha256);
    assert!(stderr.contains(&refused), "{stderr}");
    assert!(!plugin_dir.join("xla_cuda_plugin.so").exists());
    let leftovers: Vec<_> = fs::read_dir(&plugin_dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(
        leftovers.iter().all(|n| !n.to_string_lossy().ends_with(".whl")),
        "the damaged download stayed: {leftovers:?}"
    );
    fs::remove_dir_all(&root).unwrap();
}

/// The CUDA runtime's wheel (2.5 MB), kept in the cache's `test-wheels/` so a machine downloads it once.
fn cuda_runtime_wheel() -> PathBuf {
    const WHEEL: &str = "nvidia_cuda_runtime-13.5.37-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";
    const SHA256: &str = "df2b79a8852f10d1fef8c848489c49eebb5754051bf870202a862831412b179d";
    let dir = provision::cache_dir().unwrap().join("test-wheels");
    let wheel = dir.join(WHEEL);
    if !wheel.is_file() {
        let status = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"])
            .args(["--platform", "manylinux_2_17_x86_64", "nvidia-cuda-runtime==13.5.37", "-d"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success() && wheel.is_file(), "pip download of {WHEEL} failed");
    }
    use sha2::Digest;
    let digest: String = sha2::Sha256::digest(fs::read(&wheel).unwrap()).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(digest, SHA256, "{}", wheel.display());
    wheel
}

fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// The CUDA plugin's libraries are opened before it, by absolute path: unpacked from a wheel in `LAZULI_WHEELS`,
/// or from the site-packages of the Python in use (the plugin itself still the pinned one); those found
/// nowhere are named when the client fails.
#[test]
fn cuda_libraries_from_wheels_or_site_packages_are_opened_first() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("targets-cudart-{}", std::process::id()));
    let wheels = root.join("wheels");
    fs::create_dir_all(&wheels).unwrap();
    let wheel = cuda_runtime_wheel();
    fs::copy(&wheel, wheels.join(wheel.file_name().unwrap())).unwrap();
    // A Python without site-packages: the libraries can only come from the wheels.
    let no_site = root.join("no-site-python");
    write_executable(&no_site, "#!/bin/sh\nexit 1\n");
    let cuda13 = PathBuf::from("cuda13");
    let env = [("LAZULI_TARGET", cuda13.as_path()), ("LAZULI_WHEELS", &wheels), ("LAZULI_PYTHON", &no_site)];
    let (out, _) = run_child("client", Device::Cuda, &env, Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let unpacked = provision::cache_dir().unwrap().join("libs/nvidia/cu13/lib/libcudart.so.13");
    assert!(stdout.contains(&format!("preloaded {}", unpacked.canonicalize().unwrap().display())), "{stdout}");
    assert!(!stderr.contains("\n  libcudart.so.13 ("), "found, yet named missing: {stderr}");
    assert!(stderr.contains("\n  libcublas.so.13 (pip wheel nvidia-cublas"), "{stderr}");
    let fetch = "--platform manylinux1_x86_64 \"nvidia-nvjitlink>=13.0.39\" \"nvidia-cuda-nvrtc";
    assert!(stderr.contains(fetch) && stderr.contains("-d DIR` and set LAZULI_WHEELS=DIR"), "{stderr}");

    // A Python whose site-packages hold the CUDA runtime and ptxas, as `pip install "jax[cuda13]"` leaves them.
    let site = root.join("site-packages");
    fs::create_dir_all(site.join("nvidia/cu13/lib")).unwrap();
    fs::create_dir_all(site.join("nvidia/cu13/bin")).unwrap();
    fs::copy(&unpacked, site.join("nvidia/cu13/lib/libcudart.so.13")).unwrap();
    fs::write(site.join("nvidia/cu13/bin/ptxas"), "").unwrap();
    let python = root.join("python");
    write_executable(&python, &format!("#!/bin/sh\necho '{}'\n", site.display()));
    let env = [("LAZULI_TARGET", cuda13.as_path()), ("LAZULI_PYTHON", &python)];
    let (out, _) = run_child("load", Device::Cuda, &env, Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let from_site = site.join("nvidia/cu13/lib/libcudart.so.13").canonicalize().unwrap();
    assert!(stdout.contains(&format!("preloaded {}", from_site.display())), "{stdout}");
    assert!(stdout.contains(&format!("cuda data dir {}", site.join("nvidia/cu13").display())), "{stdout}");
    fs::remove_dir_all(&root).unwrap();
}

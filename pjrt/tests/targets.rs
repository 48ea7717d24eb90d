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

use lazuli_pjrt::provision::{self, targets, Device, Host, LibraryWheel, Sources, Target, TARGETS};
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
            assert!(stderr.contains("libcublas.so.13 (pip wheel nvidia-cublas==13.1.0.3"), "{stderr}");
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

/// The pinned wheel `name` of the CUDA 13 rows.
fn cuda13_wheel(name: &str) -> &'static LibraryWheel {
    let target = targets::target("cuda13-0.11.2").unwrap();
    provision::library_wheels(target).into_iter().find(|w| w.name() == name).unwrap()
}

/// The CUDA runtime's pinned wheel (2.2 MB), kept in the cache's `test-wheels/` so a machine downloads it once.
fn cuda_runtime_wheel() -> PathBuf {
    static FETCHED: std::sync::Mutex<()> = std::sync::Mutex::new(()); // two tests use it
    let _once = FETCHED.lock().unwrap_or_else(|p| p.into_inner());
    let pin = cuda13_wheel("nvidia-cuda-runtime");
    let dir = provision::cache_dir().unwrap().join("test-wheels");
    let wheel = dir.join(pin.file);
    if !wheel.is_file() {
        let status = Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check"])
            .args(pin.pip_args())
            .args([pin.requirement, "-d"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success() && wheel.is_file(), "pip download of {} failed", pin.file);
    }
    assert_eq!(sha256(&wheel), pin.sha256, "{}", wheel.display());
    wheel
}

fn sha256(path: &Path) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(fs::read(path).unwrap()).iter().map(|b| format!("{b:02x}")).collect()
}

fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// The small pinned CUDA 13 wheels (the runtime, 2.2 MB, and CUPTI, 10.7 MB) fetched with pip into the default
/// cache (once per machine), checked and unpacked; with `LAZULI_PYTHON=none` the plugin then opens `libcudart`
/// from there by absolute path (it loads without a GPU driver), and names the libraries still missing with the
/// exact `pip download` lines of their pinned wheels.
#[test]
fn pinned_cuda_libraries_are_fetched_unpacked_and_opened_from_the_cache() {
    let target = targets::target("cuda13-0.11.2").unwrap();
    let sources = Sources::default();
    provision::pinned_plugin_path_in(target, &sources).unwrap(); // the child runs no pip
    let small = [cuda13_wheel("nvidia-cuda-runtime"), cuda13_wheel("nvidia-cuda-cupti")];
    let dir = provision::fetch_library_wheels_in(target, &small, &sources).unwrap();
    let cudart = dir.join("nvidia/cu13/lib/libcudart.so.13");
    assert!(cudart.is_file() && dir.join("nvidia/cu13/lib/libcupti.so.13").is_file(), "{}", dir.display());

    let (name, none) = (PathBuf::from(target.name), PathBuf::from("none"));
    let env = [("LAZULI_TARGET", name.as_path()), ("LAZULI_PYTHON", none.as_path())];
    let (out, _) = run_child("client", Device::Cuda, &env, Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("preloaded {}", cudart.canonicalize().unwrap().display())), "{stdout}");
    assert!(!stderr.contains("\n  libcudart.so.13 ("), "found, yet named missing: {stderr}");
    assert!(stderr.contains("\n  libcublas.so.13 (pip wheel nvidia-cublas==13.1.0.3"), "{stderr}");
    let cublas = "python3 -m pip download --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 \
                  nvidia-cublas==13.1.0.3 -d DIR";
    assert!(stderr.contains(cublas) && stderr.contains("set LAZULI_WHEELS=DIR"), "{stderr}");
    assert!(!stderr.contains("nvidia-cuda-runtime=="), "the runtime is there, yet listed: {stderr}");
}

/// Under `root`: a fresh cache in which every pinned wheel of `target` but those `fetched` picks is marked
/// unpacked (so nothing else is fetched), and a stand-in driver directory (an empty `libcuda.so.1`, for
/// `LD_LIBRARY_PATH`): the machine on which lazuli fetches what it finds nowhere.
fn marked_cache_and_driver(
    target: &Target,
    root: &Path,
    fetched: impl Fn(&LibraryWheel) -> bool,
) -> (PathBuf, PathBuf) {
    let (cache, driver) = (root.join("cache"), root.join("driver"));
    let unpacked = cache.join("libs").join(target.library_dir).join(".unpacked");
    fs::create_dir_all(&unpacked).unwrap();
    for wheel in provision::library_wheels(target).into_iter().filter(|w| !fetched(w)) {
        fs::write(unpacked.join(wheel.file), wheel.sha256).unwrap();
    }
    fs::create_dir_all(&driver).unwrap();
    fs::write(driver.join("libcuda.so.1"), "").unwrap();
    (cache, driver)
}

/// A child that provisions and loads `target`'s pinned plugin with `cache`, the stand-in `driver`, no Python, and
/// `more` variables; it must succeed. Its stdout and stderr.
fn load_without_python(target: &Target, cache: &Path, driver: &Path, more: &[(&str, &Path)]) -> (String, String) {
    let plugin = provision::pinned_plugin_path_in(target, &Sources::default()).unwrap();
    let (name, none) = (PathBuf::from(target.name), PathBuf::from("none"));
    let mut env = vec![
        ("LAZULI_TARGET", name.as_path()),
        ("LAZULI_GPU_PLUGIN", &plugin),
        ("LAZULI_CACHE_DIR", cache),
        ("LAZULI_PYTHON", &none),
        ("LD_LIBRARY_PATH", driver),
    ];
    env.extend_from_slice(more);
    let (out, _) = run_child("load", Device::Cuda, &env, Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// Where the driver is (here a stand-in `libcuda.so.1` on `LD_LIBRARY_PATH`), the wheels of libraries found
/// nowhere are fetched when the plugin is provisioned: here the runtime's, from `LAZULI_WHEELS` (the others are
/// marked unpacked in a fresh cache, so nothing else is fetched). A library of another version in site-packages is
/// used, and the log line says so.
#[test]
fn cuda_libraries_found_nowhere_are_fetched_and_site_packages_win() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("targets-cudart-{}", std::process::id()));
    let wheels = root.join("wheels");
    let target = targets::target("cuda13-0.11.2").unwrap();
    let runtime = cuda13_wheel("nvidia-cuda-runtime");
    fs::create_dir_all(&wheels).unwrap();
    fs::copy(cuda_runtime_wheel(), wheels.join(runtime.file)).unwrap();
    let (cache, driver) = marked_cache_and_driver(target, &root, |w| w == runtime);
    let unpacked = cache.join("libs/cuda13");
    let (stdout, stderr) = load_without_python(target, &cache, &driver, &[("LAZULI_WHEELS", &wheels)]);
    let cudart = unpacked.join("nvidia/cu13/lib/libcudart.so.13");
    assert!(stderr.contains(&format!("unpacking nvidia-cuda-runtime==13.0.96 from {}", wheels.display())));
    assert!(stdout.contains(&format!("preloaded {}", cudart.canonicalize().unwrap().display())), "{stdout}");
    assert!(wheels.join(runtime.file).is_file(), "the user's wheel was deleted");

    // A Python whose site-packages hold another CUDA runtime and the CUDA tools, as `pip install "jax[cuda13]"`
    // leaves them.
    let site = root.join("site-packages");
    for dir in
        ["nvidia/cu13/lib", "nvidia/cu13/bin", "nvidia/cu13/nvvm/libdevice", "nvidia_cuda_runtime-13.0.48.dist-info"]
    {
        fs::create_dir_all(site.join(dir)).unwrap();
    }
    fs::copy(&cudart, site.join("nvidia/cu13/lib/libcudart.so.13")).unwrap();
    fs::write(site.join("nvidia/cu13/bin/ptxas"), "").unwrap();
    let python = root.join("python");
    write_executable(&python, &format!("#!/bin/sh\necho '{}'\n", site.display()));
    let name = PathBuf::from(target.name);
    let env = [("LAZULI_TARGET", name.as_path()), ("LAZULI_PYTHON", &python)];
    let (out, _) = run_child("load", Device::Cuda, &env, Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let from_site = site.join("nvidia/cu13/lib/libcudart.so.13").canonicalize().unwrap();
    assert!(stdout.contains(&format!("preloaded {}", from_site.display())), "{stdout}");
    assert!(stdout.contains(&format!("cuda data dir {}", site.join("nvidia/cu13").display())), "{stdout}");
    let note = format!("using nvidia-cuda-runtime 13.0.48 from {} (libcudart.so.13", site.display());
    assert!(stderr.contains(&note) && stderr.contains("lazuli pins 13.0.96"), "{stderr}");
    fs::remove_dir_all(&root).unwrap();
}

/// A CUDA toolkit of the system's (here `CUDA_HOME`) holds `ptxas` and libdevice: the tools wheels are not
/// fetched (offline, with no Python, fetching would fail), and XLA is pointed at the toolkit.
#[test]
fn a_system_cuda_toolkit_stands_in_for_the_tools_wheels() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("targets-toolkit-{}", std::process::id()));
    let toolkit = root.join("cuda");
    let target = targets::target("cuda13-0.11.2").unwrap();
    let (cache, driver) = marked_cache_and_driver(target, &root, |w| target.cuda_tools.contains(w));
    fs::create_dir_all(toolkit.join("bin")).unwrap();
    fs::create_dir_all(toolkit.join("nvvm/libdevice")).unwrap();
    write_executable(&toolkit.join("bin/ptxas"), "#!/bin/sh\n");
    let (stdout, stderr) = load_without_python(target, &cache, &driver, &[("CUDA_HOME", &toolkit)]);
    assert!(stdout.contains(&format!("cuda data dir {}", toolkit.display())), "{stdout}");
    assert!(!stderr.contains("nvidia-cuda-nvcc"), "the tools wheel was wanted: {stderr}");
    fs::remove_dir_all(&root).unwrap();
}

/// `LAZULI_PYTHON=none` searches no site-packages: a Python whose path (here through `PYTHONPATH`) holds a CUDA
/// plugin and runtime provides both, and with `none` neither is seen.
#[test]
fn python_none_searches_no_site_packages() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("targets-python-none-{}", std::process::id()));
    let site = root.join("site-packages");
    fs::create_dir_all(site.join("nvidia/cu13/lib")).unwrap();
    fs::create_dir_all(site.join("jax_plugins/xla_cuda13")).unwrap();
    let target = targets::target("cuda13").unwrap();
    let sources = Sources::default();
    let plugin = provision::pinned_plugin_path_in(target, &sources).unwrap();
    std::os::unix::fs::symlink(&plugin, site.join(target.installed_as)).unwrap();
    let dir = provision::fetch_library_wheels_in(target, &[cuda13_wheel("nvidia-cuda-runtime")], &sources).unwrap();
    fs::copy(dir.join("nvidia/cu13/lib/libcudart.so.13"), site.join("nvidia/cu13/lib/libcudart.so.13")).unwrap();
    let from_site = site.join("nvidia/cu13/lib/libcudart.so.13").canonicalize().unwrap();

    let (out, _) = run_child("load", Device::Cuda, &[("PYTHONPATH", &site)], Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("from the site-packages of python3"), "{stdout}");
    assert!(stdout.contains(&format!("preloaded {}", from_site.display())), "{stdout}");

    let none = PathBuf::from("none");
    let env = [("PYTHONPATH", site.as_path()), ("LAZULI_PYTHON", none.as_path())];
    let (out, _) = run_child("load", Device::Cuda, &env, Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    let searched = "no PJRT CUDA plugin is installed in any site-packages (LAZULI_PYTHON=none: none are searched)";
    assert!(stderr.contains(searched) && stderr.contains("libcuda.so.1 (the NVIDIA driver"), "{stderr}");
    // The pinned plugin still loads, its runtime not from that site-packages.
    let cuda13 = PathBuf::from("cuda13");
    let env = [("PYTHONPATH", site.as_path()), ("LAZULI_PYTHON", none.as_path()), ("LAZULI_TARGET", &cuda13)];
    let (out, _) = run_child("load", Device::Cuda, &env, Duration::from_secs(120));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.contains(&from_site.display().to_string()), "{stdout}");
    fs::remove_dir_all(&root).unwrap();
}

/// A corrupted library wheel in `LAZULI_WHEELS` is refused, naming the file and both sha256, and kept (it is the
/// user's); nothing is unpacked. Offline, the error lists the exact `pip download` line of every pinned wheel.
#[test]
fn a_corrupted_library_wheel_is_refused_and_offline_the_pinned_lines_are_printed() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("targets-libs-{}", std::process::id()));
    let (wheels, cache) = (root.join("wheels"), root.join("cache"));
    fs::create_dir_all(&wheels).unwrap();
    let target = targets::target("cuda13-0.11.2").unwrap();
    let runtime = cuda13_wheel("nvidia-cuda-runtime");
    let corrupted = wheels.join(runtime.file);
    let mut bytes = fs::read(cuda_runtime_wheel()).unwrap();
    bytes[1000] ^= 1;
    fs::write(&corrupted, &bytes).unwrap();
    let sources = Sources { wheels: Some(wheels), cache_dir: Some(cache.clone()), ..Sources::default() };
    let err = provision::fetch_library_wheels_in(target, &[runtime], &sources).unwrap_err().to_string();
    let refused = format!("{} has sha256 {}, expected {}", runtime.file, sha256(&corrupted), runtime.sha256);
    assert!(err.contains(&refused), "{err}");
    assert!(corrupted.is_file(), "the user's wheel was deleted");
    assert!(!cache.join("libs/cuda13/nvidia/cu13/lib/libcudart.so.13").exists());

    // A Python whose pip fails as it does without a network.
    let python = root.join("python");
    write_executable(&python, "#!/bin/sh\necho 'ERROR: No matching distribution found' >&2\nexit 1\n");
    let sources = Sources { python: Some(python.display().to_string()), cache_dir: Some(cache), ..Sources::default() };
    let all = provision::library_wheels(target);
    let err = provision::fetch_library_wheels_in(target, &all, &sources).unwrap_err().to_string();
    assert!(err.contains("No matching distribution found") && err.contains("fetch these 13 wheels"), "{err}");
    for wheel in &all {
        let line = format!(
            "-m pip download --no-deps --only-binary=:all: {} {} -d DIR",
            wheel.pip_args().join(" "),
            wheel.requirement
        );
        assert!(err.contains(&line), "{line} not in {err}");
    }
    assert!(err.contains("nvidia-cudnn-cu13==9.19.0.56") && err.contains("set LAZULI_WHEELS=DIR"), "{err}");
    fs::remove_dir_all(&root).unwrap();
}

/// The whole pinned CUDA 13 set of the 0.11.2 row (13 wheels, 1.85 GB) fetched with pip into a fresh cache,
/// checked and unpacked; the plugin then opens every library from there (no Python: `LAZULI_PYTHON=none`) and
/// fails only for want of the driver. Prints the sha256 of every file the table names, for comparing with an
/// installed copy.
#[test]
#[ignore = "downloads 1.85 GB"]
fn the_whole_cuda13_set_is_fetched_and_only_the_driver_is_missing() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("targets-cuda13-set");
    let cache = root.join("cache");
    let target = targets::target("cuda13-0.11.2").unwrap();
    let plugin = provision::pinned_plugin_path_in(target, &Sources::default()).unwrap();
    let sources = Sources { cache_dir: Some(cache.clone()), ..Sources::default() };
    let start = Instant::now();
    let dir = provision::fetch_library_wheels_in(target, &provision::library_wheels(target), &sources).unwrap();
    eprintln!("fetched and unpacked in {:.0} s", start.elapsed().as_secs_f64());
    let (name, none) = (PathBuf::from(target.name), PathBuf::from("none"));
    let env = [
        ("LAZULI_TARGET", name.as_path()),
        ("LAZULI_GPU_PLUGIN", &plugin),
        ("LAZULI_CACHE_DIR", &cache),
        ("LAZULI_PYTHON", &none),
    ];
    let (out, _) = run_child("client", Device::Cuda, &env, Duration::from_secs(300));
    let (stdout, stderr) = text(&out);
    eprintln!("{stdout}\n{stderr}");
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    for library in target.libraries.iter().filter(|l| l.pinned.is_some()) {
        let path = dir.join(library.dir).join(library.soname).canonicalize().unwrap();
        assert!(stdout.contains(&format!("preloaded {}", path.display())), "{} not opened: {stdout}", library.soname);
    }
    assert!(stdout.contains(&format!("cuda data dir {}", dir.join("nvidia/cu13").display())), "{stdout}");
    let missing = stderr.split("These libraries it needs were not found:").nth(1).unwrap_or_else(|| panic!("{stderr}"));
    let named: Vec<&str> = missing.lines().filter(|l| l.starts_with("  lib")).collect();
    assert_eq!(named.len(), 1, "{stderr}");
    assert!(named[0].starts_with("  libcuda.so.1 (the NVIDIA driver"), "{stderr}");
    assert!(!stderr.contains("could not be opened"), "{stderr}");
    let mut files: Vec<PathBuf> =
        target.libraries.iter().filter(|l| l.pinned.is_some()).map(|l| dir.join(l.dir).join(l.soname)).collect();
    files.extend(["bin/ptxas", "nvvm/libdevice/libdevice.10.bc"].map(|f| dir.join(target.cuda_data_dir).join(f)));
    use std::os::unix::fs::PermissionsExt;
    let ptxas = fs::metadata(dir.join(target.cuda_data_dir).join("bin/ptxas")).unwrap();
    assert!(ptxas.permissions().mode() & 0o111 != 0, "ptxas is not executable");
    for file in files {
        println!("{}  {}", sha256(&file), file.strip_prefix(&dir).unwrap().display());
    }
    fs::remove_dir_all(&root).unwrap();
}

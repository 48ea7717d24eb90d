//! The cached CPU plugin file is checked before it is loaded: a damaged one is deleted and fetched again, never
//! loaded; a plugin file the user names is checked before `dlopen` and never deleted.
//!
//! Every case runs in a child process (this test binary again, running only `child_provisions_and_loads`), so
//! that a crash in the loader shows up as a signal instead of killing the harness. Children get a private cache
//! (`LAZULI_CACHE_DIR`) seeded with a copy of the plugin from the default cache, and a fake Python
//! (`LAZULI_PYTHON`) that logs its arguments and fails like `pip download` without a network: fetching again
//! can only be attempted here, and the tests check that it is.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lazuli_pjrt::provision::{self, CpuPluginKind};
use lazuli_pjrt::Plugin;

const CHILD: &str = "LAZULI_TEST_PLUGIN_CACHE_CHILD";
const KIND: CpuPluginKind = CpuPluginKind::LammpsJax0112;
/// The fake Python's message; seeing it in a child's error proves a fetch was attempted.
const OFFLINE: &str = "fake pip: no network in this test";

/// The child side: finds the plugin (`cpu`, `gpu` or `tpu` from the environment) and loads it. Exit 0 and
/// `loaded <path>` on stdout when loaded; exit 3 and the error on stderr when not.
#[test]
#[ignore = "run in a child process by the other tests of this file"]
fn child_provisions_and_loads() {
    let Ok(which) = std::env::var(CHILD) else { return };
    let path = match which.as_str() {
        "gpu" => provision::gpu_plugin_path(),
        "tpu" => provision::tpu_plugin_path(),
        _ => provision::cpu_plugin_path(),
    };
    match path.and_then(Plugin::load) {
        Ok(plugin) => {
            println!("loaded {}", plugin.path().display());
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("child error: {e}");
            std::process::exit(3)
        }
    }
}

/// A private cache directory with a fake Python; removed on drop.
struct Sandbox {
    root: PathBuf,
    /// Where the plugin lives in this cache (same place, relative to the cache, as in the default one).
    so: PathBuf,
    pip_log: PathBuf,
}

impl Sandbox {
    fn new(name: &str) -> Sandbox {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("plugin-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        let relative = good_plugin().strip_prefix(provision::cache_dir().unwrap()).unwrap().to_path_buf();
        let sandbox = Sandbox { so: root.join("cache").join(relative), pip_log: root.join("pip.log"), root };
        let script =
            format!("#!/bin/sh\necho \"$@\" >> '{}'\necho '{OFFLINE}' >&2\nexit 1\n", sandbox.pip_log.display());
        write_executable(&sandbox.python(), &script);
        sandbox
    }

    fn python(&self) -> PathBuf {
        self.root.join("fake-python")
    }

    fn marker(&self) -> PathBuf {
        PathBuf::from(format!("{}.sha256", self.so.display()))
    }

    /// Copies the good plugin in, with a marker as lazuli wrote it before it recorded the file's own sha256.
    fn seed_with_old_marker(&self) {
        fs::create_dir_all(self.so.parent().unwrap()).unwrap();
        fs::copy(good_plugin(), &self.so).unwrap();
        fs::write(self.marker(), format!("{}\n", KIND.spec().sha256)).unwrap();
    }

    /// Runs the child with this cache; `env` adds or overrides variables.
    fn run(&self, which: &str, env: &[(&str, &Path)]) -> Output {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args(["child_provisions_and_loads", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(CHILD, which)
            .env("LAZULI_CACHE_DIR", self.root.join("cache"))
            .env("LAZULI_PYTHON", self.python())
            .env("LAZULI_CPU_PLUGIN", KIND.name());
        for var in ["LAZULI_PJRT_PLUGIN", "LAZULI_GPU_PLUGIN", "LAZULI_TPU_PLUGIN", "TPU_LIBRARY_PATH"] {
            command.env_remove(var);
        }
        for (var, value) in env {
            command.env(var, value);
        }
        command.output().unwrap()
    }

    /// `n` children of the CPU case at once.
    fn run_together(&self, n: usize) -> Vec<Output> {
        std::thread::scope(|s| {
            let children: Vec<_> = (0..n).map(|_| s.spawn(|| self.run("cpu", &[]))).collect();
            children.into_iter().map(|child| child.join().unwrap()).collect()
        })
    }

    fn pip_calls(&self) -> String {
        fs::read_to_string(&self.pip_log).unwrap_or_default()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// The plugin in the default cache (fetched there if needed, as every other test does).
fn good_plugin() -> PathBuf {
    provision::cpu_plugin_path_for(KIND).expect("the default cache's plugin")
}

fn write_executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// The child's exit code; a signal (a crash) or another code fails the test with the child's output.
fn expect_exit(out: &Output, code: i32) -> (String, String) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(code), "child: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    (stdout.into_owned(), stderr.into_owned())
}

/// (inode, mtime) of a file: changes when it is rewritten (lazuli renames a new marker into place).
fn version_of(path: &Path) -> (u64, std::time::SystemTime) {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path).unwrap();
    (meta.ino(), meta.modified().unwrap())
}

/// The damaged file is deleted with a one-line notice, a fetch is attempted (and fails offline), and the child
/// ends with an error instead of loading it.
fn expect_refetch(sandbox: &Sandbox, out: &Output, reason: &str) {
    let (_, stderr) = expect_exit(out, 3);
    let notice = format!("cached PJRT CPU plugin {} was damaged ({reason}", sandbox.so.display());
    assert!(stderr.contains(&notice), "no notice {notice:?} in:\n{stderr}");
    assert!(stderr.contains("deleted it, fetching it again"), "{stderr}");
    let calls = sandbox.pip_calls();
    assert!(calls.contains("-m pip download --no-deps") && calls.contains(&format!("{}==", KIND.name())), "{calls}");
    assert!(stderr.contains("could not fetch the PJRT CPU plugin") && stderr.contains(OFFLINE), "{stderr}");
    assert!(!sandbox.so.exists() && !sandbox.marker().exists(), "the damaged file or its marker is still there");
}

#[test]
fn an_old_marker_is_upgraded_once_and_a_truncated_plugin_is_fetched_again() {
    let sandbox = Sandbox::new("truncated");
    sandbox.seed_with_old_marker();

    let (stdout, _) = expect_exit(&sandbox.run("cpu", &[]), 0);
    assert!(stdout.contains(&format!("loaded {}", sandbox.so.canonicalize().unwrap().display())), "{stdout}");
    assert_eq!(sandbox.pip_calls(), "", "the old marker was verified against the pin, no fetch needed");
    let marker = fs::read_to_string(sandbox.marker()).unwrap();
    assert!(marker.starts_with("lazuli-plugin-marker 2\n"), "{marker}");
    assert!(marker.contains(&format!("so-sha256 {}\n", KIND.spec().so_sha256)), "{marker}");

    // Unchanged since verified: trusted without hashing, so the marker is not rewritten.
    let before = version_of(&sandbox.marker());
    expect_exit(&sandbox.run("cpu", &[]), 0);
    assert_eq!(version_of(&sandbox.marker()), before, "an unchanged plugin was verified again");

    let size = KIND.spec().so_size;
    fs::OpenOptions::new().write(true).open(&sandbox.so).unwrap().set_len(size / 2).unwrap();
    let out = sandbox.run("cpu", &[]);
    expect_refetch(&sandbox, &out, &format!("{} bytes, expected {size}", size / 2));
}

#[test]
fn a_flipped_byte_is_found_and_the_plugin_fetched_again() {
    let sandbox = Sandbox::new("flipped");
    sandbox.seed_with_old_marker();
    expect_exit(&sandbox.run("cpu", &[]), 0); // records the file's identity in the marker

    let mut file = fs::OpenOptions::new().read(true).write(true).open(&sandbox.so).unwrap();
    let middle = KIND.spec().so_size / 2;
    let mut byte = [0u8];
    file.seek(SeekFrom::Start(middle)).and_then(|_| file.read_exact(&mut byte)).unwrap();
    file.seek(SeekFrom::Start(middle)).and_then(|_| file.write_all(&[byte[0] ^ 0xff])).unwrap();
    drop(file);
    assert_eq!(fs::metadata(&sandbox.so).unwrap().len(), KIND.spec().so_size);

    let out = sandbox.run("cpu", &[]);
    expect_refetch(&sandbox, &out, "sha256 ");
    let (_, stderr) = expect_exit(&out, 3);
    assert!(stderr.contains(&format!("expected {}", KIND.spec().so_sha256)), "{stderr}");
}

#[test]
fn a_bad_plugin_file_named_by_the_user_is_an_error_naming_it_and_is_kept() {
    let sandbox = Sandbox::new("user");
    let text = sandbox.root.join("notes.so");
    fs::write(&text, "not a shared object\n").unwrap();
    let empty = sandbox.root.join("empty.so");
    fs::write(&empty, "").unwrap();
    let truncated = sandbox.root.join("truncated.so");
    let mut head = vec![0u8; 1 << 20];
    fs::File::open(good_plugin()).and_then(|mut f| f.read_exact(&mut head)).unwrap();
    fs::write(&truncated, &head).unwrap();
    let cases: [(&str, &str, &Path, &str); 6] = [
        ("cpu", "LAZULI_PJRT_PLUGIN", &text, "is not an ELF shared object (it starts with bytes 6e6f7420"),
        ("cpu", "LAZULI_PJRT_PLUGIN", &empty, "it is empty"),
        ("cpu", "LAZULI_PJRT_PLUGIN", &sandbox.root, "it is not a regular file"),
        ("cpu", "LAZULI_PJRT_PLUGIN", &truncated, "it is truncated or damaged"),
        ("gpu", "LAZULI_GPU_PLUGIN", &text, "is not an ELF shared object"),
        ("tpu", "TPU_LIBRARY_PATH", &truncated, "it is truncated or damaged"),
    ];
    for (which, var, path, reason) in cases {
        let (_, stderr) = expect_exit(&sandbox.run(which, &[(var, path)]), 3);
        let named = format!("{var}={} cannot be a PJRT plugin: ", path.display());
        assert!(stderr.contains(&named) && stderr.contains(reason), "{var}={path:?}: {stderr}");
        assert!(path.exists(), "{} was deleted", path.display());
    }
    assert_eq!(sandbox.pip_calls(), "");
}

/// Test binaries start many processes at once: they may all verify (and upgrade the marker) or all find the
/// damage together, and none may crash or load a damaged file.
#[test]
fn processes_starting_together_agree() {
    let sandbox = Sandbox::new("together");
    sandbox.seed_with_old_marker();
    let outputs = sandbox.run_together(3);
    for out in &outputs {
        expect_exit(out, 0);
    }
    assert_eq!(sandbox.pip_calls(), "");
    assert!(fs::read_to_string(sandbox.marker()).unwrap().starts_with("lazuli-plugin-marker 2\n"));

    fs::OpenOptions::new().write(true).open(&sandbox.so).unwrap().set_len(4096).unwrap();
    let outputs = sandbox.run_together(3);
    let mut notices = 0;
    for out in &outputs {
        let (_, stderr) = expect_exit(out, 3);
        assert!(stderr.contains(OFFLINE), "{stderr}");
        notices += stderr.matches("deleted it, fetching it again").count();
    }
    assert!(notices >= 1, "nobody said the damaged file was deleted");
    assert!(!sandbox.so.exists());
}

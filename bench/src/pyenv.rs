//! The comparison environment: a Python virtual environment with `jax[cpu]`, `numpy` and `safetensors`, made on
//! first use in `bench/.venv` (ignored by git), or any Python the user names.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::BenchResult;

/// What the comparison side needs; `jax[cpu]` resolves to the newest JAX this Python can install.
pub const PACKAGES: [&str; 3] = ["jax[cpu]", "numpy", "safetensors"];

/// The directory of the harness's own environment: `LAZULI_BENCH_VENV`, else `.venv` beside this crate.
pub fn venv_dir() -> PathBuf {
    match std::env::var_os("LAZULI_BENCH_VENV") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"),
    }
}

fn venv_python(dir: &Path) -> PathBuf {
    dir.join("bin").join("python")
}

/// Whether `python` imports everything in `modules` (a comma-separated list).
pub fn imports(python: &Path, modules: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {modules}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The Python to run the comparison with. `explicit` (or `LAZULI_BENCH_PYTHON`) is used as it is and only
/// checked; otherwise the harness's virtual environment, created on first use.
pub fn ensure(explicit: Option<&Path>) -> BenchResult<PathBuf> {
    let explicit =
        explicit.map(Path::to_path_buf).or_else(|| std::env::var_os("LAZULI_BENCH_PYTHON").map(PathBuf::from));
    if let Some(python) = explicit {
        if !imports(&python, "numpy, safetensors") {
            return Err(format!(
                "{} cannot import numpy and safetensors; install them there or leave --python out to let the \
                 harness make its own environment",
                python.display()
            )
            .into());
        }
        return Ok(python);
    }
    // One maker per process: threads (parallel tests) wait for the first and then find the environment made.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = venv_dir();
    let python = venv_python(&dir);
    if python.is_file() && imports(&python, "jax, numpy, safetensors") {
        return Ok(python);
    }
    if dir.exists() {
        // Made by hand or interrupted before this harness moved environments into place: make it anew.
        eprintln!("lazuli-bench: {} lacks jax, numpy or safetensors; making it anew", dir.display());
        std::fs::remove_dir_all(&dir)?;
    }
    create(&dir)?;
    Ok(python)
}

/// Make the environment in a fresh directory beside `dir`, then move it into place, so that an interrupted
/// install or a second process doing the same never leaves a half-made environment at `dir`.
fn create(dir: &Path) -> BenchResult<()> {
    let base = std::env::var_os("LAZULI_BENCH_BASE_PYTHON").map(PathBuf::from).unwrap_or_else(|| "python3".into());
    eprintln!(
        "lazuli-bench: first use: installing {} from PyPI into {} (about 150 MB, once)",
        PACKAGES.join(", "),
        dir.display()
    );
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "venv".into());
    let staging = parent.join(format!("{name}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let made = Command::new(&base).args(["-m", "venv"]).arg(&staging).output();
    match made {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Err(format!(
                "`{} -m venv` failed: {}. Install Python 3 with its venv module (Debian: apt-get install \
                 python3-venv), or set LAZULI_BENCH_PYTHON to a Python that has jax, numpy and safetensors",
                base.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into())
        }
        Err(e) => {
            return Err(format!(
                "cannot run {} ({e}): install Python 3, or set LAZULI_BENCH_BASE_PYTHON to one",
                base.display()
            )
            .into())
        }
    }
    let out = Command::new(venv_python(&staging))
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(PACKAGES)
        .output()?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(4).collect();
        let offline = stderr.contains("NewConnectionError")
            || stderr.contains("Temporary failure in name resolution")
            || stderr.contains("No matching distribution");
        let fix = if offline {
            "PyPI could not be reached: connect to the network and run again, or set LAZULI_BENCH_PYTHON to a \
             Python that already has jax, numpy and safetensors"
        } else {
            "fix the error above, or set LAZULI_BENCH_PYTHON to a Python that has jax, numpy and safetensors"
        };
        return Err(format!(
            "installing {} failed:\n  {}\n{fix}",
            PACKAGES.join(", "),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n  ")
        )
        .into());
    }
    match std::fs::rename(&staging, dir) {
        Ok(()) => Ok(()),
        // Another process finished first: use its environment.
        Err(_) if venv_python(dir).is_file() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(format!("moving the new environment to {}: {e}", dir.display()).into())
        }
    }
}

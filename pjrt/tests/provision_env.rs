//! How the provisioning functions read the environment. One test in its own binary, because it
//! changes environment variables, which would race with tests running beside it.

use lazuli_pjrt::provision::{self, CpuPluginKind};
use lazuli_pjrt::Error;

fn with_env<T>(vars: &[(&str, Option<&str>)], f: impl FnOnce() -> T) -> T {
    let saved: Vec<_> = vars.iter().map(|(k, _)| (k.to_string(), std::env::var_os(k))).collect();
    for (k, v) in vars {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
    let result = f();
    for (k, v) in saved {
        match v {
            Some(v) => std::env::set_var(&k, v),
            None => std::env::remove_var(&k),
        }
    }
    result
}

#[test]
fn environment_choices() {
    // Fetch (or find) both plugins with whatever cache the environment names.
    let xla = provision::cpu_plugin_path_for(CpuPluginKind::XlaCpu001).unwrap();
    let lammps = provision::cpu_plugin_path_for(CpuPluginKind::LammpsJax0112).unwrap();
    let xla_str = xla.to_str().unwrap();

    with_env(&[("LAZULI_PJRT_PLUGIN", Some(xla_str)), ("LAZULI_CPU_PLUGIN", None)], || {
        assert_eq!(provision::cpu_plugin_path().unwrap(), xla);
    });
    with_env(&[("LAZULI_PJRT_PLUGIN", Some("/nonexistent/plugin.so"))], || {
        let err = provision::cpu_plugin_path().unwrap_err();
        assert!(matches!(&err, Error::Provision(m) if m.contains("LAZULI_PJRT_PLUGIN")), "{err}");
    });
    with_env(&[("LAZULI_PJRT_PLUGIN", None), ("LAZULI_CPU_PLUGIN", Some("xla-cpu-pjrt"))], || {
        assert_eq!(provision::cpu_plugin_path().unwrap(), xla);
    });
    with_env(&[("LAZULI_PJRT_PLUGIN", None), ("LAZULI_CPU_PLUGIN", None)], || {
        assert_eq!(provision::cpu_plugin_path().unwrap(), lammps);
    });
    with_env(&[("LAZULI_PJRT_PLUGIN", None), ("LAZULI_CPU_PLUGIN", Some("tpu-please"))], || {
        let err = provision::cpu_plugin_path().unwrap_err();
        assert!(matches!(&err, Error::Provision(m) if m.contains("lammps-jax-pjrt-cpu")), "{err}");
    });

    with_env(&[("LAZULI_CACHE_DIR", Some("/some/cache")), ("XDG_CACHE_HOME", Some("/xdg"))], || {
        assert_eq!(provision::cache_dir().unwrap(), std::path::PathBuf::from("/some/cache"));
    });
    with_env(&[("LAZULI_CACHE_DIR", None), ("XDG_CACHE_HOME", Some("/xdg"))], || {
        assert_eq!(provision::cache_dir().unwrap(), std::path::PathBuf::from("/xdg/lazuli"));
    });

    with_env(&[("LAZULI_GPU_PLUGIN", Some(xla_str))], || {
        assert_eq!(provision::gpu_plugin_path().unwrap(), xla);
    });
    // Nothing installed, nothing cached and no pip: the errors say what to run and which variable to set.
    let empty_cache = std::env::temp_dir().join(format!("lazuli-provision-env-{}", std::process::id()));
    let no_python = [
        ("LAZULI_GPU_PLUGIN", None),
        ("LAZULI_TPU_PLUGIN", None),
        ("TPU_LIBRARY_PATH", None),
        ("LAZULI_TARGET", None),
        ("LAZULI_WHEELS", None),
        ("LAZULI_CACHE_DIR", Some(empty_cache.to_str().unwrap())),
        ("LAZULI_PYTHON", Some("/nonexistent/python3")),
    ];
    with_env(&no_python, || {
        let gpu = provision::gpu_plugin_path().unwrap_err().to_string();
        assert!(gpu.contains("no PJRT CUDA plugin is installed in the site-packages of /nonexistent/python3"), "{gpu}");
        if gpu.contains("this machine lacks what it needs") {
            // No NVIDIA driver: nothing is downloaded, and the error says how to fetch it anyway.
            assert!(gpu.contains("libcuda.so.1 (the NVIDIA driver") && gpu.contains("LAZULI_TARGET=cuda13"), "{gpu}");
        }
        std::env::set_var("LAZULI_TARGET", "cuda13");
        let gpu = provision::gpu_plugin_path().unwrap_err().to_string();
        std::env::remove_var("LAZULI_TARGET");
        let command = "-m pip download --no-deps --only-binary=:all: --platform manylinux_2_27_x86_64 \
                       jax-cuda13-pjrt==0.12.0.1 -d";
        assert!(gpu.contains(command) && gpu.contains("LAZULI_GPU_PLUGIN"), "{gpu}");
        let tpu = provision::tpu_plugin_path().unwrap_err().to_string();
        assert!(tpu.contains("LAZULI_TPU_PLUGIN") && tpu.contains("libtpu==0.0.52"), "{tpu}");
    });
    let _ = std::fs::remove_dir_all(&empty_cache);
    with_env(&[("LAZULI_TARGET", Some("cuda14"))], || {
        let err = provision::gpu_plugin_path().unwrap_err().to_string();
        assert!(
            err.contains("LAZULI_TARGET=\"cuda14\" is not one of: lammps-jax-pjrt-cpu, xla-cpu-pjrt, cuda13"),
            "{err}"
        );
    });
    with_env(&[("LAZULI_TPU_PLUGIN", None), ("TPU_LIBRARY_PATH", Some(xla_str))], || {
        assert_eq!(provision::tpu_plugin_path().unwrap(), xla);
    });
}

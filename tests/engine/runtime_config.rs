//! Runtime set-up through the public API: a bad plugin path is a clear error (and leaves the runtime usable),
//! the plugin chosen by the environment is the one loaded, and a second, different configuration is refused.
//! The runtime is per process: one test uses it here, alone in a child process, and the others check settings in
//! child processes.

use crate::common;

use common::child;
use lazuli::{Config, Tensor};

/// Run this module's test `name` alone in a child process with `env` set, and check that it ran and passed.
#[track_caller]
fn in_child(name: &str, env: &[(&str, &str)]) {
    child::passes(&child::test_name(module_path!(), name), env);
}

#[test]
fn plugin_choice_and_configuration_errors() {
    if child::alone(module_path!(), "plugin_choice_and_configuration_errors") {
        return; // the runtime is per process: this test starts it, alone in a process of its own
    }
    let missing = std::env::temp_dir().join("lazuli-no-such-plugin.so");
    let bad = Config { plugin_path: Some(missing.clone()), ..Config::default() };
    let err = lazuli::init(bad).unwrap_err().to_string();
    assert!(err.contains(&missing.display().to_string()), "the error names the path: {err}");

    let text = std::env::temp_dir().join(format!("lazuli-not-a-plugin-{}.so", std::process::id()));
    std::fs::write(&text, "not a shared object").unwrap();
    let err = lazuli::init(Config { plugin_path: Some(text.clone()), ..Config::from_env().unwrap() }).unwrap_err();
    assert!(err.to_string().contains(&text.display().to_string()), "{err}");
    std::fs::remove_file(&text).unwrap();

    // The failed attempts left nothing behind: the environment's configuration still starts.
    let info = lazuli::runtime_info().unwrap();
    assert_eq!(info.platform, "cpu");
    let file = info.plugin_path.file_name().unwrap().to_string_lossy().to_string();
    match std::env::var("LAZULI_CPU_PLUGIN").as_deref() {
        Ok("xla-cpu-pjrt") => assert_eq!((file.as_str(), info.api_version), ("xla_cpu_pjrt.so", (0, 81))),
        _ if std::env::var_os("LAZULI_PJRT_PLUGIN").is_none() => {
            assert_eq!((file.as_str(), info.api_version.0), ("pjrt_c_api_cpu_plugin.so", 0));
            assert!(info.api_version.1 >= 115, "{info}");
        }
        _ => {}
    }
    let t = Tensor::from_slice(&[1.5f32, 2.5], &[2]);
    assert_eq!((&t * 2.0).to_vec::<f32>().unwrap(), vec![3.0, 5.0]);

    // Re-initializing with the same configuration is a no-op; a different one is refused with the reason.
    lazuli::init(Config::from_env().unwrap()).unwrap();
    let other = Config { cpu_device_count: 3, ..Config::from_env().unwrap() };
    let err = lazuli::init(other).unwrap_err().to_string();
    assert!(err.contains("already initialized"), "{err}");
}

/// A setting given a value it does not take is an error that names the variable, the value and what it accepts
/// (`expect`), at the first read (checked in a child process started by `test`, whose runtime starts from that
/// environment).
fn a_bad_setting_is_a_clear_error(test: &str, var: &str, value: &str, expect: &str) {
    let child = format!("LAZULI_TEST_BAD_SETTING_{var}");
    if std::env::var_os(&child).is_some() {
        let err = (&Tensor::from_slice(&[1.0f32], &[1]) * 2.0).to_vec::<f32>().unwrap_err().to_string();
        assert!(err.contains(var) && err.contains(value) && err.contains(expect), "{err}");
        return;
    }
    in_child(test, &[(child.as_str(), "1"), (var, value)]);
}

/// `LAZULI_CPU_ASYNC` takes 1 or 0.
#[test]
fn a_bad_cpu_async_setting_is_a_clear_error() {
    a_bad_setting_is_a_clear_error(
        "a_bad_cpu_async_setting_is_a_clear_error",
        "LAZULI_CPU_ASYNC",
        "maybe",
        "expected 1 or 0",
    );
}

/// `LAZULI_CPU_LAUNCHER` takes 1, 0 or always.
#[test]
fn a_bad_cpu_launcher_setting_is_a_clear_error() {
    a_bad_setting_is_a_clear_error(
        "a_bad_cpu_launcher_setting_is_a_clear_error",
        "LAZULI_CPU_LAUNCHER",
        "sometimes",
        "expected 1, 0 or always",
    );
}

/// `LAZULI_CPU_DEVICES` takes 1 to 2048: a vast count grew past 6 GB in the plugin before failing.
#[test]
fn too_many_cpu_devices_is_a_clear_error() {
    let name = "too_many_cpu_devices_is_a_clear_error";
    a_bad_setting_is_a_clear_error(name, "LAZULI_CPU_DEVICES", "99999999999", "expected 1 to 2048");
}

/// `LAZULI_DONATE` takes 1 or 0 (anything else used to leave donation on silently).
#[test]
fn a_bad_donate_setting_is_a_clear_error() {
    let name = "a_bad_donate_setting_is_a_clear_error";
    a_bad_setting_is_a_clear_error(name, "LAZULI_DONATE", "banana", "expected 1 (default) or 0");
}

/// `LAZULI_PROGRAM_CACHE_LIMIT` takes a count of 1 or more (a cache of no programs would compile every step).
#[test]
fn a_bad_program_cache_limit_is_a_clear_error() {
    let name = "a_bad_program_cache_limit_is_a_clear_error";
    a_bad_setting_is_a_clear_error(name, "LAZULI_PROGRAM_CACHE_LIMIT", "0", "expected 1 or more");
}

/// `LAZULI_BACKWARD_REPLAY` takes 1 or 0 (`backward()` itself reads it as on; the runtime's start refuses it).
#[test]
fn a_bad_backward_replay_setting_is_a_clear_error() {
    let name = "a_bad_backward_replay_setting_is_a_clear_error";
    a_bad_setting_is_a_clear_error(name, "LAZULI_BACKWARD_REPLAY", "sometimes", "expected 1 or 0");
}

/// `LAZULI_SPLIT_UPDATE` takes auto, on or off.
#[test]
fn a_bad_split_update_setting_is_a_clear_error() {
    let name = "a_bad_split_update_setting_is_a_clear_error";
    a_bad_setting_is_a_clear_error(name, "LAZULI_SPLIT_UPDATE", "twice", "expected auto, on or off");
}

/// `LAZULI_SCANNED_BLOCKS` takes auto, loop or unrolled; auto writes scanned blocks out on GPUs only.
#[test]
fn scanned_blocks_are_written_out_on_gpus_unless_told() {
    let name = "scanned_blocks_are_written_out_on_gpus_unless_told";
    a_bad_setting_is_a_clear_error(name, "LAZULI_SCANNED_BLOCKS", "sometimes", "expected auto, loop or unrolled");
    use lazuli::{Backend, BlockScan};
    let unrolls = |backend, block_scan| Config { backend, block_scan, ..Config::default() }.unrolls_blocks();
    assert!(unrolls(Backend::Gpu, BlockScan::Auto));
    assert!(!unrolls(Backend::Cpu, BlockScan::Auto));
    assert!(!unrolls(Backend::Tpu, BlockScan::Auto));
    assert!(unrolls(Backend::Cpu, BlockScan::Unrolled));
    assert!(!unrolls(Backend::Gpu, BlockScan::Loop));
}

/// `LAZULI_LOCATE_AHEAD` takes auto, 1 or 0; auto compiles the NaN locator ahead on NVIDIA GPUs only, once a step
/// structure has trained for `LOCATE_AHEAD_AFTER` (10 s); 1 from a structure's second run.
#[test]
fn the_locator_is_compiled_ahead_on_gpus_unless_told() {
    let name = "the_locator_is_compiled_ahead_on_gpus_unless_told";
    a_bad_setting_is_a_clear_error(name, "LAZULI_LOCATE_AHEAD", "early", "expected auto, 1 or 0");
    use lazuli::{Backend, LocateAhead};
    let ahead = |backend, locate_ahead| Config { backend, locate_ahead, ..Config::default() }.locates_ahead();
    assert!(ahead(Backend::Gpu, LocateAhead::Auto));
    assert!(!ahead(Backend::Cpu, LocateAhead::Auto));
    assert!(!ahead(Backend::Tpu, LocateAhead::Auto));
    assert!(ahead(Backend::Cpu, LocateAhead::On));
    assert!(!ahead(Backend::Gpu, LocateAhead::Off));
    let after = |backend, locate_ahead| Config { backend, locate_ahead, ..Config::default() }.locate_ahead_after();
    let ten_seconds = std::time::Duration::from_secs(10);
    assert_eq!((lazuli::LOCATE_AHEAD_AFTER, after(Backend::Gpu, LocateAhead::Auto)), (ten_seconds, Some(ten_seconds)));
    assert_eq!(after(Backend::Cpu, LocateAhead::Auto), None);
    for backend in [Backend::Cpu, Backend::Gpu] {
        assert_eq!(after(backend, LocateAhead::On), Some(std::time::Duration::ZERO), "{backend:?}");
        assert_eq!(after(backend, LocateAhead::Off), None, "{backend:?}");
    }
}

/// The step is split on NVIDIA GPUs by default, or where asked; under the finite check only with `stop`, whose
/// sticky flag carries the gradients' trip into the update.
#[test]
fn the_update_is_split_from_the_gradients_on_gpus_and_under_the_check_only_with_stop() {
    use lazuli::{Backend, CheckFinite, SplitUpdate};
    let on = |backend, split_update, check_finite| {
        Config { backend, split_update, check_finite, ..Config::default() }.splits_update()
    };
    assert!(on(Backend::Gpu, SplitUpdate::Auto, CheckFinite::Off));
    assert!(!on(Backend::Cpu, SplitUpdate::Auto, CheckFinite::Off));
    assert!(on(Backend::Cpu, SplitUpdate::On, CheckFinite::Off));
    assert!(!on(Backend::Gpu, SplitUpdate::Off, CheckFinite::Off));
    assert!(on(Backend::Gpu, SplitUpdate::Auto, CheckFinite::Stop));
    assert!(!on(Backend::Cpu, SplitUpdate::Auto, CheckFinite::Stop));
    assert!(on(Backend::Cpu, SplitUpdate::On, CheckFinite::Stop));
    assert!(!on(Backend::Gpu, SplitUpdate::Off, CheckFinite::Stop));
    for check in [CheckFinite::Skip, CheckFinite::Log] {
        assert!(!on(Backend::Gpu, SplitUpdate::On, check));
        assert!(!on(Backend::Gpu, SplitUpdate::Auto, check));
    }
}

/// `LAZULI_COMPILE_CACHE_LIMIT` takes a size (it used to fall back to 2G with a warning).
#[test]
fn a_bad_compile_cache_limit_is_a_clear_error() {
    let name = "a_bad_compile_cache_limit_is_a_clear_error";
    a_bad_setting_is_a_clear_error(name, "LAZULI_COMPILE_CACHE_LIMIT", "lots", "expected a size in bytes");
}

/// `LAZULI_DUMP_DIR` naming a file is an error (it used to dump nothing, silently).
#[test]
fn a_dump_dir_that_is_a_file_is_a_clear_error() {
    let name = "a_dump_dir_that_is_a_file_is_a_clear_error";
    let file = std::env::temp_dir().join(format!("lazuli-dump-dir-file-{}", std::process::id()));
    let value = match std::env::var("LAZULI_DUMP_DIR") {
        Ok(v) => v, // in the child
        Err(_) => {
            std::fs::write(&file, b"not a directory").unwrap();
            file.to_string_lossy().into_owned()
        }
    };
    a_bad_setting_is_a_clear_error(name, "LAZULI_DUMP_DIR", &value, "expected a directory lazuli can create");
    let _ = std::fs::remove_file(&file);
}

/// `LAZULI_XLA_OPTIONS` reaches XLA's compiler: known options (a bool, and the empty list the GPU default uses)
/// compile and compute; an unknown name is XLA's error, reported at the line that needed the value, without
/// aborting; an item that is not `name=value` names the variable.
#[test]
fn xla_options_from_the_environment() {
    const CHILD: &str = "LAZULI_TEST_XLA_OPTIONS_CHILD";
    let x = || Tensor::from_slice(&[1.5f32, -2.0], &[2]);
    match std::env::var(CHILD).as_deref() {
        Ok("known") => return assert_eq!((&x() * 2.0).to_vec::<f32>().unwrap(), vec![3.0, -4.0]),
        Ok("unknown") => {
            let err = (&x() * 3.0).to_vec::<f32>().unwrap_err().to_string();
            let line = format!("runtime_config.rs:{}", line!() - 1);
            // lazuli leaves out a backend default that a plugin words this way (`lazy/src/runtime/`, `unknown_default`).
            assert!(err.contains("No such compile option: 'xla_no_such_option'"), "{err}");
            return assert!(err.contains(&line), "{err}");
        }
        Ok("malformed") => {
            let err = (&x() * 2.0).to_vec::<f32>().unwrap_err().to_string();
            return assert!(err.contains("LAZULI_XLA_OPTIONS") && err.contains("fast_math"), "{err}");
        }
        _ => {}
    }
    let name = "xla_options_from_the_environment";
    let known = "xla_cpu_enable_fast_math=false xla_gpu_enable_command_buffer=";
    in_child(name, &[(CHILD, "known"), ("LAZULI_XLA_OPTIONS", known), ("LAZULI_COMPILE_CACHE", "off")]);
    in_child(name, &[(CHILD, "unknown"), ("LAZULI_XLA_OPTIONS", "xla_no_such_option=1")]);
    in_child(name, &[(CHILD, "malformed"), ("LAZULI_XLA_OPTIONS", "fast_math")]);
}

/// `LAZULI_MATMUL_PRECISION` sets the process's level until `set_matmul_precision`; a bad value panics at the
/// first product, naming the variable and the user's line.
#[test]
fn matmul_precision_from_the_environment() {
    const CHILD: &str = "LAZULI_TEST_PRECISION_CHILD";
    let a = || Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    match std::env::var(CHILD).as_deref() {
        Ok("highest") => {
            assert_eq!(lazuli::matmul_precision(), lazuli::Precision::Highest);
            assert_eq!(a().matmul(&a()).to_vec::<f32>().unwrap(), vec![7.0, 10.0, 15.0, 22.0]);
            lazuli::set_matmul_precision(lazuli::Precision::High);
            return assert_eq!(lazuli::matmul_precision(), lazuli::Precision::High, "the call wins");
        }
        Ok("bad") => {
            let err = std::panic::catch_unwind(|| a().matmul(&a())).unwrap_err();
            let line = format!("runtime_config.rs:{}", line!() - 1);
            let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
            return assert!(msg.contains("LAZULI_MATMUL_PRECISION=\"fastest\"") && msg.contains(&line), "{msg}");
        }
        _ => {}
    }
    let name = "matmul_precision_from_the_environment";
    in_child(name, &[(CHILD, "highest"), ("LAZULI_MATMUL_PRECISION", "HIGHEST")]);
    in_child(name, &[(CHILD, "bad"), ("LAZULI_MATMUL_PRECISION", "fastest")]);
}

/// `LAZULI_STRICT` takes 1/on/true, 0/off/false/empty, or `programs=N,warmup=S`; any other value is an error at
/// the first program that names the variable, the value and the accepted forms (strict mode is neither
/// silently on nor silently off), and stays one at every later program.
#[test]
fn strict_setting_from_the_environment() {
    const CHILD: &str = "LAZULI_TEST_STRICT_CHILD";
    let x = || Tensor::from_slice(&[1.5f32, -2.0], &[2]);
    match std::env::var(CHILD).as_deref() {
        Ok("bad") => {
            let value = format!("{:?}", std::env::var("LAZULI_STRICT").unwrap_or_default());
            for _ in 0..2 {
                let err = (&x() * 2.0).to_vec::<f32>().unwrap_err().to_string();
                assert!(err.contains(&format!("LAZULI_STRICT={value}")), "{err}");
                assert!(
                    err.contains("expected 1 (or on, true), 0 (or off, false, empty), or programs=N,warmup=S"),
                    "{err}"
                );
            }
            return assert_eq!(lazuli::diagnostics::strict_budget(), None);
        }
        Ok("good") => {
            let budget = lazuli::diagnostics::Budget { programs_per_step: 2, compile_until_step: 1 };
            assert_eq!(lazuli::diagnostics::strict_budget(), Some((budget, 0)));
            return assert_eq!((&x() * 2.0).to_vec::<f32>().unwrap(), vec![3.0, -4.0]);
        }
        Ok("on") => {
            let budget = lazuli::diagnostics::Budget::training();
            return assert_eq!(lazuli::diagnostics::strict_budget(), Some((budget, 0)));
        }
        _ => {}
    }
    let name = "strict_setting_from_the_environment";
    for bad in [
        "banana",
        "yes",
        "2",
        "programs=two",
        "programs=0",
        "warmup=-1",
        "programs=2,speed=3",
        "programs=1,programs=2",
        "programs=2,",
    ] {
        in_child(name, &[(CHILD, "bad"), ("LAZULI_STRICT", bad)]);
    }
    in_child(name, &[(CHILD, "good"), ("LAZULI_STRICT", " programs=2, warmup=1 ")]);
    in_child(name, &[(CHILD, "on"), ("LAZULI_STRICT", "ON")]);
}

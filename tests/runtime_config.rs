//! Runtime set-up through the public API: a bad plugin path is a clear error (and leaves the runtime usable),
//! the plugin chosen by the environment is the one loaded, and a second, different configuration is refused.
//! One test: the runtime is per process.

use lazuli::{Config, Tensor};

#[test]
fn plugin_choice_and_configuration_errors() {
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

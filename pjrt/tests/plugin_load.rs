//! Loading plugins: versions, attributes, and every way loading can fail.
#[macro_use]
mod common;

use std::path::PathBuf;

use lazuli_pjrt::{AttrValue, Error, Plugin};

fn loads_with_version_and_attributes(plugin: &Plugin) {
    let (major, minor) = plugin.api_version();
    assert_eq!(major, 0);
    assert!(minor >= 57, "minor {minor}");
    assert!(plugin.path().is_file());
    let attrs = plugin.attributes().expect("attributes");
    let get = |name: &str| attrs.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    assert!(matches!(get("xla_version"), Some(AttrValue::Int64(_))), "{attrs:?}");
    match get("stablehlo_minimum_version") {
        Some(AttrValue::Int64List(v)) => assert_eq!(v.len(), 3, "{v:?}"),
        other => panic!("stablehlo_minimum_version: {other:?}"),
    }
    assert!(matches!(get("stablehlo_current_version"), Some(AttrValue::Int64List(_))));
}

fn loading_twice_shares_one_plugin(plugin: &Plugin) {
    let again = Plugin::load(plugin.path()).expect("second load");
    assert_eq!(again.path(), plugin.path());
    assert_eq!(again.api_version(), plugin.api_version());
}

fn version_too_new_is_refused(plugin: &Plugin) {
    let (_, minor) = plugin.api_version();
    let err = Plugin::load_with_min_version(plugin.path(), (0, 999)).unwrap_err();
    assert!(matches!(err, Error::ApiVersion { found: (0, m), need: (0, 999), .. } if m == minor), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&format!("implements C API 0.{minor}")), "{text}");
    assert!(text.contains("lazuli accepts 0.999 to any newer 0.x for it; use a newer plugin"), "{text}");
    let err = Plugin::load_with_min_version(plugin.path(), (1, 0)).unwrap_err();
    assert!(matches!(err, Error::ApiVersion { need: (1, 0), .. }), "{err:?}");
}

per_plugin!(loads_with_version_and_attributes, loading_twice_shares_one_plugin, version_too_new_is_refused);

#[test]
fn missing_file_is_a_load_error() {
    let path = std::env::temp_dir().join("lazuli-no-such-plugin.so");
    match Plugin::load(&path) {
        Err(Error::Load { path: p, .. }) => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_text_file_is_a_load_error() {
    let path = std::env::temp_dir().join(format!("lazuli-not-elf-{}.so", std::process::id()));
    std::fs::write(&path, "not a shared object").unwrap();
    let result = Plugin::load(&path);
    std::fs::remove_file(&path).unwrap();
    match result {
        Err(e @ Error::Load { .. }) => {
            assert!(e.to_string().contains(&*path.to_string_lossy()), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

/// libc is a real shared object without `GetPjrtApi`; its path is read from this process's own maps.
#[test]
fn a_shared_object_without_get_pjrt_api_is_a_load_error() {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so") || p.contains("/libc-"))
        .map(PathBuf::from)
        .expect("libc in /proc/self/maps");
    match Plugin::load(&libc) {
        Err(Error::Load { path, reason }) => {
            assert_eq!(path, libc);
            assert!(reason.contains("GetPjrtApi"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

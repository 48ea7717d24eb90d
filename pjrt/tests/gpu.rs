//! The CUDA plugin end to end. Opt-in, since it needs an NVIDIA GPU and the `jax-cuda13-pjrt` (or
//! cuda12) wheel in the Python environment: `cargo test -p lazuli-pjrt --test gpu -- --ignored`.
mod common;

use common::{f32_buffer, read_f32};
use lazuli_pjrt::{provision, ClientOptions, CompileOptions, ElementType, Profiler};

const ADD_MUL: &str = r#"
func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xbf16>) {
  %0 = stablehlo.add %a, %b : tensor<2x3xf32>
  %1 = stablehlo.multiply %a, %b : tensor<2x3xf32>
  %2 = stablehlo.convert %1 : (tensor<2x3xf32>) -> tensor<2x3xbf16>
  return %0, %2 : tensor<2x3xf32>, tensor<2x3xbf16>
}"#;

/// One client for the whole test: a CUDA client reserves most of the GPU memory unless told not to.
#[test]
#[ignore = "needs an NVIDIA GPU and the jax-cuda13-pjrt (or -cuda12-) plugin"]
fn cuda_end_to_end() {
    // Provisioned as lazuli does (LAZULI_TARGET and LAZULI_WHEELS apply): libraries preloaded, version checked.
    let sources = provision::Sources::from_env().unwrap();
    let (plugin, found) =
        provision::load_device_plugin(provision::Device::Cuda, &sources).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("plugin {} from {} API {:?}", found.path.display(), found.origin, plugin.api_version());
    eprintln!(
        "preloaded {:?}, missing {:?}",
        found.preload,
        found.missing.iter().map(|l| l.soname).collect::<Vec<_>>()
    );
    let options = ClientOptions::new().bool_option("preallocate", false);
    let client = provision::create_device_client(&plugin, &found, &options, provision::CLIENT_CREATE_TIMEOUT).unwrap();
    let platform = client.platform_name().unwrap();
    assert!(platform == "cuda" || platform == "gpu", "{platform}");
    let devices = client.devices();
    assert!(!devices.is_empty());
    eprintln!("{platform}: {devices:?}");
    let d = &devices[0];

    for ty in ElementType::ALL {
        let bytes: Vec<u8> = (0..6 * ty.byte_size())
            .map(|i| if ty == ElementType::Pred { (i % 2) as u8 } else { (i * 7 % 251) as u8 })
            .collect();
        let b = client.buffer_from_host(&bytes, ty, &[3, 2], d).unwrap_or_else(|e| panic!("{ty:?}: {e}"));
        assert_eq!(b.to_host().unwrap(), bytes, "{ty:?}");
        assert_eq!(b.device().unwrap(), *d);
    }

    let exe = client.compile(ADD_MUL, &CompileOptions::default()).unwrap();
    assert_eq!(exe.num_outputs().unwrap(), 2);
    let a = f32_buffer(&client, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], d);
    let b = f32_buffer(&client, &[0.5, 0.25, -1.0, 2.0, 0.0, 8.0], &[2, 3], d);
    let out = exe.execute(&[&a, &b]).unwrap();
    assert_eq!(read_f32(&out[0]), vec![1.5, 2.25, 2.0, 6.0, 5.0, 14.0]);
    assert_eq!(out[1].element_type(), ElementType::BF16);
    let bf16: Vec<u16> = out[1].to_host().unwrap().chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
    let expected: Vec<u16> = [0.5f32, 0.5, -3.0, 8.0, 0.0, 48.0].iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    assert_eq!(bf16, expected);

    let loaded = client.deserialize_executable(&exe.serialize().unwrap()).unwrap();
    assert_eq!(read_f32(&loaded.execute(&[&a, &b]).unwrap()[0]), read_f32(&out[0]));
    let err = exe.execute(&[&a]).unwrap_err();
    assert_eq!(err.call(), Some("PJRT_LoadedExecutable_Execute"), "{err}");
    let err = client.compile("func.func @main(", &CompileOptions::default()).unwrap_err();
    assert_eq!(err.call(), Some("PJRT_Client_Compile"), "{err}");

    // The plugin's profiler sees the program's kernels on the GPU's plane, each with a duration.
    let profiler = Profiler::start(&plugin).unwrap();
    for _ in 0..5 {
        read_f32(&exe.execute(&[&a, &b]).unwrap()[0]);
    }
    let trace = profiler.finish().unwrap();
    let kernels: Vec<_> = trace.events_on("/device:GPU:").filter(|(_, l, _)| l.name.contains("Stream")).collect();
    eprintln!("profiler: planes {:?}", trace.planes.iter().map(|p| &p.name).collect::<Vec<_>>());
    for (_, l, e) in kernels.iter().take(8) {
        eprintln!("  {} | {} | {} ps | {:?}", l.name, e.name, e.duration_ps, e.stats);
    }
    assert!(kernels.len() >= 5, "{} kernel events on the GPU plane", kernels.len());
    assert!(kernels.iter().all(|(_, _, e)| e.duration_ps > 0));

    // Host overhead of one small execution, for the report.
    let start = std::time::Instant::now();
    for _ in 0..200 {
        drop(exe.execute(&[&a, &b]).unwrap());
    }
    eprintln!("execute + await: {:?} each", start.elapsed() / 200);

    // The allocator's statistics follow a 64 MiB buffer in and out (preallocation is off, so it is allocated).
    let before = d.memory_stats().unwrap();
    let big = client.buffer_from_host(&vec![0u8; 64 << 20], ElementType::U8, &[64 << 20], d).unwrap();
    let held = d.memory_stats().unwrap();
    assert!(held.bytes_in_use >= before.bytes_in_use + (64 << 20), "{before:?} then {held:?}");
    let peak = held.peak_bytes_in_use.expect("the CUDA allocator tracks its peak");
    assert!(peak >= held.bytes_in_use, "{held:?}");
    assert!(held.bytes_limit.is_some_and(|l| l > 1 << 30), "{held:?}");
    drop(big);
    // The memory returns to the allocator once the device's stream is done with it, asynchronously.
    let mut after = d.memory_stats().unwrap();
    for _ in 0..200 {
        if after.bytes_in_use < held.bytes_in_use {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        after = d.memory_stats().unwrap();
    }
    assert!(after.bytes_in_use < held.bytes_in_use, "{held:?} then, 2 s after the drop, {after:?}");
    assert_eq!(after.peak_bytes_in_use, Some(peak), "the peak stays");
    eprintln!("memory stats: {before:?}, {held:?}, {after:?}");
}

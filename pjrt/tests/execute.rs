//! Compiling StableHLO and running it: single device, several outputs, SPMD over 4 devices,
//! serialization, and the errors users will hit.
#[macro_use]
mod common;

use common::{client, f32_buffer, read_f32, to_i32};
use lazuli_pjrt::{CompileOptions, Error, ErrorCode, Plugin};

const ADD: &str = r#"
func.func @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.add %a, %b : tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}"#;

/// Three outputs of two element types.
const SUM_PRODUCT_FLOOR: &str = r#"
module @three_outputs {
  func.func @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xi32>) {
    %0 = stablehlo.add %a, %b : tensor<3xf32>
    %1 = stablehlo.multiply %a, %b : tensor<3xf32>
    %2 = stablehlo.convert %1 : (tensor<3xf32>) -> tensor<3xi32>
    return %0, %1, %2 : tensor<3xf32>, tensor<3xf32>, tensor<3xi32>
  }
}"#;

/// Rows split over 4 devices; returns the doubled local shard and the (all-reduced) column sums.
const SPMD: &str = r#"
module @spmd attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func @main(%x: tensor<8x2xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"})
      -> (tensor<8x2xf32> {mhlo.sharding = "{devices=[4,1]0,1,2,3}"}, tensor<2xf32> {mhlo.sharding = "{replicated}"}) {
    %two = stablehlo.constant dense<2.0> : tensor<8x2xf32>
    %d = stablehlo.multiply %x, %two : tensor<8x2xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%x init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x2xf32>, tensor<f32>) -> tensor<2xf32>
    return %d, %s : tensor<8x2xf32>, tensor<2xf32>
  }
}"#;

const A: [f32; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
const B: [f32; 6] = [0.5, -1.0, 10.0, 0.0, -5.0, 100.0];
const A_PLUS_B: [f32; 6] = [1.5, 1.0, 13.0, 4.0, 0.0, 106.0];

fn add_runs_and_gives_exact_values(plugin: &Plugin) {
    let c = client(plugin, 1);
    let exe = c.compile(ADD, &CompileOptions::default()).unwrap();
    assert_eq!(exe.num_outputs().unwrap(), 1);
    let devices = exe.addressable_devices();
    assert_eq!(devices, vec![c.devices()[0].clone()]);
    let a = f32_buffer(&c, &A, &[2, 3], &devices[0]);
    let b = f32_buffer(&c, &B, &[2, 3], &devices[0]);
    for _ in 0..3 {
        let out = exe.execute(&[&a, &b]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].dims(), vec![2, 3]);
        assert_eq!(read_f32(&out[0]), A_PLUS_B);
    }
}

fn a_program_pinned_to_device_2_runs_there(plugin: &Plugin) {
    let c = client(plugin, 4);
    let device = c.devices()[2].clone();
    let exe = c.compile(ADD, &CompileOptions::on_device(2)).unwrap();
    assert_eq!(exe.addressable_devices(), vec![device.clone()]);
    let a = f32_buffer(&c, &A, &[2, 3], &device);
    let out = exe.execute(&[&a, &a]).unwrap();
    assert_eq!(out[0].device().unwrap(), device);
    assert_eq!(read_f32(&out[0]), A.map(|x| 2.0 * x));
    // Arguments on another device are refused before the plugin sees them.
    let elsewhere = f32_buffer(&c, &A, &[2, 3], &c.devices()[0]);
    let err = exe.execute(&[&elsewhere, &a]).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
}

fn several_outputs_come_back_in_order(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = &c.devices()[0];
    let exe = c.compile(SUM_PRODUCT_FLOOR, &CompileOptions::default()).unwrap();
    assert_eq!(exe.num_outputs().unwrap(), 3);
    let a = f32_buffer(&c, &[1.0, 2.5, -3.0], &[3], d);
    let b = f32_buffer(&c, &[4.0, 2.0, 2.5], &[3], d);
    let out = exe.execute(&[&a, &b]).unwrap();
    assert_eq!(out.len(), 3);
    assert_eq!(read_f32(&out[0]), vec![5.0, 4.5, -0.5]);
    assert_eq!(read_f32(&out[1]), vec![4.0, 5.0, -7.5]);
    assert_eq!(out[2].element_type(), lazuli_pjrt::ElementType::S32);
    assert_eq!(to_i32(&out[2].to_host().unwrap()), vec![4, 5, -7]);
}

fn spmd_over_four_devices(plugin: &Plugin) {
    let c = client(plugin, 4);
    let exe = c.compile(SPMD, &CompileOptions::spmd(4)).unwrap();
    let devices = exe.addressable_devices();
    assert_eq!(devices, c.devices());
    assert_eq!(exe.num_outputs().unwrap(), 2);
    let x: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let shards: Vec<_> =
        devices.iter().enumerate().map(|(i, d)| f32_buffer(&c, &x[4 * i..4 * i + 4], &[2, 2], d)).collect();
    let args: Vec<Vec<_>> = shards.iter().map(|s| vec![s]).collect();
    let out = exe.execute_sharded(&args).unwrap();
    assert_eq!(out.len(), 4);
    let column_sums = vec![(0..8).map(|r| (2 * r) as f32).sum::<f32>(), (0..8).map(|r| (2 * r + 1) as f32).sum()];
    for (i, (outputs, device)) in out.iter().zip(&devices).enumerate() {
        assert_eq!(outputs.len(), 2);
        assert_eq!(outputs[0].dims(), vec![2, 2]);
        assert_eq!(outputs[0].device().unwrap(), *device);
        assert_eq!(read_f32(&outputs[0]), x[4 * i..4 * i + 4].iter().map(|v| 2.0 * v).collect::<Vec<_>>());
        assert_eq!(read_f32(&outputs[1]), column_sums);
    }
    // A sharded program cannot be run through the single-device entry point.
    assert!(matches!(exe.execute(&[&shards[0]]), Err(Error::InvalidInput(_))));
    assert!(matches!(exe.execute_sharded(&args[..3]), Err(Error::InvalidInput(_))));
}

fn serialized_executables_load_and_agree(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = &c.devices()[0];
    let exe = c.compile(ADD, &CompileOptions::default()).unwrap();
    let bytes = exe.serialize().unwrap();
    assert!(bytes.len() > 100);
    let loaded = c.deserialize_executable(&bytes).unwrap();
    assert_eq!(loaded.num_outputs().unwrap(), 1);
    assert_eq!(loaded.addressable_devices(), exe.addressable_devices());
    let a = f32_buffer(&c, &A, &[2, 3], d);
    let b = f32_buffer(&c, &B, &[2, 3], d);
    assert_eq!(read_f32(&loaded.execute(&[&a, &b]).unwrap()[0]), A_PLUS_B);
    assert_eq!(read_f32(&exe.execute(&[&a, &b]).unwrap()[0]), A_PLUS_B);
    // and into a second client of the same plugin
    let c2 = client(plugin, 1);
    let loaded2 = c2.deserialize_executable(&bytes).unwrap();
    let a2 = f32_buffer(&c2, &A, &[2, 3], &c2.devices()[0]);
    let b2 = f32_buffer(&c2, &B, &[2, 3], &c2.devices()[0]);
    assert_eq!(read_f32(&loaded2.execute(&[&a2, &b2]).unwrap()[0]), A_PLUS_B);
    assert!(c.deserialize_executable(&[]).is_err());
}

fn malformed_stablehlo_reports_the_parse_error(plugin: &Plugin) {
    let c = client(plugin, 1);
    let bad = ADD.replace("stablehlo.add", "stablehlo.ad");
    let err = c.compile(&bad, &CompileOptions::default()).unwrap_err();
    assert_eq!(err.call(), Some("PJRT_Client_Compile"));
    assert!(err.code().is_some(), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("stablehlo.ad") && text.contains("3:"), "{text}");
}

fn invalid_compile_options_never_reach_the_plugin(plugin: &Plugin) {
    let c = client(plugin, 2);
    let cases = [
        CompileOptions { num_replicas: 0, ..CompileOptions::default() },
        CompileOptions { num_partitions: 0, ..CompileOptions::default() },
        CompileOptions { num_partitions: 2, ..CompileOptions::default() }, // no SPMD
        CompileOptions::spmd(4),                                           // more than 2 devices
        CompileOptions::on_device(7),                                      // no such device
        CompileOptions { device_assignment: Some(vec![vec![0, 1]]), ..CompileOptions::default() },
    ];
    for opts in cases {
        let err = c.compile(ADD, &opts).unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{opts:?}: {err:?}");
        assert_eq!(err.code(), Some(ErrorCode::InvalidArgument));
    }
}

fn wrong_argument_count_is_an_error(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = &c.devices()[0];
    let exe = c.compile(ADD, &CompileOptions::default()).unwrap();
    let a = f32_buffer(&c, &A, &[2, 3], d);
    let err = exe.execute(&[&a]).unwrap_err();
    assert_eq!(err.call(), Some("PJRT_LoadedExecutable_Execute"), "{err:?}");
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument), "{err:?}");
    let err = exe.execute(&[&a, &a, &a]).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidArgument), "{err:?}");
    // The executable is still usable afterwards.
    assert_eq!(read_f32(&exe.execute(&[&a, &a]).unwrap()[0]), A.map(|x| 2.0 * x));
}

fn buffers_of_another_client_are_refused(plugin: &Plugin) {
    let c = client(plugin, 1);
    let other = client(plugin, 1);
    let exe = c.compile(ADD, &CompileOptions::default()).unwrap();
    let a = f32_buffer(&other, &A, &[2, 3], &other.devices()[0]);
    let err = exe.execute(&[&a, &a]).unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
}

fn one_executable_runs_from_many_threads(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = c.devices()[0].clone();
    let exe = c.compile(ADD, &CompileOptions::default()).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (c, d, exe) = (&c, &d, &exe);
            s.spawn(move || {
                for _ in 0..20 {
                    let a = f32_buffer(c, &A.map(|x| x + t as f32), &[2, 3], d);
                    let out = exe.execute(&[&a, &a]).unwrap();
                    assert_eq!(read_f32(&out[0]), A.map(|x| 2.0 * (x + t as f32)));
                }
            });
        }
    });
}

/// Copies to the host started right after a launch, before the outputs are read, give the program's values,
/// finished in any order; an unfinished one dropped waits for its copy; a 2-D array comes back row-major as
/// `to_host` gives it.
fn copies_started_at_the_launch_give_the_outputs(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = &c.devices()[0];
    let exe = c.compile(SUM_PRODUCT_FLOOR, &CompileOptions::default()).unwrap();
    let a = f32_buffer(&c, &[1.0, 2.5, -3.0], &[3], d);
    let b = f32_buffer(&c, &[4.0, 2.0, 2.5], &[3], d);
    for round in 0..3 {
        let out = exe.execute(&[&a, &b]).unwrap();
        let copies: Vec<_> = out.iter().map(|o| o.start_to_host().unwrap()).collect();
        let mut copies = copies.into_iter();
        let (sum, product, floor) = (copies.next().unwrap(), copies.next().unwrap(), copies.next().unwrap());
        if round == 1 {
            drop(sum);
        } else {
            assert_eq!(common::to_f32(&sum.finish().unwrap()), vec![5.0, 4.5, -0.5], "round {round}");
        }
        assert_eq!(to_i32(&floor.finish().unwrap()), vec![4, 5, -7], "round {round}");
        assert_eq!(common::to_f32(&product.finish().unwrap()), vec![4.0, 5.0, -7.5], "round {round}");
    }
    let exe = c.compile(ADD, &CompileOptions::default()).unwrap();
    let out = exe.execute(&[&f32_buffer(&c, &A, &[2, 3], d), &f32_buffer(&c, &B, &[2, 3], d)]).unwrap();
    let copy = out[0].start_to_host().unwrap();
    // A copy reports done, without being waited for, once the plugin has written it (polled for up to 10 s).
    let start = std::time::Instant::now();
    while !copy.is_done() {
        assert!(start.elapsed().as_secs() < 10, "a copy of six floats never reported done");
        std::thread::yield_now();
    }
    assert_eq!(common::to_f32(&copy.finish().unwrap()), A_PLUS_B);
}

per_plugin!(
    add_runs_and_gives_exact_values,
    a_program_pinned_to_device_2_runs_there,
    several_outputs_come_back_in_order,
    spmd_over_four_devices,
    serialized_executables_load_and_agree,
    malformed_stablehlo_reports_the_parse_error,
    invalid_compile_options_never_reach_the_plugin,
    wrong_argument_count_is_an_error,
    buffers_of_another_client_are_refused,
    one_executable_runs_from_many_threads,
    copies_started_at_the_launch_give_the_outputs,
);

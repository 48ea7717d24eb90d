//! Clients, devices and host <-> device copies.
#[macro_use]
mod common;

use common::client;
use lazuli_pjrt::{Buffer, Client, ClientOptions, Device, ElementType, Error, LoadedExecutable, Plugin};

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Plugin>();
    check::<Client>();
    check::<Device>();
    check::<Buffer>();
    check::<LoadedExecutable>();
}

fn device_counts_follow_the_option(plugin: &Plugin) {
    for n in [1, 4] {
        let c = client(plugin, n);
        assert_eq!(c.platform_name().unwrap(), "cpu");
        let devices = c.devices();
        assert_eq!(devices.len(), n as usize);
        for (i, d) in devices.iter().enumerate() {
            assert_eq!(d.id(), i as i32);
            assert_eq!(d.local_hardware_id(), i as i32);
            assert_eq!(d.kind(), "cpu");
        }
        assert_eq!(c.plugin().path(), plugin.path());
    }
}

fn bad_create_options_never_reach_the_plugin(plugin: &Plugin) {
    let unknown = Client::new(plugin, &ClientOptions::new().int_option("no_such_option", 1)).unwrap_err();
    assert!(matches!(&unknown, Error::InvalidInput(m) if m.contains("no_such_option")), "{unknown:?}");
    // A bool cpu_device_count aborts xla-cpu-pjrt 0.0.1; here it must be a plain error.
    let mistyped = Client::new(plugin, &ClientOptions::new().bool_option("cpu_device_count", true)).unwrap_err();
    assert!(matches!(mistyped, Error::InvalidInput(_)), "{mistyped:?}");
    let zero = Client::new(plugin, &ClientOptions::new().cpu_device_count(0)).unwrap_err();
    assert!(matches!(zero, Error::InvalidInput(_)), "{zero:?}");
}

/// Host bytes for 6 elements of `ty`, covering signs, extremes, subnormals, infinities and NaN.
fn sample_bytes(ty: ElementType) -> Vec<u8> {
    use ElementType::*;
    match ty {
        Pred => vec![1, 0, 0, 1, 1, 0],
        S8 => [-128i8, -1, 0, 1, 7, 127].iter().flat_map(|x| x.to_le_bytes()).collect(),
        U8 => vec![0, 1, 2, 128, 254, 255],
        S16 => [i16::MIN, -2, 0, 3, 1000, i16::MAX].iter().flat_map(|x| x.to_le_bytes()).collect(),
        U16 => [0u16, 1, 2, 40000, 65534, u16::MAX].iter().flat_map(|x| x.to_le_bytes()).collect(),
        S32 => [i32::MIN, -5, 0, 6, 1 << 20, i32::MAX].iter().flat_map(|x| x.to_le_bytes()).collect(),
        U32 => [0u32, 1, 7, 1 << 31, u32::MAX - 1, u32::MAX].iter().flat_map(|x| x.to_le_bytes()).collect(),
        S64 => [i64::MIN, -9, 0, 10, 1 << 40, i64::MAX].iter().flat_map(|x| x.to_le_bytes()).collect(),
        U64 => [0u64, 1, 3, 1 << 63, u64::MAX - 1, u64::MAX].iter().flat_map(|x| x.to_le_bytes()).collect(),
        // 1.0, -2.0, 65504 (max), smallest subnormal, -0.0, +inf
        F16 => [0x3C00u16, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00].iter().flat_map(|x| x.to_le_bytes()).collect(),
        // 1.0, -2.0, largest finite, smallest subnormal, -0.0, quiet NaN
        BF16 => [0x3F80u16, 0xC000, 0x7F7F, 0x0001, 0x8000, 0x7FC0].iter().flat_map(|x| x.to_le_bytes()).collect(),
        F32 => [1.5f32, -0.0, f32::MAX, f32::from_bits(1), f32::INFINITY, f32::NAN]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        F64 => [1.5f64, -0.0, f64::MIN, f64::from_bits(1), f64::NEG_INFINITY, f64::NAN]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
    }
}

fn every_element_type_round_trips_exactly(plugin: &Plugin) {
    let c = client(plugin, 2);
    let device = &c.devices()[1];
    for ty in ElementType::ALL {
        let bytes = sample_bytes(ty);
        assert_eq!(bytes.len(), 6 * ty.byte_size(), "{ty:?}");
        for dims in [&[2i64, 3][..], &[6], &[3, 1, 2]] {
            let b = c.buffer_from_host(&bytes, ty, dims, device).unwrap_or_else(|e| panic!("{ty:?}: {e}"));
            assert_eq!(b.element_type(), ty);
            assert_eq!(b.dims(), dims);
            assert_eq!(b.device().unwrap(), *device);
            assert!(b.on_device_size().unwrap() >= bytes.len());
            assert_eq!(b.to_host().unwrap(), bytes, "{ty:?} {dims:?}");
        }
    }
}

fn scalars_and_empty_arrays_round_trip(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = &c.devices()[0];
    let s = c.buffer_from_host(&7i64.to_le_bytes(), ElementType::S64, &[], d).unwrap();
    assert_eq!(s.dims(), Vec::<i64>::new());
    assert_eq!(s.to_host().unwrap(), 7i64.to_le_bytes());
    let empty = c.buffer_from_host(&[], ElementType::F32, &[0, 3], d).unwrap();
    assert_eq!(empty.dims(), vec![0, 3]);
    assert_eq!(empty.to_host().unwrap(), Vec::<u8>::new());
}

fn host_data_may_be_dropped_right_after_the_copy(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = &c.devices()[0];
    let mut data = common::f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
    let b = c.buffer_from_host(&data, ElementType::F32, &[4], d).unwrap();
    data.iter_mut().for_each(|x| *x = 0xAB);
    drop(data);
    assert_eq!(common::read_f32(&b), vec![1.0, 2.0, 3.0, 4.0]);
}

fn wrong_host_sizes_and_foreign_devices_are_refused(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = &c.devices()[0];
    let short = c.buffer_from_host(&[0u8; 7], ElementType::F32, &[2], d).unwrap_err();
    assert!(matches!(short, Error::InvalidInput(_)), "{short:?}");
    let negative = c.buffer_from_host(&[], ElementType::F32, &[-1], d).unwrap_err();
    assert!(matches!(negative, Error::InvalidInput(_)), "{negative:?}");
    let other = client(plugin, 1);
    let foreign = other.buffer_from_host(&[0u8; 4], ElementType::F32, &[1], d).unwrap_err();
    assert!(matches!(foreign, Error::InvalidInput(_)), "{foreign:?}");
}

fn buffers_keep_their_client_alive(plugin: &Plugin) {
    let c = client(plugin, 1);
    let d = c.devices()[0].clone();
    let b = common::f32_buffer(&c, &[5.0, 6.0], &[2], &d);
    drop(c);
    assert_eq!(common::read_f32(&b), vec![5.0, 6.0]);
    assert_eq!(d.kind(), "cpu");
}

/// The CPU plugins keep no allocator statistics: asking is the plugin's clear error, not a crash or zeros.
/// (The GPU test checks real statistics.)
fn memory_stats_are_unimplemented_on_the_cpu(plugin: &Plugin) {
    let c = client(plugin, 1);
    let e = c.devices()[0].memory_stats().unwrap_err();
    assert_eq!(e.call(), Some("PJRT_Device_MemoryStats"), "{e}");
    assert!(matches!(&e, Error::Pjrt { code: Some(lazuli_pjrt::ErrorCode::Unimplemented), .. }), "{e:?}");
}

/// A reused upload holds the new values, for every element type and rank (the plugin's own copy to the host,
/// used for rank ≥ 2, would show a layout the in-place write got wrong); only same-typed, same-shaped uploads
/// share a buffer, and only once the earlier one is dropped.
fn reused_uploads_carry_the_new_values(plugin: &Plugin) {
    for ty in ElementType::ALL {
        let first = sample_bytes(ty);
        let second: Vec<u8> = first.chunks(ty.byte_size()).rev().flatten().copied().collect();
        for dims in [&[2i64, 3][..], &[6], &[3, 1, 2]] {
            let c = client(plugin, 2);
            let device = &c.devices()[1];
            let a = c.buffer_from_host_reusing(&first, ty, dims, device).unwrap();
            let held = c.buffer_from_host_reusing(&first, ty, dims, device).unwrap();
            assert_eq!(c.spare_uploads(), 0, "nothing dropped yet");
            drop(a);
            assert_eq!(c.spare_uploads(), 1, "{ty:?} {dims:?}: the dropped upload is kept");
            let b = c.buffer_from_host_reusing(&second, ty, dims, device).unwrap();
            assert_eq!(c.spare_uploads(), 0, "{ty:?} {dims:?}: and reused");
            assert_eq!(b.to_host().unwrap(), second, "{ty:?} {dims:?}");
            assert_eq!(held.to_host().unwrap(), first, "{ty:?} {dims:?}: a live upload is never overwritten");
            assert_eq!((b.element_type(), b.dims(), b.device().unwrap()), (ty, dims.to_vec(), device.clone()));
            drop(b);
            // Another shape or device does not take the kept buffer.
            let other = c.buffer_from_host_reusing(&second, ty, &[6, 1], device).unwrap();
            let elsewhere = c.buffer_from_host_reusing(&second, ty, dims, &c.devices()[0]).unwrap();
            assert_eq!(c.spare_uploads(), 1, "{ty:?} {dims:?}");
            assert_eq!((other.to_host().unwrap(), elsewhere.to_host().unwrap()), (second.clone(), second.clone()));
            // Plain uploads are never kept.
            drop(c.buffer_from_host(&first, ty, dims, device).unwrap());
            assert_eq!(c.spare_uploads(), 1, "{ty:?} {dims:?}");
        }
    }
}

/// A dropped upload that a launch still running (its `Completion` not yet finished) read is not overwritten by
/// the next reusing upload: the safe API is sound without the caller knowing what runs. Once the launch
/// finished, the buffer is reused; the launch computed with the values it was given.
fn a_spare_a_running_launch_read_is_not_overwritten(plugin: &Plugin) {
    const DOUBLE: &str = "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  \
        %0 = stablehlo.add %a, %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n";
    let c = client(plugin, 1);
    let device = &c.devices()[0];
    let exe = c.compile(DOUBLE, &lazuli_pjrt::CompileOptions::default()).unwrap();
    let x =
        c.buffer_from_host_reusing(&common::f32_bytes(&[1.0, 2.0, 3.0, 4.0]), ElementType::F32, &[4], device).unwrap();
    let (mut outs, done) = exe.launch_sharded(&[vec![&x]]).unwrap();
    drop(x);
    assert_eq!(c.spare_uploads(), 1, "the dropped upload is kept");
    let y = c.buffer_from_host_reusing(&common::f32_bytes(&[9.0; 4]), ElementType::F32, &[4], device).unwrap();
    assert_eq!(c.spare_uploads(), 1, "but not overwritten while the launch that read it may run");
    done.wait().unwrap();
    assert_eq!(outs[0].remove(0).to_host().unwrap(), common::f32_bytes(&[2.0, 4.0, 6.0, 8.0]));
    let z = c.buffer_from_host_reusing(&common::f32_bytes(&[5.0; 4]), ElementType::F32, &[4], device).unwrap();
    assert_eq!(c.spare_uploads(), 0, "once it finished, the buffer is reused");
    assert_eq!(
        (y.to_host().unwrap(), z.to_host().unwrap()),
        (common::f32_bytes(&[9.0; 4]), common::f32_bytes(&[5.0; 4]))
    );
}

per_plugin!(
    a_spare_a_running_launch_read_is_not_overwritten,
    reused_uploads_carry_the_new_values,
    memory_stats_are_unimplemented_on_the_cpu,
    device_counts_follow_the_option,
    bad_create_options_never_reach_the_plugin,
    every_element_type_round_trips_exactly,
    scalars_and_empty_arrays_round_trip,
    host_data_may_be_dropped_right_after_the_copy,
    wrong_host_sizes_and_foreign_devices_are_refused,
    buffers_keep_their_client_alive,
);

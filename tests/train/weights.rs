//! Plain safetensors files: every dtype both ways against the `safetensors` crate's own reader and writer;
//! corrupt, truncated and foreign files give errors naming the file, the tensor and the caller's line; loading
//! into a module by name, strict and not.

use std::path::PathBuf;

use half::{bf16, f16};
use lazuli::nn::{load_named, Activation, HostRng, Mlp, Strict};
use lazuli::{DType, Element, Error, Module, Tensor};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lazuli-st-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A tensor as the `safetensors` crate writes it, and a check of lazuli's reading of it.
struct Case {
    name: &'static str,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
    check: Box<dyn Fn(&Tensor)>,
}

fn case<T: Element + PartialEq + std::fmt::Debug>(
    name: &'static str,
    dtype: Dtype,
    want: DType,
    shape: &[usize],
    values: Vec<T>,
    le: fn(T) -> Vec<u8>,
) -> Case {
    let bytes = values.iter().flat_map(|&v| le(v)).collect();
    let shape_owned = shape.to_vec();
    let check = Box::new(move |t: &Tensor| {
        assert_eq!(t.dtype(), want, "{name}");
        assert_eq!(t.dims(), shape_owned.as_slice(), "{name}");
        assert_eq!(t.to_vec::<T>().unwrap(), values, "{name}");
    });
    Case { name, dtype, shape: shape.to_vec(), bytes, check }
}

fn cases() -> Vec<Case> {
    vec![
        case("f32", Dtype::F32, DType::F32, &[2, 3], vec![1.5f32, -2.0, 0.0, 3.25, f32::MAX, -0.0], |v| {
            v.to_le_bytes().to_vec()
        }),
        case("f64", Dtype::F64, DType::F64, &[3], vec![1e300f64, -1.0, 0.1], |v| v.to_le_bytes().to_vec()),
        case("f16", Dtype::F16, DType::F16, &[2, 2], [1.0, -0.5, 65504.0, 0.1].map(f16::from_f32).to_vec(), |v| {
            v.to_le_bytes().to_vec()
        }),
        case("bf16", Dtype::BF16, DType::BF16, &[4], [1.0, -3.0, 1e30, 0.1].map(bf16::from_f32).to_vec(), |v| {
            v.to_le_bytes().to_vec()
        }),
        case("i32", Dtype::I32, DType::I32, &[2, 1], vec![i32::MIN, 7], |v| v.to_le_bytes().to_vec()),
        case("i64", Dtype::I64, DType::I64, &[2], vec![i64::MAX, -3], |v| v.to_le_bytes().to_vec()),
        case("u8", Dtype::U8, DType::U8, &[5], vec![0u8, 1, 127, 128, 255], |v| vec![v]),
        case("u32", Dtype::U32, DType::U32, &[2], vec![u32::MAX, 5], |v| v.to_le_bytes().to_vec()),
        case("u64", Dtype::U64, DType::U64, &[1, 2], vec![u64::MAX, 9], |v| v.to_le_bytes().to_vec()),
        case("bool", Dtype::BOOL, DType::Bool, &[3], vec![true, false, true], |v| vec![v as u8]),
        case("scalar", Dtype::F32, DType::F32, &[], vec![42.0f32], |v| v.to_le_bytes().to_vec()),
        case("empty", Dtype::I32, DType::I32, &[0, 3], Vec::<i32>::new(), |v| v.to_le_bytes().to_vec()),
    ]
}

fn write_with_crate(path: &std::path::Path, cases: &[Case]) {
    let views: Vec<(&str, TensorView<'_>)> =
        cases.iter().map(|c| (c.name, TensorView::new(c.dtype, c.shape.clone(), &c.bytes).unwrap())).collect();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).unwrap();
}

#[test]
fn every_dtype_round_trips_through_the_crates_own_files() {
    let d = dir("dtypes");
    let cases = cases();
    let theirs = d.join("theirs.safetensors");
    write_with_crate(&theirs, &cases);

    let loaded = lazuli::safetensors::load(&theirs).unwrap();
    assert_eq!(loaded.len(), cases.len());
    assert_eq!(loaded.metadata().get("format").map(String::as_str), Some("pt"));
    for c in &cases {
        (c.check)(loaded.get(c.name).unwrap_or_else(|| panic!("{} is missing", c.name)));
    }
    // File order: the order of the bytes, which the crate's writer makes larger dtypes first.
    let data = std::fs::read(&theirs).unwrap();
    let st = SafeTensors::deserialize(&data).unwrap();
    let mut by_offset: Vec<(usize, String)> =
        st.tensors().into_iter().map(|(n, v)| (v.data().as_ptr() as usize, n)).collect();
    by_offset.sort();
    let names: Vec<&str> = loaded.names().collect();
    assert_eq!(names, by_offset.iter().map(|(_, n)| n.as_str()).collect::<Vec<_>>());

    // And back: lazuli's file, read by the crate, holds the same bytes.
    let ours = d.join("ours.safetensors");
    let pairs: Vec<(&str, &Tensor)> = loaded.iter().map(|(n, t)| (n.as_str(), t)).collect();
    lazuli::safetensors::save(&ours, &pairs).unwrap();
    let data = std::fs::read(&ours).unwrap();
    let st = SafeTensors::deserialize(&data).unwrap();
    assert_eq!(st.len(), cases.len());
    for c in &cases {
        let v = st.tensor(c.name).unwrap();
        assert_eq!((v.dtype(), v.shape(), v.data()), (c.dtype, c.shape.as_slice(), c.bytes.as_slice()), "{}", c.name);
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn computed_tensors_save_and_metadata_is_kept() {
    let d = dir("computed");
    let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    let y = (&x * 2.0).t();
    let meta = std::collections::BTreeMap::from([("source".to_string(), "test".to_string())]);
    let path = d.join("y.safetensors");
    lazuli::safetensors::save_with_metadata(&path, &[("y", &y), ("x", &x)], &meta).unwrap();
    let back = lazuli::safetensors::load(&path).unwrap();
    assert_eq!(back.get("y").unwrap().to_vec::<f32>().unwrap(), vec![2.0, 6.0, 4.0, 8.0]);
    assert_eq!(back.metadata(), &meta);
    let err = lazuli::safetensors::save(&path, &[("x", &x), ("x", &y)]).unwrap_err().to_string();
    assert!(err.contains("\"x\" is given twice") && err.contains("weights.rs"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The error of loading `bytes` as a file; it must name the file and this test file's line.
fn load_error(d: &std::path::Path, file: &str, bytes: &[u8]) -> String {
    let path = d.join(file);
    std::fs::write(&path, bytes).unwrap();
    let err = lazuli::safetensors::load(&path).unwrap_err();
    assert!(matches!(err, Error::Weights(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(file) && msg.contains("weights.rs"), "names the file and the line: {msg}");
    msg
}

/// A file of `json` as its header and `data` after it.
fn raw_file(json: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json.as_bytes());
    out.extend(data);
    out
}

#[test]
fn bad_files_are_errors_naming_the_file_and_the_tensor() {
    let d = dir("bad");
    // A dtype lazuli does not have, written by the crate.
    let f8 = [1u8, 2, 3, 4];
    let views = vec![("scales", TensorView::new(Dtype::F8_E4M3, vec![4], &f8).unwrap())];
    let path = d.join("f8.safetensors");
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let msg = load_error(&d, "f8.safetensors", &std::fs::read(&path).unwrap());
    assert!(msg.contains("\"scales\"") && msg.contains("F8_E4M3") && msg.contains("BF16"), "{msg}");

    let mut good = Vec::new();
    let cases = cases();
    write_with_crate(&d.join("good.safetensors"), &cases);
    good.extend(std::fs::read(d.join("good.safetensors")).unwrap());

    let msg = load_error(&d, "truncated.safetensors", &good[..good.len() - 3]);
    assert!(msg.contains("truncated") && msg.contains("lie outside"), "{msg}");
    let msg = load_error(&d, "cut-header.safetensors", &good[..40]);
    assert!(msg.contains("truncated") && msg.contains("header"), "{msg}");
    let msg = load_error(&d, "tiny.safetensors", &good[..5]);
    assert!(msg.contains("too short"), "{msg}");
    let msg = load_error(&d, "huge-header.safetensors", &u64::MAX.to_le_bytes());
    assert!(msg.contains("header claims"), "{msg}");
    let msg = load_error(&d, "not-json.safetensors", &raw_file("{\"a\": [1,", &[]));
    assert!(msg.contains("not valid JSON"), "{msg}");
    let msg =
        load_error(&d, "no-shape.safetensors", &raw_file(r#"{"w":{"dtype":"F32","data_offsets":[0,4]}}"#, &[0; 4]));
    assert!(msg.contains("\"w\"") && msg.contains("malformed"), "{msg}");
    let wrong_size = raw_file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#, &[0; 8]);
    let msg = load_error(&d, "size.safetensors", &wrong_size);
    assert!(msg.contains("\"w\"") && msg.contains("needs 8 bytes"), "{msg}");
    let beyond = raw_file(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#, &[0; 8]);
    let msg = load_error(&d, "beyond.safetensors", &beyond);
    assert!(msg.contains("\"w\"") && msg.contains("4..12"), "{msg}");
    let overlap =
        r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}"#;
    let msg = load_error(&d, "overlap.safetensors", &raw_file(overlap, &[0; 3]));
    assert!(msg.contains("overlap"), "{msg}");
    let msg = load_error(
        &d,
        "bool.safetensors",
        &raw_file(r#"{"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}}"#, &[1, 2]),
    );
    assert!(msg.contains("\"m\"") && msg.contains("not a bool"), "{msg}");
    let err = lazuli::safetensors::load(d.join("absent.safetensors")).unwrap_err().to_string();
    assert!(err.contains("absent.safetensors") && err.contains("opening failed"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

fn mlp(seed: u64) -> Mlp {
    Mlp::new(&mut HostRng::new(seed), &[3, 4, 2], Activation::Tanh, DType::F32)
}

fn values(m: &dyn Module) -> Vec<Vec<f32>> {
    m.params().iter().map(|p| p.get().to_vec::<f32>().unwrap()).collect()
}

#[test]
fn load_named_sets_every_parameter_by_name() {
    let (source, target) = (mlp(1), mlp(2));
    let named: Vec<(String, Tensor)> = source.named_params().into_iter().map(|(n, p)| (n, p.get())).collect();
    let report = load_named(&target, &named, Strict::Yes).unwrap();
    assert!(report.is_exact(), "{report}");
    assert_eq!(report.loaded, ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]);
    assert_eq!(values(&target), values(&source));
    let x = Tensor::from_slice(&[0.1f32, -0.2, 0.3], &[1, 3]);
    assert_eq!(target.forward(&x).to_vec::<f32>().unwrap(), source.forward(&x).to_vec::<f32>().unwrap());
}

#[test]
fn strict_loading_lists_every_misfit_and_changes_nothing() {
    let (source, target) = (mlp(1), mlp(2));
    let mut named: Vec<(String, Tensor)> = source.named_params().into_iter().map(|(n, p)| (n, p.get())).collect();
    named.retain(|(n, _)| n != "layers.1.bias");
    named[0].1 = Tensor::zeros(&[4, 3], DType::F32);
    named[1].1 = Tensor::zeros(&[4], DType::F64);
    named.push(("head.weight".into(), Tensor::zeros(&[2], DType::F32)));
    let before = values(&target);

    let err = load_named(&target, &named, Strict::Yes).unwrap_err();
    let msg = err.to_string();
    for part in ["\"layers.1.bias\"", "\"head.weight\"", "\"layers.0.weight\" is f32[4,3]", "\"layers.0.bias\" is f64"]
    {
        assert!(msg.contains(part), "{part} in {msg}");
    }
    assert!(msg.contains("weights.rs"), "names the caller's line: {msg}");
    assert_eq!(values(&target), before, "a strict load that fails changes nothing");

    let report = load_named(&target, &named, Strict::No).unwrap();
    assert_eq!(report.loaded, ["layers.1.weight"]);
    assert_eq!(report.missing, ["layers.1.bias"]);
    assert_eq!(report.unexpected, ["head.weight"]);
    let mismatched: Vec<&str> = report.mismatched.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(mismatched, ["layers.0.weight", "layers.0.bias"]);
    assert_eq!(report.mismatched[0].wanted.dims.as_slice(), [3, 4]);
    let after = values(&target);
    assert_eq!(after[2], values(&source)[2], "the matching parameter is loaded");
    assert_eq!([&after[0], &after[1], &after[3]], [&before[0], &before[1], &before[3]], "the rest are kept");
}

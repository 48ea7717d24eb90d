//! GPT-2 weights in Hugging Face's layout: a synthetic `model.safetensors` (2 layers, d = 16, vocab 32) written by
//! the `safetensors` crate loads into the unrolled and the scanned `Gpt`, whose logits match a GPT-2 forward pass
//! written here on ndarray from the same arrays; saving back reproduces the file's tensors byte for byte.

use std::collections::HashMap;

use lazuli::nn::{gpt2, GptConfig, HostRng};
use lazuli::{DType, Tensor};
use ndarray::{s, Array1, Array2, Axis};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

const VOCAB: usize = 32;
const POSITIONS: usize = 8;
const D: usize = 16;
const HEADS: usize = 2;
const LAYERS: usize = 2;

fn config(scan_blocks: bool) -> GptConfig {
    GptConfig {
        vocab: VOCAB,
        block_size: POSITIONS,
        n_layer: LAYERS,
        n_head: HEADS,
        d_model: D,
        dropout: 0.0,
        dtype: DType::F32,
        scan_blocks,
        checkpoint_blocks: false,
    }
}

/// GPT-2's tensors by their Hugging Face names (without prefix), random.
fn hf_weights() -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = HostRng::new(24);
    let mut out = Vec::new();
    let mut put = |name: String, shape: Vec<usize>, scale: f64, offset: f32| {
        let n = shape.iter().product();
        let v = (0..n).map(|_| offset + (rng.normal() * scale) as f32).collect();
        out.push((name, shape, v));
    };
    put("wte.weight".into(), vec![VOCAB, D], 0.3, 0.0);
    put("wpe.weight".into(), vec![POSITIONS, D], 0.1, 0.0);
    for i in 0..LAYERS {
        let h = |s: &str| format!("h.{i}.{s}");
        put(h("ln_1.weight"), vec![D], 0.1, 1.0);
        put(h("ln_1.bias"), vec![D], 0.1, 0.0);
        put(h("attn.c_attn.weight"), vec![D, 3 * D], 0.3, 0.0);
        put(h("attn.c_attn.bias"), vec![3 * D], 0.1, 0.0);
        put(h("attn.c_proj.weight"), vec![D, D], 0.3, 0.0);
        put(h("attn.c_proj.bias"), vec![D], 0.1, 0.0);
        put(h("ln_2.weight"), vec![D], 0.1, 1.0);
        put(h("ln_2.bias"), vec![D], 0.1, 0.0);
        put(h("mlp.c_fc.weight"), vec![D, 4 * D], 0.3, 0.0);
        put(h("mlp.c_fc.bias"), vec![4 * D], 0.1, 0.0);
        put(h("mlp.c_proj.weight"), vec![4 * D, D], 0.2, 0.0);
        put(h("mlp.c_proj.bias"), vec![D], 0.1, 0.0);
    }
    put("ln_f.weight".into(), vec![D], 0.1, 1.0);
    put("ln_f.bias".into(), vec![D], 0.1, 0.0);
    out
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The weights as `GPT2LMHeadModel` saves them: `transformer.` prefixes, the tied head, the mask buffers.
fn write_hf_file(path: &std::path::Path, weights: &[(String, Vec<usize>, Vec<f32>)]) {
    let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> =
        weights.iter().map(|(n, s, v)| (format!("transformer.{n}"), Dtype::F32, s.clone(), bytes(v))).collect();
    data.push(("lm_head.weight".into(), Dtype::F32, weights[0].1.clone(), bytes(&weights[0].2)));
    for i in 0..LAYERS {
        let mask = vec![1.0f32; POSITIONS * POSITIONS];
        data.push((format!("transformer.h.{i}.attn.bias"), Dtype::F32, vec![1, 1, POSITIONS, POSITIONS], bytes(&mask)));
        data.push((format!("transformer.h.{i}.attn.masked_bias"), Dtype::F32, vec![], bytes(&[-1e4])));
    }
    let views: Vec<(String, TensorView<'_>)> =
        data.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), path).unwrap();
}

/// GPT-2's forward pass for one sequence, on ndarray, from the Hugging Face arrays.
fn reference_logits(weights: &[(String, Vec<usize>, Vec<f32>)], ids: &[usize]) -> Array2<f32> {
    let w: HashMap<&str, (&[usize], &[f32])> =
        weights.iter().map(|(n, s, v)| (n.as_str(), (s.as_slice(), v.as_slice()))).collect();
    let mat = |n: &str| {
        let (s, v) = w[n];
        Array2::from_shape_vec((s[0], s[1]), v.to_vec()).unwrap()
    };
    let vec1 = |n: &str| Array1::from_vec(w[n].1.to_vec());
    let norm = |x: &Array2<f32>, p: &str| {
        let mean = x.mean_axis(Axis(1)).unwrap().insert_axis(Axis(1));
        let c = x - &mean;
        let var = (&c * &c).mean_axis(Axis(1)).unwrap().insert_axis(Axis(1));
        c / var.mapv(|v| (v + 1e-5).sqrt()) * vec1(&format!("{p}.weight")) + vec1(&format!("{p}.bias"))
    };
    let linear = |x: &Array2<f32>, p: &str| x.dot(&mat(&format!("{p}.weight"))) + vec1(&format!("{p}.bias"));
    let gelu = |x: f32| 0.5 * x * (1.0 + ((2.0 / std::f32::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh());
    let t = ids.len();
    let (wte, wpe) = (mat("wte.weight"), mat("wpe.weight"));
    let mut x = Array2::from_shape_fn((t, D), |(i, j)| wte[[ids[i], j]] + wpe[[i, j]]);
    let hd = D / HEADS;
    for l in 0..LAYERS {
        let qkv = linear(&norm(&x, &format!("h.{l}.ln_1")), &format!("h.{l}.attn.c_attn"));
        let mut y = Array2::<f32>::zeros((t, D));
        for h in 0..HEADS {
            let part = |k: usize| qkv.slice(s![.., k * D + h * hd..k * D + (h + 1) * hd]).to_owned();
            let (q, k, v) = (part(0), part(1), part(2));
            let mut scores = q.dot(&k.t()) / (hd as f32).sqrt();
            for i in 0..t {
                let row = scores.row(i).to_owned();
                let max = row.slice(s![..=i]).fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let e: Vec<f32> = (0..t).map(|j| if j <= i { (row[j] - max).exp() } else { 0.0 }).collect();
                let sum: f32 = e.iter().sum();
                scores.row_mut(i).assign(&Array1::from_vec(e.iter().map(|v| v / sum).collect()));
            }
            y.slice_mut(s![.., h * hd..(h + 1) * hd]).assign(&scores.dot(&v));
        }
        x = &x + &linear(&y, &format!("h.{l}.attn.c_proj"));
        let m = linear(&norm(&x, &format!("h.{l}.ln_2")), &format!("h.{l}.mlp.c_fc")).mapv(gelu);
        x = &x + &linear(&m, &format!("h.{l}.mlp.c_proj"));
    }
    norm(&x, "ln_f").dot(&wte.t())
}

#[test]
fn hugging_face_gpt2_weights_load_run_and_save_back() {
    let dir = std::env::temp_dir().join(format!("lazuli-gpt2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let weights = hf_weights();
    let file = dir.join("model.safetensors");
    write_hf_file(&file, &weights);
    let ids = [3usize, 17, 0, 31, 8, 8, 5];
    let want = reference_logits(&weights, &ids);
    let ids_tensor = Tensor::from_slice(&ids.map(|i| i as i32), &[1, ids.len()]);

    for scanned in [false, true] {
        let model = gpt2::load_hf(&file, config(scanned)).unwrap();
        let got = model.forward(&ids_tensor).to_vec::<f32>().unwrap();
        let worst = got.iter().zip(want.iter()).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "scanned {scanned}: logits differ from the reference by {worst}");

        // Back to GPT-2's layout (unprefixed, without the tied head and buffers): the same bytes.
        let out = dir.join(format!("back-{scanned}.safetensors"));
        gpt2::save_hf(&out, &model).unwrap();
        let data = std::fs::read(&out).unwrap();
        let st = SafeTensors::deserialize(&data).unwrap();
        assert_eq!(st.len(), weights.len());
        for (name, shape, values) in &weights {
            let v = st.tensor(name).unwrap_or_else(|_| panic!("{name} is missing"));
            assert_eq!((v.dtype(), v.shape(), v.data()), (Dtype::F32, shape.as_slice(), bytes(values).as_slice()));
        }
        let (_, meta) = SafeTensors::read_metadata(&data).unwrap();
        assert_eq!(meta.metadata().as_ref().and_then(|m| m.get("format")).map(String::as_str), Some("pt"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gpt2_weights_of_other_sizes_or_names_are_refused_listing_them() {
    let weights = hf_weights();
    let mut named: Vec<(String, Tensor)> =
        weights.iter().map(|(n, s, v)| (n.clone(), Tensor::from_slice(v, s))).collect();
    named.retain(|(n, _)| n != "h.1.ln_2.bias");
    named.push(("h.0.mlp.gate.weight".into(), Tensor::zeros(&[2], DType::F32)));
    let mut small = config(false);
    small.block_size = 4;
    let err = gpt2::from_hf(&named, small).err().expect("refused").to_string();
    for part in ["blocks.1.ln2.bias", "h.0.mlp.gate.weight", "\"wpe.weight\" is f32[8,16], wants f32[4,16]", "gpt2.rs"]
    {
        assert!(err.contains(part), "{part} in {err}");
    }
}

#[test]
fn gpt2_config_is_read_from_the_weights_shapes() {
    let weights = hf_weights();
    let named: Vec<(String, Tensor)> =
        weights.iter().map(|(n, s, v)| (format!("transformer.{n}"), Tensor::from_slice(v, s))).collect();
    let got = gpt2::config_of(&named, HEADS).unwrap();
    let want = config(false);
    assert_eq!(
        (got.vocab, got.block_size, got.n_layer, got.n_head, got.d_model, got.dtype),
        (want.vocab, want.block_size, want.n_layer, want.n_head, want.d_model, want.dtype)
    );
    let err = gpt2::config_of(&named, 3).expect_err("16 does not split into 3 heads").to_string();
    assert!(err.contains("3 heads"), "{err}");
    let without_wpe: Vec<(String, Tensor)> = named.into_iter().filter(|(n, _)| !n.ends_with("wpe.weight")).collect();
    let err = gpt2::config_of(&without_wpe, HEADS).expect_err("no wpe").to_string();
    assert!(err.contains("no wpe.weight"), "{err}");
}

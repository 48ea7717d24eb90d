//! Writes lazuli's flash-attention kernels as Triton IR files for a table of specs, for a developer to compile
//! them with Triton (`kernels/tools/check_ttir.py`) or run them on a GPU. Not part of any test.
//!
//!     cargo run -p lazuli-kernels --example dump_ttir -- DIR [--quick] [--tune]
//!
//! (or `LAZULI_TTIR_DIR=DIR cargo run ...`). Each kernel gives `DIR/<spec>.<kernel>.ttir` and a `.json` beside it
//! with its launch (name, grid, num_warps, num_stages, blocks) and spec. `--quick` writes a few specs instead of
//! the whole table; `--tune` adds block-size variants (`tune_<blocks>_<spec>`) of causal attention at GPT-2's
//! shape (B=8, H=12, T=1024) for a few dtypes and head dims, and those specs' default kernels.

use std::fs;
use std::path::{Path, PathBuf};

use lazuli_kernels::triton::flash::{self, FlashDtype, FlashLayout, FlashSpec, FlashTuning};
use lazuli_kernels::triton::TritonCall;

/// Shapes (batch, heads, seq_q, seq_kv, head_dim) of the full table.
const SHAPES: [(usize, usize, usize, usize, usize); 5] =
    [(8, 12, 1024, 1024, 64), (2, 3, 100, 100, 64), (1, 2, 77, 130, 128), (2, 2, 128, 128, 80), (1, 2, 300, 200, 96)];

/// (dtype, tf32) pairs: f32 with both products.
const DTYPES: [(FlashDtype, bool); 4] =
    [(FlashDtype::BF16, true), (FlashDtype::F16, true), (FlashDtype::F32, true), (FlashDtype::F32, false)];

const MASKS: [(bool, Option<usize>); 3] = [(false, None), (true, None), (true, Some(256))];

fn table(quick: bool) -> Vec<FlashSpec> {
    let mut specs = Vec::new();
    for &(b, h, tq, tk, d) in if quick { &SHAPES[..2] } else { &SHAPES[..] } {
        for (dtype, tf32) in DTYPES {
            for layout in [FlashLayout::Bhtd, FlashLayout::Bthd] {
                for (causal, window) in MASKS {
                    let spec = FlashSpec::new(b, h, tq, tk, d, dtype, layout);
                    specs.push(spec.with_causal(causal).with_window(window).with_tf32(tf32));
                }
            }
        }
    }
    // Rows that see no key (a narrow window, many more queries than keys), the largest and smallest head dims.
    let extra = [
        FlashSpec::new(1, 2, 300, 50, 64, FlashDtype::BF16, FlashLayout::Bhtd).with_causal(true).with_window(Some(20)),
        FlashSpec::new(1, 2, 40, 40, 256, FlashDtype::BF16, FlashLayout::Bthd).with_causal(true),
        FlashSpec::new(1, 2, 40, 40, 256, FlashDtype::F32, FlashLayout::Bhtd),
        FlashSpec::new(3, 1, 9, 9, 8, FlashDtype::F16, FlashLayout::Bhtd).with_causal(true),
    ];
    specs.extend(extra);
    specs
}

/// Causal attention of GPT-2's shape (B=8, H=12, T=1024) with head dim `d`, for timing block sizes.
fn tune_spec(dtype: FlashDtype, tf32: bool, d: usize) -> FlashSpec {
    FlashSpec::new(8, 12, 1024, 1024, d, dtype, FlashLayout::Bhtd).with_causal(true).with_tf32(tf32)
}

/// Block-size variants to time: (block_m, block_n, num_warps, num_stages) for each kernel.
type Variants = &'static [(usize, usize, u32, u32)];

fn tune_table() -> Vec<(FlashSpec, [Variants; 3])> {
    let half_64: [Variants; 3] = [
        &[(128, 64, 4, 3), (64, 64, 4, 4)],
        &[(64, 64, 4, 4), (64, 32, 4, 4)],
        &[(32, 64, 4, 4), (32, 128, 8, 3), (64, 64, 4, 3)],
    ];
    let half_128: [Variants; 3] =
        [&[(64, 64, 4, 3), (128, 32, 4, 3)], &[(64, 32, 4, 3)], &[(64, 64, 8, 2), (32, 64, 8, 3)]];
    let half_256: [Variants; 3] = [&[(64, 32, 4, 2)], &[(32, 32, 4, 2)], &[(32, 64, 8, 2)]];
    let tf32_64: [Variants; 3] = [&[(64, 64, 4, 3)], &[(64, 32, 4, 3)], &[(32, 64, 4, 3)]];
    let tf32_128: [Variants; 3] = [&[(64, 32, 4, 2)], &[(32, 32, 4, 2)], &[(32, 64, 8, 2)]];
    let ieee_64: [Variants; 3] = [&[(64, 32, 8, 2)], &[(32, 32, 8, 2)], &[(16, 32, 8, 2)]];
    vec![
        (tune_spec(FlashDtype::BF16, true, 64), half_64),
        (tune_spec(FlashDtype::BF16, true, 128), half_128),
        (tune_spec(FlashDtype::BF16, true, 256), half_256),
        (tune_spec(FlashDtype::F32, true, 64), tf32_64),
        (tune_spec(FlashDtype::F32, true, 128), tf32_128),
        (tune_spec(FlashDtype::F32, false, 64), ieee_64),
    ]
}

fn spec_tag(s: &FlashSpec) -> String {
    let dtype = match (s.dtype, s.tf32) {
        (FlashDtype::BF16, _) => "bf16",
        (FlashDtype::F16, _) => "f16",
        (FlashDtype::F32, true) => "f32tf32",
        (FlashDtype::F32, false) => "f32ieee",
    };
    let layout = if s.layout == FlashLayout::Bhtd { "bhtd" } else { "bthd" };
    let mask = match (s.causal, s.window) {
        (false, _) => "full".to_string(),
        (true, None) => "causal".to_string(),
        (true, Some(w)) => format!("w{w}"),
    };
    format!("{dtype}_{layout}_{mask}_b{}h{}q{}k{}d{}", s.batch, s.heads, s.seq_q, s.seq_kv, s.head_dim)
}

fn json(call: &TritonCall, kernel: &str, spec: &FlashSpec, tuning: &FlashTuning) -> String {
    let dtype = match spec.dtype {
        FlashDtype::F32 => "f32",
        FlashDtype::F16 => "f16",
        FlashDtype::BF16 => "bf16",
    };
    let layout = if spec.layout == FlashLayout::Bhtd { "bhtd" } else { "bthd" };
    let window = spec.window.map_or("null".to_string(), |w| w.to_string());
    format!(
        concat!(
            "{{\"name\": \"{}\", \"kernel\": \"{}\", \"grid\": [{}, {}, {}], \"num_warps\": {}, \"num_stages\": {}, ",
            "\"block_m\": {}, \"block_n\": {}, \"spec\": {{\"batch\": {}, \"heads\": {}, \"seq_q\": {}, ",
            "\"seq_kv\": {}, \"head_dim\": {}, \"dtype\": \"{}\", \"layout\": \"{}\", \"causal\": {}, ",
            "\"window\": {}, \"scale\": {:e}, \"tf32\": {}}}}}\n"
        ),
        call.name,
        kernel,
        call.grid[0],
        call.grid[1],
        call.grid[2],
        call.num_warps,
        call.num_stages,
        tuning.block_m,
        tuning.block_n,
        spec.batch,
        spec.heads,
        spec.seq_q,
        spec.seq_kv,
        spec.head_dim,
        dtype,
        layout,
        spec.causal,
        window,
        spec.scale(),
        spec.tf32
    )
}

fn write(dir: &Path, stem: &str, kernel: &str, spec: &FlashSpec, tuning: &FlashTuning, call: &TritonCall) {
    let base = dir.join(format!("{stem}.{kernel}"));
    let result = fs::write(base.with_extension(format!("{kernel}.ttir")), &call.ir)
        .and_then(|()| fs::write(base.with_extension(format!("{kernel}.json")), json(call, kernel, spec, tuning)));
    if let Err(e) = result {
        eprintln!("cannot write {}: {e}", base.display());
        std::process::exit(1);
    }
}

type Generate = fn(&FlashSpec, &FlashTuning) -> Result<TritonCall, String>;

/// A kernel's file suffix, its generator and its default blocks.
type KernelKind = (&'static str, Generate, fn(&FlashSpec) -> FlashTuning);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = args.iter().find(|a| !a.starts_with("--")).cloned().or_else(|| std::env::var("LAZULI_TTIR_DIR").ok());
    let Some(dir) = dir.map(PathBuf::from) else {
        eprintln!("usage: dump_ttir DIR [--quick] [--tune]   (or LAZULI_TTIR_DIR=DIR)");
        std::process::exit(2);
    };
    if let Err(e) = fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        std::process::exit(1);
    }
    let kernels: [KernelKind; 3] = [
        ("fwd", flash::forward_tuned, FlashTuning::forward),
        ("dq", flash::backward_dq_tuned, FlashTuning::backward_dq),
        ("dkdv", flash::backward_dkdv_tuned, FlashTuning::backward_dkdv),
    ];
    let mut count = 0;
    for spec in table(args.iter().any(|a| a == "--quick")) {
        if let Some(why) = flash::unsupported(&spec) {
            eprintln!("skipping {}: {why}", spec_tag(&spec));
            continue;
        }
        for (kernel, generate, default) in kernels {
            let tuning = default(&spec);
            match generate(&spec, &tuning) {
                Ok(call) => write(&dir, &spec_tag(&spec), kernel, &spec, &tuning, &call),
                Err(why) => eprintln!("skipping {} {kernel}: {why}", spec_tag(&spec)),
            }
            count += 1;
        }
    }
    if args.iter().any(|a| a == "--tune") {
        // Each variant of one kernel is timed with the other two at their defaults, written under the spec's tag.
        for (spec, variants) in tune_table() {
            for ((kernel, generate, default), variants) in kernels.into_iter().zip(variants) {
                let tuning = default(&spec);
                if let Ok(call) = generate(&spec, &tuning) {
                    write(&dir, &spec_tag(&spec), kernel, &spec, &tuning, &call);
                }
                for &(block_m, block_n, num_warps, num_stages) in variants {
                    let tuning = FlashTuning { block_m, block_n, num_warps, num_stages };
                    let stem = format!("tune_m{block_m}n{block_n}w{num_warps}s{num_stages}_{}", spec_tag(&spec));
                    match generate(&spec, &tuning) {
                        Ok(call) => write(&dir, &stem, kernel, &spec, &tuning, &call),
                        Err(why) => eprintln!("skipping {stem} {kernel}: {why}"),
                    }
                    count += 1;
                }
            }
        }
    }
    println!("wrote {count} kernels to {}", dir.display());
}

//! Structure checks of the generated text, without a GPU or Triton (`kernels/tools/check_ttir.py` compiles it
//! with Triton; `kernels/python/flash_twin.py` checks the algorithm).

use std::collections::HashSet;

use super::*;

fn gpt2() -> FlashSpec {
    FlashSpec::new(8, 12, 1024, 1024, 64, FlashDtype::BF16, FlashLayout::Bhtd).with_causal(true)
}

fn all_kernels(spec: &FlashSpec) -> [(TritonCall, usize); 3] {
    [(forward(spec), 5), (backward_dq(spec), 7), (backward_dkdv(spec), 8)]
}

/// A spread of specs: every dtype, layout and mask, ragged and padded shapes.
fn specs() -> Vec<FlashSpec> {
    let shapes = [(8, 12, 1024, 1024, 64), (2, 3, 100, 100, 64), (1, 2, 77, 130, 128), (2, 2, 128, 128, 80)];
    let mut out = Vec::new();
    for (b, h, tq, tk, d) in shapes.into_iter().chain([(1, 1, 300, 50, 96), (1, 1, 40, 40, 256), (3, 1, 9, 9, 8)]) {
        for dtype in [FlashDtype::BF16, FlashDtype::F16, FlashDtype::F32] {
            for layout in [FlashLayout::Bhtd, FlashLayout::Bthd] {
                for (causal, window) in [(false, None), (true, None), (true, Some(256)), (true, Some(20))] {
                    let spec = FlashSpec::new(b, h, tq, tk, d, dtype, layout).with_causal(causal).with_window(window);
                    out.push(spec);
                }
            }
        }
    }
    out
}

/// The `%name`s a text uses that nothing defines (a result, an argument, a loop or block variable).
fn undefined_values(text: &str) -> Vec<String> {
    let mut defined = HashSet::new();
    let mut used = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        // Definitions: results (`%x = `, `%x:3 = `), arguments and block variables (`%x: type`), the loop
        // variable and iter_args of an `scf.for` line (`%iv = %lo`, `%a = %init`).
        for (i, (token, end)) in tokens(line).into_iter().enumerate() {
            let rest = &line[end..];
            let defines = rest.starts_with(':') || (rest.starts_with(" = ") && (i == 0 || line.contains("scf.for")));
            if defines {
                defined.insert(token);
            } else {
                used.push(token);
            }
        }
    }
    used.retain(|u| !defined.contains(u.split('#').next().unwrap_or(u)));
    used
}

/// The `%name` tokens of a line and the byte offset just past each.
fn tokens(line: &str) -> Vec<(String, usize)> {
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let start = i;
            i += 1;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'#') {
                i += 1;
            }
            out.push((line[start..i].to_string(), i));
        } else {
            i += 1;
        }
    }
    out
}

fn signature(text: &str) -> &str {
    text.lines().find(|l| l.contains("tt.func public")).unwrap_or("")
}

#[test]
fn the_text_names_its_function_and_has_one_pointer_per_operand_and_result() {
    for spec in [gpt2(), FlashSpec::new(2, 3, 100, 77, 80, FlashDtype::F32, FlashLayout::Bthd)] {
        for (call, pointers) in all_kernels(&spec) {
            assert!(call.ir.contains(&format!("tt.func public @{}(", call.name)), "{}", call.name);
            assert!(call.ir.starts_with("module {"));
            let sig = signature(&call.ir);
            assert_eq!(sig.matches("!tt.ptr<").count(), pointers, "{sig}");
            assert_eq!(sig.matches("{tt.divisibility = 16 : i32}").count(), pointers, "{sig}");
            assert!(call.name.starts_with("lazuli_flash_"));
        }
    }
}

#[test]
fn pointer_types_follow_the_dtype_and_lse_is_f32() {
    let spec = gpt2();
    let sig = signature(&forward(&spec).ir).to_string();
    assert_eq!(sig.matches("!tt.ptr<bf16>").count(), 4, "{sig}");
    assert_eq!(sig.matches("!tt.ptr<f32>").count(), 1, "{sig}");
    let sig = signature(&backward_dkdv(&spec).ir).to_string();
    assert_eq!(sig.matches("!tt.ptr<bf16>").count(), 6, "{sig}");
    assert_eq!(sig.matches("!tt.ptr<f32>").count(), 2, "{sig}");
}

#[test]
fn grids_cover_the_sequence_in_blocks() {
    let spec = gpt2();
    let (fwd, dq, dkdv) =
        (FlashTuning::forward(&spec), FlashTuning::backward_dq(&spec), FlashTuning::backward_dkdv(&spec));
    // Causal: batch · heads along x, blocks along y (heaviest first).
    assert_eq!(forward(&spec).grid, [96, (1024 / fwd.block_m) as u32, 1]);
    assert_eq!(backward_dq(&spec).grid, [96, (1024 / dq.block_m) as u32, 1]);
    assert_eq!(backward_dkdv(&spec).grid, [96, (1024 / dkdv.block_n) as u32, 1]);

    // Without a mask every block does the same work: blocks along x.
    let ragged = FlashSpec::new(2, 3, 100, 130, 64, FlashDtype::F16, FlashLayout::Bthd);
    let t = FlashTuning::forward(&ragged);
    assert_eq!(forward(&ragged).grid, [100usize.div_ceil(t.block_m) as u32, 6, 1]);
    let t = FlashTuning::backward_dkdv(&ragged);
    assert_eq!(backward_dkdv(&ragged).grid, [130usize.div_ceil(t.block_n) as u32, 6, 1]);
    let call = forward(&ragged);
    assert_eq!((call.num_warps, call.num_stages), (t_fwd(&ragged).num_warps, t_fwd(&ragged).num_stages));
}

fn t_fwd(spec: &FlashSpec) -> FlashTuning {
    FlashTuning::forward(spec)
}

#[test]
fn every_kernel_of_every_spec_is_well_formed_ascii() {
    for spec in specs() {
        assert_eq!(unsupported(&spec), None, "{spec:?}");
        for (call, _) in all_kernels(&spec) {
            let text = &call.ir;
            assert!(text.is_ascii(), "{}", call.name);
            assert_eq!(text.matches('{').count(), text.matches('}').count(), "{}", call.name);
            assert_eq!(text.matches('(').count(), text.matches(')').count(), "{}", call.name);
            assert!(text.contains("tt.return"));
            let undefined = undefined_values(text);
            assert!(undefined.is_empty(), "{}: {undefined:?}", call.name);
            assert!(call.grid.iter().all(|&g| g >= 1));
        }
    }
}

#[test]
fn different_specs_give_different_text() {
    let base = FlashSpec::new(2, 3, 100, 100, 64, FlashDtype::BF16, FlashLayout::Bhtd);
    let variants = [
        base.clone(),
        base.clone().with_causal(true),
        base.clone().with_causal(true).with_window(Some(16)),
        FlashSpec { dtype: FlashDtype::F16, ..base.clone() },
        FlashSpec { layout: FlashLayout::Bthd, ..base.clone() },
        FlashSpec { seq_kv: 101, ..base.clone() },
        FlashSpec { head_dim: 80, ..base.clone() },
        FlashSpec { heads: 4, layout: FlashLayout::Bthd, ..base.clone() },
        base.clone().with_scale(0.5),
        FlashSpec { dtype: FlashDtype::F32, ..base.clone() },
        FlashSpec { dtype: FlashDtype::F32, ..base.clone() }.with_tf32(false),
    ];
    for kernel in [forward, backward_dq, backward_dkdv] {
        let calls: HashSet<TritonCall> = variants.iter().map(kernel).collect();
        assert_eq!(calls.len(), variants.len());
        // Only the grid depends on batch and heads in the Bhtd layout.
        let more = FlashSpec { heads: 4, batch: 5, ..base.clone() };
        assert_eq!(kernel(&more).ir, kernel(&base).ir);
        assert_ne!(kernel(&more).grid, kernel(&base).grid);
    }
}

#[test]
fn the_same_spec_gives_the_same_text() {
    assert_eq!(forward(&gpt2()), forward(&gpt2()));
    assert_eq!(backward_dkdv(&gpt2()), backward_dkdv(&gpt2()));
}

#[test]
fn dot_precision_and_input_casts_follow_the_dtype() {
    let f32_spec = FlashSpec::new(1, 1, 64, 64, 64, FlashDtype::F32, FlashLayout::Bhtd);
    for (call, _) in all_kernels(&f32_spec) {
        assert!(call.ir.contains("inputPrecision = tf32") && !call.ir.contains("inputPrecision = ieee"));
        assert!(!call.ir.contains("arith.truncf"), "f32 needs no rounding");
    }
    for (call, _) in all_kernels(&f32_spec.clone().with_tf32(false)) {
        assert!(call.ir.contains("inputPrecision = ieee") && !call.ir.contains("inputPrecision = tf32"));
    }
    // bf16: p (and ds) rounded to bf16 for the products; the results rounded when stored.
    let fwd = forward(&gpt2()).ir;
    let t = FlashTuning::forward(&gpt2());
    assert!(fwd.contains("arith.truncf") && fwd.contains(&format!("tensor<{}x{}xbf16>", t.block_m, t.block_n)));
    assert!(fwd.contains("math.exp2") && fwd.contains("math.log2"));
}

#[test]
fn masked_loops_are_written_only_where_a_mask_can_apply() {
    let loops = |call: TritonCall| call.ir.matches("scf.for").count();
    let even = FlashSpec::new(1, 2, 256, 256, 64, FlashDtype::BF16, FlashLayout::Bhtd);
    // No mask and whole blocks: one loop, no select.
    assert_eq!(loops(forward(&even)), 1);
    assert_eq!(loops(backward_dq(&even)), 1);
    assert_eq!(loops(backward_dkdv(&even)), 1);
    let t = FlashTuning::forward(&even);
    let block_select = format!("tensor<{0}x{1}xi1>, tensor<{0}x{1}xf32>", t.block_m, t.block_n);
    let block_select = block_select.as_str();
    assert!(!forward(&even).ir.contains(block_select), "no elementwise mask");
    assert!(forward(&even.clone().with_causal(true)).ir.contains(block_select));
    // Causal: the diagonal after (queries' view) or before (keys' view) the whole blocks.
    let causal = even.clone().with_causal(true);
    assert_eq!(loops(forward(&causal)), 2);
    assert_eq!(loops(backward_dkdv(&causal)), 2);
    // A window adds the window's edge.
    let window = causal.clone().with_window(Some(100));
    assert_eq!(loops(forward(&window)), 3);
    assert_eq!(loops(backward_dq(&window)), 3);
    assert_eq!(loops(backward_dkdv(&window)), 3);
    // Ragged keys: a masked tail.
    let ragged = FlashSpec { seq_kv: 250, ..even };
    assert_eq!(loops(forward(&ragged)), 2);
    assert_eq!(loops(backward_dkdv(&ragged)), 2);
}

#[test]
fn a_window_wider_than_the_queries_is_no_window() {
    let causal = FlashSpec::new(1, 2, 100, 300, 64, FlashDtype::BF16, FlashLayout::Bhtd).with_causal(true);
    for kernel in [forward, backward_dq, backward_dkdv] {
        let wide = kernel(&causal.clone().with_window(Some(usize::MAX)));
        assert_eq!(wide.ir.replace("_causal_w18446744073709551615_", "_causal_"), kernel(&causal).ir);
        assert_ne!(kernel(&causal.clone().with_window(Some(99))).ir, kernel(&causal).ir);
    }
}

#[test]
fn padded_head_dims_are_masked() {
    let spec = FlashSpec::new(1, 1, 64, 64, 80, FlashDtype::BF16, FlashLayout::Bthd);
    assert_eq!(spec.block_d(), 128);
    let fwd = forward(&spec).ir;
    let bm = FlashTuning::forward(&spec).block_m;
    assert!(fwd.contains(&format!("tensor<{bm}x128xbf16>")), "q padded to 128 columns");
    assert!(fwd.contains("arith.constant dense<80> : tensor<128xi32>"), "the head-dim bound");
    let masked_loads = |text: &str| text.lines().filter(|l| l.contains("tt.load %") && l.contains(", ")).count();
    let loads = |text: &str| text.matches("tt.load %").count();
    assert_eq!(masked_loads(&fwd), loads(&fwd), "every load of a padded head is masked");
    // Whole head dim, whole blocks: only the query block's load checks its rows.
    let whole = forward(&FlashSpec { head_dim: 64, ..spec }).ir;
    assert_eq!((loads(&whole), masked_loads(&whole)), (3, 1));
}

#[test]
fn unsupported_specs_say_why() {
    let ok = FlashSpec::new(1, 1, 16, 16, 64, FlashDtype::BF16, FlashLayout::Bhtd);
    assert_eq!(unsupported(&ok), None);
    let cases = [
        (FlashSpec { head_dim: 264, ..ok.clone() }, "head_dim"),
        (FlashSpec { head_dim: 60, ..ok.clone() }, "head_dim"),
        (FlashSpec { seq_q: 0, ..ok.clone() }, "zero"),
        (FlashSpec { batch: 0, ..ok.clone() }, "zero"),
        (ok.clone().with_window(Some(8)), "causal"),
        (ok.clone().with_causal(true).with_window(Some(0)), "window"),
        (ok.clone().with_scale(f64::NAN), "scale"),
        (FlashSpec { batch: 70_000, ..ok.clone() }, "grid"),
        (FlashSpec { seq_kv: 1 << 24, heads: 64, ..ok.clone() }, "i32"),
        (FlashSpec { seq_q: 16 << 20, seq_kv: 16 << 20, batch: 70_000, ..ok.clone() }.with_causal(true), "grid"),
    ];
    for (spec, word) in cases {
        let why = unsupported(&spec).unwrap_or_default();
        assert!(why.contains(word), "{spec:?}: {why:?}");
    }
}

#[test]
fn causal_kernels_take_more_heads_than_a_grid_column() {
    // Causal kernels run batch · heads along the grid's x, which takes far more than y's 65,535.
    let spec = FlashSpec::new(700, 100, 40, 40, 64, FlashDtype::F16, FlashLayout::Bthd).with_causal(true);
    assert_eq!(unsupported(&spec), None);
    let calls =
        [forward(&spec), backward_dq(&spec), backward_dkdv(&spec), backward_packed(&spec.clone().with_packed(true))];
    for call in calls {
        assert_eq!(call.grid[0], 70_000, "{}", call.name);
        let pointers = call.ir.matches("tt.divisibility").count();
        call.validate(pointers, 0).unwrap_or_else(|why| panic!("{}: {why}", call.name));
    }
    // Without the mask they run it along y, and refuse it.
    assert!(unsupported(&spec.with_causal(false)).is_some_and(|why| why.contains("65535 along y")));
}

/// The instruction that defines the value named `name` in `ir` (`%name_<n> = …`), if any.
fn definition<'a>(ir: &'a str, name: &str) -> Option<&'a str> {
    let start = format!("%{name}_");
    ir.lines().map(str::trim).find(|l| {
        l.strip_prefix(&start).and_then(|rest| rest.split(' ').next()).is_some_and(|n| n.parse::<u32>().is_ok())
    })
}

/// [`definition`], which must exist.
fn defined<'a>(ir: &'a str, name: &str) -> &'a str {
    definition(ir, name).unwrap_or_else(|| panic!("no %{name} in:\n{ir}"))
}

#[test]
fn causal_kernels_start_their_heaviest_blocks_first() {
    let causal = gpt2();
    // The forward's last query block sees every key: program y = 0 takes it (block 15 - y).
    let f = forward(&causal).ir;
    assert!(defined(&f, "head_pid").contains("tt.get_program_id x"), "{f}");
    assert!(defined(&f, "block_pid").contains("tt.get_program_id y"), "{f}");
    assert!(defined(&f, "reversed").contains("arith.subi"), "{f}");
    // dk and dv's first key block sees every query: it is block y itself; dq's blocks run reversed.
    let kv = backward_dkdv(&causal).ir;
    assert!(defined(&kv, "block_pid").contains("tt.get_program_id y") && definition(&kv, "reversed").is_none());
    assert!(definition(&backward_dq(&causal).ir, "reversed").is_some());
    // The packed backward: dk and dv's programs (the heavier job) at 0 on the third axis, dq's at 1.
    let spec = FlashSpec::new(8, 12, 1024, 1024, 64, FlashDtype::BF16, FlashLayout::Bthd).with_causal(true);
    let packed = backward_packed(&spec.with_packed(true)).ir;
    let job = defined(&packed, "job");
    assert!(job.contains("tt.get_program_id z"), "{packed}");
    let test = packed.lines().find(|l| l.contains("arith.cmpi eq") && l.contains("%job_")).unwrap_or_default();
    let dq_job = test.split(", ").nth(2).and_then(|v| v.split(' ').next()).unwrap_or("?");
    let constant = packed.lines().map(str::trim).find(|l| l.starts_with(&format!("{dq_job} = "))).unwrap_or_default();
    assert!(constant.contains("arith.constant 1 : i32"), "the dq job's test: {test}\n{packed}");
    // Without a mask: blocks along x, in order.
    let full = forward(&FlashSpec { causal: false, ..causal }).ir;
    assert!(defined(&full, "block_pid").contains("tt.get_program_id x") && definition(&full, "reversed").is_none());
}

#[test]
fn tuned_variants_check_their_blocks() {
    let spec = gpt2();
    let t = FlashTuning { block_m: 64, block_n: 32, num_warps: 4, num_stages: 2 };
    let call = forward_tuned(&spec, &t).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(call.grid, [96, 16, 1]);
    assert_ne!(call.ir, forward(&spec).ir);
    assert!(backward_dq_tuned(&spec, &FlashTuning { block_m: 48, ..t }).is_err());
    assert!(backward_dkdv_tuned(&spec, &FlashTuning { num_warps: 3, ..t }).is_err());
    assert!(forward_tuned(&FlashSpec { head_dim: 7, ..spec }, &t).is_err());
}

#[test]
fn the_undefined_value_check_finds_a_missing_definition() {
    let text = "module {\n  tt.func public @f(%a_1: i32) {\n    %b_2 = arith.addi %a_1, %c_9 : i32\n  }\n}\n";
    assert_eq!(undefined_values(text), vec!["%c_9".to_string()]);
}

#[test]
fn packed_kernels_read_slots_of_one_operand_and_the_backward_is_one_launch() {
    let plain = FlashSpec::new(8, 12, 1024, 1024, 64, FlashDtype::BF16, FlashLayout::Bthd).with_causal(true);
    let packed = plain.clone().with_packed(true);
    assert_eq!(unsupported(&packed), None);
    let (f, b) = (forward(&packed), backward_packed(&packed));
    assert_eq!(signature(&f.ir).matches("!tt.ptr<").count(), 3, "qkv, o, lse: {}", signature(&f.ir));
    assert_eq!(signature(&b.ir).matches("!tt.ptr<").count(), 5, "qkv, do, lse, delta, dqkv: {}", signature(&b.ir));
    assert_eq!(f.grid, forward(&plain).grid);
    assert_eq!(b.grid, [96, 16, 2], "dq's and dk/dv's programs side by side on the third axis");
    // Rows of the packed operand are 3 · 12 · 64 apart (768 for a tensor of its own), and k and v start 12 and 24
    // heads in; the output and its cotangent keep the plain layout.
    assert!(f.ir.contains("dense<2304> : tensor<64xi32>") && f.ir.contains("dense<768> : tensor<64xi32>"), "{}", f.ir);
    assert!(!forward(&plain).ir.contains("2304"));
    assert!(f.ir.contains("arith.constant 12 : i32") && f.ir.contains("arith.constant 24 : i32"), "{}", f.ir);
    assert_eq!(b.ir.matches("scf.if").count(), 1, "one test of the job when both have 16 blocks:\n{}", b.ir);
    // Where dq's and dk/dv's blocks differ (a wide head), the programs past a job's blocks do nothing.
    let wide = FlashSpec::new(1, 2, 100, 100, 256, FlashDtype::BF16, FlashLayout::Bthd).with_packed(true);
    assert_eq!(backward_packed(&wide).ir.matches("scf.if").count(), 2);
    for spec in specs().into_iter().filter(|s| s.layout == FlashLayout::Bthd && s.seq_q == s.seq_kv) {
        let spec = spec.with_packed(true);
        assert_eq!(unsupported(&spec), None, "{spec:?}");
        for call in [forward(&spec), backward_packed(&spec)] {
            assert!(call.name.contains("bt3hd"), "{}", call.name);
            assert_eq!(call.ir.matches('{').count(), call.ir.matches('}').count(), "{}", call.name);
            let undefined = undefined_values(&call.ir);
            assert!(undefined.is_empty(), "{}: {undefined:?}", call.name);
        }
    }
    let bhtd = FlashSpec::new(1, 1, 16, 16, 64, FlashDtype::BF16, FlashLayout::Bhtd).with_packed(true);
    assert!(unsupported(&bhtd).is_some_and(|why| why.contains("packed")));
    let cross = FlashSpec::new(1, 1, 16, 32, 64, FlashDtype::BF16, FlashLayout::Bthd).with_packed(true);
    assert!(unsupported(&cross).is_some_and(|why| why.contains("one sequence length")));
}

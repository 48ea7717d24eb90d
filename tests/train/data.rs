//! `lazuli::data`: token files, batches against a reference computed here, determinism, prefetching, bad files;
//! and the `tracing` spans around step boundaries, compiles and checkpoint saves.

use std::path::PathBuf;

use lazuli::data::{Batches, HostBatch, TokenFile, TokenWidth};
use lazuli::nn::HostRng;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lazuli-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir.join(name)
}

/// Distinct, irregular ids (no window equals another), below `max`.
fn tokens(n: usize, max: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 7919 + 13) % max).collect()
}

/// The documented rule, written out again: batch `k` draws `batch` offsets from
/// `HostRng::new(HostRng::new(seed).next_u64() + k)`, each below `len - seq`.
fn reference(ids: &[u32], batch: usize, seq: usize, seed: u64, k: u64) -> (Vec<i32>, Vec<i32>) {
    let base = HostRng::new(seed).next_u64();
    let mut rng = HostRng::new(base.wrapping_add(k));
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for _ in 0..batch {
        let o = rng.below((ids.len() - seq) as u64) as usize;
        x.extend(ids[o..o + seq].iter().map(|&i| i as i32));
        y.extend(ids[o + 1..o + seq + 1].iter().map(|&i| i as i32));
    }
    (x, y)
}

#[test]
fn batches_are_the_documented_windows_of_the_file() {
    for (width, max) in [(TokenWidth::U16, 65_521), (TokenWidth::U32, 2_000_000_011)] {
        let ids = tokens(200, max);
        let path = scratch(&format!("exact-{width:?}.bin"));
        TokenFile::write(&path, &ids, width).unwrap();
        let file = TokenFile::open(&path, width).unwrap();
        assert_eq!(file.len(), 200);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 200 * width.bytes() as u64);
        assert_eq!(file.read(10, 3).unwrap(), ids[10..13].iter().map(|&i| i as i32).collect::<Vec<_>>());

        let (b, t, seed) = (3, 8, 42);
        for (k, batch) in Batches::new(&file, b, t, seed).unwrap().take(4).enumerate() {
            let (x, y) = batch.unwrap();
            assert_eq!((x.dims(), y.dims()), (&[b, t][..], &[b, t][..]));
            assert_eq!(x.dtype(), lazuli::DType::I32);
            let (rx, ry) = reference(&ids, b, t, seed, k as u64);
            assert_eq!(x.to_vec::<i32>().unwrap(), rx, "inputs of batch {k} ({width:?})");
            assert_eq!(y.to_vec::<i32>().unwrap(), ry, "targets of batch {k} ({width:?})");
        }
    }
}

#[test]
fn every_window_is_drawn_including_the_last() {
    // 12 ids, windows of 4 + 1: offsets 0..=7.
    let ids: Vec<u32> = (0..12).collect();
    let path = scratch("windows.bin");
    TokenFile::write(&path, &ids, TokenWidth::U16).unwrap();
    let file = TokenFile::open(&path, TokenWidth::U16).unwrap();
    let batches = Batches::new(&file, 4, 4, 7).unwrap();
    let mut seen = [false; 8];
    for k in 0..100 {
        let b = batches.host(k).unwrap();
        for (row, &o) in b.offsets.iter().enumerate() {
            seen[o] = true;
            assert_eq!(b.inputs[row * 4..row * 4 + 4], [o as i32, o as i32 + 1, o as i32 + 2, o as i32 + 3]);
            assert_eq!(b.targets[row * 4 + 3], o as i32 + 4);
        }
    }
    assert_eq!(seen, [true; 8]);
}

#[test]
fn the_same_seed_gives_the_same_batches_and_a_resumed_run_continues_them() {
    let path = scratch("determinism.bin");
    TokenFile::write(&path, &tokens(5000, 50_000), TokenWidth::U16).unwrap();
    let file = TokenFile::open(&path, TokenWidth::U16).unwrap();
    let run = |seed: u64, from: u64, n: usize| -> Vec<HostBatch> {
        let mut b = Batches::new(&file, 4, 16, seed).unwrap().starting_at(from);
        (0..n).map(|_| b.next_host().unwrap()).collect()
    };
    let first = run(1, 0, 10);
    assert_eq!(first, run(1, 0, 10));
    assert_eq!(first[6..], run(1, 6, 4)[..], "starting_at(6) continues with batch 6");
    assert!(first.iter().zip(run(2, 0, 10)).all(|(a, b)| a.offsets != b.offsets), "another seed, other batches");
    // Neighbouring seeds are not the same stream shifted by one batch.
    assert_ne!(first[1].offsets, run(2, 0, 1)[0].offsets);
    assert_eq!(first.iter().map(|b| b.index).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
}

#[test]
fn prefetching_gives_the_same_batches_as_the_plain_iterator() {
    let path = scratch("prefetch.bin");
    let ids = tokens(3000, 60_000);
    TokenFile::write(&path, &ids, TokenWidth::U32).unwrap();
    let file = TokenFile::open(&path, TokenWidth::U32).unwrap();
    let plain = Batches::new(&file, 5, 32, 9).unwrap().starting_at(3);
    for depth in [1, 2, 8] {
        let mut ahead = plain.clone().prefetch(depth);
        for k in 3..40 {
            assert_eq!(ahead.next_host().unwrap(), plain.host(k).unwrap(), "batch {k}, depth {depth}");
        }
        // The tensors, made on this thread.
        let (x, y) = ahead.next().unwrap().unwrap();
        let (rx, ry) = reference(&ids, 5, 32, 9, 40);
        assert_eq!((x.to_vec::<i32>().unwrap(), y.to_vec::<i32>().unwrap()), (rx, ry));
        drop(ahead); // stops the thread, blocked on a full channel or not
    }
}

#[test]
fn bad_files_are_clear_errors_naming_the_callers_line() {
    let odd = scratch("odd.bin");
    std::fs::write(&odd, [1u8, 2, 3, 4, 5, 6, 7]).unwrap();
    let e = TokenFile::open(&odd, TokenWidth::U16).unwrap_err().to_string();
    assert!(e.contains("7 bytes is not a multiple of 2") && e.contains("odd.bin"), "{e}");
    assert!(e.contains("tests/train/data.rs:"), "names the caller: {e}");

    let six = scratch("six.bin");
    std::fs::write(&six, [0u8; 6]).unwrap();
    let e = TokenFile::open(&six, TokenWidth::U32).unwrap_err().to_string();
    assert!(e.contains("6 bytes is not a multiple of 4"), "{e}");

    let empty = scratch("empty.bin");
    std::fs::write(&empty, []).unwrap();
    let e = TokenFile::open(&empty, TokenWidth::U16).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");

    let e = TokenFile::open(scratch("missing.bin"), TokenWidth::U16).unwrap_err().to_string();
    assert!(e.contains("missing.bin"), "{e}");

    let short = scratch("short.bin");
    TokenFile::write(&short, &[1, 2, 3, 4], TokenWidth::U16).unwrap();
    let file = TokenFile::open(&short, TokenWidth::U16).unwrap();
    let e = Batches::new(&file, 2, 4, 0).unwrap_err().to_string();
    assert!(e.contains("4 token ids, shorter than one sequence") && e.contains("need 5"), "{e}");
    assert!(e.contains("tests/train/data.rs:"), "names the caller: {e}");
    assert!(Batches::new(&file, 2, 3, 0).is_ok(), "one window of 3 + 1 fits");
    assert!(Batches::new(&file, 0, 3, 0).is_err());
    // A batch the host cannot hold is refused here, not by an aborted allocation at the first batch.
    let line = line!() + 1;
    let e = Batches::new(&file, 1 << 40, 3, 0).unwrap_err().to_string();
    assert!(e.contains("GiB on the host, which has") && e.contains(&format!("data.rs:{line}:")), "{e}");
    let e = Batches::new(&file, usize::MAX / 2, 3, 0).unwrap_err().to_string();
    assert!(e.contains("more than an address space holds"), "{e}");

    let e = TokenFile::write(scratch("big.bin"), &[1, 70_000], TokenWidth::U16).unwrap_err().to_string();
    assert!(e.contains("token 1 is 70000"), "{e}");
    let e = file.read(2, 3).unwrap_err().to_string();
    assert!(e.contains("past the end"), "{e}");
    // A range past `usize` is the same error, its end named as it is (a debug build overflowed making the message).
    let e = file.read(usize::MAX, 2).unwrap_err().to_string();
    assert!(e.contains("past the end") && e.contains(&format!("..{}", usize::MAX as u128 + 2)), "{e}");
}

#[test]
fn a_file_truncated_under_the_prefetching_thread_is_an_error_not_a_hang() {
    let path = scratch("truncated.bin");
    TokenFile::write(&path, &tokens(1000, 60_000), TokenWidth::U16).unwrap();
    let file = TokenFile::open(&path, TokenWidth::U16).unwrap();
    let batches = Batches::new(&file, 8, 64, 3).unwrap();
    std::fs::write(&path, [0u8; 20]).unwrap(); // 10 ids left of the 1000 the file was opened with
    let e = batches.prefetch(2).next().unwrap().unwrap_err().to_string();
    assert!(e.contains("truncated.bin") && e.contains("tests/train/data.rs:"), "{e}");
}

/// The span names a subscriber sees, in order, across threads (a process-wide subscriber: hence a child process).
mod spans {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    #[derive(Default)]
    pub struct Names {
        pub seen: Arc<Mutex<Vec<String>>>,
        next: AtomicU64,
    }

    impl Subscriber for Names {
        fn enabled(&self, meta: &Metadata<'_>) -> bool {
            meta.is_span() && meta.target() == "lazuli"
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            self.seen.lock().unwrap().push(span.metadata().name().to_string());
            Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }
}

#[test]
fn steps_compiles_and_saves_are_tracing_spans() {
    if crate::common::child::alone(module_path!(), "steps_compiles_and_saves_are_tracing_spans") {
        return;
    }
    let names = spans::Names::default();
    let seen = names.seen.clone();
    tracing::subscriber::set_global_default(names).expect("the child's only subscriber");
    let count = |name: &str| seen.lock().unwrap().iter().filter(|n| *n == name).count();

    let layer = lazuli::nn::Linear::new(&mut HostRng::new(1), 3, 2, true, lazuli::DType::F32);
    for _ in 0..2 {
        let x = lazuli::Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]);
        let y = layer.forward(&x) * 2.0;
        lazuli::sync().unwrap();
        drop(y);
    }
    assert_eq!((count("sync"), count("compile")), (2, 1), "{:?}", seen.lock().unwrap());
    lazuli::checkpoint::save(scratch("spans.safetensors"), &layer, None, &[], &Default::default()).unwrap();
    assert_eq!(count("checkpoint_save"), 1, "{:?}", seen.lock().unwrap());
}

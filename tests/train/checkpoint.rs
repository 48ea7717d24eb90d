//! Checkpoints: resuming continues bit for bit; bad files (corrupt, edited, truncated, mismatched) give clear
//! errors naming the file and the caller's line, and change nothing; saves killed or interrupted by signals in
//! real child processes leave the previous checkpoint intact and no temp files behind.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use lazuli::checkpoint;
use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{AdamW, DType, Module, Optimizer, Tensor};

fn batch(step: u64) -> (Tensor, Tensor) {
    // Deterministic data per step, so a resumed run sees the same batches.
    let mut rng = HostRng::new(1000 + step);
    let x: Vec<f32> = (0..32 * 4).map(|_| rng.normal() as f32).collect();
    let y: Vec<f32> = x.chunks(4).map(|r| (r[0] * r[1] - r[2] + 0.5 * r[3]).tanh()).collect();
    (Tensor::from_slice(&x, &[32, 4]), Tensor::from_slice(&y, &[32, 1]))
}

fn train(model: &Mlp, opt: &mut AdamW, steps: std::ops::Range<u64>) -> Vec<u32> {
    let mut losses = Vec::new();
    for step in steps {
        let (x, y) = batch(step);
        let loss = (model.forward(&x) - &y).pow(2.0).mean_all();
        loss.backward();
        opt.step();
        opt.zero_grad();
        lazuli::sync().unwrap();
        losses.push(loss.item::<f32>().unwrap().to_bits());
    }
    losses
}

fn fresh(seed: u64) -> (Mlp, AdamW) {
    let model = Mlp::new(&mut HostRng::new(seed), &[4, 32, 1], Activation::Tanh, DType::F32);
    let opt = AdamW::new(model.named_params(), 3e-3);
    (model, opt)
}

fn params_bits(m: &Mlp) -> Vec<u32> {
    m.params().iter().flat_map(|p| p.get().to_vec::<f32>().unwrap()).map(f32::to_bits).collect()
}

#[test]
fn resume_is_bit_exact_and_bad_files_change_nothing() {
    let dir = std::env::temp_dir().join(format!("lazuli-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.safetensors");

    // Uninterrupted: 12 steps.
    let (model, mut opt) = fresh(1);
    let all = train(&model, &mut opt, 0..12);
    let final_params = params_bits(&model);

    // Interrupted after 5 steps, saved, resumed into a differently initialised model and optimizer.
    let (model, mut opt) = fresh(1);
    let first = train(&model, &mut opt, 0..5);
    let mut user = BTreeMap::new();
    user.insert("step".to_string(), "5".to_string());
    checkpoint::save(&path, &model, Some(&opt), &[], &user).unwrap();
    drop((model, opt));
    let (model, mut opt) = fresh(99);
    let (_, meta) = checkpoint::load(&path, &model, Some(&mut opt)).unwrap();
    assert_eq!(meta.optimizer_steps, 5);
    assert_eq!(meta.user.get("step").map(String::as_str), Some("5"));
    let rest = train(&model, &mut opt, 5..12);
    assert_eq!([first, rest].concat(), all, "losses of the resumed run equal the uninterrupted run, bit for bit");
    assert_eq!(params_bits(&model), final_params);

    let good = std::fs::read(&path).unwrap();
    let before = params_bits(&model);

    // A model of another shape: a clear error naming the parameter; the model and the file are untouched.
    let (other, mut other_opt) = {
        let m = Mlp::new(&mut HostRng::new(3), &[4, 16, 1], Activation::Tanh, DType::F32);
        let o = AdamW::new(m.named_params(), 1e-3);
        (m, o)
    };
    let other_before = params_bits(&other);
    let e = checkpoint::load(&path, &other, Some(&mut other_opt)).unwrap_err().to_string();
    assert!(e.contains("layers.0.weight") && e.contains("f32[4,32]") && e.contains("f32[4,16]"), "{e}");
    assert_eq!(params_bits(&other), other_before);
    assert_eq!(std::fs::read(&path).unwrap(), good);

    // A truncated file: a clear error, nothing changed.
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &good[..good.len() / 2]).unwrap();
    let e = checkpoint::load(&cut, &model, Some(&mut opt)).unwrap_err().to_string();
    assert!(e.contains("truncated") || e.contains("not a valid"), "{e}");
    assert_eq!(params_bits(&model), before);

    // A file that is not a lazuli checkpoint.
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ").unwrap();
    assert!(checkpoint::load(&junk, &model, None).is_err());

    // Saving over an existing checkpoint replaces it whole (no temp files left behind).
    checkpoint::save(&path, &model, Some(&opt), &[], &BTreeMap::new()).unwrap();
    assert_eq!(temp_files(&dir), Vec::<String>::new());

    // A save that fails names the file and the caller's line.
    let nowhere = dir.join("missing-dir").join("x.safetensors");
    let line = line!() + 1;
    let e = checkpoint::save(&nowhere, &model, Some(&opt), &[], &BTreeMap::new()).unwrap_err().to_string();
    assert!(e.contains("x.safetensors") && e.contains(&format!("tests/train/checkpoint.rs:{line}:")), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lazuli-ckpt-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Names of the temp files of saves in `dir`.
fn temp_files(dir: &Path) -> Vec<String> {
    let names = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap());
    names.filter(|n| n.contains(".lazuli-tmp-")).collect()
}

/// A safetensors file's JSON header and where its data starts.
fn header(file: &[u8]) -> (serde_json::Value, usize) {
    let n = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&file[8..8 + n]).unwrap(), 8 + n)
}

/// `file` with `json` as its header.
fn with_header(file: &[u8], json: &serde_json::Value) -> Vec<u8> {
    let mut text = serde_json::to_vec(json).unwrap();
    text.resize(text.len().next_multiple_of(8), b' ');
    [&(text.len() as u64).to_le_bytes()[..], &text, &file[header(file).1..]].concat()
}

/// Where tensor `name`'s bytes are in `file`.
fn bytes_of(file: &[u8], name: &str) -> std::ops::Range<usize> {
    let (json, start) = header(file);
    let at = |i: usize| start + json[name]["data_offsets"][i].as_u64().unwrap() as usize;
    at(0)..at(1)
}

#[test]
fn corrupt_or_edited_files_are_refused_naming_what_changed() {
    let dir = scratch("corrupt");
    let path = dir.join("c.safetensors");
    let (model, mut opt) = fresh(1);
    train(&model, &mut opt, 0..2);
    let user = BTreeMap::from([("step".to_string(), "5".to_string())]);
    checkpoint::save(&path, &model, Some(&opt), &[], &user).unwrap();
    let good = std::fs::read(&path).unwrap();
    let saved = params_bits(&model);

    let (target, mut target_opt) = fresh(7);
    let before = params_bits(&target);
    // Loads `bytes` from a file of their own: refused, naming the file and this line, and nothing changed.
    let mut refused = |file: &str, bytes: &[u8]| -> String {
        let p = dir.join(file);
        std::fs::write(&p, bytes).unwrap();
        let line = line!() + 1;
        let e = checkpoint::load(&p, &target, Some(&mut target_opt)).unwrap_err().to_string();
        assert!(e.contains(&p.display().to_string()), "the error names the file: {e}");
        assert!(e.contains(&format!("tests/train/checkpoint.rs:{line}:")), "the error names the caller's line: {e}");
        assert_eq!(params_bits(&target), before, "{file}: nothing changed");
        e
    };

    // One flipped bit in a parameter's bytes.
    let mut flipped = good.clone();
    flipped[bytes_of(&good, "model.layers.0.weight").start + 37] ^= 0x10;
    let e = refused("flipped.safetensors", &flipped);
    assert!(e.contains("tensor \"model.layers.0.weight\" does not match its checksum"), "{e}");

    // A NaN written over an optimizer moment.
    let moment = "optim.layers.1.weight.exp_avg_sq";
    let mut nan = good.clone();
    let at = bytes_of(&good, moment).start + 4;
    nan[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let e = refused("nan.safetensors", &nan);
    assert!(e.contains(&format!("tensor \"{moment}\" does not match its checksum")), "{e}");

    // An edited metadata value, same length, so the file is still valid safetensors.
    let (from, to) = (br#""user.step":"5""#, br#""user.step":"6""#);
    let at = good.windows(from.len()).position(|w| w == from).expect("the user entry is in the header");
    let mut edited = good.clone();
    edited[at..at + to.len()].copy_from_slice(to);
    let e = refused("edited.safetensors", &edited);
    assert!(e.contains("the metadata does not match its checksum"), "{e}");

    // A dtype edited in the header (f32 -> i32 keeps the byte count): caught by the metadata checksum.
    let (mut json, _) = header(&good);
    json["model.layers.0.weight"]["dtype"] = "I32".into();
    let e = refused("dtype.safetensors", &with_header(&good, &json));
    assert!(e.contains("the metadata does not match its checksum"), "{e}");

    // Checksums removed from a current-format file: refused, not loaded unverified.
    let (mut json, _) = header(&good);
    json["__metadata__"].as_object_mut().unwrap().retain(|k, _| !k.starts_with("sha256."));
    let e = refused("stripped.safetensors", &with_header(&good, &json));
    assert!(e.contains("no metadata checksum"), "{e}");

    // A format from the future.
    let (mut json, _) = header(&good);
    json["__metadata__"]["format"] = "lazuli-checkpoint-3".into();
    let e = refused("future.safetensors", &with_header(&good, &json));
    assert!(e.contains("newer"), "{e}");

    // The format before checksums (what the previous lazuli wrote: no sha256 entries) still loads, bit for bit.
    json["__metadata__"]["format"] = "lazuli-checkpoint-1".into();
    json["__metadata__"].as_object_mut().unwrap().retain(|k, _| !k.starts_with("sha256."));
    let old = dir.join("old.safetensors");
    std::fs::write(&old, with_header(&good, &json)).unwrap();
    let (_, meta) = checkpoint::load(&old, &target, Some(&mut target_opt)).unwrap();
    assert_eq!(meta.user.get("step").map(String::as_str), Some("5"));
    assert_eq!(meta.optimizer_steps, 2);
    assert_eq!(params_bits(&target), saved);

    // And the intact file loads.
    let (other, mut other_opt) = fresh(8);
    checkpoint::load(&path, &other, Some(&mut other_opt)).unwrap();
    assert_eq!(params_bits(&other), saved);
    std::fs::remove_dir_all(&dir).unwrap();
}

// Saves in child processes (this test binary, running `save_loop_child`), interrupted by real signals.

const CHILD_TARGETS: &str = "LAZULI_TEST_CKPT_TARGETS";
const CHILD_MB: &str = "LAZULI_TEST_CKPT_MB";
const CHILD_SAVES: &str = "LAZULI_TEST_CKPT_SAVES";
const CHILD_READY: &str = "LAZULI_TEST_CKPT_READY";
const CHILD_GO: &str = "LAZULI_TEST_CKPT_GO";
/// Elements of the large extra tensor per MiB.
const PER_MB: usize = (1 << 20) / 4;

/// Saves the model of `fresh(1)` with a large extra tensor to the targets in turn, `CHILD_SAVES` times (0: until
/// killed). With `CHILD_READY` and `CHILD_GO`, says it is ready and waits for the go before the first save.
#[test]
#[ignore = "run in a process of its own by the tests below"]
fn save_loop_child() {
    let Some(targets) = std::env::var_os(CHILD_TARGETS) else { return };
    let targets: Vec<PathBuf> = std::env::split_paths(&targets).collect();
    let number = |var: &str| -> usize { std::env::var(var).unwrap().parse().unwrap() };
    let (model, opt) = fresh(1);
    let big = Tensor::from_slice(&vec![0.25f32; number(CHILD_MB) * PER_MB], &[number(CHILD_MB) * PER_MB]);
    if let (Some(ready), Some(go)) = (std::env::var_os(CHILD_READY), std::env::var_os(CHILD_GO)) {
        std::fs::write(ready, b"").unwrap();
        wait_until("the go", || Path::new(&go).exists());
    }
    let saves = number(CHILD_SAVES);
    for i in (0..).take_while(|&i| saves == 0 || i < saves) {
        let target = &targets[i % targets.len()];
        checkpoint::save(target, &model, Some(&opt), &[("big", big.clone())], &BTreeMap::new()).unwrap();
    }
}

/// A child running `save_loop_child`, killed if the test fails before it ends.
struct Saver(Child);

impl Drop for Saver {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn spawn_saver(targets: &[&Path], mb: usize, saves: usize, barrier: Option<(&Path, &Path)>) -> Saver {
    let child = crate::common::child::test_name(module_path!(), "save_loop_child");
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", &child, "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_TARGETS, std::env::join_paths(targets).unwrap())
        .env(CHILD_MB, mb.to_string())
        .env(CHILD_SAVES, saves.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some((ready, go)) = barrier {
        cmd.env(CHILD_READY, ready).env(CHILD_GO, go);
    }
    Saver(cmd.spawn().unwrap())
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn signal(saver: &Saver, name: &str) {
    let status = Command::new("kill").args(["-s", name, &saver.0.id().to_string()]).status().unwrap();
    assert!(status.success(), "kill -s {name}");
}

/// The child's exit status, and what it wrote to stderr.
fn finish(mut saver: Saver) -> (ExitStatus, String) {
    let mut status = None;
    wait_until("the child to end", || {
        status = saver.0.try_wait().unwrap();
        status.is_some()
    });
    let mut stderr = String::new();
    saver.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (status.unwrap(), stderr)
}

/// Stop the child (SIGSTOP) while it is writing `target`'s temp file, after at least one save has completed.
fn stop_mid_save(saver: &mut Saver, target: &Path) {
    let dir = target.parent().unwrap();
    let mine = format!("{}.lazuli-tmp-{}-", target.file_name().unwrap().to_str().unwrap(), saver.0.id());
    let writing = || temp_files(dir).iter().any(|n| n.starts_with(&mine));
    let state = format!("/proc/{}/stat", saver.0.id());
    loop {
        wait_until("a save in progress", || {
            if let Some(status) = saver.0.try_wait().unwrap() {
                panic!("the saving child ended early ({status})");
            }
            target.exists() && writing()
        });
        signal(saver, "STOP");
        // The state follows the command's name in parentheses: `T` once stopped.
        wait_until("the child to stop", || {
            let stat = std::fs::read_to_string(&state).unwrap();
            stat.rsplit(") ").next().is_some_and(|rest| rest.starts_with('T'))
        });
        if writing() {
            return;
        }
        signal(saver, "CONT");
    }
}

/// `target` is a complete, verified checkpoint with the children's large extra tensor.
fn assert_loads(target: &Path, mb: usize) {
    let (model, _) = fresh(5);
    let (extra, _) = checkpoint::load(target, &model, None).unwrap();
    let big = extra["big"].to_vec::<f32>().unwrap();
    assert_eq!(big.len(), mb * PER_MB);
    assert!(big.iter().all(|&x| x == 0.25), "{}: the large tensor's values", target.display());
    assert_eq!(params_bits(&model), params_bits(&fresh(1).0));
}

/// SIGKILL cannot be caught: the temp file stays, and the next save of that target removes it.
#[test]
fn a_save_killed_outright_leaves_a_temp_file_the_next_save_removes() {
    let dir = scratch("sigkill");
    let target = dir.join("k.safetensors");
    let mut child = spawn_saver(&[&target], 16, 0, None);
    stop_mid_save(&mut child, &target);
    child.0.kill().unwrap();
    let (status, stderr) = finish(child);
    assert_eq!(status.signal(), Some(9), "{stderr}");
    let left = temp_files(&dir);
    assert_eq!(left.len(), 1, "the killed save left its temp file: {left:?}");
    assert_loads(&target, 16);

    let (model, opt) = fresh(1);
    checkpoint::save(&target, &model, Some(&opt), &[], &BTreeMap::new()).unwrap();
    assert_eq!(temp_files(&dir), Vec::<String>::new(), "the next save removed it");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// SIGTERM or SIGINT while a save is writing: the temp file is removed, the previous checkpoint stays whole,
/// and the process still dies of the signal.
fn interrupted_save_cleans_up(name: &str, number: i32) {
    if sigint_ignored() && name == "INT" {
        eprintln!("SIGINT is ignored in this process (and so in its children): nothing to test");
        return;
    }
    let dir = scratch(&format!("sig{name}"));
    let target = dir.join("t.safetensors");
    let mut child = spawn_saver(&[&target], 16, 0, None);
    stop_mid_save(&mut child, &target);
    signal(&child, name);
    signal(&child, "CONT");
    let (status, stderr) = finish(child);
    assert_eq!(status.signal(), Some(number), "the child died of SIG{name}: {status}\n{stderr}");
    assert_eq!(temp_files(&dir), Vec::<String>::new(), "SIG{name} removed the temp file");
    assert_loads(&target, 16);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A shell running a job in the background ignores SIGINT for it, and children inherit that.
fn sigint_ignored() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let ignored = status.lines().find_map(|l| l.strip_prefix("SigIgn:")).unwrap();
    u64::from_str_radix(ignored.trim(), 16).unwrap() & (1 << (2 - 1)) != 0
}

#[test]
fn sigterm_during_a_save_removes_the_temp_file() {
    interrupted_save_cleans_up("TERM", 15);
}

#[test]
fn sigint_during_a_save_removes_the_temp_file() {
    interrupted_save_cleans_up("INT", 2);
}

/// Two processes saving at once, each to a target of its own and both to a shared one: the clean-up of stale
/// temp files never removes a live process's, so every save succeeds.
#[test]
fn concurrent_saves_keep_each_others_temp_files() {
    let dir = scratch("concurrent");
    let shared = dir.join("shared.safetensors");
    let go = dir.join("go");
    let own: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("own{i}.safetensors"))).collect();
    let ready: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("ready{i}"))).collect();
    // Sizes and counts at which a clean-up that ignored liveness failed 10 runs out of 10.
    let (mb, saves) = (16, 16);
    let children: Vec<Saver> =
        (0..2).map(|i| spawn_saver(&[&own[i], &shared], mb, saves, Some((&ready[i], &go)))).collect();
    wait_until("both children to be ready", || ready.iter().all(|r| r.exists()));
    std::fs::write(&go, b"").unwrap();
    for child in children {
        let (status, stderr) = finish(child);
        assert!(status.success(), "every save of the child succeeded: {status}\n{stderr}");
    }
    assert_eq!(temp_files(&dir), Vec::<String>::new());
    for target in own.iter().chain([&shared]) {
        assert_loads(target, mb);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

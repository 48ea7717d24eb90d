//! `LAZULI_EVENTS` writes JSON lines; `lazuli-report` reads them back and names the break, its line and its fix.
//! The event file is chosen once per process: one test writes it here, the other in a child process. The tests
//! live in the tool's package, where Cargo builds the binary for them (`CARGO_BIN_EXE_lazuli-report`).

use std::process::Command;

use lazuli::Tensor;

#[test]
fn event_file_and_report_tool() {
    let dir = std::env::temp_dir().join(format!("lazuli-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let events = dir.join("events.jsonl");
    std::env::set_var("LAZULI_EVENTS", &events);

    let w = Tensor::from_slice(&[0.5f32; 6], &[2, 3]);
    let mut l_item = 0;
    for step in 0..3 {
        let x = Tensor::from_slice(&[step as f32; 6], &[3, 2]);
        let y = x.matmul(&w).tanh().sum_all();
        l_item = line!() + 1;
        let v = y.item::<f32>().unwrap(); // a break, every step
        let _next = &y * 2.0 + v as f64;
        lazuli::sync().unwrap();
    }
    let text = std::fs::read_to_string(&events).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.iter().filter(|e| e["kind"] == "program").count() >= 6, "{text}");
    assert_eq!(lines.iter().filter(|e| e["kind"] == "step_end").count(), 3);

    let (json, chrome) = (dir.join("report.json"), dir.join("trace.json"));
    let out = Command::new(env!("CARGO_BIN_EXE_lazuli-report"))
        .arg(&events)
        .arg("--json")
        .arg(&json)
        .arg("--chrome")
        .arg(&chrome)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(report.contains("steps: 3"), "{report}");
    assert!(report.contains("3 step(s) with graph breaks"), "{report}");
    let site = format!("item at {}:{l_item}: an extra program in 3 step(s) (steps 0-2)", file!());
    assert!(report.contains(&site), "{report}");
    assert!(report.contains("fix: read the value after the step boundary"), "{report}");

    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["breaks"][0]["count"], 3);
    assert_eq!(r["breaks"][0]["site"], format!("{}:{l_item}", file!()));
    let t: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let execs = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["name"].as_str().unwrap().starts_with("execute"));
    assert!(execs.count() >= 6);

    // A malformed file is a clear error, not a panic.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"kind\": \"program\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lazuli-report")).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1"), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The training loop of `examples/graph_breaks_combined.rs`, run in a child process by
/// `combined_causes_each_at_its_own_line`.
#[path = "../../examples/graph_breaks_combined.rs"]
#[allow(dead_code)]
mod combined;

/// Five problems in the same steps (an `item()` mid-step, a short last batch, a loop count that changes, a
/// constant that changes every step, an `if` on a tensor): the JSON report names each at its own line with its
/// own fix, groups each cause's compiles into one entry with their steps, and reports nothing else.
#[test]
fn combined_causes_each_at_its_own_line() {
    const CHILD: &str = "LAZULI_TEST_COMBINED_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return combined::train(false).unwrap();
    }
    let dir = std::env::temp_dir().join(format!("lazuli-report-combined-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (events, json) = (dir.join("events.jsonl"), dir.join("report.json"));
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "combined_causes_each_at_its_own_line", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LAZULI_EVENTS", &events)
        .env_remove("LAZULI_STRICT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains("1 passed"), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_lazuli-report")).arg(&events).arg("--json").arg(&json).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    // Each problem's line, found by its text in the example; the file as the compiler named it.
    let source = include_str!("../../examples/graph_breaks_combined.rs");
    let first_site = r["breaks"][0]["site"].as_str().unwrap_or_default();
    let file = first_site.rsplit_once(':').map(|(f, _)| f.to_string()).unwrap_or_default();
    assert!(file.ends_with("examples/graph_breaks_combined.rs"), "{text}");
    let site = |code: &str| {
        let lines: Vec<usize> =
            source.lines().enumerate().filter(|(_, l)| l.contains(code)).map(|(i, _)| i + 1).collect();
        assert_eq!(lines.len(), 1, "{code:?} is on one line of the example");
        format!("{file}:{}", lines[0])
    };
    let (item, branch, boundary) = (site("loss.item::<f32>()?"), site("if norm2 > 1.0"), site("lazuli::sync()?"));
    let materialized =
        vec![format!("item at {item}"), format!("host_control_flow at {branch}"), format!("sync at {boundary}")];
    let all_steps: Vec<u64> = (0..10).collect();

    assert_eq!((r["steps"].as_u64(), r["programs"].as_u64(), r["recompiles"].as_u64()), (Some(10), Some(30), Some(27)));
    let breaks = r["breaks"].as_array().unwrap();
    let mut got: Vec<(&str, &str)> =
        breaks.iter().map(|b| (b["cause"].as_str().unwrap(), b["site"].as_str().unwrap())).collect();
    got.sort_unstable();
    assert_eq!(got, vec![("host_control_flow", branch.as_str()), ("item", item.as_str())], "{text}");
    for b in breaks {
        assert_eq!(
            (b["count"].as_u64(), serde_json::from_value::<Vec<u64>>(b["steps"].clone()).unwrap()),
            (Some(10), all_steps.clone())
        );
    }
    let fix = |b: &serde_json::Value| b["advice"].as_str().unwrap_or_default().to_string();
    let by_cause = |c: &str| breaks.iter().find(|b| b["cause"] == c).unwrap();
    assert!(fix(by_cause("item")).contains("read the value after the step boundary"), "{text}");
    assert!(fix(by_cause("host_control_flow")).contains("decide on the device"), "{text}");

    // One entry per cause, at the cause's line; every recompile materialized at the same three lines.
    let causes = r["recompile_sites"].as_array().unwrap();
    let mut got: Vec<(&str, &str)> =
        causes.iter().map(|c| (c["kind"].as_str().unwrap(), c["site"].as_str().unwrap())).collect();
    got.sort_unstable();
    let (weight, batch, passes) =
        (site("Tensor::constant(0.9f64"), site("let x = Tensor::from_slice"), site("h = &h + h.tanh()"));
    let want = vec![("constant", weight.as_str()), ("input_type", batch.as_str()), ("loop_count", passes.as_str())];
    assert_eq!(got, want, "{text}");
    let cause = |kind: &str| {
        let c = causes.iter().find(|c| c["kind"] == kind).unwrap();
        let steps: Vec<u64> = serde_json::from_value(c["steps"].clone()).unwrap();
        let explanation: Vec<String> = serde_json::from_value(c["explanation"].clone()).unwrap();
        let at: Vec<String> = serde_json::from_value(c["materialized_at"].clone()).unwrap();
        assert_eq!(at, materialized, "{kind}: {text}");
        (c["count"].as_u64().unwrap(), steps, explanation.join("\n"), fix(c))
    };
    let (count, steps, why, fix) = cause("constant");
    assert_eq!((count, steps), (27, (1..10).collect::<Vec<u64>>()), "{text}");
    assert!(
        why.contains(&format!("a constant recorded at {weight}:")) && why.contains("is 0.9 now, 1 before"),
        "{why}"
    );
    assert!(fix.contains("pass it as a host scalar operand"), "{fix}");
    let (count, steps, why, fix) = cause("input_type");
    assert_eq!((count, steps), (6, vec![4, 9]), "{text}");
    assert!(
        why.contains("now f32[22,4], before f32[32,4]") && why.contains("now f32[22,1], before f32[32,1]"),
        "{why}"
    );
    assert!(fix.contains("pad or bucket batches"), "{fix}");
    let (count, steps, why, fix) = cause("loop_count");
    assert_eq!((count, steps), (3, vec![5]), "{text}");
    assert!(why.contains(&format!("the loop at {passes} recorded its ops 3 times, before 2")), "{why}");
    assert!(fix.contains("keep loop counts fixed per step, or pad/bucket them"), "{fix}");
}

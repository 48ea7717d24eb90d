//! `LAZULI_EVENTS` writes JSON lines; `lazuli-report` reads them back and names the break, its line and its fix.
//! One test: the event file is chosen once per process.

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
    let site = format!("item at {}:{l_item}: an extra program in 3 step(s) from step 0", file!());
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

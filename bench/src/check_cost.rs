//! What the finite check costs the CPU workloads: `LAZULI_CHECK_FINITE=off` against each other mode, in rounds.
//! The check is fixed per process, so each round runs one process per mode (`cpu-check-side`), their order
//! reversed every other round; each process times lazuli and JAX in alternating repetitions, as `cpu` does.
//! The machine's speed drifts between processes by as much as the check costs, so a round's cost is reported two
//! ways: lazuli's medians against each other, and lazuli ÷ JAX in the same process against each other (JAX runs
//! the same step in every process, so the second takes out most of the drift). The table gives each round's
//! ratio and the median of the rounds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::compare::{self, Options};
use crate::stats::{duration, machine, median, today, Spread};
use crate::workloads::Workload;
use crate::{pyenv, worker, BenchResult};

/// The CPU workloads by name, in table order.
fn workloads(only: &[String]) -> Vec<Workload> {
    Workload::cpu_workloads().into_iter().filter(|w| only.is_empty() || only.contains(&w.name)).collect()
}

/// One process's side: each workload of `only` timed against JAX under this process's check; one JSON line each
/// (`workload`, lazuli's and JAX's medians in seconds).
pub fn side(only: &[String], reps: usize, python: Option<&Path>, dir: &Path) -> BenchResult<Vec<Value>> {
    let python = pyenv::ensure(python)?;
    let script = worker::write_script(dir)?;
    let opts = Options { reps, ..Options::default() };
    let mut out = Vec::new();
    for w in workloads(only) {
        let row = compare::cpu_row(&w, &python, &script, dir, &opts)?;
        row.agreement().map_err(|e| format!("{}: the losses disagree: {e}", w.name))?;
        let jax = row.others.first().map_or(f64::NAN, |o| o.steps.median());
        out.push(json!({ "workload": w.name, "lazuli": row.lazuli.steps.median(), "jax": jax }));
    }
    Ok(out)
}

/// `rounds` rounds of one `cpu-check-side` process per mode (`off` first, and each of `modes`), then the table.
pub fn run(only: &[String], modes: &[String], rounds: usize, reps: usize, python: Option<PathBuf>) -> BenchResult<()> {
    let mut all = vec!["off".to_string()];
    all.extend(modes.iter().filter(|m| *m != "off").cloned());
    // (workload, mode) → per round (lazuli, JAX).
    let mut times: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
    for round in 0..rounds {
        let mut order = all.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for mode in &order {
            eprintln!("lazuli-bench: round {} of {rounds}, LAZULI_CHECK_FINITE={mode} ...", round + 1);
            for line in child(only, mode, reps, python.as_deref())? {
                let workload = line["workload"].as_str().unwrap_or_default().to_string();
                let at = |k: &str| line[k].as_f64().unwrap_or(f64::NAN);
                times.entry((workload, mode.clone())).or_default().push((at("lazuli"), at("jax")));
            }
        }
    }
    println!("## lazuli-bench check-cost, {}", today());
    println!("- command: `{}`", std::env::args().collect::<Vec<_>>().join(" "));
    println!("- machine: {}", machine());
    println!(
        "- method: {rounds} rounds; per round one process per setting (order reversed every other round), each \
         timing lazuli and JAX jit in {reps} alternating repetitions; a round's cost is that setting's step over \
         `off`'s, by lazuli's medians and by lazuli ÷ JAX in the same process"
    );
    println!("\n| workload | setting | `off`, lazuli's medians | setting, lazuli's medians | ÷ `off`, per round (medians) | ÷ `off`, per round (÷ JAX) | median cost (medians; ÷ JAX) |");
    println!("|---|---|---|---|---|---|---|");
    for w in workloads(only) {
        let Some(off) = times.get(&(w.name.clone(), "off".into())) else { continue };
        for mode in all.iter().skip(1) {
            let Some(on) = times.get(&(w.name.clone(), mode.clone())) else { continue };
            let by_medians: Vec<f64> = on.iter().zip(off).map(|(s, o)| s.0 / o.0).collect();
            let by_jax: Vec<f64> = on.iter().zip(off).map(|(s, o)| (s.0 / s.1) / (o.0 / o.1)).collect();
            let list = |v: &[f64]| v.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
            let range = |v: &[(f64, f64)]| {
                let lazuli = Spread { values: v.iter().map(|t| t.0).collect() };
                format!("{}–{}", duration(lazuli.min()), duration(lazuli.max()))
            };
            let pct = |r: f64| format!("{:+.1}%", (r - 1.0) * 100.0);
            println!(
                "| {} | `{mode}` | {} | {} | {} | {} | {}; {} |",
                w.name,
                range(off),
                range(on),
                list(&by_medians),
                list(&by_jax),
                pct(median(&by_medians)),
                pct(median(&by_jax))
            );
        }
    }
    Ok(())
}

/// One `cpu-check-side` process under `LAZULI_CHECK_FINITE=mode`: its JSON lines.
fn child(only: &[String], mode: &str, reps: usize, python: Option<&Path>) -> BenchResult<Vec<Value>> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["cpu-check-side", "--reps", &reps.to_string()]);
    if !only.is_empty() {
        cmd.args(["--only", &only.join(",")]);
    }
    if let Some(p) = python {
        cmd.arg("--python").arg(p);
    }
    let out = cmd.env("LAZULI_CHECK_FINITE", mode).stderr(Stdio::inherit()).output()?;
    if !out.status.success() {
        return Err(format!("cpu-check-side under LAZULI_CHECK_FINITE={mode} failed ({})", out.status).into());
    }
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()?;
    Ok(lines)
}

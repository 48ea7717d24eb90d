//! Medians, spreads and the facts every table row carries (machine, date, versions).

use std::process::Command;

/// Median of `v` (mean of the middle two for an even count); NaN for an empty slice.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Repetitions of one measurement: each value is one repetition's median step time.
#[derive(Clone, Debug, Default)]
pub struct Spread {
    pub values: Vec<f64>,
}

impl Spread {
    pub fn push(&mut self, v: f64) {
        self.values.push(v);
    }
    pub fn median(&self) -> f64 {
        median(&self.values)
    }
    pub fn min(&self) -> f64 {
        self.values.iter().copied().fold(f64::INFINITY, f64::min)
    }
    pub fn max(&self) -> f64 {
        self.values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }
    /// `(max − min) / median`: how far the repetitions disagree.
    pub fn relative_spread(&self) -> f64 {
        (self.max() - self.min()) / self.median()
    }
    /// "1.23 ms (1.20–1.31)" with a unit chosen for the size.
    pub fn show(&self) -> String {
        format!("{} ({}–{})", duration(self.median()), duration(self.min()), duration(self.max()))
    }
}

/// Seconds as µs, ms or s with three significant digits.
pub fn duration(s: f64) -> String {
    if !s.is_finite() {
        return "–".into();
    }
    let (v, unit) = if s < 1e-3 {
        (s * 1e6, "µs")
    } else if s < 1.0 {
        (s * 1e3, "ms")
    } else {
        (s, "s")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {unit}")
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock.
pub fn today() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!("{year:04}-{month:02}-{day:02}")
}

/// CPU model, core count and memory of this machine, in one line.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / (1024.0 * 1024.0))
        .unwrap_or(0.0);
    format!("{model}, {cores} cores, {mem_gib:.0} GiB")
}

/// `rustc --version` where a toolchain is installed (a copied binary may run where none is).
pub fn rustc_version() -> String {
    Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "rustc: not installed here (binary built elsewhere)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_spreads() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        let s = Spread { values: vec![2e-3, 1e-3, 3e-3] };
        assert_eq!((s.min(), s.median(), s.max()), (1e-3, 2e-3, 3e-3));
        assert_eq!(s.show(), "2.00 ms (1.00 ms–3.00 ms)");
        assert_eq!(s.relative_spread(), 1.0);
        assert_eq!(duration(42e-6), "42.0 µs");
        assert_eq!(duration(2.5), "2.50 s");
    }

    #[test]
    fn dates() {
        let d = today();
        assert_eq!(d.len(), 10);
        assert!(d.as_str() > "2024-01-01", "{d}");
    }
}

//! Learning-rate schedules: functions of the step number. They change a host scalar, never the graph.

/// A learning rate as a function of the step (counted from 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    Constant(f64),
    /// Linear warm-up from 0 to `peak` over `warmup` steps, then cosine decay to `min` at `total`.
    WarmupCosine {
        peak: f64,
        min: f64,
        warmup: u64,
        total: u64,
    },
}

impl Schedule {
    pub fn at(&self, step: u64) -> f64 {
        match *self {
            Schedule::Constant(lr) => lr,
            Schedule::WarmupCosine { peak, min, warmup, total } => {
                if step < warmup {
                    peak * (step + 1) as f64 / warmup as f64
                } else if step >= total {
                    min
                } else {
                    let progress = (step - warmup) as f64 / (total - warmup).max(1) as f64;
                    min + 0.5 * (peak - min) * (1.0 + (std::f64::consts::PI * progress).cos())
                }
            }
        }
    }
}

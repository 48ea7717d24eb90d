//! Learning-rate schedules: functions of the step number. They change a host scalar, never the graph.

/// A learning rate as a function of the step (counted from 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Schedule {
    /// The same learning rate at every step.
    Constant(f64),
    /// Linear warm-up from 0 to `peak` over `warmup` steps, then cosine decay to `min` at `total`.
    WarmupCosine {
        /// The rate at the end of warm-up.
        peak: f64,
        /// The rate at `total` and after.
        min: f64,
        /// Steps of linear warm-up.
        warmup: u64,
        /// The step at which the decay reaches `min`.
        total: u64,
    },
}

impl Schedule {
    /// The learning rate at `step` (counted from 0).
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

//! Finding where a NaN came from. A small regression MLP is trained with AdamW on a Gaussian likelihood whose noise
//! variance is annealed towards zero on the host; at step 5 it reaches zero and `log` of it goes to -inf, making
//! the loss and every gradient non-finite from then on. With `LAZULI_CHECK_FINITE=stop` each step's own program
//! counts the non-finite values that enter its update and, from the bad step on, keeps the weights and AdamW's
//! state as they were before it. The step's check is read once a later step is launched, so that reading it never waits
//! for the device, or by a read that has waited for the step anyway, as this loop's read of each step's loss does: step
//! 5's read returns an error naming the first op that made a non-finite value from finite operands, with its line; the
//! example prints it and exits normally. With `LAZULI_CHECK_FINITE=skip` every step from step 5 on is skipped instead:
//! its loss prints as non-finite, the model keeps its weights from step 4, and the run ends with the count of skipped
//! steps.
//!
//! LAZULI_CHECK_FINITE=stop cargo run --release --example nan_hunt

use lazuli::nn::{Activation, HostRng, Mlp};
use lazuli::{AdamW, DType, Error, Module, Optimizer, Tensor};

fn main() -> lazuli::Result<()> {
    let mut rng = HostRng::new(7);
    let model = Mlp::new(&mut rng, &[2, 16, 1], Activation::Tanh, DType::F32);
    let mut opt = AdamW::new(model.named_params(), 1e-2);
    let xs: Vec<f32> = (0..64).map(|_| rng.normal() as f32).collect();
    let ys: Vec<f32> = xs.chunks(2).map(|p| (p[0] * 1.5 - p[1]).sin()).collect();
    let (x, y) = (Tensor::from_slice(&xs, &[32, 2]), Tensor::from_slice(&ys, &[32, 1]));
    for step in 0..10u32 {
        // The noise variance, annealed on the host: 0.5, 0.4, …, 0 at step 5, then negative.
        let variance = Tensor::full(&[], 0.5 - 0.1 * step as f64, DType::F32);
        let mse = (&model.forward(&x) - &y).pow(2.0).mean_all();
        let log_var = variance.log(); // the planted op: log(0) = -inf at step 5
        let loss = &mse * (-&log_var).exp() + &log_var;
        loss.backward();
        opt.step();
        opt.zero_grad();
        match lazuli::sync().and_then(|()| loss.item::<f32>()) {
            Ok(value) => println!("step {step}: loss {value:.4}"),
            Err(e @ Error::NonFinite { .. }) => {
                println!("step {step}: {e}");
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
    lazuli::wait()?; // reads the last step's check
    let skipped = lazuli::metrics().skipped_steps;
    if skipped > 0 {
        println!("{skipped} step(s) skipped: the weights are those of the last finite step");
    } else {
        println!("no error: run with LAZULI_CHECK_FINITE=stop to locate the first non-finite value");
    }
    Ok(())
}

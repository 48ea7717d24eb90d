//! Bad input gets a clear error naming the user's line, before anything reaches XLA.

use std::sync::Mutex;

use lazuli::{DType, Tensor};

use crate::common::child;
use crate::common::panic_message;

/// The compile counter is process-wide; the tests of this binary take turns.
static SERIAL: Mutex<()> = Mutex::new(());

/// Run `f`, expect a panic, return its message.
#[test]
fn shape_mismatch_names_the_users_line() {
    if child::alone(module_path!(), "shape_mismatch_names_the_users_line") {
        return; // the compile counter is process-wide: alone in a process of its own
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let a = Tensor::from_slice(&[1.0f32; 6], &[2, 3]);
    let b = Tensor::from_slice(&[1.0f32; 4], &[4]);
    let before = lazuli::metrics();
    let line = line!() + 1;
    let msg = panic_message(|| drop(&a + &b));
    assert!(msg.contains("f32[2,3]") && msg.contains("f32[4]"), "{msg}");
    assert!(msg.contains(&format!("{}:{line}:", file!())), "message must name {}:{line}: {msg}", file!());
    assert_eq!((lazuli::metrics() - before).compiles, 0, "nothing reached XLA");

    let line = line!() + 1;
    let msg = panic_message(|| drop(a.matmul(&a)));
    assert!(msg.contains("matmul") && msg.contains(&format!("{}:{line}:", file!())), "{msg}");

    let line = line!() + 1;
    let msg = panic_message(|| drop(a.sum(&[2])));
    assert!(msg.contains("axis 2") && msg.contains(&format!("{}:{line}:", file!())), "{msg}");

    let line = line!() + 1;
    let msg = panic_message(|| drop(a.reshape(&[4, 2])));
    assert!(msg.contains("reshape") && msg.contains(&format!("{}:{line}:", file!())), "{msg}");

    let i = Tensor::from_slice(&[1i32; 6], &[2, 3]);
    let line = line!() + 1;
    let msg = panic_message(|| drop(&a + &i));
    assert!(msg.contains("dtypes differ") && msg.contains(&format!("{}:{line}:", file!())), "{msg}");

    let line = line!() + 1;
    let msg = panic_message(|| drop(i.exp()));
    assert!(msg.contains("floating-point") && msg.contains(&format!("{}:{line}:", file!())), "{msg}");

    let line = line!() + 1;
    let msg = panic_message(|| drop(Tensor::from_slice(&[1.0f32; 5], &[2, 3])));
    assert!(msg.contains("5 values") && msg.contains(&format!("{}:{line}:", file!())), "{msg}");

    // A layer norm's eps below 0 or not finite (a constant row's scale would be NaN, or every row's).
    for eps in [-1e-5, f64::NAN, f64::INFINITY] {
        let line = line!() + 1;
        let msg = panic_message(|| drop(a.layer_norm(&[-1], eps)));
        assert!(msg.contains(&format!("eps = {eps}")) && msg.contains(&format!("{}:{line}:", file!())), "{msg}");
    }
    assert_eq!((lazuli::metrics() - before).compiles, 0, "nothing reached XLA");
}

#[test]
fn typed_reads_check_the_dtype_and_the_element_count() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let a = Tensor::from_slice(&[1.0f32, 2.0], &[2]);
    let line = line!() + 1;
    let err = a.to_vec::<i32>().unwrap_err().to_string();
    assert!(err.contains("f32") && err.contains("i32") && err.contains(&format!("{}:{line}", file!())), "{err}");
    let err = a.item::<f32>().unwrap_err().to_string();
    assert!(err.contains("2 elements"), "{err}");
    assert_eq!(a.sum(&[0]).item::<f32>().unwrap(), 3.0);
    assert_eq!(Tensor::zeros(&[2], DType::I64).to_vec::<i64>().unwrap(), vec![0, 0]);
}

/// Printing a tensor: magnitudes past 1e8 or under 1e-4 in exponents (not forty digits), the rest as before, in
/// every float dtype; an empty tensor as `[]` (ndarray wrote `[[]]` for `[0, 3]`, as if there were one row).
#[test]
fn printing_shows_extremes_in_exponents_and_empty_tensors_as_empty() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let x = Tensor::from_slice(&[f32::NAN, f32::INFINITY, 1e-45, 3.4e38], &[4]);
    assert_eq!(format!("{x}"), "[NaN, inf, 1e-45, 3.4e38] : f32[4]");
    let plain = Tensor::from_slice(&[0.5f64, -2.0, 1e-4, 9.9e7], &[2, 2]);
    assert_eq!(format!("{plain}"), "[[0.5, -2],\n [0.0001, 99000000]] : f64[2,2]");
    let half = Tensor::from_slice(&[2e-5f32, 1.0], &[2]).to_dtype(DType::F16);
    assert_eq!(format!("{half}"), "[2.002716e-5, 1e0] : f16[2]"); // f16's nearest to 2e-5, a subnormal
    let bf = Tensor::from_slice(&[1e9f32, 3.0], &[2]).to_dtype(DType::BF16);
    assert_eq!(format!("{bf}"), "[9.9824435e8, 3e0] : bf16[2]"); // bf16 holds 998244352 for 1e9
    assert_eq!(format!("{}", Tensor::zeros(&[0, 3], DType::F32)), "[] : f32[0,3]");
    assert_eq!(format!("{}", Tensor::zeros(&[2, 0], DType::I32)), "[] : i32[2,0]");
    assert_eq!(format!("{}", Tensor::from_slice(&[7i32, -1], &[2])), "[7, -1] : i32[2]");
}

/// A test or `main` that returns `lazuli::Result` prints its error's `Debug`: that is the message as `Display`
/// writes it, lines and all, not the variant's fields. The child returns the error of a `try_scan` whose body
/// changes its carry's shape.
#[test]
fn a_returned_error_prints_its_message() {
    const CHILD: &str = "LAZULI_TEST_RETURN_AN_ERROR";
    let test = child::test_name(module_path!(), "a_returned_error_prints_its_message_child");
    let out = child::run(&test, &[(CHILD, "1")]);
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "the child returns an error: {printed}");
    let (_, after) = printed.split_once("scan body line: ").expect("the child's line");
    let line: String = after.chars().take_while(char::is_ascii_digit).collect();
    let want = format!("\n  recorded at {}:{line}:", file!());
    assert!(printed.contains("Error: ") && printed.contains("carry 0 from f32[2] into f32[4]"), "{printed}");
    assert!(printed.contains(&want), "names the line with the message's own line break: {printed}");
    assert!(!printed.contains("ShapeMismatch") && !printed.contains("\\n"), "{printed}");
}

#[test]
fn a_returned_error_prints_its_message_child() -> lazuli::Result<()> {
    if std::env::var("LAZULI_TEST_RETURN_AN_ERROR").is_err() {
        return Ok(());
    }
    // The body gives back a step of the xs as the carry: f32[2] would become f32[4].
    let x = Tensor::zeros(&[2], DType::F32);
    let xs = Tensor::zeros(&[3, 4], DType::F32);
    println!("scan body line: {}", line!() + 1);
    lazuli::try_scan(|_, x| (vec![x[0].clone()], vec![]), &[x], &[xs])?;
    Ok(())
}

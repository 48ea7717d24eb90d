//! What the kernels share: the element types Triton takes, the choice between a Triton implementation and the
//! composite with its reason, and the map that makes each kernel once per signature.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use lazuli_hlo::{Choice, DType, KernelDef};

use crate::triton::ttir::Scalar;
use crate::{Implementation, Target};

/// The Triton element type of a float dtype the kernels take.
pub(crate) fn triton_scalar(dtype: DType, kernel: &str) -> Result<Scalar, String> {
    match dtype {
        DType::F32 => Ok(Scalar::F32),
        DType::BF16 => Ok(Scalar::BF16),
        DType::F16 => Ok(Scalar::F16),
        other => Err(format!("lazuli's Triton {kernel} takes f32, bf16 or f16, not {other}")),
    }
}

/// Triton where it applies (or where forced, with an error saying why it cannot), else the composite. `what`
/// describes the call for the reason; `triton` gives the kernels' spec or why they do not apply, on a target that
/// runs lazuli's GPU kernels at all.
pub(crate) fn triton_or_composite<S>(
    kernel: &str,
    what: String,
    (target, want): (&Target, Implementation),
    triton: impl FnOnce() -> Result<S, String>,
) -> Result<(Option<S>, Choice), String> {
    let triton = || match target.no_gpu_kernels() {
        Some(why) => Err(why),
        None => triton(),
    };
    let chose = |implementation: &'static str, reason: String| Choice { implementation, reason };
    match want {
        Implementation::Composite => Ok((None, chose("composite", "asked for".into()))),
        Implementation::Cudnn => Err(format!("{kernel}: cuDNN was asked for, but lazuli has no cuDNN {kernel}")),
        Implementation::Triton => match triton() {
            Ok(spec) => Ok((Some(spec), chose("triton", what))),
            Err(why) => Err(format!("{kernel}: Triton was asked for but {why}")),
        },
        Implementation::Auto => match triton() {
            Ok(spec) => Ok((Some(spec), chose("triton", what))),
            Err(why) => Ok((None, chose("composite", format!("{what}; {why}")))),
        },
    }
}

/// Kernels made so far, by signature, target and setting: each kernel keeps one such map. Every call of a kernel
/// looks its signature up here while it is recorded, so the map hashes with foldhash, not SipHash.
pub(crate) type Made<K> = Mutex<Option<HashMap<K, Arc<KernelDef>, foldhash::fast::FixedState>>>;

/// The kernel of `key` from `made`, or made by `make` and kept there.
pub(crate) fn made_once<K: Hash + Eq>(
    made: &Made<K>,
    key: K,
    make: impl FnOnce() -> Result<Arc<KernelDef>, String>,
) -> Result<Arc<KernelDef>, String> {
    if let Some(def) = made.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(&key)) {
        return Ok(def.clone());
    }
    let def = make()?;
    made.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::default).insert(key, def.clone());
    Ok(def)
}

//! Upload: each parameter's device value. Host data is copied once (scalars shared per dtype and value, batches
//! into the buffer of an earlier, dropped upload of their type and shape); on a mesh, each device gets its shard;
//! for the CPU launcher, host data travels as bytes and is uploaded there.

use std::sync::Arc;

use lazuli_pjrt::ElementType;

use super::plan::Plan;
use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::error::{Error, Result};
use crate::graph::tensor::{Data, Node};
use crate::runtime::launcher::Arg;
use crate::runtime::value::DeviceValue;
use crate::runtime::Runtime;

/// Where a leaf's host data goes: uploaded right away (`reuse`: on the CPU, into the buffer of an earlier,
/// dropped upload that no running program reads), or by the launcher right before the program runs.
#[derive(Clone, Copy)]
pub(crate) enum Upload {
    Now { reuse: bool },
    OnLauncher,
}

/// Every parameter's argument, one list per device, and the bytes copied to the device.
pub(crate) fn arguments(rt: &Runtime, plan: &Plan, upload: Upload) -> Result<(Vec<Vec<Arg>>, u64)> {
    let leaves = &plan.walk.leaves;
    let mut args: Vec<Vec<Arg>> = vec![Vec::with_capacity(leaves.len()); plan.devices()];
    let mut uploaded = 0;
    for (i, leaf) in leaves.iter().enumerate() {
        match &plan.mesh {
            Some(placement) => {
                let (bufs, bytes) = crate::exec::spmd::leaf_shards(rt, leaf, &placement.params[i])?;
                uploaded += bytes;
                for (k, b) in bufs.into_iter().enumerate() {
                    args[k].push(Arg::Shard(b));
                }
            }
            None => {
                let (arg, bytes) = device_value(rt, leaf, upload)?;
                uploaded += bytes;
                args[0].push(arg);
            }
        }
    }
    Ok((args, uploaded))
}

pub(crate) fn element_type(dt: lazuli_hlo::DType) -> ElementType {
    use lazuli_hlo::DType::*;
    match dt {
        F32 => ElementType::F32,
        F64 => ElementType::F64,
        F16 => ElementType::F16,
        BF16 => ElementType::BF16,
        I32 => ElementType::S32,
        I64 => ElementType::S64,
        U8 => ElementType::U8,
        U32 => ElementType::U32,
        U64 => ElementType::U64,
        Bool => ElementType::Pred,
    }
}

/// A leaf's device value. A host leaf is copied to the device once; later materializations reuse the copy. Host
/// scalars (learning rates, Adam's betas, recorded anew every step) share one device copy per dtype and value;
/// they are never donated (`plan_donation`), so sharing is safe.
///
/// An array of a batch's size may overwrite the buffer of an earlier upload of its type and shape that no
/// running program reads (`Client::buffer_from_host_reusing`, which checks that itself).
fn device_value(rt: &Runtime, node: &Node, upload: Upload) -> Result<(Arg, u64)> {
    type ScalarKey = (lazuli_hlo::DType, Vec<u8>);
    static SCALARS: std::sync::Mutex<Option<std::collections::HashMap<ScalarKey, Arc<DeviceValue>>>> =
        std::sync::Mutex::new(None);
    let mut state = node.lock();
    let bytes = match &state.data {
        Some(Data::Device(v)) => return Ok((Arg::Value(v.clone()), 0)),
        Some(Data::Host(bytes)) => bytes.clone(),
        // A sharded value used by a single-device program: gathered once, then kept on the device.
        Some(d @ Data::Sharded { .. }) => d.to_host(&node.ty)?,
        None => return Err(Error::Internal("a pending node was bound to a parameter".into())),
    };
    // Only scalars are looked up (and their key copied): a batch or a weight is uploaded as it is.
    let key = (node.ty.rank() == 0).then(|| (node.ty.dtype, bytes.to_vec()));
    if let Some(key) = &key {
        let cached = SCALARS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|m| m.get(key).cloned());
        // A copy whose upload failed (with the program it was queued with) is made again, not shared on.
        if let Some(value) = cached.filter(|v| !v.failed()) {
            state.data = Some(Data::Device(value.clone()));
            return Ok((Arg::Value(value), 0));
        }
    }
    let dims: Vec<i64> = node.ty.dims.iter().map(|&d| d as i64).collect();
    let ty = element_type(node.ty.dtype);
    let n = bytes.len() as u64;
    let (arg, value) = match upload {
        Upload::Now { reuse } => {
            let buf = if reuse && key.is_none() {
                rt.client.buffer_from_host_reusing(&bytes, ty, &dims, &rt.device)?
            } else {
                rt.client.buffer_from_host(&bytes, ty, &dims, &rt.device)?
            };
            let value = DeviceValue::ready(buf, 0);
            (Arg::Value(value.clone()), value)
        }
        Upload::OnLauncher => {
            let into = DeviceValue::pending(0);
            (Arg::Upload { bytes, ty, dims, reuse: key.is_none(), into: into.clone() }, into)
        }
    };
    Counters::add(&COUNTERS.bytes_to_device, n);
    state.data = Some(Data::Device(value.clone()));
    if let Some(key) = key {
        let mut cache = SCALARS.lock().unwrap_or_else(|e| e.into_inner());
        let map = cache.get_or_insert_with(Default::default);
        // Values that change every step (a learning-rate schedule) would grow it without bound.
        if map.len() >= 256 {
            map.clear();
        }
        map.insert(key, value);
    }
    Ok((arg, n))
}

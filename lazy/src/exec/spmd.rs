//! Running a graph on a mesh: pick the mesh from the graph's sharded inputs, propagate shardings to the outputs
//! with each op's `shard` rule, split host data into per-device shards, and put shards back together on reads.

use std::rc::Rc;
use std::sync::Arc;

use lazuli_hlo::{DimShards, Graph, Loc, Op, ShardIn, TensorType};
use lazuli_pjrt::Buffer;
use lazuli_sharding::{Mesh, Sharding};

use crate::diagnostics::metrics::{Counters, COUNTERS};
use crate::error::{Error, Result};
use crate::graph::tensor::{Data, Node};
use crate::runtime::Runtime;

/// The mesh a traced graph runs on: the one its sharded inputs and its first constraint share, or `None`.
pub(crate) fn mesh_of(leaves: &[Rc<Node>], constraint: Option<&(Loc, Option<Arc<Sharding>>)>) -> Result<Option<Mesh>> {
    let mut mesh: Option<Mesh> = None;
    let mut see = |m: &Mesh| -> Result<()> {
        match &mesh {
            None => mesh = Some(m.clone()),
            Some(old) if old == m => {}
            Some(old) => {
                return Err(Error::Sharding(format!("one program cannot span two meshes: {old} and {m}")));
            }
        }
        Ok(())
    };
    // The finite check's flag follows the program: a flag laid out by an earlier program puts none on a mesh.
    for leaf in leaves.iter().filter(|l| !crate::exec::finite::flag::is_flag(l)) {
        if let Some(s) = leaf.sharding() {
            see(&s.mesh)?;
        }
    }
    match (constraint, &mesh) {
        (Some((at, Some(s))), Some(inputs)) if s.mesh != *inputs => Err(Error::Sharding(format!(
            "the sharding constraint at {at} lays its value out on {}, but its program's inputs are on {inputs}: one \
             program cannot span two meshes",
            s.mesh
        ))),
        (Some((_, Some(s))), None) => Ok(Some(s.mesh.clone())),
        (Some((at, None)), None) => Err(Error::Sharding(format!(
            "the sharding constraint at {at} has no mesh, and no input of its program is placed on one"
        ))),
        _ => Ok(mesh),
    }
}

/// Annotate `graph` for SPMD on `mesh`: parameters keep their placement (replicated when they have none), and
/// outputs get the sharding the ops' rules propagate. Returns the parameter and output shardings.
pub(crate) fn annotate(
    graph: &mut Graph,
    leaves: &[Rc<Node>],
    mesh: &Mesh,
) -> (Vec<Arc<Sharding>>, Vec<Arc<Sharding>>) {
    let params: Vec<Arc<Sharding>> = leaves
        .iter()
        .map(|l| l.sharding().unwrap_or_else(|| Arc::new(Sharding::replicated(mesh, l.ty.rank()))))
        .collect();
    let mut dims: Vec<Option<DimShards>> = vec![None; graph.nodes.len()];
    for (i, &id) in graph.params.iter().enumerate() {
        dims[id] = Some(params[i].dims.clone()).filter(|d| d.iter().any(|a| !a.is_empty()));
    }
    for id in 0..graph.nodes.len() {
        let node = &graph.nodes[id];
        if matches!(node.op, Op::Parameter(_)) {
            continue;
        }
        let x: Vec<ShardIn<'_>> =
            node.operands.iter().map(|&o| ShardIn { ty: &graph.nodes[o].ty, dims: dims[o].as_ref() }).collect();
        dims[id] = node.op.shard(&x, &node.ty);
    }
    let outputs: Vec<Arc<Sharding>> = graph
        .outputs
        .iter()
        .map(|&o| {
            let ty = &graph.nodes[o].ty;
            let s = dims[o].clone().and_then(|d| Sharding::from_dims(mesh, d, &ty.dims));
            Arc::new(s.unwrap_or_else(|| Sharding::replicated(mesh, ty.rank())))
        })
        .collect();
    graph.partitions = mesh.size() as u32;
    graph.param_shardings = params.iter().map(|s| Some(s.hlo())).collect();
    graph.output_shardings = outputs.iter().map(|s| Some(s.hlo())).collect();
    (params, outputs)
}

/// Call `f(global_offset, block_offset, len)` (in bytes) for each contiguous row of the block of dimensions `dims`
/// starting at `offsets` inside a dense tensor of dimensions `shape`.
fn for_each_row(
    shape: &[usize],
    offsets: &[usize],
    dims: &[usize],
    elem: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    let rank = shape.len();
    if rank == 0 {
        return f(0, 0, elem);
    }
    let row = dims[rank - 1] * elem;
    let rows: usize = dims[..rank - 1].iter().product();
    let mut idx = vec![0usize; rank - 1];
    for r in 0..rows {
        let mut g = 0usize;
        for d in 0..rank - 1 {
            g = g * shape[d] + offsets[d] + idx[d];
        }
        f((g * shape[rank - 1] + offsets[rank - 1]) * elem, r * row, row);
        for d in (0..rank - 1).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// The piece of `bytes` (a dense `ty` tensor) that mesh position `k` holds under `sharding`.
pub(crate) fn split(bytes: &[u8], ty: &TensorType, sharding: &Sharding, k: usize) -> Vec<u8> {
    let local = sharding.shard_shape(&ty.dims);
    let elem = ty.dtype.byte_size();
    let mut block = vec![0u8; local.iter().product::<usize>() * elem];
    for_each_row(&ty.dims, &sharding.offsets(k, &ty.dims), &local, elem, |g, b, n| {
        block[b..b + n].copy_from_slice(&bytes[g..g + n])
    });
    block
}

/// The whole tensor from its shards (each piece read once).
pub(crate) fn gather(shards: &[Arc<Buffer>], ty: &TensorType, sharding: &Sharding) -> Result<Vec<u8>> {
    let elem = ty.dtype.byte_size();
    let local = sharding.shard_shape(&ty.dims);
    let mut global = vec![0u8; ty.byte_size()];
    for (k, shard) in shards.iter().enumerate() {
        if !sharding.is_first_copy(k) {
            continue;
        }
        let block = shard.to_host()?;
        Counters::add(&COUNTERS.bytes_to_host, block.len() as u64);
        for_each_row(&ty.dims, &sharding.offsets(k, &ty.dims), &local, elem, |g, b, n| {
            global[g..g + n].copy_from_slice(&block[b..b + n])
        });
    }
    Ok(global)
}

/// Per-device buffers of a leaf under `want`: reused when the leaf already lives that way, otherwise built from
/// its host value (uploading each piece to its device). Returns the buffers and the bytes uploaded.
pub(crate) fn leaf_shards(rt: &Runtime, leaf: &Node, want: &Arc<Sharding>) -> Result<(Vec<Arc<Buffer>>, u64)> {
    let data = leaf.lock().data.clone();
    let bytes = match data {
        Some(Data::Sharded { shards, sharding }) if sharding == *want => return Ok((shards, 0)),
        Some(Data::Host(b)) => b,
        Some(other) => Arc::new(other.to_host(&leaf.ty)?.to_vec()),
        None => return Err(Error::Internal("a pending node was bound to a parameter".into())),
    };
    let devices = rt.client.devices();
    let dims: Vec<i64> = want.shard_shape(&leaf.ty.dims).iter().map(|&d| d as i64).collect();
    let mut shards = Vec::with_capacity(want.mesh.size());
    let mut uploaded = 0u64;
    for (k, &dev) in want.mesh.devices().iter().enumerate() {
        let piece = split(&bytes, &leaf.ty, want, k);
        let device = devices.get(dev).ok_or_else(|| {
            Error::Sharding(format!("the mesh names device {dev}, the runtime has {}", devices.len()))
        })?;
        shards.push(Arc::new(rt.client.buffer_from_host(
            &piece,
            crate::exec::upload::element_type(leaf.ty.dtype),
            &dims,
            device,
        )?));
        uploaded += piece.len() as u64;
    }
    Counters::add(&COUNTERS.bytes_to_device, uploaded);
    // Keep the placed copy: the next step finds the leaf already sharded.
    leaf.lock().data = Some(Data::Sharded { shards: shards.clone(), sharding: want.clone() });
    Ok((shards, uploaded))
}

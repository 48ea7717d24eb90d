//! Sharding propagation helpers shared by the ops' `shard` rules. A rule says how an op's result is split given
//! how its operands are split (`None`: whole on every device). lazuli uses the rules to annotate a program's
//! outputs — so sharded weights and optimizer state stay sharded across steps — and the planner uses them to
//! cost a candidate sharding. XLA's SPMD partitioner decides everything inside the program.

pub use lazuli_sharding::DimShards;

use crate::dtype::TensorType;

/// One operand as a sharding rule sees it.
#[derive(Clone, Copy, Debug)]
pub struct ShardIn<'a> {
    pub ty: &'a TensorType,
    pub dims: Option<&'a DimShards>,
}

fn sharded_dims(d: &DimShards) -> usize {
    d.iter().filter(|a| !a.is_empty()).count()
}

/// Elementwise: the most-split operand of the result's rank wins (XLA reshards the others to match).
pub fn elementwise(x: &[ShardIn<'_>], out: &TensorType) -> Option<DimShards> {
    // `max_by_key` keeps the last of equals; reversed, the first operand wins ties.
    x.iter()
        .rev()
        .filter_map(|o| o.dims.filter(|d| d.len() == out.rank() && o.ty.dims == out.dims))
        .max_by_key(|d| sharded_dims(d))
        .filter(|d| sharded_dims(d) > 0)
        .cloned()
}

/// Keep the split of every dimension whose size did not change (slice, pad, reverse, concatenate).
pub fn keep_unchanged(x: &ShardIn<'_>, out: &TensorType) -> Option<DimShards> {
    let d = x.dims?;
    if d.len() != out.rank() {
        return None;
    }
    let kept: DimShards =
        d.iter().enumerate().map(|(i, a)| if x.ty.dims[i] == out.dims[i] { a.clone() } else { Vec::new() }).collect();
    (sharded_dims(&kept) > 0).then_some(kept)
}

/// Drop the listed dimensions (reductions).
pub fn drop_dims(x: &ShardIn<'_>, dropped: &[usize]) -> Option<DimShards> {
    let d = x.dims?;
    let kept: DimShards = d.iter().enumerate().filter(|(i, _)| !dropped.contains(i)).map(|(_, a)| a.clone()).collect();
    (sharded_dims(&kept) > 0).then_some(kept)
}

/// Remove axes used by an earlier dimension (a mesh axis can split only one dimension).
pub fn dedupe(mut d: DimShards) -> Option<DimShards> {
    let mut seen = Vec::new();
    for axes in &mut d {
        axes.retain(|a| {
            let fresh = !seen.contains(a);
            seen.push(*a);
            fresh
        });
    }
    (sharded_dims(&d) > 0).then_some(d)
}

/// Reshape: dimensions matched from the front and from the back keep their split; where leading dimensions merge
/// (`[B, T, d] → [B·T, d]`) the outermost one's split carries over, and where one splits (`[B·T, d] → [B, T, d]`)
/// its split moves to the new outermost dimension.
pub fn reshape(x: &ShardIn<'_>, out: &TensorType) -> Option<DimShards> {
    let d = x.dims?;
    let (a, b) = (&x.ty.dims, &out.dims);
    let mut r: DimShards = vec![Vec::new(); b.len()];
    let mut front = 0;
    while front < a.len() && front < b.len() && a[front] == b[front] {
        r[front] = d[front].clone();
        front += 1;
    }
    let mut back = 0;
    while back < a.len() - front && back < b.len() - front && a[a.len() - 1 - back] == b[b.len() - 1 - back] {
        r[b.len() - 1 - back] = d[a.len() - 1 - back].clone();
        back += 1;
    }
    if front < a.len() - back && front < b.len() - back {
        r[front] = d[front].clone();
    }
    dedupe(r)
}

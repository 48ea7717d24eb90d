//! A resolved sharding: a mesh plus, per tensor dimension, the mesh axes (by index) that split it. Converts to
//! XLA's sharding attribute and says which slice of the global tensor each device holds.

use std::fmt::Write;

use crate::{Mesh, PartitionSpec, ShardingError};

/// Per tensor dimension, the indices of the mesh axes that split it (outermost first). Mesh-independent, so op
/// sharding rules (in `lazuli-hlo`) can propagate it.
pub type DimShards = Vec<Vec<usize>>;

/// A partition spec resolved on a mesh for one tensor: which mesh axes split which of its dimensions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sharding {
    /// The mesh the tensor lies on.
    pub mesh: Mesh,
    /// Per tensor dimension, the indices of the mesh axes that split it.
    pub dims: DimShards,
}

impl Sharding {
    /// Resolve `spec` on `mesh` for a tensor of dimensions `shape`: checks axis names, reuse and divisibility.
    pub fn new(mesh: &Mesh, spec: &PartitionSpec, shape: &[usize]) -> Result<Sharding, ShardingError> {
        if spec.rank() != shape.len() {
            return Err(ShardingError::RankMismatch {
                spec: spec.to_string(),
                spec_rank: spec.rank(),
                rank: shape.len(),
            });
        }
        let mut dims = Vec::with_capacity(shape.len());
        let mut used = vec![false; mesh.axes().len()];
        for (d, names) in spec.0.iter().enumerate() {
            let mut axes = Vec::new();
            for n in names {
                let a = mesh.axis_index(n)?;
                if std::mem::replace(&mut used[a], true) {
                    return Err(ShardingError::AxisReused { axis: n.clone(), spec: spec.to_string() });
                }
                axes.push(a);
            }
            let parts: usize = axes.iter().map(|&a| mesh.axis_size(a)).product();
            if !shape[d].is_multiple_of(parts) {
                return Err(ShardingError::NotDivisible { dim: d, size: shape[d], parts, axes: names.clone() });
            }
            dims.push(axes);
        }
        Ok(Sharding { mesh: mesh.clone(), dims })
    }

    /// A full copy on every device of the mesh.
    pub fn replicated(mesh: &Mesh, rank: usize) -> Sharding {
        Sharding { mesh: mesh.clone(), dims: vec![Vec::new(); rank] }
    }

    /// From already-validated axis indices (as op sharding rules produce them); `None` if they no longer divide.
    pub fn from_dims(mesh: &Mesh, dims: DimShards, shape: &[usize]) -> Option<Sharding> {
        let ok = dims.len() == shape.len()
            && dims
                .iter()
                .zip(shape)
                .all(|(axes, &n)| n % axes.iter().map(|&a| mesh.axis_size(a)).product::<usize>() == 0);
        ok.then(|| Sharding { mesh: mesh.clone(), dims })
    }

    /// Whether every device holds the whole tensor.
    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(Vec::is_empty)
    }

    /// Number of pieces dimension `d` is cut into.
    pub fn parts(&self, d: usize) -> usize {
        self.dims[d].iter().map(|&a| self.mesh.axis_size(a)).product()
    }

    /// The partition spec with axis names.
    pub fn spec(&self) -> PartitionSpec {
        PartitionSpec(
            self.dims.iter().map(|axes| axes.iter().map(|&a| self.mesh.axes()[a].0.clone()).collect()).collect(),
        )
    }

    /// Dimensions of each device's piece.
    pub fn shard_shape(&self, shape: &[usize]) -> Vec<usize> {
        shape.iter().enumerate().map(|(d, &n)| n / self.parts(d)).collect()
    }

    /// Which tile of dimension `d` mesh position `k` holds.
    fn tile(&self, coords: &[usize], d: usize) -> usize {
        self.dims[d].iter().fold(0, |t, &a| t * self.mesh.axis_size(a) + coords[a])
    }

    /// For mesh position `k`: the start of its piece along each dimension.
    pub fn offsets(&self, k: usize, shape: &[usize]) -> Vec<usize> {
        let c = self.mesh.coords(k);
        let local = self.shard_shape(shape);
        (0..shape.len()).map(|d| self.tile(&c, d) * local[d]).collect()
    }

    /// Whether position `k` holds the first copy of its piece (so gathering reads each piece once).
    pub fn is_first_copy(&self, k: usize) -> bool {
        let c = self.mesh.coords(k);
        let used: Vec<usize> = self.dims.iter().flatten().copied().collect();
        (0..c.len()).all(|a| used.contains(&a) || c[a] == 0)
    }

    /// XLA's sharding attribute: `{replicated}`, `{devices=[4,2]0,1,…}`, or with the unused axes as a trailing
    /// replicated tile dimension, `{devices=[1,2,4]… last_tile_dim_replicate}`.
    pub fn hlo(&self) -> String {
        if self.is_replicated() {
            return "{replicated}".to_string();
        }
        let used: Vec<usize> = self.dims.iter().flatten().copied().collect();
        let unused: Vec<usize> = (0..self.mesh.axes().len()).filter(|a| !used.contains(a)).collect();
        let replicas: usize = unused.iter().map(|&a| self.mesh.axis_size(a)).product();
        let mut tiles: Vec<usize> = (0..self.dims.len()).map(|d| self.parts(d)).collect();
        if replicas > 1 {
            tiles.push(replicas);
        }
        // Row-major position of each device in the tile array.
        let mut ids = vec![0usize; self.mesh.size()];
        for k in 0..self.mesh.size() {
            let c = self.mesh.coords(k);
            let mut idx = 0;
            for d in 0..self.dims.len() {
                idx = idx * self.parts(d) + self.tile(&c, d);
            }
            if replicas > 1 {
                idx = idx * replicas + unused.iter().fold(0, |t, &a| t * self.mesh.axis_size(a) + c[a]);
            }
            // Sharding attributes name logical devices (SPMD partitions): mesh positions, not device ids.
            ids[idx] = k;
        }
        let mut s = String::from("{devices=[");
        let t: Vec<String> = tiles.iter().map(|x| x.to_string()).collect();
        s.push_str(&t.join(","));
        s.push(']');
        let i: Vec<String> = ids.iter().map(|x| x.to_string()).collect();
        s.push_str(&i.join(","));
        if replicas > 1 {
            s.push_str(" last_tile_dim_replicate");
        }
        s.push('}');
        s
    }

    /// Human-readable form: `P(data, _) on Mesh[data=4, model=2]`.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        let _ = write!(s, "{} on {}", self.spec(), self.mesh);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_strings() {
        let m = Mesh::new(&[("data", 4), ("model", 2)]).unwrap();
        let s = |spec: &[&[&str]], shape: &[usize]| Sharding::new(&m, &PartitionSpec::new(spec), shape).unwrap().hlo();
        assert_eq!(s(&[&[], &[]], &[8, 8]), "{replicated}");
        assert_eq!(s(&[&["data"], &["model"]], &[8, 8]), "{devices=[4,2]0,1,2,3,4,5,6,7}");
        assert_eq!(s(&[&["model"], &["data"]], &[8, 8]), "{devices=[2,4]0,2,4,6,1,3,5,7}");
        assert_eq!(s(&[&["data"], &[]], &[8, 8]), "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}");
        assert_eq!(s(&[&[], &["model"]], &[8, 8]), "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}");
        assert_eq!(s(&[&["data", "model"], &[]], &[8, 8]), "{devices=[8,1]0,1,2,3,4,5,6,7}");
        assert_eq!(s(&[&["model", "data"], &[]], &[8, 8]), "{devices=[8,1]0,2,4,6,1,3,5,7}");
    }

    #[test]
    fn errors_and_offsets() {
        let m = Mesh::new(&[("data", 4), ("model", 2)]).unwrap();
        let e = Sharding::new(&m, &PartitionSpec::new(&[&["batch"], &[]]), &[8, 8]).unwrap_err();
        assert!(matches!(e, ShardingError::UnknownAxis { .. }), "{e}");
        let e = Sharding::new(&m, &PartitionSpec::new(&[&["data"], &[]]), &[6, 8]).unwrap_err();
        assert_eq!(e.to_string(), "dimension 0 of size 6 is not divisible by 4 (mesh axes [\"data\"])");
        let e = Sharding::new(&m, &PartitionSpec::new(&[&["data"], &["data"]]), &[8, 8]).unwrap_err();
        assert!(matches!(e, ShardingError::AxisReused { .. }), "{e}");
        let sh = Sharding::new(&m, &PartitionSpec::new(&[&["model"], &["data"]]), &[4, 8]).unwrap();
        assert_eq!(sh.shard_shape(&[4, 8]), vec![2, 2]);
        // Position 5 = (data 2, model 1): rows 2..4, columns 4..6.
        assert_eq!(sh.offsets(5, &[4, 8]), vec![2, 4]);
        let half = Sharding::new(&m, &PartitionSpec::new(&[&["data"], &[]]), &[4, 8]).unwrap();
        assert!(half.is_first_copy(4) && !half.is_first_copy(5));
    }
}

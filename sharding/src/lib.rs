//! Meshes of devices with named axes, partition specs (which mesh axes split which tensor dimension), and their
//! conversion to XLA's sharding attribute. Pure data: no runtime; `lazuli-lazy` places and runs shards.
#![forbid(unsafe_code)]

mod layout;
pub mod plan;

pub use layout::{DimShards, Sharding};

use std::fmt;

/// Why a mesh or a partition spec does not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardingError {
    /// A spec names an axis the mesh does not have.
    #[error("the mesh has no axis named {axis:?} (axes: {axes:?})")]
    UnknownAxis {
        /// The name asked for.
        axis: String,
        /// The mesh's axes.
        axes: Vec<String>,
    },
    /// A spec splits two dimensions over the same mesh axis.
    #[error("mesh axis {axis:?} is used by more than one dimension of the spec {spec}")]
    AxisReused {
        /// The axis used twice.
        axis: String,
        /// The spec.
        spec: String,
    },
    /// A dimension does not divide into as many pieces as its mesh axes ask.
    #[error("dimension {dim} of size {size} is not divisible by {parts} (mesh axes {axes:?})")]
    NotDivisible {
        /// The tensor dimension.
        dim: usize,
        /// Its size.
        size: usize,
        /// The pieces its axes ask for.
        parts: usize,
        /// The mesh axes splitting it.
        axes: Vec<String>,
    },
    /// A spec's rank differs from the tensor's.
    #[error("the spec {spec} has {spec_rank} dimensions, the tensor has {rank}")]
    RankMismatch {
        /// The spec.
        spec: String,
        /// Its number of dimensions.
        spec_rank: usize,
        /// The tensor's.
        rank: usize,
    },
    /// The mesh itself is malformed (an unnamed or empty axis, an axis twice, a device count that does not match).
    #[error("invalid mesh: {0}")]
    InvalidMesh(String),
}

/// Devices arranged in a grid with named axes, e.g. `[("data", 4), ("model", 2)]`: device `k` (row-major over
/// the axes) is `devices[k]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    axes: Vec<(String, usize)>,
    devices: Vec<usize>,
}

impl Mesh {
    /// A mesh over devices `0..size` in order.
    pub fn new(axes: &[(&str, usize)]) -> Result<Mesh, ShardingError> {
        let size = axes.iter().map(|a| a.1).product();
        Mesh::with_devices(axes, (0..size).collect())
    }

    /// A mesh over the given device ids (row-major over the axes).
    pub fn with_devices(axes: &[(&str, usize)], devices: Vec<usize>) -> Result<Mesh, ShardingError> {
        if axes.is_empty() || axes.iter().any(|a| a.1 == 0 || a.0.is_empty()) {
            return Err(ShardingError::InvalidMesh(format!("axes must be named and non-empty: {axes:?}")));
        }
        for (i, a) in axes.iter().enumerate() {
            if axes[..i].iter().any(|b| b.0 == a.0) {
                return Err(ShardingError::InvalidMesh(format!("axis {:?} appears twice", a.0)));
            }
        }
        let size: usize = axes.iter().map(|a| a.1).product();
        if devices.len() != size {
            return Err(ShardingError::InvalidMesh(format!("{size} positions but {} devices", devices.len())));
        }
        Ok(Mesh { axes: axes.iter().map(|(n, s)| (n.to_string(), *s)).collect(), devices })
    }

    /// The number of devices.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// The axes with their sizes, outermost first.
    pub fn axes(&self) -> &[(String, usize)] {
        &self.axes
    }

    /// The device ids, row-major over the axes.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// The position of the axis `name`, or `UnknownAxis`.
    pub fn axis_index(&self, name: &str) -> Result<usize, ShardingError> {
        self.axes.iter().position(|a| a.0 == name).ok_or_else(|| ShardingError::UnknownAxis {
            axis: name.to_string(),
            axes: self.axes.iter().map(|a| a.0.clone()).collect(),
        })
    }

    /// The size of axis `index`.
    pub fn axis_size(&self, index: usize) -> usize {
        self.axes[index].1
    }

    /// The mesh coordinates of position `k` (row-major).
    pub fn coords(&self, mut k: usize) -> Vec<usize> {
        let mut c = vec![0; self.axes.len()];
        for (i, (_, s)) in self.axes.iter().enumerate().rev() {
            c[i] = k % s;
            k /= s;
        }
        c
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.axes.iter().map(|(n, s)| format!("{n}={s}")).collect();
        write!(f, "Mesh[{}]", parts.join(", "))
    }
}

/// For each tensor dimension, the mesh axes that split it (none: replicated along that dimension). Axes not used
/// by any dimension replicate the whole tensor.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct PartitionSpec(
    /// Per tensor dimension, the names of the mesh axes that split it, outermost first.
    pub Vec<Vec<String>>,
);

impl PartitionSpec {
    /// `PartitionSpec::new(&[&["data"], &[]])`: dimension 0 split over `data`, dimension 1 whole.
    pub fn new(dims: &[&[&str]]) -> PartitionSpec {
        PartitionSpec(dims.iter().map(|d| d.iter().map(|s| s.to_string()).collect()).collect())
    }

    /// Every dimension whole: a full copy on every device.
    pub fn replicated(rank: usize) -> PartitionSpec {
        PartitionSpec(vec![Vec::new(); rank])
    }

    /// Dimension `dim` of a rank-`rank` tensor split over `axis`, the rest whole.
    pub fn split(rank: usize, dim: usize, axis: &str) -> PartitionSpec {
        let mut p = PartitionSpec::replicated(rank);
        p.0[dim].push(axis.to_string());
        p
    }

    /// The number of tensor dimensions the spec covers.
    pub fn rank(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Display for PartitionSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|d| match d.len() {
                0 => "_".to_string(),
                1 => d[0].clone(),
                _ => format!("({})", d.join(",")),
            })
            .collect();
        write!(f, "P({})", parts.join(", "))
    }
}

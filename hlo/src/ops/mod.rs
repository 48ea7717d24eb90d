//! Op families, one file each; see [`crate::op::OpRules`] for what every family provides.
pub mod activation;
pub(crate) mod composite;
pub mod conv;
pub mod dot;
pub mod elementwise;
pub mod fused;
pub mod gather;
pub mod layout;
pub mod leaf;
pub mod norm;
pub mod random;
pub mod reduce;
pub mod scan;
pub mod sharding;
pub mod slicing;
pub mod special;
pub mod window;

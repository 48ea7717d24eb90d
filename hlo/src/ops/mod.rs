//! Op families, one file each; see [`crate::op::OpRules`] for what every family provides.
pub mod dot;
pub mod elementwise;
pub mod layout;
pub mod leaf;
pub mod reduce;

//! (filled in by the planner)

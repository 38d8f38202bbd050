//! The horizontal pod autoscaler (`horizontalpodautoscaling`; events from
//! `horizontal-pod-autoscaler`; docs/SEEDS-SPEC.md §3.10): its decisions, `reconcile::plan` over
//! `calculator` (replica counts from samples) and `behavior` (stabilization windows, scaling
//! policies, clamps).

pub mod behavior;
pub mod calculator;
pub mod metrics;
pub mod reconcile;
#[cfg(test)]
mod tests;

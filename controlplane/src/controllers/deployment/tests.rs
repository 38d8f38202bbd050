//! Table tests of the Deployment decision (docs/SEEDS-SPEC.md CTL-4..CTL-16).

//! Table tests of the DaemonSet decision.

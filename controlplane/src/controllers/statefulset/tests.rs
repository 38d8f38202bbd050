//! Table tests of the StatefulSet decision.

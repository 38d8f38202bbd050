//! Table tests of the scheduling cycle with the specification examples.

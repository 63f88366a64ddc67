//! The stream's rules, one scenario each, driven without sockets.

use super::model_tests::{Run, Start, Step};

#[test]
fn placeholder_compiles() {
    let _ = (Run::new, Start { ring: true, gate_open: true, seeded: false }, Step::Pub);
}

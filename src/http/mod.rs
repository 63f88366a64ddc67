//! The HTTP API: routes and JSON shapes.

pub mod codec;

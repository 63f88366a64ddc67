//! The HTTP API: the server loop, the routes, and the JSON codec.

pub mod codec;
pub mod routes;
pub mod server;

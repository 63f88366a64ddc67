//! The HTTP API: the server loop, the routes, and the JSON codec.

pub mod access_log;
pub mod auth;
pub mod codec;
pub mod conn;
#[cfg(test)]
mod conn_fuzz_tests;
pub mod endpoints;
pub mod metrics;
pub mod routes;
pub mod server;
mod slots;

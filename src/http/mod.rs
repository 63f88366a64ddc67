//! The HTTP API: the server loop, the routes, and the JSON codec. Only the
//! codec is the library's: a router serving `/query` in-process parses and
//! answers with it; the rest is the daemon's.

pub(crate) mod access_log;
pub(crate) mod auth;
pub mod codec;
pub(crate) mod conn;
#[cfg(test)]
mod conn_fuzz_tests;
pub(crate) mod endpoints;
pub(crate) mod metrics;
pub(crate) mod routes;
pub(crate) mod server;
mod slots;

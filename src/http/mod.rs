//! The HTTP API: the server loop, the routes, and the JSON codec.

pub mod access_log;
pub mod auth;
pub mod body;
pub mod codec;
pub mod endpoints;
pub mod metrics;
pub mod request;
pub mod routes;
pub mod server;
mod slots;
mod stream;

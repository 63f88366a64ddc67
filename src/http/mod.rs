//! The HTTP API: the server loop, the routes, and the JSON codec.

pub mod auth;
pub mod body;
pub mod codec;
pub mod request;
pub mod routes;
pub mod server;
mod slots;
mod stream;

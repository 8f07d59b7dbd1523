//! Operations endpoints: `/health` and `/ready`, `/info`, `/v1/models` and `/metrics`, the
//! API description (`/openapi.json`, `/docs`), and the deep health probe.

pub mod deep_health;
pub mod info;
pub mod lifecycle;
pub mod openapi;
pub mod server_info;

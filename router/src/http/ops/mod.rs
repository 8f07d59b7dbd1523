//! Operations endpoints: `/health` and `/ready`, `/info`, `/v1/models` and `/metrics`, the
//! API description (`/openapi.json`, `/docs`), the deep health probe, and LoRA adapter updates.

pub mod deep_health;
pub mod info;
pub mod lifecycle;
pub mod lora_updates;
pub mod openapi;
pub mod server_info;

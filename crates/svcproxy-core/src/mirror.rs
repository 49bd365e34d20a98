//! Placeholder: being written.
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
pub struct Mirrored {
    pub slices: Vec<EndpointSlice>,
    pub problems: Vec<String>,
}
pub fn endpoints_to_slices(_ep: &Endpoints) -> Mirrored {
    Mirrored {
        slices: vec![],
        problems: vec![],
    }
}

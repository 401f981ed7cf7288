//! `openapi.yaml` at the repository root is generated from the code. This test fails
//! when they drift; `STRATA_UPDATE_OPENAPI=1 cargo test --release --test it openapi::`
//! rewrites the file.

#[test]
fn openapi_yaml_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
    let generated = strata::server::openapi::yaml();
    if std::env::var_os("STRATA_UPDATE_OPENAPI").is_some() {
        let tmp = format!("{path}.tmp");
        std::fs::write(&tmp, &generated).unwrap();
        std::fs::rename(&tmp, path).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi.yaml is out of date: run `STRATA_UPDATE_OPENAPI=1 cargo test --release --test it openapi::`"
    );
}

/// Every route the server answers is in the document.
#[test]
fn every_route_is_documented() {
    let doc = strata::server::openapi::document();
    let paths: Vec<&String> = doc.paths.paths.keys().collect();
    for route in [
        "/",
        "/health",
        "/metrics",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/models",
        "/v1/models/{id}",
        "/v1/embeddings",
        "/api/generate",
        "/api/chat",
        "/api/tags",
        "/api/show",
        "/api/ps",
        "/api/version",
        "/api/embed",
        "/api/embeddings",
        "/api/delete",
        "/api/copy",
    ] {
        assert!(doc.paths.paths.contains_key(route), "{route} is missing from the OpenAPI document: {paths:?}");
    }
}

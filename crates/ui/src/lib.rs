//! The web UI: a single page of plain JavaScript modules and CSS, compiled
//! into the binary with `include_str!`, served at `/` (the page) and
//! `/ui/<file>` (its modules and stylesheet). No build step: the browser
//! loads the files as they are.
//!
//! ```text
//!  browser ── GET / ──────────► index.html
//!          ── GET /ui/app.js ─► ES modules, style.css
//!          ── GET /api/v1/… ──► the querier's HTTP API (docs/api.md)
//! ```
//!
//! Every piece of view state lives in the URL's query string, so the page
//! itself is the same for every view; the modules read the URL and call the
//! API. Assets are small and change only with the binary: they are served
//! with an `ETag` of the build's version and `no-cache`, so a browser
//! revalidates and never runs a stale module against a new API.

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

/// One compiled-in file: name under `/ui/`, content type, body.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

macro_rules! asset {
    ($name:literal, $ct:expr) => {
        Asset {
            name: $name,
            content_type: $ct,
            body: include_str!(concat!("../assets/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file of the UI.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("state.js", JS),
    asset!("format.js", JS),
    asset!("flame.js", JS),
    asset!("icicle.js", JS),
    asset!("chart.js", JS),
    asset!("explore.js", JS),
    asset!("top.js", JS),
    asset!("compare.js", JS),
];

/// A validator that changes with every build of a different version and
/// content size, enough for assets that only change with the binary.
fn etag() -> String {
    let size: usize = ASSETS.iter().map(|a| a.body.len()).sum();
    format!("\"{}-{size}\"", env!("CARGO_PKG_VERSION"))
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(a) = ASSETS.iter().find(|a| a.name == name) else {
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "error": format!("no UI file named {name:?}") })),
        )
            .into_response();
    };
    let tag = etag();
    if headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|v| v.as_bytes() == tag.as_bytes())
    {
        return StatusCode::NOT_MODIFIED.into_response();
    }
    let mut r = a.body.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a.content_type),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(&tag) {
        h.insert(header::ETAG, v);
    }
    r
}

/// The UI's routes: `/` and `/ui/{file}`. Merged next to the query API by
/// every process that serves it (the querier role and `fathom all`).
pub fn router() -> Router {
    Router::new()
        .route(
            "/",
            get(|h: HeaderMap| async move { serve("index.html", &h) }),
        )
        .route(
            "/ui/{file}",
            get(|Path(f): Path<String>, h: HeaderMap| async move { serve(&f, &h) }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{Body, to_bytes};
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(path: &str, inm: Option<&str>) -> (StatusCode, HeaderMap, String) {
        let mut req = Request::get(path);
        if let Some(t) = inm {
            req = req.header(header::IF_NONE_MATCH, t);
        }
        let r = router()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let (parts, body) = r.into_parts();
        let b = to_bytes(body, 1 << 20).await.unwrap();
        (
            parts.status,
            parts.headers,
            String::from_utf8(b.to_vec()).unwrap(),
        )
    }

    #[tokio::test]
    async fn serves_the_page_and_its_modules() {
        let (s, h, body) = get("/", None).await;
        assert_eq!(s, StatusCode::OK);
        assert!(
            h[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        assert!(body.contains("/ui/app.js"), "the page loads the app module");
        let (s, h, body) = get("/ui/app.js", None).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(h[header::CONTENT_TYPE], JS);
        assert!(body.contains("import"));
        // Revalidation.
        let tag = h[header::ETAG].to_str().unwrap().to_owned();
        let (s, _, _) = get("/ui/app.js", Some(&tag)).await;
        assert_eq!(s, StatusCode::NOT_MODIFIED);
    }

    #[tokio::test]
    async fn unknown_file_is_a_json_404() {
        let (s, _, body) = get("/ui/nope.js", None).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["error"].as_str().unwrap().contains("nope.js"), "{body}");
    }

    /// Every module another module imports is served: a missing entry in
    /// ASSETS would break the page only in a browser.
    #[test]
    fn every_imported_module_is_an_asset() {
        for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            for line in a.body.lines() {
                let line = line.trim();
                if !(line.starts_with("import ") || line.starts_with("} from ")) {
                    continue;
                }
                if let Some(i) = line.find("from \"./") {
                    let rest = &line[i + 8..];
                    let name = &rest[..rest.find('"').unwrap()];
                    assert!(
                        ASSETS.iter().any(|x| x.name == name),
                        "{} imports {name}, which is not in ASSETS",
                        a.name
                    );
                }
            }
        }
    }
}

//! Reading a request body: size limit, content type, JSON syntax and shape, each rejected with
//! a 4xx and a JSON body `{"error": ...}` that names the problem and where it is.
//!
//! kube-scheduler discards non-200 bodies, so only malformed input takes this path; logical
//! errors are answered 200 with `Error` set by the verb handlers.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// A rejected request: status plus a message naming the problem.
#[derive(Debug)]
pub struct BadRequest {
    pub status: StatusCode,
    pub message: String,
    /// Short label for metrics.
    pub class: &'static str,
}

impl IntoResponse for BadRequest {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(ct) = ct.to_str() else {
        return false;
    };
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// Reads and decodes a JSON body of at most `limit` bytes into an owned value.
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, BadRequest> {
    decode(&read_body(headers, body, limit).await?)
}

/// Reads a JSON body of at most `limit` bytes, undecoded: for requests that [`decode`] into
/// values borrowing from it.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, BadRequest> {
    if !is_json(headers) {
        let got = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none");
        return Err(BadRequest {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: format!("expected Content-Type: application/json, got {got}"),
            class: "content_type",
        });
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            || e.to_string().contains("length limit");
        if too_large {
            BadRequest {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!(
                    "request body exceeds the limit of {limit} bytes (--body-limit-bytes)"
                ),
                class: "too_large",
            }
        } else {
            BadRequest {
                status: StatusCode::BAD_REQUEST,
                message: format!("failed to read request body: {e}"),
                class: "read",
            }
        }
    })
}

/// Decodes JSON, reporting syntax errors by line/column and shape errors by path. `T` may borrow
/// from `bytes`.
pub fn decode<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, BadRequest> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let result: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = result.map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let (status, class, what) = match inner.classify() {
            serde_json::error::Category::Data => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "shape",
                "request JSON has the wrong shape",
            ),
            serde_json::error::Category::Eof => (
                StatusCode::BAD_REQUEST,
                "syntax",
                "request body is truncated or empty",
            ),
            _ => (
                StatusCode::BAD_REQUEST,
                "syntax",
                "request body is not valid JSON",
            ),
        };
        let at = if path.is_empty() || path == "." {
            String::new()
        } else {
            format!(" at {path}")
        };
        BadRequest {
            status,
            message: format!("{what}{at}: {inner}"),
            class,
        }
    })?;
    de.end().map_err(|e| BadRequest {
        status: StatusCode::BAD_REQUEST,
        message: format!("request body has trailing characters after the JSON value: {e}"),
        class: "syntax",
    })?;
    Ok(value)
}

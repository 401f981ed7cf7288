//! API errors: one type, rendered in the OpenAI, Ollama or Anthropic shape depending on
//! the route family, mapped to HTTP status in exactly one place.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::queue::{JobError, SubmitError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: the request is malformed or a value is out of range.
    InvalidRequest,
    /// 400: the prompt is longer than the model's context.
    ContextLength,
    /// 401: missing or wrong API key.
    Authentication,
    /// 403: a browser page of another site (its `Origin` is not allowed).
    Forbidden,
    /// 404: no such model.
    ModelNotFound,
    /// 404: no such route or resource.
    NotFound,
    /// 405
    MethodNotAllowed,
    /// 413
    PayloadTooLarge,
    /// 429 (OpenAI) / 503 (Ollama): the queue is full.
    QueueFull,
    /// 503: loading or shutting down.
    Unavailable,
    /// 502: a server Strata asked (the model hub) failed or answered wrongly.
    BadGateway,
    /// 507: the disk (or the quota) is full.
    InsufficientStorage,
    /// 500: a real server fault.
    Internal,
}

/// An error with the field it concerns.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError { kind, message: message.into(), param: None }
    }

    /// 400 naming the field: `` `top_p` must be in (0, 1] ``.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        ApiError { kind: ErrorKind::InvalidRequest, message: message.into(), param: Some(param.to_string()) }
    }

    /// 500: the worker dropped a job's channel before its final event.
    pub fn worker_gone() -> Self {
        ApiError::new(ErrorKind::Internal, "the worker ended the job without a result")
    }

    pub fn model_not_found(model: &str) -> Self {
        ApiError::new(ErrorKind::ModelNotFound, format!("model '{model}' not found")).with_param("model")
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    /// OpenAI's 429 for a full queue; Ollama answers 503 for the same.
    pub fn status(&self, family: Family) -> StatusCode {
        match self.kind {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::ModelNotFound | ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorKind::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::QueueFull if family != Family::Ollama => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::QueueFull | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::BadGateway => StatusCode::BAD_GATEWAY,
            ErrorKind::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    pub fn openai_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength => "invalid_request_error",
            ErrorKind::ModelNotFound | ErrorKind::NotFound => "invalid_request_error",
            ErrorKind::MethodNotAllowed => "invalid_request_error",
            ErrorKind::PayloadTooLarge => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::QueueFull => "rate_limit_error",
            ErrorKind::Unavailable | ErrorKind::BadGateway => "server_error",
            ErrorKind::InsufficientStorage | ErrorKind::Internal => "server_error",
        }
    }

    /// OpenAI's `error.code`.
    pub fn openai_code(&self) -> Option<&'static str> {
        match self.kind {
            ErrorKind::ModelNotFound => Some("model_not_found"),
            ErrorKind::ContextLength => Some("context_length_exceeded"),
            ErrorKind::Authentication => Some("invalid_api_key"),
            ErrorKind::Forbidden => Some("origin_not_allowed"),
            ErrorKind::QueueFull => Some("rate_limit_exceeded"),
            ErrorKind::PayloadTooLarge => Some("request_too_large"),
            ErrorKind::MethodNotAllowed => Some("method_not_allowed"),
            ErrorKind::NotFound => Some("not_found"),
            ErrorKind::InsufficientStorage => Some("insufficient_storage"),
            _ => None,
        }
    }

    /// The OpenAI body `{"error":{"message","type","param","code"}}`.
    pub fn openai_body(&self) -> OpenAiErrorBody {
        OpenAiErrorBody {
            error: OpenAiErrorDetail {
                message: self.message.clone(),
                r#type: self.openai_type().to_string(),
                param: self.param.clone(),
                code: self.openai_code().map(str::to_string),
            },
        }
    }

    /// Anthropic's `error.type`.
    pub fn anthropic_type(&self) -> &'static str {
        match self.kind {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength | ErrorKind::MethodNotAllowed => {
                "invalid_request_error"
            }
            ErrorKind::ModelNotFound | ErrorKind::NotFound => "not_found_error",
            ErrorKind::PayloadTooLarge => "request_too_large",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Forbidden => "permission_error",
            ErrorKind::QueueFull => "rate_limit_error",
            ErrorKind::Unavailable => "overloaded_error",
            ErrorKind::BadGateway | ErrorKind::InsufficientStorage | ErrorKind::Internal => "api_error",
        }
    }

    /// The Anthropic body `{"type":"error","error":{"type","message"}}`.
    pub fn anthropic_body(&self) -> AnthropicErrorBody {
        AnthropicErrorBody {
            kind: "error".into(),
            error: AnthropicErrorDetail { kind: self.anthropic_type().into(), message: self.message.clone() },
        }
    }

    /// The Ollama body `{"error":"..."}`.
    pub fn ollama_body(&self) -> OllamaErrorBody {
        OllamaErrorBody { error: self.message.clone() }
    }

    pub fn into_response_for(self, family: Family) -> Response {
        let status = self.status(family);
        // The request log (`request_log`) writes the line, with the method and path.
        let note = super::request_log::ErrorNote(self.message.clone());
        let mut resp = match family {
            Family::OpenAi => (status, axum::Json(self.openai_body())).into_response(),
            Family::Ollama => (status, axum::Json(self.ollama_body())).into_response(),
            Family::Anthropic => (status, axum::Json(self.anthropic_body())).into_response(),
        };
        resp.extensions_mut().insert(note);
        if self.kind == ErrorKind::QueueFull || self.kind == ErrorKind::Unavailable {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}

/// Which API a route belongs to (decides the error shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    OpenAi,
    Ollama,
    /// Anthropic's Messages API (`/v1/messages`).
    Anthropic,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub r#type: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub error: AnthropicErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `permission_error`,
    /// `not_found_error`, `request_too_large`, `rate_limit_error`, `api_error` or
    /// `overloaded_error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub message: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OllamaErrorBody {
    pub error: String,
}

/// An [`ApiError`] answered in the OpenAI shape.
pub struct OpenAiError(pub ApiError);
/// An [`ApiError`] answered in the Ollama shape.
pub struct OllamaError(pub ApiError);
/// An [`ApiError`] answered in the Anthropic shape.
pub struct AnthropicError(pub ApiError);

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.into_response_for(Family::Anthropic)
    }
}

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        self.0.into_response_for(Family::OpenAi)
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        self.0.into_response_for(Family::Ollama)
    }
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        OpenAiError(e)
    }
}

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Full => ApiError::new(ErrorKind::QueueFull, "the request queue is full; retry shortly"),
            SubmitError::Closed => ApiError::new(ErrorKind::Unavailable, "the server is shutting down"),
        }
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::ModelNotFound(m) => ApiError::model_not_found(&m),
            JobError::Invalid { param, message } => {
                ApiError { kind: ErrorKind::InvalidRequest, message, param: param.map(str::to_string) }
            }
            JobError::ContextLength { param, message } => {
                ApiError { kind: ErrorKind::ContextLength, message, param: Some(param.to_string()) }
            }
            JobError::Internal(m) => ApiError::new(ErrorKind::Internal, m),
            JobError::Device(m) => ApiError::new(ErrorKind::Unavailable, m),
            JobError::ShuttingDown => ApiError::new(ErrorKind::Unavailable, "the server is shutting down"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Device trouble (GPU memory, a failed launch; see the queue worker's `model_error`)
    /// is a 503 whose message is the job's; other internal errors are 500s.
    #[test]
    fn job_device_errors_are_503_and_internal_500() {
        let api = ApiError::from(JobError::Device("model `m`: GPU memory exhausted".into()));
        assert_eq!(api.status(Family::OpenAi), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(api.message, "model `m`: GPU memory exhausted");
        let api = ApiError::from(JobError::Internal("model `m`: no tensor x".into()));
        assert_eq!(api.status(Family::Ollama), StatusCode::INTERNAL_SERVER_ERROR);
    }
}

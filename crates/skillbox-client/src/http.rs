//! `HttpSkillSandbox`: a `SkillSandbox` that is a `skillbox serve` somewhere else.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::{
    ApiError, ClientError, ErrorCode, MAX_TIMEOUT_MS, RunRequest, RunResult, SkillSandbox,
};

/// Talks to `skillbox serve` at `base` (e.g. `http://127.0.0.1:8080`).
#[derive(Debug, Clone)]
pub struct HttpSkillSandbox {
    base: String,
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer …` when set (a server with API keys needs it).
    api_key: Option<String>,
}

impl HttpSkillSandbox {
    pub fn new(base: impl Into<String>) -> Result<Self, ClientError> {
        let base = base.into().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::new(
                ErrorCode::Invalid,
                format!("remote URL {base:?}: must start with http:// or https://"),
            ));
        }
        let http = reqwest::Client::builder()
            // The longest run, plus time to store and answer.
            .timeout(Duration::from_millis(MAX_TIMEOUT_MS + 60_000))
            .build()
            .map_err(|e| ClientError::new(ErrorCode::Unavailable, format!("http client: {e}")))?;
        Ok(HttpSkillSandbox {
            base,
            http,
            api_key: None,
        })
    }

    /// Sends `token` as the bearer token of every request (`skillbox keys new` makes one).
    pub fn with_api_key(mut self, token: impl Into<String>) -> Self {
        self.api_key = Some(token.into());
        self
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub(crate) fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub(crate) async fn error_of(response: reqwest::Response) -> ClientError {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        match serde_json::from_str::<ApiError>(&body) {
            Ok(api) => ClientError::new(api.error.code, api.error.message),
            Err(_) => ClientError::new(
                ErrorCode::Unknown,
                format!(
                    "HTTP {status}: {}",
                    body.chars().take(500).collect::<String>()
                ),
            ),
        }
    }

    pub(crate) fn transport(&self, e: reqwest::Error) -> ClientError {
        ClientError::new(ErrorCode::Unavailable, format!("{}: {e}", self.base))
    }
}

#[async_trait]
impl SkillSandbox for HttpSkillSandbox {
    async fn run(&self, request: RunRequest) -> Result<RunResult, ClientError> {
        let response = self
            .authorized(self.http.post(format!("{}/v1/run", self.base)))
            .json(&request)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        if !response.status().is_success() {
            return Err(Self::error_of(response).await);
        }
        response.json::<RunResult>().await.map_err(|e| {
            ClientError::new(
                ErrorCode::Invalid,
                format!("{}: the answer is not a RunResult: {e}", self.base),
            )
        })
    }

    async fn download(&self, sha256: &str) -> Result<Bytes, ClientError> {
        let response = self
            .authorized(self.http.get(format!("{}/v1/objects/{sha256}", self.base)))
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        if !response.status().is_success() {
            return Err(Self::error_of(response).await);
        }
        response.bytes().await.map_err(|e| self.transport(e))
    }
}

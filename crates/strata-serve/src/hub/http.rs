//! Requests to the hub: status mapping, retries with backoff, URLs and headers.

use ureq::http::Response;

use super::hash::Hasher;
use super::{HubClient, HubError, MAX_JSON_BYTES, RemoteFile};

/// Why one attempt failed: worth retrying, or not.
pub(super) enum Failure {
    Transient(String),
    Fatal(HubError),
}

impl From<HubError> for Failure {
    fn from(e: HubError) -> Self {
        Failure::Fatal(e)
    }
}

/// What a request was for, to name it in a 404 or 401.
pub(super) struct Ctx<'a> {
    pub repo: &'a str,
    pub revision: &'a str,
    pub file: Option<&'a str>,
}

impl HubClient {
    /// Counts a failed attempt (progress resets the count) and waits, or gives up.
    pub(super) fn after_failure(
        &self,
        url: &str,
        msg: String,
        failures: &mut u32,
        progressed: bool,
    ) -> Result<(), HubError> {
        *failures = if progressed { 1 } else { *failures + 1 };
        if *failures >= self.retry.attempts {
            return Err(HubError::Network {
                url: url.to_string(),
                msg: format!("{msg} (gave up after {failures} tries)"),
            });
        }
        tracing::warn!(url, error = %msg, "download interrupted; retrying");
        std::thread::sleep(self.retry.backoff(*failures));
        Ok(())
    }

    /// A small file (the safetensors index) into memory, verified.
    pub(super) fn fetch_small(&self, repo: &str, commit: &str, file: &RemoteFile) -> Result<Vec<u8>, HubError> {
        let url = self.resolve_url(repo, commit, &file.path);
        if file.size > MAX_JSON_BYTES {
            return Err(HubError::BadResponse { url, msg: format!("{} is {} bytes", file.path, file.size) });
        }
        let ctx = Ctx { repo, revision: commit, file: Some(&file.path) };
        let bytes = self.with_retries(&url, || {
            let mut resp = self.request(&url, 0).map_err(|e| classify_ureq(&url, e))?;
            self.check_status(&resp, &url, &ctx)?;
            resp.body_mut()
                .with_config()
                .limit(MAX_JSON_BYTES)
                .read_to_vec()
                .map_err(|e| Failure::Transient(format!("reading the body: {e}")))
        })?;
        let mut hasher = Hasher::new(file);
        hasher.update(&bytes);
        let actual = hasher.finish();
        let (check, expected, actual) = if bytes.len() as u64 != file.size {
            ("size", file.size.to_string(), bytes.len().to_string())
        } else {
            ("digest", file.digest.hex().to_string(), actual)
        };
        if expected != actual {
            return Err(HubError::Integrity { file: file.path.clone(), check, expected, actual });
        }
        Ok(bytes)
    }

    /// A JSON answer, and the `rel="next"` link of its `Link` header.
    pub(super) fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        ctx: &Ctx<'_>,
    ) -> Result<(T, Option<String>), HubError> {
        let (bytes, next) = self.with_retries(url, || {
            let mut resp = self.request(url, 0).map_err(|e| classify_ureq(url, e))?;
            self.check_status(&resp, url, ctx)?;
            let next = header(&resp, "link").and_then(|l| next_link(&l));
            let bytes = resp
                .body_mut()
                .with_config()
                .limit(MAX_JSON_BYTES)
                .read_to_vec()
                .map_err(|e| Failure::Transient(format!("reading the body: {e}")))?;
            Ok((bytes, next))
        })?;
        let value = serde_json::from_slice(&bytes)
            .map_err(|e| HubError::BadResponse { url: url.to_string(), msg: format!("invalid JSON: {e}") })?;
        Ok((value, next))
    }

    pub(super) fn with_retries<T>(
        &self,
        url: &str,
        mut attempt: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T, HubError> {
        let mut failures = 0;
        loop {
            match attempt() {
                Ok(v) => return Ok(v),
                Err(Failure::Fatal(e)) => return Err(e),
                Err(Failure::Transient(msg)) => self.after_failure(url, msg, &mut failures, false)?,
            }
        }
    }

    pub(super) fn request(&self, url: &str, from: u64) -> Result<Response<ureq::Body>, ureq::Error> {
        let mut req = self.agent.get(url).header("Accept-Encoding", "identity");
        if let Some(token) = &self.token {
            req = req.header("Authorization", format!("Bearer {token}"));
        }
        if from > 0 {
            req = req.header("Range", format!("bytes={from}-"));
        }
        req.call()
    }

    /// Maps an error status to an error naming what was asked for.
    pub(super) fn check_status(&self, resp: &Response<ureq::Body>, url: &str, ctx: &Ctx<'_>) -> Result<(), Failure> {
        let status = resp.status().as_u16();
        let code = header(resp, "x-error-code");
        let detail = header(resp, "x-error-message");
        let url = url.to_string();
        match status {
            200..=299 => Ok(()),
            408 | 429 | 500..=599 => Err(Failure::Transient(format!("HTTP {status}"))),
            401 | 403 => {
                let repo = ctx.repo;
                let hint = match (&self.token, code.as_deref()) {
                    (None, _) => format!(
                        "`{repo}` may be private or gated, or may not exist: set HF_TOKEN to a Hugging Face access token that can read it"
                    ),
                    (Some(_), Some("GatedRepo")) => format!(
                        "`{repo}` is gated: accept its conditions on the hub with the account whose token is in HF_TOKEN"
                    ),
                    (Some(_), _) => {
                        format!("the hub refused the token in HF_TOKEN: check that it is valid and can read `{repo}`")
                    }
                };
                let msg = match detail {
                    Some(d) => format!("{d}; {hint}"),
                    None => hint,
                };
                Err(HubError::Unauthorized { url, status, msg }.into())
            }
            404 => {
                let (repo, rev) = (ctx.repo, ctx.revision);
                let what = match (code.as_deref(), ctx.file) {
                    (Some("RepoNotFound"), _) => format!("repository `{repo}`"),
                    (Some("RevisionNotFound"), _) => format!("revision `{rev}` of `{repo}`"),
                    (_, Some(file)) => format!("file `{file}` of `{repo}` at `{rev}`"),
                    (_, None) => format!("repository `{repo}` at revision `{rev}`"),
                };
                Err(HubError::NotFound { what, url }.into())
            }
            _ => {
                let msg = detail.map(|d| format!(": {d}")).unwrap_or_default();
                Err(HubError::Http { url, status, msg }.into())
            }
        }
    }

    /// A `Link` target may be relative to the endpoint's origin.
    pub(super) fn absolute(&self, link: &str) -> String {
        if link.starts_with("http://") || link.starts_with("https://") {
            return link.to_string();
        }
        let scheme_end = self.endpoint.find("://").map_or(0, |i| i + 3);
        let origin_end = self.endpoint[scheme_end..].find('/').map_or(self.endpoint.len(), |i| scheme_end + i);
        format!("{}{link}", &self.endpoint[..origin_end])
    }
}

/// Dropped connections and timeouts are worth retrying; certificate and TLS failures
/// (which rustls reports as `InvalidData`), bad URLs and unknown hosts are not.
pub(super) fn classify_ureq(url: &str, e: ureq::Error) -> Failure {
    use ureq::Error as E;
    match e {
        E::Io(ref io) if io.kind() == std::io::ErrorKind::InvalidData => {
            Failure::Fatal(HubError::Network { url: url.to_string(), msg: e.to_string() })
        }
        E::Io(_) | E::Timeout(_) | E::ConnectionFailed | E::Protocol(_) => Failure::Transient(e.to_string()),
        E::BodyExceedsLimit(n) => {
            Failure::Fatal(HubError::BadResponse { url: url.to_string(), msg: format!("the answer exceeds {n} bytes") })
        }
        other => Failure::Fatal(HubError::Network { url: url.to_string(), msg: other.to_string() }),
    }
}

pub(super) fn header(resp: &Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// The URL of the `rel="next"` entry of a `Link` header.
pub(super) fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.trim().split_once(';')?;
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        let next = params.split(';').any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"));
        next.then(|| target.to_string())
    })
}

/// The first byte of a `Content-Range: bytes START-END/TOTAL` header.
pub(super) fn parse_content_range_start(value: &str) -> Option<u64> {
    let range = value.trim().strip_prefix("bytes ")?;
    range.split_once('-')?.0.trim().parse().ok()
}

/// Percent-encodes like Python's `urllib.parse.quote` (`/` kept only when asked).
pub(super) fn quote(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub(super) fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_matches_python_quote() {
        assert_eq!(quote("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(quote("main", false), "main");
        assert_eq!(quote("dir/a b+c.json", true), "dir/a%20b%2Bc.json");
        assert_eq!(quote("é~_.-", true), "%C3%A9~_.-");
    }

    #[test]
    fn next_links_are_found_among_others() {
        let h = r#"<https://hf.co/api/models/x/tree/main?cursor=abc&recursive=true>; rel="next""#;
        assert_eq!(next_link(h).as_deref(), Some("https://hf.co/api/models/x/tree/main?cursor=abc&recursive=true"));
        let h = r#"<https://a/prev>; rel="prev", </api/next>; rel="next""#;
        assert_eq!(next_link(h).as_deref(), Some("/api/next"));
        assert_eq!(next_link(r#"<https://a/prev>; rel="prev""#), None);
        assert_eq!(next_link("garbage"), None);
    }

    #[test]
    fn relative_links_join_the_endpoint_origin() {
        let c = HubClient::new("http://127.0.0.1:9/mirror/", None).unwrap();
        assert_eq!(c.endpoint(), "http://127.0.0.1:9/mirror");
        assert_eq!(c.absolute("/api/x?cursor=1"), "http://127.0.0.1:9/api/x?cursor=1");
        assert_eq!(c.absolute("https://other/y"), "https://other/y");
        let c = HubClient::new("https://hf.co", None).unwrap();
        assert_eq!(c.absolute("/api/x"), "https://hf.co/api/x");
        assert_eq!(
            c.resolve_url("org/m", "refs/pr/2", "a b.json"),
            "https://hf.co/org/m/resolve/refs%2Fpr%2F2/a%20b.json"
        );
    }

    #[test]
    fn content_range_start_is_parsed() {
        assert_eq!(parse_content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(parse_content_range_start("bytes 0-0/1"), Some(0));
        assert_eq!(parse_content_range_start("bytes */200"), None);
        assert_eq!(parse_content_range_start(""), None);
    }
}

//! A request's own speculative decoding settings: the `speculative` object every
//! generation route takes, and llama-server's flat `speculative.n_max`,
//! `speculative.n_min` and `speculative.p_min` keys on `/v1`, checked into the engine's
//! [`SpecRequest`] once, here.

use serde::Deserialize;
use utoipa::ToSchema;

use super::error::ApiError;
use strata_engine::speculative::{MAX_DRAFT, SpecKind, SpecRequest};

/// `speculative`: how this request speculates; each field left out takes the model's
/// (`--draft`, `--draft-max`, `--draft-min`, `--draft-p-min`).
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct SpeculativeOptions {
    /// `draft` (the draft model the server loaded beside the model), `ngram` (drafts from
    /// the context) or `off`.
    #[serde(rename = "type")]
    #[schema(pattern = "^(draft|ngram|off)$", example = "ngram")]
    pub kind: Option<String>,
    /// Tokens drafted at most per step, 0..=64 (0: no speculation).
    #[schema(minimum = 0, maximum = 64)]
    pub n_max: Option<i64>,
    /// Fewer drafted tokens than this are not verified; at most `n_max`.
    #[schema(minimum = 0, maximum = 64)]
    pub n_min: Option<i64>,
    /// A draft model stops proposing where its most likely token is less likely than
    /// this, in [0, 1].
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub p_min: Option<f64>,
}

/// llama-server's flat keys (`"speculative.n_max": 8`), as a request gave them.
#[derive(Debug, Default)]
pub struct FlatKeys {
    pub n_max: Option<i64>,
    pub n_min: Option<i64>,
    pub p_min: Option<f64>,
}

/// `speculative` and the flat keys as a [`SpecRequest`]. Every error names its field; a
/// field given both ways is refused. Whether the model has a draft model for `draft` is
/// known where the request runs (a 400 from there).
pub fn spec_request(options: Option<SpeculativeOptions>, flat: FlatKeys) -> Result<SpecRequest, ApiError> {
    let o = options.unwrap_or_default();
    let kind = match o.kind.as_deref() {
        None => None,
        Some("draft") => Some(SpecKind::Draft),
        Some("ngram") => Some(SpecKind::Ngram),
        Some("off") => Some(SpecKind::Off),
        Some(other) => {
            return Err(ApiError::invalid(
                "speculative.type",
                format!("`speculative.type` must be draft, ngram or off, not `{other:.32}`"),
            ));
        }
    };
    let max = count("speculative.n_max", once("speculative.n_max", o.n_max, flat.n_max)?)?;
    let min = count("speculative.n_min", once("speculative.n_min", o.n_min, flat.n_min)?)?;
    if let (Some(min), Some(max)) = (min, max)
        && min > max
    {
        return Err(ApiError::invalid(
            "speculative.n_min",
            "`speculative.n_min` must not be more than `speculative.n_max`",
        ));
    }
    let p_min = match once("speculative.p_min", o.p_min, flat.p_min)? {
        None => None,
        Some(p) if p.is_finite() && (0.0..=1.0).contains(&p) => Some(p as f32),
        Some(_) => return Err(ApiError::invalid("speculative.p_min", "`speculative.p_min` must be in [0, 1]")),
    };
    Ok(SpecRequest { kind, max, min, p_min })
}

/// The value of `field`, given in `speculative` or as its flat key, not both.
fn once<T>(field: &str, nested: Option<T>, flat: Option<T>) -> Result<Option<T>, ApiError> {
    match (nested, flat) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            field,
            format!("`{field}` is given twice: in the `speculative` object and as the key `{field}`"),
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// A token count in 0..=[`MAX_DRAFT`].
fn count(field: &str, value: Option<i64>) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(n) if n < 0 => Err(ApiError::invalid(field, format!("`{field}` must be at least 0"))),
        Some(n) if n > MAX_DRAFT as i64 => {
            Err(ApiError::invalid(field, format!("`{field}` must be at most {MAX_DRAFT}")))
        }
        Some(n) => Ok(Some(n as usize)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(kind: Option<&str>, n_max: Option<i64>, n_min: Option<i64>, p_min: Option<f64>) -> SpeculativeOptions {
        SpeculativeOptions { kind: kind.map(str::to_string), n_max, n_min, p_min }
    }

    #[test]
    fn the_object_and_the_flat_keys_become_the_requests_settings() {
        let got = spec_request(Some(options(Some("ngram"), Some(8), None, Some(0.5))), FlatKeys::default()).unwrap();
        assert_eq!(got, SpecRequest { kind: Some(SpecKind::Ngram), max: Some(8), min: None, p_min: Some(0.5) });
        let flat = FlatKeys { n_max: Some(4), n_min: Some(2), p_min: None };
        let got = spec_request(Some(options(Some("off"), None, None, None)), flat).unwrap();
        assert_eq!(got, SpecRequest { kind: Some(SpecKind::Off), max: Some(4), min: Some(2), p_min: None });
        assert_eq!(spec_request(None, FlatKeys::default()).unwrap(), SpecRequest::default());
    }

    #[test]
    fn bad_values_are_refused_naming_the_field() {
        let err = |o: SpeculativeOptions, flat: FlatKeys| {
            let e = spec_request(Some(o), flat).unwrap_err();
            (e.param.clone().unwrap_or_default(), e.message.clone())
        };
        let (param, msg) = err(options(None, Some(65), None, None), FlatKeys::default());
        assert_eq!((param.as_str(), msg.as_str()), ("speculative.n_max", "`speculative.n_max` must be at most 64"));
        let (param, _) = err(options(None, None, Some(-1), None), FlatKeys::default());
        assert_eq!(param, "speculative.n_min");
        let (param, msg) = err(options(None, Some(2), Some(3), None), FlatKeys::default());
        assert_eq!(param, "speculative.n_min");
        assert!(msg.contains("not be more than"), "{msg}");
        let (param, _) = err(options(None, None, None, Some(1.5)), FlatKeys::default());
        assert_eq!(param, "speculative.p_min");
        let (param, msg) = err(options(Some("eagle"), None, None, None), FlatKeys::default());
        assert_eq!(param, "speculative.type");
        assert!(msg.contains("draft, ngram or off"), "{msg}");
        let (param, msg) = err(options(None, Some(2), None, None), FlatKeys { n_max: Some(2), ..FlatKeys::default() });
        assert_eq!(param, "speculative.n_max");
        assert!(msg.contains("given twice"), "{msg}");
    }
}

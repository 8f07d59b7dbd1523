//! The tracing flags, each also read from an upper-case environment variable.

/// The path OTLP/HTTP receivers take traces on.
const TRACES_PATH: &str = "/v1/traces";

/// Where and how much to trace (TGI's flag names).
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct OtlpArgs {
    /// Export request traces to this OTLP/HTTP (protobuf) receiver, e.g.
    /// `http://otel-collector:4318` (`/v1/traces` is appended unless the URL ends with it).
    /// Unset: no tracing at all.
    #[arg(long, env = "OTLP_ENDPOINT", value_parser = endpoint)]
    pub otlp_endpoint: Option<String>,
    /// Share of requests traced, from 0 to 1, when the client sent no `traceparent` (one that
    /// it sent decides by its sampled flag).
    #[arg(long, env = "OTLP_SAMPLE_RATIO", default_value_t = 1.0, value_parser = ratio)]
    pub otlp_sample_ratio: f64,
    /// `service.name` of the router's spans.
    #[arg(long, env = "OTLP_SERVICE_NAME", default_value = "tandem.router")]
    pub otlp_service_name: String,
}

/// An `http://` or `https://` URL.
fn endpoint(text: &str) -> Result<String, String> {
    let lowered = text.to_ascii_lowercase();
    let scheme = ["http://", "https://"]
        .iter()
        .find(|scheme| lowered.starts_with(**scheme));
    match scheme {
        Some(scheme) if text.len() > scheme.len() => Ok(text.to_owned()),
        _ => Err(format!(
            "expected an http:// or https:// URL such as http://otel-collector:4318, got {text:?}"
        )),
    }
}

/// A number from 0 to 1.
fn ratio(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if (0.0..=1.0).contains(&value) => Ok(value),
        _ => Err(format!("expected a number from 0 to 1, got {text:?}")),
    }
}

/// The URL spans are posted to: `endpoint` with `/v1/traces` appended, unless it ends with it.
pub fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with(TRACES_PATH) {
        base.to_owned()
    } else {
        format!("{base}{TRACES_PATH}")
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        otlp: OtlpArgs,
    }

    #[test]
    fn tracing_is_off_by_default_and_the_flags_are_checked_when_given() {
        let defaults = Cli::try_parse_from(["router"]).expect("no flags").otlp;
        assert_eq!(defaults.otlp_endpoint, None);
        assert_eq!(defaults.otlp_sample_ratio, 1.0);
        assert_eq!(defaults.otlp_service_name, "tandem.router");
        let given = Cli::try_parse_from([
            "router",
            "--otlp-endpoint",
            "http://collector:4318",
            "--otlp-sample-ratio",
            "0.1",
        ])
        .expect("valid flags")
        .otlp;
        assert_eq!(
            given.otlp_endpoint.as_deref(),
            Some("http://collector:4318")
        );
        assert_eq!(given.otlp_sample_ratio, 0.1);
        for wrong in [
            ["--otlp-sample-ratio", "2"],
            ["--otlp-endpoint", "collector:4317"],
        ] {
            let error = Cli::try_parse_from(["router", wrong[0], wrong[1]]).expect_err("refused");
            assert!(error.to_string().contains(wrong[0]), "{error}");
        }
    }

    #[test]
    fn the_traces_path_is_appended_once() {
        assert_eq!(
            traces_url("http://collector:4318"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://collector:4318/"),
            "http://collector:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://collector/otlp/v1/traces"),
            "https://collector/otlp/v1/traces"
        );
    }

    #[test]
    fn endpoints_must_be_http_urls_and_ratios_fractions() {
        assert!(endpoint("http://localhost:4318").is_ok());
        assert!(endpoint("HTTPS://collector").is_ok());
        assert!(endpoint("localhost:4317").is_err());
        assert!(endpoint("http://").is_err());
        assert_eq!(ratio("0.25"), Ok(0.25));
        assert_eq!(ratio("1"), Ok(1.0));
        assert!(ratio("1.5").is_err());
        assert!(ratio("-0.1").is_err());
        assert!(ratio("NaN").is_err());
    }
}

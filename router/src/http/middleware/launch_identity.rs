//! The launch id: every `/health` answer carries the id the launcher wrote to
//! `--launch-id-file`, so the launcher tells its own router from another process holding the
//! port before it sends that port an API key.

use std::path::{Path, PathBuf};

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

use crate::http::state::AppState;

pub const LAUNCH_ID_HEADER: &str = "x-tandem-launch-id";
/// Longer than any id the launcher writes; a bigger file is not a launch id.
const MAX_LAUNCH_ID_LEN: usize = 256;

/// Why `--launch-id-file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LaunchIdError {
    #[error("cannot read --launch-id-file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--launch-id-file {path} must hold one id of printable ASCII (at most {MAX_LAUNCH_ID_LEN} bytes)")]
    Invalid { path: PathBuf },
}

/// The id in `path`, surrounding whitespace ignored, as the header value it is sent as.
pub fn read_launch_id(path: &Path) -> Result<HeaderValue, LaunchIdError> {
    let text = std::fs::read_to_string(path).map_err(|source| LaunchIdError::Read {
        path: path.to_owned(),
        source,
    })?;
    let id = text.trim();
    let printable = id.bytes().all(|byte| byte.is_ascii_graphic());
    if id.is_empty() || id.len() > MAX_LAUNCH_ID_LEN || !printable {
        return Err(LaunchIdError::Invalid {
            path: path.to_owned(),
        });
    }
    HeaderValue::from_str(id).map_err(|_| LaunchIdError::Invalid {
        path: path.to_owned(),
    })
}

/// Middleware on `/health`: the answer, whatever its status, carries the launch id.
pub async fn answer_with_launch_id(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if let Some(id) = &state.launch_id {
        response.headers_mut().insert(LAUNCH_ID_HEADER, id.clone());
    }
    response
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn file_with(contents: &str) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(contents.as_bytes()).unwrap();
        file
    }

    #[test]
    fn the_launch_id_is_read_without_its_newline() {
        let file = file_with("3f9a0c\n");
        assert_eq!(read_launch_id(file.path()).unwrap(), "3f9a0c");
    }

    #[test]
    fn an_empty_spaced_or_missing_launch_id_file_is_refused() {
        for contents in ["", " \n", "two words", &"x".repeat(MAX_LAUNCH_ID_LEN + 1)] {
            let file = file_with(contents);
            assert!(matches!(
                read_launch_id(file.path()),
                Err(LaunchIdError::Invalid { .. })
            ));
        }
        let missing = read_launch_id(Path::new("/nonexistent/launch-id"));
        assert!(matches!(missing, Err(LaunchIdError::Read { .. })));
    }
}

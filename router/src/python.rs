//! The Python extension module: lets `uv sync` install the router as the `tandem-router` command.

use pyo3::prelude::*;

/// Runs the router with `argv` (program name first); returns the process exit status.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| crate::main_with_args(argv))
}

/// The prompt a `/v1/chat/completions` body (JSON) becomes under the Jinja `template`.
#[pyfunction]
#[pyo3(signature = (template, body, bos_token=None, eos_token=None))]
fn render_chat(
    template: &str,
    body: &str,
    bos_token: Option<String>,
    eos_token: Option<String>,
) -> PyResult<String> {
    crate::http::render_chat_request(template, bos_token, eos_token, body)
        .map_err(pyo3::exceptions::PyValueError::new_err)
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(run, module)?)?;
    module.add_function(wrap_pyfunction!(render_chat, module)?)
}

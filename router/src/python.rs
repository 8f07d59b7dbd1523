//! The Python extension module: lets `uv sync` install the router as the `tandem-router` command.

use pyo3::prelude::*;

/// Runs the router with `argv` (program name first); returns the process exit status.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| crate::main_with_args(argv))
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(run, module)?)
}

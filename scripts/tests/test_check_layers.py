"""The layering check fails on import cycles between modules and passes on a layered crate."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_layers import main


def write_crate(root: Path, files: dict[str, str]) -> Path:
    src = root / "src"
    for name, text in files.items():
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return src


def test_two_files_importing_each_other_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_crate(
        tmp_path,
        {
            "lib.rs": "pub mod config;\npub mod server;\n",
            "config.rs": "use crate::server::Server;\npub struct Config;\n",
            "server.rs": "pub struct Server;\nfn run(_: crate::config::Config) {}\n",
        },
    )
    assert main([str(src)]) == 1
    errors = capsys.readouterr().err
    assert "top-level modules import each other in a cycle: config, server" in errors
    assert "config.rs and server.rs import each other" in errors


def test_a_cycle_through_three_top_level_modules_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_crate(
        tmp_path,
        {
            "lib.rs": "pub mod http;\npub mod metrics;\npub mod scheduler;\n",
            "http/mod.rs": "mod info;\nuse crate::scheduler::Handle;\n",
            "http/info.rs": "pub struct ServerInfo;\n",
            "metrics/mod.rs": "pub fn record_info(_: &crate::http::info::ServerInfo) {}\n",
            "scheduler/mod.rs": "pub struct Handle;\nfn step() { crate::metrics::record_info(todo()) }\n",
        },
    )
    assert main([str(src)]) == 1
    assert "cycle: http, metrics, scheduler" in capsys.readouterr().err


def test_sibling_files_importing_each_other_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_crate(
        tmp_path,
        {
            "lib.rs": "pub mod validation;\n",
            "validation/mod.rs": "mod params;\nmod processors;\n",
            "validation/params.rs": "use super::processors::{self, Bias};\n",
            "validation/processors.rs": "pub struct Bias;\nfn f() -> super::params::Params { todo!() }\n",
        },
    )
    assert main([str(src)]) == 1
    assert "validation/params.rs and validation/processors.rs import each other" in capsys.readouterr().err


def test_a_layered_crate_with_parent_child_imports_passes(tmp_path: Path) -> None:
    src = write_crate(
        tmp_path,
        {
            "lib.rs": "pub mod pb { pub struct Step; }\npub mod scheduler;\npub mod kv;\n",
            "kv/mod.rs": "mod pool;\npub use pool::Pool;\npub struct Block;\n",
            "kv/pool.rs": "use super::Block;\npub struct Pool;\n",
            "scheduler/mod.rs": (
                "mod metrics;\nuse crate::kv::{self, Pool};\nuse crate::pb;\n"
                "// crate::http::App is only a comment\n"
                'const NAME: &str = "crate::http::App";\n'
                "fn f<'a>(c: char) -> bool { c == '{' }\n"
                "#[cfg(test)]\nmod tests {\n    fn g() { super::metrics::record(); }\n}\n"
            ),
            "scheduler/metrics.rs": "pub fn record() {}\nfn h() -> super::super::kv::Block { todo!() }\n",
        },
    )
    assert main([str(src)]) == 0

"""Artifacts: stored on the local disk or any fsspec URL, handed downstream by URI, deleted with
their run."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from treadle import TaskContext, dag, task
from treadle.authoring.artifacts import Artifacts, delete_run_files, run_folder
from treadle.config import Settings
from treadle.errors import ConfigError
from treadle.testing import run_dag


def test_local_artifacts_round_trip_and_are_replaced_atomically(tmp_path: Path) -> None:
    arts = Artifacts(run_id="r1", task_id="extract", home=tmp_path)
    uri = arts.put("data.bin", b"\x00\x01" * 1000)
    assert uri.startswith("file://") and "/runs/r1/artifacts/extract/data.bin" in uri
    assert arts.get(uri) == b"\x00\x01" * 1000
    source = tmp_path / "big.csv"
    source.write_text("a,b\n1,2\n")
    assert arts.get(arts.put("data.bin", source)) == b"a,b\n1,2\n"  # a path is copied; same name replaced
    assert not list((run_folder(tmp_path, "r1") / "artifacts" / "extract").glob(".*partial"))
    other = Artifacts(run_id="r2", task_id="load", home=tmp_path)
    assert other.get(uri) == b"a,b\n1,2\n"  # any task reads by URI


@pytest.mark.parametrize("name", ["", "../x", "a/b", "..", "with space"])
def test_bad_names_are_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="artifact name must match"):
        Artifacts(run_id="r", task_id="t", home=tmp_path).put(name, b"x")


def test_uris_outside_the_deployment_are_refused(tmp_path: Path) -> None:
    arts = Artifacts(run_id="r", task_id="t", home=tmp_path / "home")
    secret = tmp_path / "secret"
    secret.write_text("no")
    with pytest.raises(ValueError, match="not an artifact of this deployment"):
        arts.get(secret.as_uri())
    with pytest.raises(ValueError, match="not a local artifact URI"):
        arts.get("/etc/passwd")
    with pytest.raises(FileNotFoundError, match="is not a file"):
        arts.put("x", tmp_path / "missing")


def test_fsspec_artifacts_round_trip_and_go_with_their_run(tmp_path: Path) -> None:
    url = f"memory://treadle-{uuid.uuid4().hex}"
    arts = Artifacts(run_id="r1", task_id="t", home=tmp_path, url=url)
    uri = arts.put("x.json", b"{}")
    assert uri == f"{url}/r1/t/x.json" and arts.get(uri) == b"{}"
    keep = Artifacts(run_id="r2", task_id="t", home=tmp_path, url=url).put("y", b"1")
    with pytest.raises(ValueError, match="not an artifact of this deployment"):
        arts.get("memory://elsewhere/r1/t/x.json")
    assert delete_run_files(tmp_path, ["r1"], artifacts_url=url) == 1
    with pytest.raises(FileNotFoundError):
        arts.get(uri)
    assert arts.get(keep) == b"1"


def test_local_run_files_are_deleted_with_the_run(tmp_path: Path) -> None:
    Artifacts(run_id="old", task_id="t", home=tmp_path).put("a", b"1")
    Artifacts(run_id="new", task_id="t", home=tmp_path).put("a", b"1")
    assert delete_run_files(tmp_path, ["old", "never-existed", "../escape"]) == 1
    assert not run_folder(tmp_path, "old").exists() and run_folder(tmp_path, "new").exists()


def test_a_bad_artifacts_url_is_a_config_error_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TREADLE_ARTIFACTS_URL must be an fsspec URL"):
        Settings.from_env({"TREADLE_HOME": str(tmp_path), "TREADLE_ARTIFACTS_URL": "bucket/prefix"})
    with pytest.raises(ConfigError, match="no filesystem for 'nosuchfs'"):
        Settings.from_env({"TREADLE_HOME": str(tmp_path), "TREADLE_ARTIFACTS_URL": "nosuchfs://x"})
    ok = Settings.from_env({"TREADLE_HOME": str(tmp_path), "TREADLE_ARTIFACTS_URL": "memory://x"})
    assert ok.artifacts_url == "memory://x"


def test_without_fsspec_local_artifacts_work_and_a_url_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)  # what `import fsspec` finds when not installed
    arts = Artifacts(run_id="r1", task_id="t", home=tmp_path)
    assert arts.get(arts.put("a", b"1")) == b"1"
    assert delete_run_files(tmp_path, ["r1"]) == 1
    env = {"TREADLE_HOME": str(tmp_path)}
    wanted = {
        "s3://bucket/treadle": "pip install 'treadle[artifacts]' s3fs",
        "gs://bucket/treadle": "pip install 'treadle[artifacts]' gcsfs",
        "file:///mnt/shared": "pip install 'treadle[artifacts]'",
        "webdav://host/x": "pip install 'treadle[artifacts]' and the fsspec filesystem package for webdav://",
    }
    for url, hint in wanted.items():
        with pytest.raises(ConfigError) as error:
            Settings.from_env({**env, "TREADLE_ARTIFACTS_URL": url})
        scheme = url.split(":", 1)[0]
        assert str(error.value) == (
            f"TREADLE_ARTIFACTS_URL is set (scheme {scheme}://), but fsspec is not installed: {hint}"
        )
    with pytest.raises(
        ConfigError, match=r"fsspec is not installed: pip install 'treadle\[artifacts\]' s3fs"
    ):
        Artifacts(run_id="r1", task_id="t", home=tmp_path, url="s3://bucket/treadle").put("a", b"1")


def test_a_command_without_fsspec_refuses_an_artifacts_url_naming_what_to_install(tmp_path: Path) -> None:
    probe = "import sys\nsys.modules['fsspec'] = None\nfrom treadle.cli.main import main\nmain()\n"
    env = {
        "TREADLE_HOME": str(tmp_path),
        "TREADLE_ARTIFACTS_URL": "s3://bucket/treadle",
        "PATH": "/usr/bin:/bin",
    }
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run(
        [sys.executable, "-c", probe, "dags", "list"],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "fsspec is not installed: pip install 'treadle[artifacts]' s3fs" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@task
def produce(context: TaskContext) -> str:
    return context.artifacts.put("payload", b"x" * 100_000)


@task
def consume(uri: str, context: TaskContext) -> int:
    return len(context.artifacts.get(uri))


def test_a_large_payload_goes_downstream_by_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREADLE_HOME", str(tmp_path))

    @dag(dag_id="artifacts_dag")
    def artifacts_dag() -> None:
        consume(produce())

    result = run_dag(artifacts_dag, max_result_bytes=1024)
    assert result.state == "success" and result.results["consume"] == 100_000
    assert (run_folder(tmp_path, result.run.run_id) / "artifacts" / "produce" / "payload").exists()

"""Artifacts: files a task hands to the tasks after it, when a result is too large for the database.

    @task
    def extract(context: TaskContext) -> str:
        return context.artifacts.put("orders.parquet", "/tmp/orders.parquet")  # a path: copied

    @task
    def load(uri: str, context: TaskContext) -> int:
        data = context.artifacts.get(uri)  # bytes
        ...

Results stay small (`TREADLE_MAX_RESULT_BYTES`); an artifact's URI is the small thing passed
downstream. By default artifacts live on the local disk, under `$TREADLE_HOME/runs/RUN_ID/
artifacts/TASK_ID/NAME` (one host: standalone, or workers sharing a disk); with
`TREADLE_ARTIFACTS_URL` set to any fsspec URL (`s3://bucket/treadle`, `gs://...`,
`file:///mnt/shared/treadle`, `memory://` in tests) they live there, under `RUN_ID/TASK_ID/NAME`.
Artifacts are scoped per run: retention deletes a run's artifacts with the run.

The local disk needs nothing more; a URL needs fsspec, which comes with the `artifacts` extra
(`pip install 'treadle[artifacts]'`), and the filesystem package of its scheme (s3fs for s3://,
gcsfs for gs://, adlfs for az://).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from treadle.domain.identifiers import is_identifier
from treadle.errors import ConfigError

#: Environment variable naming the artifacts location (an fsspec URL); unset: the local disk.
ARTIFACTS_URL_ENV = "TREADLE_ARTIFACTS_URL"


def run_folder(home: Path, run_id: str) -> Path:
    """The local folder of one run's files (manifest, outputs, local artifacts)."""
    return home / "runs" / run_id


#: The filesystem package of the common remote schemes (fsspec itself names the others).
FILESYSTEM_PACKAGES = {
    "s3": "s3fs",
    "s3a": "s3fs",
    "gs": "gcsfs",
    "gcs": "gcsfs",
    "az": "adlfs",
    "abfs": "adlfs",
    "abfss": "adlfs",
}

#: Schemes fsspec serves by itself.
BUILT_IN = ("file", "local", "memory")


def fsspec_missing(protocol: str) -> str:
    """What to install when an artifacts URL of `protocol` is set and fsspec is not installed."""
    package = FILESYSTEM_PACKAGES.get(protocol)
    if package is not None:
        wanted = f"pip install 'treadle[artifacts]' {package}"
    elif protocol in BUILT_IN:
        wanted = "pip install 'treadle[artifacts]'"
    else:
        wanted = f"pip install 'treadle[artifacts]' and the fsspec filesystem package for {protocol}://"
    return f"{ARTIFACTS_URL_ENV} is set (scheme {protocol}://), but fsspec is not installed: {wanted}"


def _protocol(url: str) -> str:
    return url.split("://", 1)[0]


def _filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of `url` and the path inside it (Any: fsspec is untyped)."""
    try:
        import fsspec
    except ImportError:
        raise ConfigError(fsspec_missing(_protocol(url))) from None

    fs, _, paths = fsspec.get_fs_token_paths(url)
    return fs, str(paths[0]).rstrip("/")


def check_artifacts_url(url: str) -> str | None:
    """The problem with an artifacts URL in words, or None if fsspec can use it."""
    if "://" not in url:
        return (
            f"{ARTIFACTS_URL_ENV} must be an fsspec URL such as s3://bucket/prefix or file:///path, "
            f"got {url!r}"
        )
    protocol = _protocol(url)
    try:
        import fsspec
    except ImportError:
        return fsspec_missing(protocol)
    try:
        fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        return f"{ARTIFACTS_URL_ENV}: no filesystem for {protocol!r} ({exc})"
    return None


class Artifacts:
    """The artifacts of one task of one run (see the module docstring)."""

    def __init__(self, *, run_id: str, task_id: str, home: Path, url: str | None = None) -> None:
        self.run_id = run_id
        self.task_id = task_id
        self.home = home
        self.url = url.rstrip("/") if url else None

    @classmethod
    def from_env(cls, *, run_id: str, task_id: str) -> Artifacts:
        """The artifacts of a task, located by TREADLE_HOME and TREADLE_ARTIFACTS_URL."""
        home = Path(os.environ.get("TREADLE_HOME", "~/.treadle")).expanduser()
        return cls(run_id=run_id, task_id=task_id, home=home, url=os.environ.get(ARTIFACTS_URL_ENV) or None)

    def put(self, name: str, data: bytes | str | os.PathLike[str]) -> str:
        """Store `data` (bytes, or the path of a file to copy) as artifact `name`; returns its URI.

        `name` is a file name ([A-Za-z0-9._-], no folders); putting a name again replaces it.
        """
        if not isinstance(name, str) or not is_identifier(name) or name in (".", ".."):
            raise ValueError(f"artifact name must match [A-Za-z0-9._-]{{1,250}}, got {name!r}")
        if not isinstance(data, bytes | str | os.PathLike):
            raise TypeError(f"artifact data must be bytes or a file path, got {type(data).__name__}")
        source = None if isinstance(data, bytes) else Path(data)
        if source is not None and not source.is_file():
            raise FileNotFoundError(f"artifact {name!r}: {source} is not a file")
        if self.url is None:
            target = run_folder(self.home, self.run_id) / "artifacts" / self.task_id / name
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{name}.partial")
            if source is None:
                assert isinstance(data, bytes)
                partial.write_bytes(data)
            else:
                shutil.copyfile(source, partial)
            os.replace(partial, target)  # readers never see half an artifact
            return target.resolve().as_uri()
        fs, root = _filesystem(self.url)
        path = f"{root}/{self.run_id}/{self.task_id}/{name}"
        if source is None:
            assert isinstance(data, bytes)
            fs.pipe_file(path, data)
        else:
            fs.put_file(str(source), path)
        return f"{self.url}/{self.run_id}/{self.task_id}/{name}"

    def get(self, uri: str) -> bytes:
        """The bytes of an artifact of this deployment (any run's, by the URI `put` returned)."""
        if self.url is None:
            if not uri.startswith("file://"):
                raise ValueError(f"{uri!r} is not a local artifact URI (file://...)")
            path = Path(uri.removeprefix("file://")).resolve()
            base = (self.home / "runs").resolve()
            if base not in path.parents or path.parent.parent.name != "artifacts":
                raise ValueError(f"{uri!r} is not an artifact of this deployment (under {base})")
            return path.read_bytes()
        if not uri.startswith(self.url + "/"):
            raise ValueError(f"{uri!r} is not an artifact of this deployment (under {self.url})")
        fs, root = _filesystem(self.url)
        data: bytes = fs.cat_file(f"{root}/{uri.removeprefix(self.url + '/')}")
        return data


def delete_run_files(home: Path, run_ids: Iterable[str], *, artifacts_url: str | None = None) -> int:
    """Delete the files of finished runs (retention): their local folder and, with an artifacts
    URL, their artifacts there. Returns how many runs had something deleted; a failure to delete
    one run's files is not an error (they are deleted by a later prune or by hand)."""
    deleted = 0
    fs, root = _filesystem(artifacts_url) if artifacts_url else (None, "")
    for run_id in run_ids:
        if not run_id or "/" in run_id or run_id in (".", ".."):
            continue
        found = False
        folder = run_folder(home, run_id)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
            found = True
        if fs is not None:
            path = f"{root}/{run_id}"
            try:
                if fs.exists(path):
                    fs.rm(path, recursive=True)
                    found = True
            except OSError:
                pass
        deleted += found
    return deleted

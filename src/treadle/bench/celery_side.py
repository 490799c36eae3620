"""The Celery side of `treadle bench --vs-celery`: `celery worker` processes (prefork,
`--slots` children each) on Redis, running the run workloads' shapes as canvases; the figure is
the wall time from `apply_async` to the result."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from treadle.bench.harness import log_mentions, stop_groups, wait_for
from treadle.bench.options import BenchOptions
from treadle.bench.workloads import CELERY_APP, Workload


class CelerySide:
    """`celery worker` processes on Redis running the same shapes as canvases."""

    def __init__(self, root: Path, options: BenchOptions) -> None:
        self.root, self.options = root, options
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs = [root / f"celery{i}.log" for i in range(options.workers)]
        self.tasks: Any = None
        self.client: Any = None

    def start(self) -> None:
        """Check Redis is empty, start the workers and wait until each is ready."""
        try:
            import redis
        except ImportError as exc:
            raise RuntimeError("--vs-celery needs Celery and Redis: pip install 'treadle[bench]'") from exc
        self.client = redis.Redis.from_url(self.options.redis)
        if self.client.dbsize() != 0:
            raise RuntimeError(f"{self.options.redis} is not empty; name an unused database with --redis")
        (self.root / "treadle_bench_celery.py").write_text(CELERY_APP)
        queue = f"treadle_bench_{os.getpid()}"
        os.environ.update(BENCH_REDIS=self.options.redis, BENCH_QUEUE=queue)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        sys.path.insert(0, str(self.root))
        self.tasks = importlib.import_module("treadle_bench_celery")
        for i, log in enumerate(self.logs):
            argv = [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "treadle_bench_celery",
                "worker",
                "--pool",
                "prefork",
            ]
            argv += ["--concurrency", str(self.options.slots), "--hostname", f"bench{i}@%h"]
            argv += ["--loglevel", "INFO", "--logfile", str(log)]
            argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
            with (self.root / f"celery{i}.out").open("ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=self.root,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        for log in self.logs:
            wait_for("a Celery worker to be ready", partial(log_mentions, log, " ready."), timeout=120)

    def once(self, workload: Workload) -> dict[str, Any]:
        """Submit the workload's canvas and wait for its result."""
        assert workload.celery is not None
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a Celery worker exited with {proc.returncode}")
        canvas = workload.celery(self.tasks)
        began = time.perf_counter()
        value = canvas.apply_async().get(timeout=self.options.timeout_s, interval=0.005)
        wall = time.perf_counter() - began
        if workload.expected is not None and int(value) != workload.expected:
            raise RuntimeError(f"Celery {workload.name} returned {value!r}, expected {workload.expected}")
        return {"wall_s": wall}

    def stop(self) -> None:
        """Stop the workers and empty the Redis database again."""
        stop_groups(self.procs, grace_s=15)
        if self.tasks is not None:
            self.tasks.app.close()
        if self.client is not None:
            self.client.flushdb()
            self.client.close()

    def version(self) -> str:
        """Celery's version."""
        import celery

        return str(celery.__version__)

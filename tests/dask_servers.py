"""A real Dask cluster for tests: ``dask scheduler`` and ``dask worker`` processes (the commands
``distributed`` installs) on 127.0.0.1, each worker with its own environment (local cache,
PYTHONPATH) and log file, started and stopped here. Also used by benchmarks/bench_cluster.py."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from remote_servers import free_port, stop_process

GiB = 1 << 30


def _dask() -> list[str]:
    exe = Path(sys.executable).with_name("dask")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dask"]


class Worker:
    def __init__(self, name: str, proc: subprocess.Popen, log: Path, env: dict):
        self.name, self.proc, self.log_path, self.env = name, proc, log, env

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def built(self) -> list[str]:
        """ "kind/key" of every stage this worker built, in order (from its log)."""
        return re.findall(r"^npubuild-cluster: (\S+) built for ", self.log(), re.M)

    def started(self) -> list[str]:
        """The "[task] building kind key12" lines of this worker's log (builds begun, finished or not)."""
        return re.findall(r"^\[\S+\] building \S+ \S+$", self.log(), re.M)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc)


class DaskCluster:
    """``dask scheduler`` on 127.0.0.1:<free port>, plus workers added with :meth:`add_worker`."""

    def __init__(self, logs: Path):
        self.logs = Path(logs)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.workers: dict[str, Worker] = {}
        self._log = open(self.logs / "scheduler.log", "w")
        self.proc = subprocess.Popen(
            [*_dask(), "scheduler", "--host", "127.0.0.1", "--port", str(self.port), "--no-dashboard", "--no-show"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait(lambda: "Scheduler at:" in (self.logs / "scheduler.log").read_text(), "the scheduler", self.proc)

    def _wait(self, ready, what: str, proc: subprocess.Popen, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while not ready():
            if proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError(f"{what} did not start; logs in {self.logs}")
            time.sleep(0.1)

    def add_worker(self, name: str, env: dict, memory: int = 4 * GiB) -> Worker:
        """Start ``dask worker`` (one thread, no nanny: killing it kills the worker) with the
        resource ``MEMORY=<memory>`` and the environment ``env``; wait until it registered."""
        log = self.logs / f"worker-{name}.log"
        f = open(log, "w")
        proc = subprocess.Popen(
            [
                *_dask(),
                "worker",
                self.address,
                "--name",
                name,
                "--nthreads",
                "1",
                "--no-nanny",
                "--no-dashboard",
                "--host",
                "127.0.0.1",
                "--resources",
                f"MEMORY={memory}",
                "--local-directory",
                str(self.logs / f"dask-{name}"),
            ],
            env=dict(env, NPUBUILD_BUILDER=name, PYTHONUNBUFFERED="1"),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
        f.close()
        w = Worker(name, proc, log, env)
        self.workers[name] = w
        self._wait(lambda: "Registered to" in w.log(), f"worker {name}", proc)
        return w

    def stop(self) -> None:
        for w in self.workers.values():
            w.stop()
        stop_process(self.proc)
        self._log.close()

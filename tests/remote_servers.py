"""Remote caches for tests: a ``file://`` folder, or a real S3 endpoint served by ``moto_server``
(``moto[server]``, the endpoint s3fs's own tests use) on 127.0.0.1, started and stopped here."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

BUCKET = "npubuild-test"


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Terminate a server process we started; kill it if it has not exited after ``timeout`` s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """``moto_server`` as a subprocess on 127.0.0.1:<free port>, with one bucket."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).with_name("moto_server")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
        self.proc = subprocess.Popen(
            [*cmd, "-H", "127.0.0.1", "-p", str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start on port {self.port}") from None
                time.sleep(0.1)
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True, endpoint_url=self.endpoint, **self.credentials).mkdir(BUCKET)

    credentials = {"key": "testing", "secret": "testing"}

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to reach this server through NPUBUILD_REMOTE=s3://..."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_CONFIG_FILE": os.devnull,
        }

    def url(self) -> str:
        """A fresh, empty prefix in the bucket."""
        return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"

    def stop(self) -> None:
        stop_process(self.proc, 10)

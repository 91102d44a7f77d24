"""A Spark standalone cluster on 127.0.0.1 for the tests: a master and one worker, started from
pyspark's own installation (`bin/spark-class`: nothing is downloaded), stopped by PID.

Executors run this interpreter (PYSPARK_PYTHON), so they import kafkasniff as installed here,
compiled modules included — what a real cluster's executors need too.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from broker import free_port

START_TIMEOUT = 90.0  # seconds; the master is up in ~8 s on a quiet machine, slower on a loaded one


class SparkClusterError(RuntimeError):
    pass


class StandaloneCluster:
    """`with StandaloneCluster(work_dir) as url:` a spark://127.0.0.1:PORT master with one worker."""

    def __init__(self, work_dir: Path, cores: int = 2, memory: str = "2g") -> None:
        import pyspark

        self.spark_home = Path(pyspark.__file__).parent
        self.work_dir = work_dir
        self.cores, self.memory = cores, memory
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_HOME": str(self.spark_home), "SPARK_LOCAL_IP": "127.0.0.1",
                    "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(work_dir),
                    "SPARK_WORKER_DIR": str(work_dir / "worker")}
        self.processes: list[subprocess.Popen] = []

    def _start(self, name: str, *args: str) -> Path:
        log = self.work_dir / f"{name}.log"
        with open(log, "wb") as out:
            self.processes.append(subprocess.Popen(
                [str(self.spark_home / "bin" / "spark-class"), *args], env=self.env, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        return log

    def _wait(self, what: str, log: Path, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready():
            if any(p.poll() is not None for p in self.processes):
                raise SparkClusterError(f"the Spark {what} exited:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise SparkClusterError(f"the Spark {what} did not start in {START_TIMEOUT:.0f} s:\n{_tail(log)}")
            time.sleep(0.2)

    def __enter__(self) -> str:
        try:
            master_log = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                     "--port", str(self.port), "--webui-port", "0")
            self._wait("master", master_log, lambda: _accepts(self.port))
            worker_log = self._start("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                     "--cores", str(self.cores), "--memory", self.memory, "--webui-port", "0",
                                     self.url)
            self._wait("worker", worker_log,
                       lambda: re.search(r"Registering worker", master_log.read_text(errors="replace")))
        except BaseException:
            self.stop()
            raise
        return self.url

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"

"""Start and stop Spark for the `spark` and `report` commands.

PySpark is an optional extra and Spark needs a Java runtime: `missing_requirement` says in
one line what to install. Spark's own output (JVM warnings, log4j) goes to a log file, not
the console; a session that fails to start shows the end of that log.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import contextlib
from contextlib import contextmanager
from pathlib import Path

INSTALL_PYSPARK = "PySpark is not installed: pip install 'kafkasniff[spark]'"
DEFAULT_MASTER = "local[*]"
_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""
_SPARK_CONF = {
    "spark.app.name": "kafkasniff",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # The SQL side only shuffles small things (counts per table, topic names, the connection
    # numbering); the packets go through an RDD shuffle. Adaptive re-planning and 200 shuffle
    # partitions would cost seconds per run for nothing (measured: 4.9 s -> 3.0 s on a small run).
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    # The shuffled segments go to the decode tasks in Arrow batches of 10,000 rows by default: loopback captures
    # carry segments of up to 64 KB, so a batch could hold hundreds of MB. Cut at 8 MB, as the read tasks cut
    # theirs (reading.BATCH_BYTES): a 356 MB records-heavy capture's decode tasks 1.2-1.6 s -> 0.75-0.9 s each.
    "spark.sql.execution.arrow.maxBytesPerBatch": str(8 << 20),
    # Spark keeps Python workers apart by their environment variables: the SQL side's tasks (mapInArrow) are given
    # this setting as one more, so they had workers of their own, and the RDD job finishing a shuffled run started
    # two more, importing everything again (measured: ten gzipped 1 MB captures, the first run of a session, the
    # finishing job 1.2 s; a trivial RDD job after a mapInArrow one 0.91 s, 0.11 s with the workers shared). With
    # it off, a worker's error also shows PySpark's own frames.
    "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled": "false",
    # The Python workers import kafkasniff as installed, not from the folder they run in (the driver's: a source
    # tree there, unbuilt or another version, was imported instead, and the tasks failed). Python 3.11's safe path.
    "spark.executorEnv.PYTHONSAFEPATH": "1",
}


# A command's jobs are short: the JVM's optimising compiler (C2) would spend more CPU compiling than it saves
# (measured on a 12 KB capture, the first job: 21 s of JVM CPU with it, 9 s without); the serial collector suits
# a driver with a core or two. The driver's JVM loads thousands of classes of Spark's own jars (those of the installed
# PySpark) and the classes Spark SQL generates: verifying their bytecode at every start cost a local context's start
# 0.4-0.7 s (2.7-3.0 s -> 2.3-2.5 s) and `report` about a second (three runs alternated: 10.9-13.1 s -> 8.8-11.6 s).
# (The option is a diagnostic one, which a later JVM may drop: then ignored, not fatal.)
_DRIVER_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:+IgnoreUnrecognizedVMOptions "
                       "-XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote")


class SparkUnavailable(Exception):
    """Spark cannot run here; the message says what to install or where Spark's log is."""


def missing_requirement() -> str | None:
    """What to install before Spark can run, in one line; None when all is there."""
    from importlib import metadata, util  # 20 ms: here, so that every other command starts without it

    try:
        pyspark_version = metadata.version("pyspark")
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401  (an installed but broken package fails here)
    except (ImportError, metadata.PackageNotFoundError):
        return INSTALL_PYSPARK
    if util.find_spec("pandas") is None:  # (PySpark's Arrow functions insist on it; found, not imported: 0.3 s)
        return INSTALL_PYSPARK
    needed = 17 if int(pyspark_version.split(".")[0]) >= 4 else 8
    install = f"install a Java {max(needed, 17)} runtime (e.g. apt-get install openjdk-17-jre-headless)"
    java = java_command()
    if java is None:
        return f"Spark needs Java and none was found: {install} or set JAVA_HOME"
    version = java_major_version(java)
    if version is None:
        return f"{java} does not run: {install} or set JAVA_HOME"
    if version < needed:
        return f"PySpark {pyspark_version} needs Java {needed}+, {java} is Java {version}: {install}"
    return None


def java_command() -> str | None:
    """The java Spark will start: $JAVA_HOME/bin/java, else java on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home, "bin", "java")
        return str(java) if java.is_file() else None
    return shutil.which("java")


def java_major_version(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if out.returncode or not found:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


@contextmanager
def spark_context(master: str = DEFAULT_MASTER, conf: dict[str, str] | None = None):
    """A SparkContext for the pipeline. An already running one is reused (and left running); otherwise one is
    started here and stopped on exit. The SQL side, where a run needs it, is sql_session's."""
    from pyspark import SparkContext

    active = SparkContext._active_spark_context  # (PySpark's record of it: its public getter starts one)
    if active is not None:
        yield active
        return
    context, log_dir = start_context(master, conf)
    try:
        yield context
    finally:
        stop_context(context, log_dir)


def start_context(master: str = DEFAULT_MASTER, conf: dict[str, str] | None = None):
    """Start a SparkContext with the pipeline's settings (and the SQL side's, for sql_session); returns (context,
    directory of Spark's log). Raises SparkUnavailable."""
    from pyspark import SparkConf, SparkContext

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    local = master == "local" or master.startswith("local[")
    if local:  # workers must run this interpreter, which has kafkasniff and its dependencies
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log_dir = Path(tempfile.mkdtemp(prefix="kafkasniff-spark-"))
    (log_dir / "log4j2.properties").write_text(_LOG4J)
    log_path = log_dir / "spark.log"
    conf = dict(conf or {})
    # The caller's driver options (a Kerberos configuration, say) come after the log's and the speed's: added to them,
    # not in their place (a later -XX option wins)
    java_options = " ".join(filter(None, (f"-Dlog4j.configurationFile=file:{log_dir / 'log4j2.properties'}",
                                          _DRIVER_JVM_OPTIONS, conf.pop("spark.driver.extraJavaOptions", ""))))
    settings = {**_SPARK_CONF, **unix_socket_settings(), "spark.driver.extraJavaOptions": java_options, **conf}
    try:
        with _stderr_to(log_path):  # the JVM inherits stderr at start and keeps it
            context = SparkContext(conf=SparkConf().setMaster(master).setAll(list(settings.items())))
    except Exception as error:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        shutil.rmtree(log_dir, ignore_errors=True)
        causes = [found[1] for line in lines if (found := _JAVA_EXCEPTION.search(line))]
        if causes:  # (PySpark's own error only says the JVM exited; the innermost cause says why)
            raise SparkUnavailable(f"Spark did not start: {causes[-1][:300]}; check --master and --conf") from None
        raise SparkUnavailable(f"Spark did not start ({error.__class__.__name__}: {str(error)[:300]})"
                               + "".join(f"\n  {line}" for line in lines[-5:])) from None
    # A cluster's executors import kafkasniff as installed there: its C modules cannot load from a zip.
    return context, log_dir


# A Java exception's line in Spark's log (`Exception in thread "main" org.apache.spark.SparkException: ...`, `Caused by:
# java.net.BindException: ...`): its class and message
_JAVA_EXCEPTION = re.compile(r"(?:^|\s)((?:[a-z][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): .+)")


def unix_socket_settings() -> dict[str, str]:
    """The JVM and its Python workers talk over loopback TCP unless told otherwise; a task's small writes then wait on
    delayed acknowledgements (measured: a trivial two-task job 110-128 ms over TCP, 65 ms over a Unix socket). Spark
    before 4.1 ignores the setting; PySpark 4.1 and later refuse it, and the context does not start, where Python's
    socketserver has no Unix sockets (Windows)."""
    import socketserver

    return {"spark.python.unix.domain.socket.enabled": "true"} if hasattr(socketserver, "UnixStreamServer") else {}


def sql_session():
    """The SparkSession of the running context (DataFrames, SQL, Parquet), made when first asked for. Not at the
    context's start: a run of RDD jobs needs none, and making one costs the driver's JVM 1.5 s the first time (the
    SQL side's classes; measured: kafkasniff spark on the project's captures 6.8-7.6 s -> 5.6-5.7 s without it)."""
    from pyspark.sql import SparkSession

    return SparkSession.builder.getOrCreate()


def stop_context(context, log_dir: Path) -> None:
    """Stop a context of start_context (and its SQL side) and remove its log. Without PySpark's wait for the thread
    of its accumulator server, which reads the JVM's updates polling once a second and sees the stop only at its
    next poll: the stop took 1.0 s, 0.09 s of it the JVM's. The thread is a daemon, left to end by itself (a
    command's process does not wait for it); a later context has a server of its own. Its Unix socket's file (in the
    JVM's temporary folder) is removed here, before the thread could: a command's process ends first, and each left
    one behind."""
    server, context._accumulatorServer = getattr(context, "_accumulatorServer", None), None
    context.stop()
    if server is not None:
        if isinstance(server.server_address, str):  # (a Unix socket's path; over TCP, a host and port)
            with contextlib.suppress(OSError):
                os.remove(server.server_address)
        threading.Thread(target=server.shutdown, name="accumulator server's shutdown", daemon=True).start()
    shutil.rmtree(log_dir, ignore_errors=True)


@contextmanager
def _stderr_to(path: Path):
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


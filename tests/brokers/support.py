"""The real brokers the transport tests use, and brokers of their own for the faults.

The machine's RabbitMQ (5672) and Redis (6379) are shared: every test names its own
queues (a unique ``BROKER_PREFIX``) and deletes them after, and never restarts them. A
test that cuts or restarts a broker starts its own instance (own port, data directory
and, for RabbitMQ, node name) and stops it by its pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator

import pika
import psutil
import redis

RABBITMQ_URL = os.environ.get("DURABLE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_URL = os.environ.get("DURABLE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
URLS = {"rabbitmq": RABBITMQ_URL, "redis": REDIS_URL}
TRANSPORTS = ("rabbitmq", "redis")
QUEUE = "brokered"


def unique_prefix() -> str:
    return f"djtest.{uuid.uuid4().hex[:12]}"


def broker_settings(base: dict, transport: str, prefix: str, urls: dict | None = None) -> dict:
    """``DURABLE_JOBS`` with the queue ``brokered`` on ``transport`` (the rest on the database)."""
    return {
        **base,
        "TRANSPORT": {QUEUE: transport},
        "BROKER_URLS": urls or URLS,
        "BROKER_PREFIX": prefix,
        "BROKER_TIMEOUT": 2.0,
    }


def delete_names(transport: str, prefix: str, url: str | None = None) -> None:
    """Delete what a test made on a shared broker (delay queues delete themselves)."""
    url = url or URLS[transport]
    with contextlib.suppress(Exception):
        if transport == "rabbitmq":
            connection = pika.BlockingConnection(pika.URLParameters(url))
            try:
                connection.channel().queue_delete(f"{prefix}.{QUEUE}")
            finally:
                connection.close()
        else:
            client = redis.Redis.from_url(url)
            client.delete(f"{prefix}.{QUEUE}", f"{prefix}.{QUEUE}.scheduled")
            client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port} after {seconds}s")


def _wait_for_amqp(url: str, seconds: float) -> None:
    """Until the node answers an AMQP handshake. Its port opens before it is ready for
    one: a test whose first connection (under a 1 s ``BROKER_TIMEOUT``) came right after
    the port opened met "Timeout during AMQP handshake" on a loaded machine."""
    deadline = time.monotonic() + seconds
    parameters = pika.URLParameters(url)
    parameters.socket_timeout = parameters.stack_timeout = 5
    while True:
        try:
            pika.BlockingConnection(parameters).close()
            return
        except pika.exceptions.AMQPError as error:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} gave no AMQP handshake after {seconds}s") from error
            time.sleep(0.2)


class OwnRedis:
    """A redis-server of the test's own (port, directory), started and stopped by pid."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="djtest-redis-")
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.dir,
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_port(self.port, 10)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.close()


class OwnRabbitMQ:
    """A RabbitMQ node of the test's own (node name, port, data directory), stopped by pid.

    Debian's ``rabbitmq-server`` runs the node as the ``rabbitmq`` user, so its directory
    is world-writable; its own config file names its own listener (the machine's config
    names 5672). The node's Erlang VM writes its pid to the pid file: the VM and every
    process under it are killed by pid, then the wrapper this test started.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.dist_port = free_port()
        self.dir = tempfile.mkdtemp(prefix="djtest-rabbit-")
        os.chmod(self.dir, 0o777)
        self.node = f"djtest{uuid.uuid4().hex[:8]}@localhost"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def _file(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o666)
        return path

    def start(self) -> None:
        config = self._file("rabbitmq.conf", f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        env = {
            **os.environ,
            "RABBITMQ_CONFIG_FILE": config.removesuffix(".conf"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": os.path.join(self.dir, "mnesia"),
            "RABBITMQ_LOG_BASE": os.path.join(self.dir, "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": self._file("enabled_plugins", "[].\n"),
            "RABBITMQ_PID_FILE": os.path.join(self.dir, "pid"),
        }
        self.process = subprocess.Popen(
            ["rabbitmq-server"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _wait_for_port(self.port, 60)
        _wait_for_amqp(self.url, 60)

    def kill(self) -> None:
        """SIGKILL the node (a crash, not a shutdown) and everything this test started for it."""
        victims = []
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(self.dir, "pid")) as f:
                beam = psutil.Process(int(f.read().strip()))
            victims = [beam, *beam.children(recursive=True)]
        if self.process is not None:
            with contextlib.suppress(psutil.Error):
                wrapper = psutil.Process(self.process.pid)
                victims += [wrapper, *wrapper.children(recursive=True)]
        for process in victims:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(victims, timeout=10)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, "pid"))
        self.process = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def own_rabbitmq() -> Iterator[OwnRabbitMQ]:
    server = OwnRabbitMQ()
    server.start()
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def own_broker(transport: str) -> Iterator[OwnRabbitMQ | OwnRedis]:
    """A broker of this test's own, to cut and restart."""
    with own_rabbitmq() if transport == "rabbitmq" else own_redis() as server:
        yield server


@contextlib.contextmanager
def black_hole() -> Iterator[int]:
    """A TCP port that accepts connections and never answers: a broker that hangs.

    Yields the port; every connection it accepted is closed, and the listener with them,
    when the block ends.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(OSError):
                accepted.append(listener.accept()[0])  # held open, never read or answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        for connection in accepted:
            connection.close()
        listener.close()

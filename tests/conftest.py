"""Shared test helpers. Real data lives in ../shared/data beside the repository (never copied into it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never download: set before anything imports huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Under pytest-xdist (`-n 2`, the README's test command) each worker is one of two processes on two cores: one thread
# each, for torch and for the processes a test starts (oversubscribed cores ran about ten times slower here).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

# Files whose fixtures or tests train for minutes, longest first, run before the others: two workers
# (`-n 2 --dist loadfile`) then end together instead of one of them starting the longest file last.
LONGEST_FILES = ("test_written_entities.py", "test_toy_world_qa.py", "test_toy_world_growth.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's own order kept


SHARED_DATA_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def shared_data_path(relative: str) -> Path:
    """Path of a file under ../shared/data; skips the test when it is absent, fails when
    EDMEM_REQUIRE_SHARED_DATA=1 (CI must not silently skip the real-data tests)."""
    path = SHARED_DATA_DIR / relative
    if not path.exists():
        message = f"shared data file {path} is absent"
        if os.environ.get("EDMEM_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(f"{message} and EDMEM_REQUIRE_SHARED_DATA=1")
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def wikipedia_sample_206() -> Path:
    return shared_data_path("wikipedia/enwiki-pages-articles-sample-206.xml.bz2")


@pytest.fixture(scope="session")
def wikipedia_sample_small() -> Path:
    return shared_data_path("wikipedia/enwiki-pages-articles-sample-small.xml.bz2")

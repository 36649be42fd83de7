"""Fixtures the plugin tests share."""

import pytest
from plugin_fakes import LoopThread


@pytest.fixture
def loop_thread():
    """An asyncio loop on a thread of its own, as LMCache runs the plugin's; stopped after."""
    lt = LoopThread()
    yield lt
    lt.stop()

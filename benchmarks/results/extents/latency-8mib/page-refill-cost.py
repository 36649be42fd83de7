# What this VM charges for page-cache pages filled again after they were freed: 1 GiB of
# 8 MiB buffered writes to a loop device over cached pages, right after a discard dropped
# them, and 5 s after (root; overwrites /dev/loop0 from 1 GiB to 2 GiB).
import mmap, os, subprocess, sys, time
dev = "/dev/loop0"; GiB = 1 << 30; CH = 8 << 20
buf = mmap.mmap(-1, CH); buf.write(os.urandom(CH))
fd = os.open(dev, os.O_RDWR)
def write_region(off):
    t = time.perf_counter()
    for i in range(GiB // CH):
        os.pwrite(fd, buf, off + i * CH)
    return time.perf_counter() - t
def settle():
    os.fsync(fd)
A = 1 * GiB
for trial in range(2):
    write_region(A); settle()                  # region A written and cached
    t_over = write_region(A); settle()         # overwrite cached pages: no allocation
    subprocess.run(["blkdiscard", "-o", str(A), "-l", str(GiB), dev], check=True)   # drops A's cached pages
    t_now = write_region(A); settle()          # fresh pages at once
    subprocess.run(["blkdiscard", "-o", str(A), "-l", str(GiB), dev], check=True)
    time.sleep(5)                              # time for freed pages to be reported to the host
    t_late = write_region(A); settle()
    print(f"1 GiB of 8 MiB buffered writes: over cached pages {t_over:.3f} s, right after a discard {t_now:.3f} s, 5 s after a discard {t_late:.3f} s")

"""noloco_rt/process/thread_names.py: the kernel shows each thread's Python name."""

from __future__ import annotations

import threading

from noloco_rt.process.thread_names import KERNEL_NAME_LIMIT, name_kernel_threads


def _kernel_name(native_id: int) -> str:
    with open(f"/proc/self/task/{native_id}/comm") as comm:
        return comm.read().rstrip("\n")


def test_each_thread_but_the_main_one_gets_its_name_cut_to_the_kernel_limit():
    release = threading.Event()
    long_name = threading.Thread(target=release.wait, name="a-thread-name-longer-than-fifteen", daemon=True)
    wide_name = threading.Thread(target=release.wait, name="ääääääää", daemon=True)  # 16 bytes in UTF-8
    main_before = _kernel_name(threading.main_thread().native_id)
    long_name.start()
    wide_name.start()
    try:
        assert name_kernel_threads() >= 2
        assert _kernel_name(long_name.native_id) == "a-thread-name-longer-than-fifteen"[:KERNEL_NAME_LIMIT]
        assert _kernel_name(wide_name.native_id) == "ä" * 7  # cut on a character, not inside one
        assert _kernel_name(threading.main_thread().native_id) == main_before  # the process title stays
    finally:
        release.set()
        long_name.join(5)
        wide_name.join(5)

"""The heap's settings for a long decoding loop: the garbage collector's and the C allocator's."""

import gc
from contextlib import contextmanager

# What a decoding loop allocates (segments, messages, events, lines) is freed by reference counting as soon
# as it has been shown; the collector's default, a pass every 700 allocations, then spends about 5 % of a
# decode (measured with callgrind) walking the objects that live on: schema tables, layouts, sessions.
YOUNG_ALLOCATIONS_PER_PASS = 50_000
PASSES_PER_OLDER_PASS = (20, 100)
# A Spark task's loops hold their rows in batches while they make more (a task's share of the segments until every
# file is read, 16,384 rows of each table until they are staged): all young, and a pass walks every one of them.
# bench60's decode task at 50,000 allocations a pass: 9 passes of 10-40 ms, 0.1 s of its 1.2 s; at 400,000, two.
# The rest of what such a loop allocates is freed by reference counting, which takes it off the count as well: the
# count grows by what the loop holds, and by cyclic garbage, of which a decode makes next to none (22 objects for
# bench60's 143,115 messages), so the task's peak is unchanged (379-384 MB either way).
TASK_ALLOCATIONS_PER_PASS = 400_000

# A decode allocates and frees big buffers over and over: 1 MiB reads of the capture, segments of up to 64 KiB,
# frames of megabytes. glibc maps every block past 128 KiB on its own and gives the top of its heap back to the
# kernel once 128 KiB of it are free, so each such buffer was faulted in page by page and zeroed by the kernel,
# then unmapped: on the records-heavy benchmark, 40 % of the one-line view's time was the kernel's (page faults,
# clearing pages). Blocks up to MAPPED_FROM come from the heap, which keeps up to KEPT_FREE of freed memory for
# the next ones; what the process's peak holds is unchanged (it holds the same buffers), bigger frames are mapped
# as before.
MAPPED_FROM = 8 << 20
KEPT_FREE = 16 << 20

cdef extern from *:
    """
    #ifdef __GLIBC__
    #include <malloc.h>
    static int heap_keep_freed(int mapped_from, int kept_free) {
        return mallopt(M_MMAP_THRESHOLD, mapped_from) && mallopt(M_TRIM_THRESHOLD, kept_free);
    }
    #else
    static int heap_keep_freed(int mapped_from, int kept_free) { return 0; }  /* other allocators: as they are */
    #endif
    """
    int heap_keep_freed(int mapped_from, int kept_free)


def reuse_freed_memory() -> bool:
    """Have the C allocator keep freed big buffers for the next ones (see MAPPED_FROM); True where it can (glibc).
    For the rest of the process: a Spark worker that lives on after its task keeps at most KEPT_FREE."""
    return bool(heap_keep_freed(MAPPED_FROM, KEPT_FREE))


def collect_rarely() -> None:
    """Keep what start-up made out of every collection, and collect cycles seldom; reuse freed big buffers."""
    gc.freeze()
    gc.set_threshold(YOUNG_ALLOCATIONS_PER_PASS, *PASSES_PER_OLDER_PASS)
    reuse_freed_memory()


@contextmanager
def collecting_rarely():
    """Rare collections (TASK_ALLOCATIONS_PER_PASS) for the time of a Spark task's loop, in a process that lives on
    after it (the task's leftovers are not frozen, which would keep any garbage cycle among them for good)."""
    reuse_freed_memory()
    before = gc.get_threshold()
    gc.set_threshold(TASK_ALLOCATIONS_PER_PASS, *PASSES_PER_OLDER_PASS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def freeze_at_task_start() -> None:
    """At a Spark task's start, keep what the worker holds (modules, caches, the task's command) out of every
    collection. PySpark's worker collects every generation after each task (its daemon's gc.collect()): in a worker
    that has decoded, a walk of ~90,000 objects, 45 ms a task, spent on the way to the worker's next task. Frozen,
    they are not walked. Nothing frozen is garbage kept for good: that same collection, after the previous task,
    freed the garbage of the tasks before; a command's objects hold no cycles and go by reference counting (the
    frozen count stays the same task after task)."""
    gc.freeze()


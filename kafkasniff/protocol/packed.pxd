"""Reading partition_facts' packed partitions (partitions.c's layout) in compiled loops, with no object made per
partition: the analyses' loops over Fetch, Produce and ListOffsets partitions read them so.

    cdef Packed packed = packed_of(data, slots)
    cdef Part part = first_part()
    while next_part(&packed, &part):
        part.topic, part.partition, has(&packed, &part, slot), value(&packed, &part, slot), part.batch_count

The bytes are partitions.c's, but may have crossed a pipe or a file: a partition that would end past them ends
the reading."""

from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy

cdef enum:
    # Words before a partition's facts (topic index, partition index), and per record batch (walker.BATCH_FACTS).
    # wire.pyx checks them against partitions.c's when it is loaded.
    HEAD_WORDS = 2
    BATCH_WORDS = 5


cdef struct Packed:
    const char *data
    Py_ssize_t words       # int64 words in data
    Py_ssize_t slots       # facts per partition: the wanted tuple's length
    Py_ssize_t mask_words


cdef struct Part:
    Py_ssize_t next        # the word where the next partition starts
    int64_t topic          # an index into the message's topics
    int64_t partition
    Py_ssize_t facts_at    # its first mask word
    Py_ssize_t batches_at  # its first batch's first word
    Py_ssize_t batch_count


cdef inline int64_t word(const Packed *p, Py_ssize_t i) noexcept nogil:
    cdef int64_t v
    memcpy(&v, p.data + 8 * i, 8)
    return v


cdef inline Packed packed_of(bytes data, Py_ssize_t slots):
    """`data` must stay alive while it is read."""
    cdef Packed p
    p.data = data
    p.words = len(data) // 8
    p.slots = slots
    p.mask_words = (slots + 63) // 64
    return p


cdef inline Part first_part() noexcept nogil:
    cdef Part part
    part.next = 0
    return part


cdef inline bint next_part(const Packed *p, Part *part) noexcept nogil:
    """Moves to the next partition: False after the last."""
    cdef Py_ssize_t at = part.next
    cdef Py_ssize_t count_at = at + HEAD_WORDS + p.mask_words + p.slots
    cdef int64_t count
    if count_at >= p.words:
        return False
    count = word(p, count_at)
    if count < 0 or count > (p.words - count_at - 1) // BATCH_WORDS:
        return False
    part.topic = word(p, at)
    part.partition = word(p, at + 1)
    part.facts_at = at + HEAD_WORDS
    part.batches_at = count_at + 1
    part.batch_count = count
    part.next = part.batches_at + count * BATCH_WORDS
    return True


cdef inline bint has(const Packed *p, const Part *part, Py_ssize_t slot) noexcept nogil:
    return (<uint64_t>word(p, part.facts_at + slot // 64)) >> (slot % 64) & 1


cdef inline int64_t value(const Packed *p, const Part *part, Py_ssize_t slot) noexcept nogil:
    return word(p, part.facts_at + p.mask_words + slot)


cdef inline object fact(const Packed *p, const Part *part, Py_ssize_t slot, default):
    """The fact of `slot` as an int, or `default` when the partition has none."""
    return value(p, part, slot) if has(p, part, slot) else default


cdef inline int64_t batch_word(const Packed *p, const Part *part, Py_ssize_t batch, Py_ssize_t field) noexcept nogil:
    """Field `field` (walker.BATCH_FACTS' order) of the partition's batch `batch`."""
    return word(p, part.batches_at + batch * BATCH_WORDS + field)


cdef inline list batches(const Packed *p, const Part *part):
    """The partition's batches as walker.BATCH_FACTS tuples (is_control a bool)."""
    cdef Py_ssize_t i
    return [(batch_word(p, part, i, 0), batch_word(p, part, i, 1), batch_word(p, part, i, 2),
             batch_word(p, part, i, 3) != 0, batch_word(p, part, i, 4)) for i in range(part.batch_count)]

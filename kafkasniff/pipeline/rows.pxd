"""The rows' C-level interface, for the decode loop (connections.pyx) to call without Python lookups."""

from kafkasniff.stream.session cimport MessageEvent


cpdef long long micros(double ts)
cpdef tuple message_row(MessageEvent ev, str connection_id, list files, str src, str dst, str client_id,
                        list topics, record_count)


cdef class RecordColumns:
    cdef list shared, chunks
    cdef Py_ssize_t count, rows_per_group
    cdef object full
    cdef tuple common  # the current message's columns
    cpdef clear(self)
    cpdef object add(self, MessageEvent ev, str connection_id, str client_id)

"""The rows' C-level interface, for the decode loop (connections.pyx) to call without Python lookups."""

cimport cpython.array as carray

from kafkasniff.stream.session cimport MessageEvent


cpdef long long micros(double ts)


cdef class MessageColumns:
    cdef Py_ssize_t count
    cdef carray.array ts
    cdef list numbers, texts, lists, list_ends
    cpdef clear(self)
    cpdef add(self, MessageEvent ev, str connection_id, list files, str src, str dst, str client_id, dict topics,
              record_count)
    cdef void _add_list(self, Py_ssize_t column, values) except *


cdef class RecordColumns:
    cdef list shared, chunks
    cdef Py_ssize_t count, rows_per_group
    cdef object full
    cdef tuple common  # the current message's columns
    cpdef clear(self)
    cpdef object add(self, MessageEvent ev, str connection_id, str client_id)

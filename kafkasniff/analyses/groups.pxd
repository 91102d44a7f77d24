# cython: language_level=3

cdef class Owners:
    cdef public dict by_partition  # (topic, partition, client id, ip) -> groups
    cdef public dict by_member     # (client id, ip) -> groups

    cdef object owner(self, topic, partition, client, host_ip)

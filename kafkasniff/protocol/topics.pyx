# cython: language_level=3
"""Topics named by id: the names a capture gives them, learned as it goes by.

Compiled: every message that names topics is resolved here (the one-line view, --stats and the analyses)."""

from kafkasniff.protocol.topicname cimport topic_name


cpdef str topic_text(str name):
    """A topic's name as lines show it: as it is when printable (every valid name), else as repr() escapes it: a
    damaged capture's bytes must not break a line, or reach a terminal as control characters."""
    return name if name.isprintable() else repr(name)


cdef class TopicNames:
    """Topic names a message mentions, with the records it carries for each.

    Newer versions of Fetch, Produce and others name topics by id only; ids are
    resolved with the (id, name) pairs that Metadata, CreateTopics and similar
    responses carry, learned as the capture goes by. Unresolved ids are listed
    as the id's text. Memory grows with the number of distinct topics only.

    Finding the mentions needs only the message; resolving them needs every
    earlier message of the capture. The two halves are apart so that parallel
    decoding can find mentions in its workers and resolve them in capture order.
    """

    cdef public dict by_id  # topic id -> name

    def __init__(self) -> None:
        self.by_id = {}

    cpdef dict resolve(self, list mentions):
        """Mentions (Message.mentions) as {topic: [records, partitions]}; learns the (id, name) pairs among them."""
        cdef dict found = {}
        cdef list entry
        for name, topic_id, records, partitions in mentions:
            if name is not None and topic_id is not None:
                self.by_id[topic_id] = name
            elif topic_id is not None:
                name = topic_name(name, topic_id, self.by_id)
            entry = found.get(name)
            if entry is None:
                found[name] = [records, list(partitions)]
            else:
                entry[0] += records
                entry[1] += partitions
        return found

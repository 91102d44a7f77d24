"""The one-line view's C-level interface, for Output to call without Python calls."""

from kafkasniff.stream.session cimport MessageEvent, NoticeEvent, SaslTokenEvent

cpdef str clock(double ts)
cpdef bytes topics_row(dict topics)
cpdef bytes message_row(MessageEvent ev, topics=*)
cpdef str message_line(MessageEvent ev, topics=*)
cpdef str sasl_line(SaslTokenEvent ev, bint show_secrets)
cpdef str notice_line(NoticeEvent ev)
cpdef str event_line(ev, bint show_secrets=*, topics=*)
cpdef bytes event_row(ev, bint show_secrets=*, topics=*)

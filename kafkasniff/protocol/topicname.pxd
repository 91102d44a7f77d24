"""A partition's topic as the views and analyses name it, for compiled loops over partitions."""


cdef inline object topic_name(topic, topic_id, dict by_id):
    """Its name when the message gives one; else its id's name as the capture has named it so far (by_id:
    TopicNames.by_id); else the id itself."""
    return topic if topic is not None else by_id.get(topic_id, topic_id)

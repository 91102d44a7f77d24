"""The Parquet tables the Spark pipeline writes: columns, Spark SQL types and meaning.

One definition serves the workers (which build rows in `raw_columns` order), the job (which
turns raw rows into the final tables) and the documentation. Workers cannot make Spark
timestamps cheaply, so a `timestamp` column travels as microseconds since the epoch
(`bigint`) and becomes a timestamp on the JVM side. `date` and `stream` are not in the raw
rows: `date` comes from each table's time column, `stream` from numbering the connections
of the whole run.

`groups` and `partitions` are the analyses of the whole run (consumer groups, lag, traffic: see
pipeline.analysis), one file each, not partitioned by date: they are small, and their rows span
the run rather than a moment.
"""

from __future__ import annotations

from typing import NamedTuple


class Column(NamedTuple):
    name: str
    type: str  # Spark SQL DDL type
    doc: str


class Table(NamedTuple):
    name: str
    time_column: str | None  # the column `date` is taken from; None: a table not partitioned by date
    columns: tuple[Column, ...]
    doc: str
    internal: tuple[Column, ...] = ()  # raw columns the job uses and the table does not keep


    @property  # (tables are few and small: no need to cache these)
    def raw_columns(self) -> tuple[Column, ...]:
        return tuple(Column(c.name, "bigint" if c.type == "timestamp" else c.type, c.doc)
                     for c in self.columns if c.name not in DERIVED) + self.internal

    @property
    def raw_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.raw_columns)


DATE = Column("date", "date", "UTC date of the row's time; the table is partitioned by it (`date=YYYY-MM-DD/`)")
STREAM = Column("stream", "bigint",
                "Connection number, 0, 1, ... in order of their first packets over all inputs of the run, merged by "
                "time as mergecap merges them (ties: in the order the inputs hold those packets); for a single "
                "capture it is the `stream` that `decode` prints. Stable for the same inputs, whatever the split "
                "into files or Spark partitions")
CONNECTION_ID = Column("connection_id", "string",
                       "Stable connection key across runs: hash of both endpoints and the first-seen microsecond")
DERIVED = frozenset({DATE.name, STREAM.name})

MESSAGES = Table("messages", "ts", (
    DATE,
    Column("ts", "timestamp", "Capture time of the segment that completed the message (`ts` of `decode --json`)"),
    STREAM,
    CONNECTION_ID,
    Column("capture_files", "array<string>", "Capture file(s) holding the message's bytes"),
    Column("src", "string", "Sender, `ip:port` (`[ip]:port` for IPv6)"),
    Column("dst", "string", "Receiver, `ip:port`"),
    Column("kind", "string", "`request` or `response`"),
    Column("api_key", "int", "Kafka API key; null when a response's API is unknown"),
    Column("api_name", "string", "API name (Produce, Fetch, Metadata, ...)"),
    Column("api_version", "int", "API version"),
    Column("header_version", "int", "Request/response header version"),
    Column("correlation_id", "int", "Correlation id from the header"),
    Column("client_id", "string", "Client id of the request (for a response: of its request)"),
    Column("size", "int", "Message bytes after the 4-byte size prefix"),
    Column("latency_ms", "double", "Responses: capture time from the request to the response, milliseconds"),
    Column("throttle_time_ms", "int", "Responses: the ThrottleTimeMs the broker sent; null when the response has none"),
    Column("errors", "array<string>", "Names of the non-zero error codes anywhere in the message, each once"),
    Column("topics", "array<string>",
           "Topics of the message and, for a response, of its request, as `decode --json` lists them; topic ids are "
           "named from Metadata/CreateTopics responses anywhere in the run's inputs (an unknown id stays an id)"),
    Column("record_count", "int",
           "Records decoded in the message's record batches (Produce requests, Fetch responses); null otherwise"),
    Column("inferred", "boolean", "Responses: the request was not captured and the API was inferred from the bytes"),
    Column("expects_response", "boolean", "Requests: a response is due (false for Produce with acks=0)"),
    Column("malformed", "string", "Why decoding stopped early; null for a well-formed message"),
    Column("malformed_offset", "int", "Where decoding stopped: byte offset from the start of the size prefix"),
    Column("trailing_bytes", "int", "Bytes left over after a complete body"),
    Column("tls_version", "string", "`1.2` or `1.3` when the message was decrypted from TLS; null for plaintext"),
    Column("tls_cipher", "string", "The TLS cipher suite (IANA name) it was decrypted from; null for plaintext"),
), "one row per Kafka request or response")

RECORDS = Table("records", "ts", (
    DATE,
    Column("ts", "timestamp", "Capture time of the message that carried the record"),
    STREAM,
    CONNECTION_ID,
    Column("direction", "string", "`produce` (in a request) or `fetch` (in a response)"),
    Column("api_name", "string", "API of the carrying message (Produce, Fetch, ShareFetch)"),
    Column("api_version", "int", "API version of the carrying message"),
    Column("correlation_id", "int", "Correlation id of the carrying message"),
    Column("client_id", "string", "Client id of the request (for a response: of its request)"),
    Column("topic", "string", "Topic name: from the message, or for topic ids from Metadata/CreateTopics "
                              "responses anywhere in the run's inputs; null when unknown"),
    Column("topic_id", "string", "Topic id (UUID) when the message names the topic by id"),
    Column("partition", "int", "Partition index"),
    Column("offset", "bigint", "Record offset; null when base offset + delta does not fit 64 bits (hostile input)"),
    Column("timestamp", "timestamp", "Record timestamp (CreateTime or LogAppendTime); null when none (magic 0, -1) "
                                     "or past 64 bits of microseconds"),
    Column("key_size", "int", "Key bytes; null for a null key"),
    Column("value_size", "int", "Value bytes; null for a null value (tombstone)"),
    Column("header_count", "int", "Number of record headers"),
    Column("codec", "string", "Compression of the batch: none, gzip, snappy, lz4, zstd"),
    Column("magic", "int", "Batch format: 2 (record batch), 0 or 1 (legacy message set)"),
    Column("producer_id", "bigint", "Producer id of the batch (-1 when none)"),
    Column("is_transactional", "boolean", "The batch is part of a transaction"),
    Column("is_control", "boolean", "Control record (transaction marker)"),
    Column("crc_valid", "boolean", "The batch's (legacy: the message's) CRC matches its bytes"),
), "one row per record in Produce requests and Fetch responses")

CONNECTIONS = Table("connections", "first_seen", (
    DATE,
    STREAM,
    CONNECTION_ID,
    Column("client", "string", "Client endpoint (the side sending Kafka requests; else the TCP initiator)"),
    Column("server", "string", "Server endpoint"),
    Column("first_seen", "timestamp", "Capture time of the connection's first packet"),
    Column("last_seen", "timestamp", "Capture time of its last packet"),
    Column("protocol", "string", "`kafka` (requests seen), `tls` (encrypted, not decoded) or `unknown`"),
    Column("tls_version", "string", "TLS connections: `1.2` or `1.3` (decrypted or not), as far as the handshake "
                                    "tells; null for plaintext"),
    Column("tls_cipher", "string", "TLS connections: the cipher suite (IANA name) when known; null for plaintext"),
    Column("handshake", "boolean", "The TCP handshake was captured (else the capture started mid-connection)"),
    Column("client_ids", "array<string>", "Client ids of its requests, in order of first use (null for a request "
                                          "whose client id is null, or was not read: a malformed header)"),
    Column("requests", "bigint", "Kafka requests"),
    Column("responses", "bigint", "Kafka responses"),
    Column("packets", "bigint", "TCP segments (late retransmissions after the close excluded)"),
    Column("bytes_to_server", "bigint", "TCP payload bytes client to server, each byte once"),
    Column("bytes_to_client", "bigint", "TCP payload bytes server to client, each byte once"),
    Column("gaps", "bigint", "Holes in the byte streams (bytes never captured)"),
    Column("gap_bytes", "bigint", "Bytes missing in those holes"),
    Column("end_reason", "string", "`fin`, `rst`, `capture end`, `port reused` or `idle` (no packet for 900 s)"),
    Column("capture_files", "array<string>", "Capture file(s) holding its packets, in time order"),
), "one row per TCP connection", internal=(
    # where its first packet is among the inputs: ties of first_seen are numbered in capture order
    Column("first_file", "int", "Number of the input holding the first packet, in the run's file order"),
    Column("first_index", "bigint", "Index of the first packet in that file"),
))



def struct(*fields: tuple[str, str]) -> str:
    """The Spark SQL type of a struct of (name, type) fields."""
    return "struct<" + ",".join(f"`{name}`:{type_}" for name, type_ in fields) + ">"


_FETCH_SAMPLE = struct(("ts", "timestamp"), ("fetch_offset", "bigint"), ("high_watermark", "bigint"),
                       ("last_stable_offset", "bigint"), ("lag", "bigint"))

GROUPS = Table("groups", None, (
    Column("group_id", "string", "Consumer group id"),
    Column("group_state", "string", "The group at the end of the run: `Stable`, `Rebalancing` or `Empty` (every "
                                    "member left)"),
    Column("generation", "int", "Generation id (classic protocol) or group epoch (KIP-848 `consumer` and "
                                "`share` groups); null on the row of what happened after the last generation"),
    Column("protocol", "string", "`classic`, `consumer` (KIP-848) or `share`"),
    Column("protocol_type", "string", "Classic: the JoinGroup protocol type (`consumer`, `connect`, ...)"),
    Column("assignor", "string", "Classic: the assignment strategy chosen; KIP-848: the server assignor members "
                                 "asked for"),
    Column("started", "timestamp", "When the rebalance that formed the generation began: its first cause or "
                                   "JoinGroup (the after row: the first thing after the last generation)"),
    Column("first_join", "timestamp", "Classic: the rebalance's first JoinGroup request"),
    Column("formed", "timestamp", "The first response giving the generation id (epoch)"),
    Column("completed", "timestamp", "When the last member got its assignment; null while some member has not"),
    Column("rebalance_ms", "double", "First JoinGroup (epochs: `started`) to `completed`, milliseconds"),
    Column("causes", "array<string>", "What started the rebalance: members joining, leaving, dropping out, "
                                      "subscriptions changing; failing those, what clients said"),
    Column("errors", "map<string,bigint>", "Error names of the group responses in the rebalance, and counts"),
    Column("events", "array<string>", "KIP-848: members rejoining that kept the epoch, within the generation"),
    Column("member_id", "string", "Member id (one row per member of the generation)"),
    Column("client_id", "string", "The member's client id"),
    Column("host", "string", "The member's connection to the coordinator, `ip:port`"),
    Column("instance_id", "string", "Static membership: its group instance id"),
    Column("leader", "boolean", "Classic: the member is the generation's leader; null for epochs"),
    Column("subscription", "array<string>", "Topics the member subscribed to"),
    Column("assignment", "map<string,array<int>>", "Partitions by topic given to the member in this generation "
                                                   "(topic ids named from the run's Metadata)"),
    Column("assigned_at", "timestamp", "When it got them (SyncGroup response; epochs: the heartbeat response)"),
), "one row per member of each consumer-group generation, as `kafkasniff groups --json`")

PARTITIONS = Table("partitions", None, (
    Column("topic", "string", "Topic name (an id the run never names stays the id)"),
    Column("partition", "int", "Partition index"),
    Column("produced_records", "bigint", "Records in Produce requests to it that their responses acknowledged"),
    Column("produced_bytes", "bigint", "Bytes of those requests' record sets"),
    Column("first_produced_offset", "bigint", "Lowest offset they were written at (from the responses)"),
    Column("last_produced_offset", "bigint", "Highest offset"),
    Column("first_produced_at", "timestamp", "The first of those Produce requests"),
    Column("last_produced_at", "timestamp", "The last"),
    Column("records_per_minute", "double", "produced_records per minute from the first to the last; null with "
                                           "fewer than two times"),
    Column("fetch_responses", "bigint", "Consumer Fetch responses answering for it without error"),
    Column("fetched_records", "bigint", "Data records in their record batches (each fetch counted)"),
    Column("fetched_bytes", "bigint", "Bytes of their record sets"),
    Column("high_watermark", "bigint", "The last Fetch response's high watermark"),
    Column("last_stable_offset", "bigint", "And its last stable offset"),
    Column("high_watermark_at", "timestamp", "When"),
    Column("log_end_offset", "bigint", "Highest log end seen: high watermarks, produced offsets, ListOffsets"),
    Column("log_end_at", "timestamp", "When it was seen"),
    Column("consumers", "array<" + struct(
        ("group", "string"), ("client_id", "string"), ("fetches", "bigint"), ("last", _FETCH_SAMPLE),
        ("max_lag", _FETCH_SAMPLE), ("delivered_to", "bigint")) + ">",
           "Per consumer (its group, or its client id outside groups), as `lag --json` `consumers`: fetches, the "
           "last fetch and the one of largest lag (lag = high watermark, or last stable offset when "
           "read_committed, minus fetch offset), and the offset after the last record fetched"),
    Column("committed", "array<" + struct(
        ("group", "string"), ("committed_offset", "bigint"), ("committed_at", "timestamp"), ("commits", "bigint"),
        ("source", "string"), ("log_end_at_commit", "bigint"), ("lag_at_commit", "bigint"),
        ("log_end_offset", "bigint"), ("lag", "bigint")) + ">",
           "Per group, as `lag --json` `committed`: the last committed offset (OffsetCommit, or OffsetFetch), its "
           "lag behind the log end then and at the end of the run"),
), "one row per topic and partition: traffic, log end, consumers' lag and committed offsets, as "
   "`kafkasniff lag --json`")

DECODED_TABLES = (MESSAGES, RECORDS, CONNECTIONS)  # staged by the decode tasks
ANALYSED_TABLES = (GROUPS, PARTITIONS)             # written by the analysis task
TABLES = DECODED_TABLES + ANALYSED_TABLES



def arrow_type(ddl: str):
    """The Arrow type of a column of Spark SQL type `ddl` (the types of these tables), as written to Parquet."""
    import pyarrow as pa

    if ddl.startswith("array<"):
        return pa.list_(arrow_type(ddl[len("array<"):-1]))
    if ddl.startswith("map<"):
        key, value = _top_level(ddl[len("map<"):-1])
        return pa.map_(arrow_type(key), arrow_type(value))
    if ddl.startswith("struct<"):
        fields = [field.split(":", 1) for field in _top_level(ddl[len("struct<"):-1])]
        return pa.struct([(name.strip("`"), arrow_type(type_)) for name, type_ in fields])
    return {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "double": pa.float64(),
            "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC")}[ddl]


def _top_level(ddl: str) -> list[str]:
    """The comma-separated parts of a type list, commas inside <...> left alone."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(ddl):
        depth += (char == "<") - (char == ">")
        if char == "," and depth == 0:
            parts.append(ddl[start:at])
            start = at + 1
    return parts + [ddl[start:]]


def raw_schema(table: Table):
    """The Arrow schema of the table's raw rows (see `Table.raw_columns`)."""
    import pyarrow as pa

    return pa.schema([(c.name, arrow_type(c.type)) for c in table.raw_columns])


def file_schema(table: Table):
    """The Arrow schema of the table's Parquet files: its columns but `date`, which names their folder."""
    import pyarrow as pa

    return pa.schema([(c.name, arrow_type(c.type)) for c in table.columns if c.name != DATE.name])

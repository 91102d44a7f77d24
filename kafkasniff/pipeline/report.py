"""Spark SQL over the tables `build_tables` wrote: the sections of `kafkasniff report`.

Every section is a list of plain dicts (JSON-ready). Topics count data records only (not
transaction markers), and bytes are key plus value bytes. Percentiles are exact (Spark's
`percentile`, linear interpolation between the closest ranks, as numpy's default). `groups` and
`partitions` summarise the tables of the same names: per group, its generations and rebalances;
per partition, its traffic and how far its consumers are behind.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from kafkasniff.pipeline.tables import TABLES, Table

# Times as UTC text: PySpark would hand timestamps over in the driver's local time zone.
_TIME_TEXT = {"utc_min_ts": "date_format(min(ts), 'yyyy-MM-dd HH:mm:ss.SSSSSS')",
              "utc_max_ts": "date_format(max(ts), 'yyyy-MM-dd HH:mm:ss.SSSSSS')"}
SECTIONS = {
    "summary": """
        SELECT (SELECT count(*) FROM connections) AS connections,
               (SELECT count(*) FROM connections WHERE protocol = 'kafka') AS kafka_connections,
               count(*) AS messages,
               count_if(kind = 'request') AS requests,
               count_if(kind = 'response') AS responses,
               count_if(malformed IS NOT NULL) AS malformed,
               (SELECT count(*) FROM records) AS records,
               {utc_min_ts} AS first_utc, {utc_max_ts} AS last_utc
        FROM messages""",
    "latency": """
        SELECT api_name, count(*) AS responses,
               percentile(latency_ms, 0.5) AS p50_ms, percentile(latency_ms, 0.9) AS p90_ms,
               percentile(latency_ms, 0.99) AS p99_ms, max(latency_ms) AS max_ms, avg(latency_ms) AS mean_ms
        FROM messages WHERE kind = 'response' AND latency_ms IS NOT NULL
        GROUP BY api_name ORDER BY responses DESC, api_name""",
    "errors": """
        WITH responses AS (SELECT api_name, errors FROM messages WHERE kind = 'response'),
             per_api AS (SELECT api_name, count(*) AS api_responses FROM responses GROUP BY api_name)
        SELECT error, api_name, count(*) AS responses, first(api_responses) AS api_responses,
               count(*) / first(api_responses) AS rate
        FROM (SELECT api_name, explode(errors) AS error FROM responses) JOIN per_api USING (api_name)
        GROUP BY error, api_name ORDER BY responses DESC, error, api_name""",
    "topics": """
        SELECT coalesce(topic, topic_id) AS topic,
               count_if(direction = 'produce') AS produced_records,
               sum(if(direction = 'produce', coalesce(key_size, 0) + coalesce(value_size, 0), 0)) AS produced_bytes,
               count_if(direction = 'fetch') AS fetched_records,
               sum(if(direction = 'fetch', coalesce(key_size, 0) + coalesce(value_size, 0), 0)) AS fetched_bytes,
               count(*) AS records, sum(coalesce(key_size, 0) + coalesce(value_size, 0)) AS bytes
        FROM records WHERE NOT is_control GROUP BY 1 ORDER BY bytes DESC, records DESC, topic LIMIT {top}""",
    "clients": """
        SELECT client_id, count(DISTINCT stream) AS connections,
               count_if(kind = 'request') AS requests, count_if(kind = 'response') AS responses,
               sum(size) AS bytes, count_if(size(errors) > 0) AS error_responses,
               coalesce(sum(throttle_time_ms), 0) AS throttle_ms,
               array_join(sort_array(collect_set(api_name)), ' ') AS apis,
               {utc_min_ts} AS first_utc, {utc_max_ts} AS last_utc
        FROM messages GROUP BY client_id ORDER BY requests DESC, client_id LIMIT {top}""",
    "throttle": """
        SELECT api_name, count(*) AS responses, count_if(throttle_time_ms > 0) AS throttled,
               sum(throttle_time_ms) AS total_ms, max(throttle_time_ms) AS max_ms
        FROM messages WHERE kind = 'response' AND throttle_time_ms IS NOT NULL
        GROUP BY api_name ORDER BY total_ms DESC, responses DESC, api_name""",
    "groups": """
        WITH generations AS (
            SELECT group_id, generation, first(protocol) AS protocol, first(rebalance_ms) AS rebalance_ms,
                   count(member_id) AS members, first(causes) AS causes,
                   first(aggregate(map_values(errors), 0L, (total, n) -> total + n)) AS errors
            FROM groups WHERE generation IS NOT NULL GROUP BY group_id, generation)
        SELECT group_id, group_state AS state, max_by(protocol, generation) AS protocol,
               count(generation) AS generations, max(generation) AS last_generation,
               max_by(members, generation) AS members, max(rebalance_ms) AS max_rebalance_ms,
               coalesce(sum(errors), 0) AS errors, max_by(array_join(causes, '; '), generation) AS last_cause
        FROM (SELECT DISTINCT group_id, group_state FROM groups) LEFT JOIN generations USING (group_id)
        GROUP BY group_id, group_state ORDER BY group_id LIMIT {top}""",
    "partitions": """
        SELECT topic, partition, produced_records, produced_bytes, records_per_minute, fetched_records,
               fetched_bytes, log_end_offset, size(consumers) AS consumers,
               array_max(transform(consumers, c -> c.last.lag)) AS max_consumer_lag,
               array_max(transform(committed, c -> c.lag)) AS max_committed_lag
        FROM partitions ORDER BY produced_bytes DESC, fetched_bytes DESC, topic, partition LIMIT {top}""",
}


def register_tables(spark, directory: str) -> None:
    """The tables under `directory` as temporary views, read with their documented schema
    (a table of an empty run has no Parquet file to take a schema from)."""
    for table in TABLES:
        spark.read.schema(_ddl(table)).parquet(f"{directory.rstrip('/')}/{table.name}") \
            .createOrReplaceTempView(table.name)


def _ddl(table: Table) -> str:
    return ", ".join(f"`{c.name}` {c.type}" for c in table.columns)


def report(spark, directory: str, top: int = 20) -> dict[str, list[dict]]:
    register_tables(spark, directory)
    spark.conf.set("spark.sql.session.timeZone", "UTC")

    def section(query: str) -> list[dict]:
        return [row.asDict(recursive=True) for row in spark.sql(query.format(top=top, **_TIME_TEXT)).collect()]

    # The sections' queries at once, a thread each: a query's planning and code generation, in the driver's JVM,
    # cost more than its data, and one query's keep one core busy
    with ThreadPoolExecutor(len(SECTIONS)) as threads:
        sections = {name: threads.submit(section, query) for name, query in SECTIONS.items()}
    return {name: rows.result() for name, rows in sections.items()}

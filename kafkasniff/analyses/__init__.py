"""Answers from decoded traffic: consumer-group generations, consumer lag, produce-to-fetch latency, live traffic.

Sans-I/O, like the decoder below them: each analysis takes the MessageEvents of kafkasniff.stream in capture
order (`observe`) and keeps state whose size grows with groups, clients, topics and partitions, not with
messages; results come out as plain values (`to_json`) and rich tables. The commands feed them from captures
(`groups`, `lag`, `decode --stats`) or from a live interface (`sniff --stats`, `--top`, `--metrics-port`).
"""

"""kafkasniff: a Kafka wire-protocol analyzer driven by Apache Kafka's message schemas."""

__version__ = "0.1.0"

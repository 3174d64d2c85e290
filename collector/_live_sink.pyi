class LiveSink:
    """The base of a sink whose `applied` the live path calls in C (collector/_live_sink.pyx)."""

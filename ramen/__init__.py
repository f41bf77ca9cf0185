"""ramen: a stream processor with replayable workers over Aeron-compatible log buffers and archives."""

__version__ = "0.1.0"

"""Aeron Archive: catalog, segment files, recorder, replay sessions, mark file and event-time index."""

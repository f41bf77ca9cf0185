"""The worker process: sources, function executors, replayer and archiver."""

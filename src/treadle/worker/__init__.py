"""Worker process: claims attempts, runs them in child processes, heartbeats, reports outcomes."""

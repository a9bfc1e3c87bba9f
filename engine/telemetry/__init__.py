"""What every process reports: node metrics, request ids in log lines, OpenTelemetry traces,
the per-step log."""

"""The pack pipeline: scan, plan, read and re-encode samples, run them on an executor, write shards,
resume and report, and what a command may do to its output (ownership, one writer, files replaced together)."""

"""Apps that the worker process tests run as real ``x-jobs worker apps.<module>:app`` processes,
and the harness that starts those processes and reads what their handlers recorded."""

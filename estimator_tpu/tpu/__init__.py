"""TPU readiness checked on CPU: the preflight report and its checks."""

"""The troubleshooting view stores nothing: every answer is evaluated when it is asked for, from
what the other apps store (checks, metrics, logs, alerts, the process table, gate results)."""

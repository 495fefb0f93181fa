"""Prometheus metrics: ``GET /metrics`` (viewer scope), in Prometheus' text format.

What the database says at scrape time (``collector``: GPUs by state, team allocation,
measured busy, the queue, the latest plan, actions, migration durations, telemetry
freshness, idle GPU-hours by cause over the last hour) and what this process measured
(``http``: request latency per route). Labels are clusters, GPU models, teams, SLA
classes, causes, action kinds and states, routes — never job ids — so their number is
bounded by the fleet's configuration, not by its workload.
"""

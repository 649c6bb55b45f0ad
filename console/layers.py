"""The console's apps from the base to the composition root: an app may import the apps before
it, never one after it (tests/test_app_layers.py holds every module to this).

A new app takes the place that its imports give it. Rollouts, alerts and autoscaling read
deployments, processes, metrics and gates, so they go after ``quality``; node agents host a
node's supervisor and go after ``supervisor``.
"""

from __future__ import annotations

APP_ORDER: tuple[str, ...] = (
    "audit",        # the append-only log of every change: who, when, what, before and after
    "accounts",     # teams, members and their roles
    "credentials",  # API tokens (expiring, revocable) and login rate limits
    "fleet",        # nodes and their devices
    "catalog",      # base models, variants and their quantization jobs
    "deployments",  # plans: a deployment's workers, ports and devices
    "supervisor",   # the process table: every child process on a node
    "quantization",  # building quantized variants, the builder a requested process
    "live",         # logs and metrics of those processes
    "checks",       # pre-flight checks of a plan against the fleet and the process table
    "gateway",      # API keys and the router's admin API
    "quality",      # output gates and variant measurements
    "playground",   # chat with a deployment through its router
    "alerts",       # alert rules over the metrics, silences, notifiers and the alert dashboard
    "diagnosis",    # the troubleshooting view: eight symptoms from checks, metrics, logs, alerts
    "verification",  # reports per revision: connectivity, function, performance, stress, logs
    "rollouts",     # revisions of a deployment and the rollouts between them
    "advisor",      # measured speeds, the predicted goodput of each topology, the advice
    "autoscaling",  # pool policies, the autoscaler's decisions; it pauses during a rollout
    "control",      # composition root: the deployment lifecycle, its pages, the supervise daemon
)

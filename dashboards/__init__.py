"""Grafana dashboards as code. Not built yet: see issue 6."""

"""The REST API and Prometheus metrics (FastAPI). Not built yet: see issue 4."""

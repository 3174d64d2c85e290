"""The REST API, Prometheus metrics and the page (FastAPI): `app.create_app` wires them."""

"""History of every replica's cache over time (SQLAlchemy). Not built yet: see issue 3."""

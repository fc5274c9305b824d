"""The API server client: a thin JSON REST layer with typed errors, and a watch-backed informer
(plain dicts in and out). api/ holds the schemas; this package talks to the API server."""

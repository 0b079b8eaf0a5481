"""The stages' runtime observability: figures declared on the stats, Prometheus metrics,
heartbeats, and `app.install`, which adds them to a worker's Faust app."""

"""The operator's tools on a dataset and a run, used by the command line only: status, the
run's console and progress, dead letters, audit, seal, export, report."""

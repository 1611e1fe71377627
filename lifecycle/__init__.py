"""Commands the chart runs as Helm hook Jobs around the services (not the services themselves)."""

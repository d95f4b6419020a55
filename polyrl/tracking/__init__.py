"""MLflow: runs and their hierarchy, the buffered run logger, chart views and UI links, sample tables
and the rollout inspector."""

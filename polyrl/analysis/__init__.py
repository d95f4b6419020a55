"""Reading finished experiments back from MLflow: ``polyrl compare`` (tables, curves, paired
intervals and verdicts, per-example flip tables, compute-matched axes), the sequential stopping
rule and its planning (``polyrl plan``), A/A calibration, reward replay and the results document."""

"""Artifacts live beside their store: an experiment polyrl creates on a SQLite store keeps its
artifacts next to the database, whatever folder the command ran from (real MLflow, SQLite)."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from polyrl.tracking.mlflow_runs import ExperimentTracker, artifact_location


def test_artifacts_land_beside_the_sqlite_store_not_in_the_working_folder(tmp_path, monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # MLflow's default would be ./mlruns here
    uri = f"sqlite:///{store / 'm.db'}"
    tracker = ExperimentTracker(uri, "team/probe")
    run = tracker.start_parent("probe")
    run.log_text("hello", "notes/hello.txt")
    run.finish()
    location = MlflowClient(uri).get_experiment(tracker.experiment_id).artifact_location
    assert location == (store / "mlartifacts" / "team_probe").resolve().as_uri()
    assert (store / "mlartifacts" / "team_probe" / run.run_id / "artifacts" / "notes" / "hello.txt").read_text() == "hello"
    assert not (elsewhere / "mlruns").exists()


def test_a_relative_sqlite_path_is_resolved_and_servers_keep_their_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert artifact_location("sqlite:///dir/m.db", "exp") == (tmp_path / "dir" / "mlartifacts" / "exp").resolve().as_uri()
    assert artifact_location("http://127.0.0.1:5000", "exp") is None  # a server keeps its own artifact root
    assert artifact_location("sqlite://", "exp") is None  # in memory: MLflow decides
    assert artifact_location(f"file://{Path(tmp_path)}", "exp") is None  # a file store keeps artifacts inside

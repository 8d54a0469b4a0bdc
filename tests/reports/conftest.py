"""The report tests' shared study, written once per test module: ``fx`` (what ``study_fixture.make_study`` wrote),
``rep`` (its sections as data) and ``page`` (its HTML report)."""

from __future__ import annotations

import pytest

from reports import build_report, compute_sections
from study_fixture import FixtureStudy, make_study


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> FixtureStudy:
    return make_study(tmp_path_factory.mktemp("study"))


@pytest.fixture(scope="module")
def rep(fx):
    return compute_sections(fx.dir, fx.storage_url, fx.name)


@pytest.fixture(scope="module")
def page(fx) -> str:
    path = build_report(fx.dir, fx.storage_url, fx.name)
    assert path == fx.dir / "report.html"
    return path.read_text()
